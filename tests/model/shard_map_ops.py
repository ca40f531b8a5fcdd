"""Runs every op the model uses inside jax.shard_map, rows sharded over 4 fake CPU devices,
and checks each output is bitwise the unsharded result. A script, not a test module: the
fake devices must be configured before jax is imported, so test_shard_map.py runs it in a
subprocess (XLA_FLAGS=--xla_force_host_platform_device_count=4). Prints "ok" on success."""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model import bind, init_random

M, D, F, V, C = 64, 96, 160, 300, 5  # M rows, split 16 per device


def check(name: str, fn, row_args, shared_args=()) -> None:
    """fn(*row_args, *shared_args) with row_args sharded on axis 0, shared_args replicated."""
    mesh = jax.make_mesh((4,), ("rows",), axis_types=(jax.sharding.AxisType.Auto,))
    whole = jax.jit(fn)(*row_args, *shared_args)
    specs = (P("rows"),) * len(row_args) + (P(),) * len(shared_args)
    sharded_fn = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=P("rows"))
    sharded = jax.jit(sharded_fn)(*row_args, *shared_args)
    for i, (a, b) in enumerate(zip(jax.tree.leaves(whole), jax.tree.leaves(sharded), strict=True)):
        a, b = np.asarray(a), np.asarray(b)
        same = a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))
        assert same, f"{name}: output {i} differs between shard_map over rows and one device"
    print(f"{name}: bitwise equal under shard_map")


def check_ops(rng: np.random.Generator) -> None:
    x = jnp.asarray(rng.normal(size=(M, D)), jnp.float32)
    r = jnp.asarray(rng.normal(size=(M, D)), jnp.float32)
    g = jnp.asarray(rng.normal(size=(D,)), jnp.float32)
    w_q, s_w = ops.quantize_weight(jnp.asarray(rng.normal(size=(F, D)), jnp.float32))
    x_q, s_x = ops.quantize_rows(x)
    gate, up = (jnp.asarray(rng.normal(size=(M, F)), jnp.float32) for _ in range(2))
    emb = jnp.asarray(rng.normal(size=(V, D)), jnp.bfloat16)
    ids = jnp.asarray(rng.integers(0, V, (M, C)), jnp.int32)
    counts = jnp.asarray(rng.integers(1, C + 1, (M,)), jnp.int32)
    check("int8_gemm", lambda q, s, w, sw: ops.int8_gemm(q, s, w, sw), (x_q, s_x), (w_q, s_w))
    check("quantize_rows", ops.quantize_rows, (x,))
    check("rmsnorm", lambda a, b: ops.rmsnorm(a, b, eps=1e-6, weight_offset=1.0), (x,), (g,))
    check("rmsnorm_quant", lambda a, b: ops.rmsnorm_quant(a, b, eps=1e-6), (x,), (g,))
    check(
        "add_rmsnorm_quant", lambda a, b, c: ops.add_rmsnorm_quant(a, b, c, eps=1e-5), (x, r), (g,)
    )
    for act in ("gelu_tanh", "silu"):
        check(
            f"glu_quant[{act}]",
            lambda a, b, act=act: ops.glu_quant(a, b, activation=act),
            (gate, up),
        )
    check(
        "candidate_head",
        lambda h, i, n, e: ops.candidate_head(h, e, i, n, softcap=30.0),
        (x, ids, counts),
        (emb,),
    )
    qkv = jnp.asarray(rng.normal(size=(M, 2, 4, 32)), jnp.float32)  # K = 2, G = 2, H = 32
    cos, sin = ops.rope_tables(jnp.arange(M, dtype=jnp.int32) * 37, np.full(16, 0.01, np.float32))
    check(
        "qkv_rope",
        lambda a, c, s, g1, g2: ops.qkv_rope(a, c, s, g1, g2, eps=1e-6, weight_offset=1.0),
        (qkv, cos, sin),
        (g[:32], g[32:64]),
    )
    check("vocab_logsumexp", lambda h, e: ops.vocab_logsumexp(h, e, softcap=30.0), (x,), (emb,))


def check_model_mlp(rng: np.random.Generator) -> None:
    """The int8 layer wrappers (fused add+norm+quantise, gate/up GEMM, GLU, down GEMM)."""
    config = ModelConfig(
        family="gemma3",
        vocab_size=V,
        hidden_size=D,
        intermediate_size=F,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        rms_norm_eps=1e-6,
        rope_theta=1e4,
        activation="gelu_tanh",
        norm_weight_offset=1.0,
        sandwich_norms=True,
    )
    params = init_random(config, "int8", seed=1)

    def mlp_block(h, delta, params):
        layer = bind(params, config).layers[0]
        x, h = layer.pre_mlp_norm.project_input(h, delta)
        return layer.post_mlp_norm(layer.mlp(x)), h

    h = jnp.asarray(rng.normal(size=(M, D)), jnp.float32)
    delta = jnp.asarray(rng.normal(size=(M, D)), jnp.float32)
    check("model int8 MLP block", mlp_block, (h, delta), (params,))


def main() -> None:
    assert len(jax.devices()) == 4, (
        f"needs 4 devices, got {len(jax.devices())}: run with "
        "XLA_FLAGS=--xla_force_host_platform_device_count=4 (XLA_FLAGS was "
        f"{os.environ.get('XLA_FLAGS')!r})"
    )
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    rng = np.random.default_rng(seed)
    check_ops(rng)
    check_model_mlp(rng)
    print("ok")


if __name__ == "__main__":
    main()
