"""Packed step inputs: each executable call gets its integer inputs as one buffer (one
host-to-device copy), and packing then unpacking gives the scheduler's arrays back exactly."""

from __future__ import annotations

import numpy as np
import pytest

from prism_jax.config import EngineConfig
from prism_jax.forest import build_forest
from prism_jax.kv_pages import PagePool
from prism_jax.prefix_cache import PrefixCache
from prism_jax.prompts import RenderedQuestion
from prism_jax.scheduler import place, plan_steps, step_arrays
from prism_jax.step_buffers import forward_layout, pack, readout_layout, size, unpack

CFG = EngineConfig(
    page_size=4, kv_pages=64, token_buckets=(8, 16, 64), row_buckets=(1, 4),
    candidate_buckets=(2, 4, 256),
)  # fmt: skip
QS = [
    RenderedQuestion(tuple(range(100, 110)), (1, 2, 3), ((7,), (8,))),
    RenderedQuestion(tuple(range(100, 110)), (4, 5), ((9, 10, 11), (12,))),  # leaves + lse
]


def _steps(chunk: int) -> list[dict[str, np.ndarray]]:
    forest = build_forest(QS, root_len=3)
    placements = place(forest, PrefixCache(PagePool(CFG.kv_pages, CFG.page_size)))
    plans = plan_steps(forest, placements, chunk)
    return [step_arrays(forest, placements, p, CFG, CFG.kv_pages) for p in plans]


@pytest.mark.parametrize("chunk", [5, 64])
def test_round_trip_is_exact(chunk):
    for arrays in _steps(chunk):
        t = arrays["tokens"].shape[0]
        layouts = [forward_layout(t, CFG), readout_layout(*arrays["cand_ids"].shape)]
        for layout in layouts:
            packed = pack(arrays, layout)
            assert packed.dtype == np.int32 and packed.shape == (size(layout),)
            for name, got in unpack(packed, layout).items():
                np.testing.assert_array_equal(got, arrays[name], err_msg=name)


def test_layouts_cover_every_step_input():
    """A new int32 input of the step must join a layout, not travel as its own array (only
    lse_rows goes alone, to the vocabulary pass; lse_of stays on the host)."""
    (arrays,) = _steps(64)
    t, (r, c) = arrays["tokens"].shape[0], arrays["cand_ids"].shape
    packed = {name for name, _ in forward_layout(t, CFG) + readout_layout(r, c)}
    assert set(arrays) - packed == {"lse_rows", "lse_of"}
    assert all(a.dtype == np.int32 for a in arrays.values())


def test_pack_refuses_wrong_shapes_and_dtypes():
    (arrays,) = _steps(64)
    layout = forward_layout(arrays["tokens"].shape[0], CFG)
    with pytest.raises(ValueError, match="tokens"):
        pack(dict(arrays, tokens=arrays["tokens"].astype(np.int64)), layout)
    with pytest.raises(ValueError, match="pages_flat"):
        pack(dict(arrays, pages_flat=arrays["pages_flat"][:-1]), layout)
