"""Packed step inputs: the int32 arrays one executable call needs, as one flat buffer.

Every numpy array passed to a compiled executable is its own host-to-device copy (on an H200
they land ~45 µs apart), so the runner sends one buffer per call and slices it back inside the
jitted function at offsets that are static per bucket. A layout is a tuple of (name, shape);
`pack` and `unpack` are inverses for any layout, on numpy or traced arrays.

Each array starts at a multiple of ALIGN int32s (1 KiB): XLA on the GPU passes a slice at such
an offset to a custom call as an address inside the buffer (a dynamic-slice fusion), where the
32-token bucket's slices at 128-384 byte offsets each became a copy kernel in every forward
part, ~20 a follow-up step with ~20 µs of idle GPU after each (results/e2e_h100_session39/).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from prism_jax.config import EngineConfig

Layout = tuple[tuple[str, tuple[int, ...]], ...]
ALIGN = 256  # int32s: every array of a packed buffer starts at a multiple of 1 KiB


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


def offsets(layout: Layout) -> tuple[int, ...]:
    """Where each array of the layout starts in the packed buffer: the first at 0, each next one
    at the first multiple of ALIGN past the previous array's end."""
    out, at = [], 0
    for _, shape in layout:
        out.append(at)
        at += -(-math.prod(shape) // ALIGN) * ALIGN
    return tuple(out)


def size(layout: Layout) -> int:
    """int32s of the packed buffer: up to the last array's end (no padding after it)."""
    if not layout:
        return 0
    return offsets(layout)[-1] + math.prod(layout[-1][1])


def pack(arrays: Mapping[str, np.ndarray], layout: Layout) -> np.ndarray:
    """int32 [size(layout)]: the layout's arrays flattened at offsets(layout), zeros between."""
    buffer = np.zeros(size(layout), np.int32)
    for (name, shape), at in zip(layout, offsets(layout), strict=True):
        a = arrays[name]
        if a.shape != shape or a.dtype != np.int32:
            raise ValueError(f"{name}: expected int32 {shape}, got {a.dtype} {a.shape}")
        buffer[at : at + a.size] = a.reshape(-1)
    return buffer


def unpack(buffer: Any, layout: Layout) -> dict[str, Any]:
    """The layout's arrays as static slices of a packed buffer (numpy or traced)."""
    assert buffer.shape == (size(layout),), f"buffer {buffer.shape} != ({size(layout)},)"
    return {
        name: buffer[at : at + math.prod(shape)].reshape(shape)
        for (name, shape), at in zip(layout, offsets(layout), strict=True)
    }
