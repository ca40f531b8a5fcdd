"""l2_prefetch: ask the GPU's L2 for an array ahead of the kernel that reads it.

A step of the 27B on a 4K-key follow-up spends ~60 us a layer in attention, which reads little
from DRAM, and then streams the o projection's weights (22 MB, one digit) at a small M, where
the GEMM is bound by DRAM. `prefetched(q, w)` hands q on unchanged through a custom call that
asks the L2 for w (CUDA: bulk prefetches, which return at once and fill while the attention
runs; CPU: nothing), so the o projection can find w in the L2. It changes when data
arrive, never a value. PRISM_ATTN_WEIGHT_PREFETCH=on has the int8 model do this for the o
projection (opt-in until an H200 has timed it; `prefetch_o_weights`).
"""

from __future__ import annotations

import jax
import numpy as np

from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, env_switch, resolve_impl

OP = "l2_prefetch"


def prefetch_o_weights() -> bool:
    """PRISM_ATTN_WEIGHT_PREFETCH=on: the int8 model prefetches the o projection's weights
    before each attention call (read when the step is traced); unset or "off": it does not."""
    return env_switch("PRISM_ATTN_WEIGHT_PREFETCH", False)


def l2_prefetch(x, after, *, max_bytes: int = 0, impl: Impl | None = None) -> jax.Array:
    """The custom call: asks the L2 for x's first max_bytes bytes (0: all) once `after`
    exists, and returns `after` unchanged (aliased: nothing is copied). Whatever consumes the
    result runs after the request, a data dependency XLA keeps (an optimization barrier would
    not survive its pipeline)."""
    if max_bytes < 0:
        raise ValueError(f"{OP}: max_bytes must be >= 0 (0: all of x), got {max_bytes}")
    if resolve_impl(impl) == "reference":
        return after
    require_target("prism_l2_prefetch")
    out = jax.ShapeDtypeStruct(after.shape, after.dtype)
    call = jax.ffi.ffi_call("prism_l2_prefetch", out, input_output_aliases={1: 0})
    return call(x, after, max_bytes=np.int64(max_bytes))


def prefetched(y, *arrays, max_bytes: int = 0, impl: Impl | None = None):
    """y itself, handed on through an L2 prefetch of each array in turn: pass the result to
    the kernel before which the prefetches should be issued."""
    for a in arrays:
        y = l2_prefetch(a, y, max_bytes=max_bytes, impl=impl)
    return y
