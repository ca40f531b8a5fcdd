"""A forward step as several executables, each running a run of consecutive decoder layers.

XLA's host work to execute a step grows with its commands: on the H200 ~2 us per fusion and
~3-5 us per custom call, ~55 us per 27B layer, all of it before the executable's first kernel
(results/e2e_h200_session11/: the CUDA graph's launch itself costs ~4 us at any size; XLA
prepares and initialises every command and its fallback thunk first). One executable for the
62 layers idles the GPU ~4 ms per step. Calls are asynchronous, so with parts of a few layers
the GPU starts after the first part's host work while the host prepares the next parts: only
the first part's host time stays on the step's critical path.

The parts compute exactly what the single call computes (the same custom calls on the same
inputs, layer by layer), so results keep their bits whatever the split; tests check that.
"""

from __future__ import annotations

import jax

# EngineConfig.forward_layers_per_call=None on a GPU. With parts 1, 2, 4, 8, 16, 30 the 27B's
# one-digit walls were 0.12-0.34 ms lower on an H100 than with 2, 4, then 8 each (nine parts):
# each part boundary costs the GPU tens of microseconds, and each part's host work (~55 us a
# layer) still fits in the GPU time of the part before it, which is at least ~150 us a layer
# (results/e2e_h100_session39/).
GPU_LAYERS_PER_CALL = 32


def layers_per_call(configured: int | None, num_layers: int, backend: str) -> int:
    """EngineConfig.forward_layers_per_call resolved for this backend."""
    if configured is not None:
        assert configured >= 1, f"layers per call must be >= 1, got {configured}"
        return configured
    return GPU_LAYERS_PER_CALL if backend == "gpu" else num_layers


def plan_parts(num_layers: int, per_call: int, first: int = 1) -> tuple[range, ...]:
    """Consecutive layer ranges covering [0, num_layers): one when per_call >= num_layers,
    else a ramp that starts at `first` layers and doubles up to per_call layers a part. The
    first part's host work is the only part on the step's critical path, so it is the
    smallest; each following part is at most twice the previous, so the host prepares it
    while the GPU runs the previous ones."""
    assert num_layers >= 1 and per_call >= 1, (num_layers, per_call)
    assert 1 <= first <= per_call, f"first part of {first} layers, cap {per_call}"
    if per_call >= num_layers:
        return (range(num_layers),)
    parts, start, size = [], 0, first
    while start < num_layers:
        parts.append(range(start, min(start + size, num_layers)))
        start, size = start + size, min(2 * size, per_call)
    return tuple(parts)


def layer_of(path) -> int | None:
    """The decoder layer a params leaf belongs to (its path is .state['layers'][i]...), or None
    for the embedding, final norm and lm_head."""
    keys = [getattr(k, "key", getattr(k, "name", None)) for k in path]
    if len(keys) > 2 and keys[1] == "layers":
        assert isinstance(keys[2], int), f"unexpected params path {jax.tree_util.keystr(path)}"
        return keys[2]
    return None


def part_leaf_indices(params, parts: tuple[range, ...]) -> tuple[tuple[int, ...], ...]:
    """Per part, the indices (in jax.tree.leaves(params) order) of the leaves it reads: its
    layers' weights, plus the non-layer leaves for the first part (the embedding) and the last
    (the final norm). A part is passed only these: each argument costs host time per call."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    layers = [layer_of(p) for p in paths]
    assert all(x is None or 0 <= x < parts[-1].stop for x in layers), "a leaf of a missing layer"
    out = []
    for i, part in enumerate(parts):
        edge = i == 0 or i == len(parts) - 1  # embeds the tokens or applies the final norm
        out.append(tuple(j for j, x in enumerate(layers) if (edge if x is None else x in part)))
    return tuple(out)
