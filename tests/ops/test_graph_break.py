"""graph_break: an identity on any buffer, and a forward cut into several CUDA graphs gives the
one-graph forward's bits (on the CPU here; on the H200 through benchmarks/gpu_suite.sh)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.engine import Engine
from prism_jax.model import init_random
from prism_jax.prompts import RenderedQuestion
from tests.conftest import assert_bitwise_equal, run_on
from tests.model.tiny import TINY_HF_CONFIGS


@pytest.mark.parametrize(
    "shape,dtype", [((7, 33), jnp.float32), ((5, 4, 3), jnp.bfloat16), ((16,), jnp.int8)]
)
def test_identity_keeps_bits(device, rng, shape, dtype):
    x = np.asarray(jnp.asarray(rng.standard_normal(shape) * 50).astype(dtype))
    y = run_on(device, jax.jit(ops.graph_break), x)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert_bitwise_equal(y, x, "graph_break")
    assert_bitwise_equal(run_on(device, ops.graph_break, x, impl="reference"), x, "reference")


def test_graph_layers_must_not_be_negative():
    with pytest.raises(AssertionError, match="graph_layers must be >= 0"):
        EngineConfig(graph_layers=-1)


@pytest.mark.parametrize("graph_layers", [1, 3])
def test_forward_in_several_graphs_keeps_bits(device, rng, graph_layers):
    config = ModelConfig.from_hf_config(dict(TINY_HF_CONFIGS["gemma3"]))
    buckets = EngineConfig(
        page_size=8, kv_pages=64, token_buckets=(64,), row_buckets=(1, 4),
        candidate_buckets=(4, 256),
    )  # fmt: skip
    v = config.vocab_size
    prefix = tuple(int(t) for t in rng.integers(0, v, 40))
    question = RenderedQuestion(prefix, (5, 6, 7), ((11,), (12,), (13,)))
    probabilities = []
    for layers in (0, graph_layers):
        with jax.default_device(device):
            params = init_random(config, "int8", seed=7)
            engine_config = dataclasses.replace(buckets, graph_layers=layers)
            engine = Engine(config, params, None, None, engine_config=engine_config)
            probabilities.append(engine.run([question]).probabilities)
    assert_bitwise_equal(
        np.asarray(probabilities[1], np.float64),
        np.asarray(probabilities[0], np.float64),
        f"graph_layers={graph_layers} vs one graph",
    )
