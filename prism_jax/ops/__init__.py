"""prism_jax.ops: every custom call behind one door (shape checks, dispatch, reference).

Layers call these functions, never jax.ffi directly. Each op runs the XLA FFI custom call
(CPU or CUDA, registered at import) or its pure-jnp reference, chosen by `impl=` or
`use_impl(...)`.
"""

from prism_jax.ops._registry import register
from prism_jax.ops.candidate_head import candidate_head, vocab_logsumexp
from prism_jax.ops.dispatch import current_impl, use_impl
from prism_jax.ops.glu_quant import (
    glu_quant,
    glu_quant2,
    glu_quant2_pair,
    glu_quant2_sum,
    glu_quant_pair,
)
from prism_jax.ops.int8_gemm import int8_gemm
from prism_jax.ops.qkv_rope import (
    kv_write_fused,
    qkv_rope,
    qkv_rope_sum,
    qkv_rope_supported,
    rope_tables,
)
from prism_jax.ops.quantize import (
    dequantize_rows,
    quantize_remainder,
    quantize_rows,
    quantize_weight,
)
from prism_jax.ops.quantize_digits import quantize_digits
from prism_jax.ops.rmsnorm_quant import (
    add_rmsnorm,
    add_rmsnorm_quant,
    add_rmsnorm_quant_sum,
    rmsnorm,
    rmsnorm_quant,
)
from prism_jax.ops.tree_attention import pack_chains, tree_attention
from prism_jax.ops.tree_attention_digits import tree_attention_digits

register()

__all__ = [
    "add_rmsnorm",
    "add_rmsnorm_quant",
    "add_rmsnorm_quant_sum",
    "candidate_head",
    "current_impl",
    "dequantize_rows",
    "glu_quant",
    "glu_quant2",
    "glu_quant2_pair",
    "glu_quant2_sum",
    "glu_quant_pair",
    "int8_gemm",
    "pack_chains",
    "kv_write_fused",
    "qkv_rope",
    "qkv_rope_sum",
    "qkv_rope_supported",
    "quantize_digits",
    "quantize_remainder",
    "quantize_rows",
    "quantize_weight",
    "register",
    "rope_tables",
    "rmsnorm",
    "rmsnorm_quant",
    "tree_attention",
    "tree_attention_digits",
    "use_impl",
    "vocab_logsumexp",
]
