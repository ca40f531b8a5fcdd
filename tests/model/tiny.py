"""Tiny HF configs of every family (as config.json dicts) and the HF reference runner.

The reference runs in .venv-ref (Python 3.11 + PyTorch CPU; `make ref-venv`), called through
a subprocess: PyTorch has no CPU wheel for this project's Python 3.12.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
REF_PYTHON = ROOT / ".venv-ref" / "bin" / "python"
REF_SCRIPT = ROOT / "tests" / "reference" / "hf_reference.py"
T = 24  # longer than gemma3's sliding window below, so the window matters

# Config tables read best compact.
# fmt: off
_SMALL = dict(vocab_size=384, hidden_size=64, max_position_embeddings=256)
TINY_HF_CONFIGS: dict[str, dict] = {
    # Sliding and global layers with their own rope bases, linear scaling on the global ones,
    # head_dim != D / N, a non-default query_pre_attn_scalar and a final softcap.
    "gemma3": dict(
        _SMALL, model_type="gemma3_text", intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention"],
        query_pre_attn_scalar=24, rope_theta=10_000.0, rope_local_base_freq=100.0,
        rope_scaling={"rope_type": "linear", "factor": 2.0}, final_logit_softcapping=30.0,
    ),
    # Untied lm_head; llama3 rope scaling with wavelengths in all three of its regimes.
    "llama": dict(
        _SMALL, model_type="llama", intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10_000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=False,
    ),
    # q/k/v biases, one kv head, tied embedding.
    "qwen2": dict(
        _SMALL, model_type="qwen2", intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, rope_theta=1_000_000.0,
        tie_word_embeddings=True, use_sliding_window=False,
    ),
    # qk-norm, head_dim != D / N, untied.
    "qwen3": dict(
        _SMALL, model_type="qwen3", intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1_000_000.0,
        tie_word_embeddings=False,
    ),
}
# fmt: on
FAMILIES = tuple(TINY_HF_CONFIGS)


def tokens_for(name: str) -> list[int]:
    rng = np.random.default_rng(sum(map(ord, name)))
    return rng.integers(0, TINY_HF_CONFIGS[name]["vocab_size"], T).tolist()


def require_reference() -> None:
    if not REF_PYTHON.exists():
        pytest.skip(
            f"{REF_PYTHON} is missing: run `make ref-venv` (HF transformers + PyTorch "
            "CPU in Python 3.11) to compare against HF"
        )


def run_reference(out_dir: pathlib.Path, seed: int = 0, cases: list | None = None) -> pathlib.Path:
    """Runs HF on `cases` (default: every tiny model with random weights), writing the logits
    to out_dir/<name>/; returns out_dir."""
    require_reference()
    if cases is None:
        cases = [
            dict(name=n, config=c, seed=seed + i, tokens=tokens_for(n))
            for i, (n, c) in enumerate(TINY_HF_CONFIGS.items())
        ]
    spec = out_dir / "spec.json"
    spec.write_text(json.dumps(cases))
    proc = subprocess.run(
        [str(REF_PYTHON), str(REF_SCRIPT), str(spec), str(out_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"HF reference failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return out_dir
