"""Random weights for a model config without any checkpoint: the 27B-shaped benchmarks and the
tests. Float masters are made one tensor at a time and quantised by each module's load."""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
from flax import nnx

from prism_jax.config import ModelConfig, Precision
from prism_jax.model.layers import Embedding, Linear, RMSNorm
from prism_jax.model.transformer import Params, abstract_model, to_params


def _random_init(module: nnx.Module, key: jax.Array, config: ModelConfig) -> None:
    """Float masters on the default device, converted by each module's load (int8 quantises).

    Scales keep activations O(1) so random models give non-degenerate distributions.
    """
    k1, k2 = jax.random.split(key)
    if isinstance(module, Linear):
        w = jax.random.normal(k1, (*module.out, module.in_dim), jnp.float32)
        w = w * jnp.float32(module.in_dim**-0.5)
        bias = None
        if module.bias is not None:
            bias = 0.1 * jax.random.normal(k2, module.out, jnp.float32)
        module.load(w, bias)
    elif isinstance(module, RMSNorm):
        gamma = 0.1 * jax.random.normal(k1, module.gamma.shape, jnp.float32)
        module.load(gamma + (0.0 if module.offset else 1.0))
    elif isinstance(module, Embedding):
        v, d = module.table.shape
        module.load(jax.random.normal(k1, (v, d), jnp.float32) * jnp.float32(2 * d**-0.5))


def init_random(config: ModelConfig, precision: Precision, seed: int) -> Params:
    """Random weights without any checkpoint (benchmarks at 27B shapes, tests).

    Each tensor's key is derived from the seed and the parameter's path, so the int8 model is
    the quantised fp32 model of the same seed. Tensors are made one at a time on the default
    device: peak extra memory is one fp32 tensor.
    """
    model = abstract_model(config, precision)
    root = jax.random.key(seed)
    for path, node in nnx.iter_graph(model):
        if isinstance(node, Linear | RMSNorm | Embedding):
            name = "/".join(map(str, path)).encode()
            _random_init(node, jax.random.fold_in(root, zlib.crc32(name) & 0x7FFFFFFF), config)
    return to_params(model)
