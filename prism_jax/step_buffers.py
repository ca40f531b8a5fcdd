"""Packed step inputs: the int32 arrays one executable call needs, as one flat buffer.

Every numpy array passed to a compiled executable is its own host-to-device copy (on an H200
they land ~45 µs apart), so the runner sends one buffer per call and slices it back inside the
jitted function at offsets that are static per bucket. A layout is a tuple of (name, shape);
`pack` and `unpack` are inverses for any layout, on numpy or traced arrays.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from prism_jax.config import EngineConfig

Layout = tuple[tuple[str, tuple[int, ...]], ...]


def forward_layout(t: int, engine: EngineConfig) -> Layout:
    """The forward's inputs for a step of t tokens (scheduler.step_arrays' names). out_rows,
    the readout rows padded to the largest row bucket, keeps one buffer for every part
    whatever the step's row bucket (the last layer's part reads its first R)."""
    return (
        ("tokens", (t,)),
        ("slot", (t,)),
        ("positions", (t,)),
        ("chain_of", (t,)),
        ("chain_segments", (t, engine.chain_depth, 3)),
        ("pages_flat", (engine.kv_pages,)),
        ("out_rows", (engine.row_buckets[-1],)),
    )


def readout_layout(r: int, c: int) -> Layout:
    """The candidate readout's inputs for r rows of c candidates."""
    return (("rows", (r,)), ("cand_counts", (r,)), ("cand_ids", (r, c)))


def size(layout: Layout) -> int:
    return sum(math.prod(shape) for _, shape in layout)


def pack(arrays: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray:
    """int32 [size(layout)]: the layout's arrays flattened end to end, in layout order."""
    parts = []
    for name, shape in layout:
        a = arrays[name]
        if a.shape != shape or a.dtype != np.int32:
            raise ValueError(f"{name}: expected int32 {shape}, got {a.dtype} {a.shape}")
        parts.append(a.reshape(-1))
    return np.concatenate(parts)


def unpack(buffer: Any, layout: Layout) -> dict[str, Any]:
    """The layout's arrays as static slices of a packed buffer (numpy or traced)."""
    assert buffer.shape == (size(layout),), f"buffer {buffer.shape} != ({size(layout)},)"
    out, at = {}, 0
    for name, shape in layout:
        n = math.prod(shape)
        out[name] = buffer[at : at + n].reshape(shape)
        at += n
    return out
