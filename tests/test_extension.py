"""The compiled extension: one module, the same targets on every platform it was built for,
and every CUDA source of cc/ compiled into it when nvcc exists (CI has nvcc, no GPU)."""

import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGETS = {
    "prism_int8_gemm",
    "prism_rmsnorm",
    "prism_rmsnorm_quant",
    "prism_add_rmsnorm_quant",
    "prism_add_rmsnorm_quant_sum",
    "prism_add_rmsnorm",
    "prism_norm_add_rmsnorm_quant",
    "prism_norm_add_rmsnorm_quant_sum",
    "prism_norm_add_rmsnorm",
    "prism_glu_quant",
    "prism_glu_quant2",
    "prism_glu_quant2_sum",
    "prism_quantize_rows",
    "prism_qkv_rope",
    "prism_qkv_rope_sum",
    "prism_qkv_rope_kv",
    "prism_qkv_rope_sum_kv",
    "prism_candidate_head",
    "prism_vocab_logsumexp",
    "prism_tree_attention",
    "prism_tree_attention_digits",
}


def source_list() -> dict[str, list[str]]:
    kinds: dict[str, list[str]] = {}
    for line in (ROOT / "cc" / "sources.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            kind, path = line.split()
            kinds.setdefault(kind, []).append(path)
    return kinds


def test_registrations_cover_every_target():
    from prism_jax import _prism_ops, ops

    regs = _prism_ops.registrations()
    assert set(regs["cpu"]) == TARGETS
    assert set(ops.register()["cpu"]) == TARGETS
    if _prism_ops.with_cuda:
        assert set(regs["CUDA"]) == TARGETS


def test_source_list_names_every_source():
    listed = {p for paths in source_list().values() for p in paths}
    sources = (p for p in (ROOT / "cc").rglob("*") if p.suffix in (".cc", ".cu"))
    on_disk = {str(p.relative_to(ROOT)) for p in sources}
    assert listed == on_disk, f"cc/sources.txt and cc/ disagree: {sorted(listed ^ on_disk)}"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_cuda_sources_compiled_into_extension():
    from prism_jax import _prism_ops

    if os.environ.get("PRISM_CUDA") == "0":
        pytest.skip("PRISM_CUDA=0: CPU-only build requested")
    assert _prism_ops.with_cuda, (
        "nvcc is installed but the extension was built without CUDA: rebuild with `make build`"
    )
    assert source_list()["cuda"], "cc/sources.txt lists no CUDA source"
