"""graph_break: an identity the GPU forward uses to end XLA's current CUDA graph.

XLA records each run of command-buffer-compatible thunks as one CUDA graph; the 27B forward was
one graph of 1,058 commands, and on an H200 the host spent ~4 ms in the call before the first
kernel ran. prism_graph_break's CUDA handler is not command-buffer compatible, so a break every
few layers splits the forward into several graphs: the GPU starts on the first while the host
launches the rest. Values pass through untouched (y aliases x), so results keep their bits.
"""

from __future__ import annotations

import jax

from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl


def graph_break(x: jax.Array, impl: Impl | None = None) -> jax.Array:
    """x, unchanged; with the custom calls, the point where a new CUDA graph starts."""
    if resolve_impl(impl) == "reference":
        return x
    require_target("prism_graph_break")
    call = jax.ffi.ffi_call(
        "prism_graph_break",
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        input_output_aliases={0: 0},
        vmap_method="broadcast_all",
    )
    return call(x)
