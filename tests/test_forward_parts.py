"""The forward's split into executables of consecutive layers (prism_jax/forward_parts.py); that
the parts keep the single call's bits is tests/test_determinism.py's (h)."""

from __future__ import annotations

import itertools

import jax
import pytest

from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.forward_parts import (
    GPU_LAYERS_PER_CALL,
    layer_of,
    layers_per_call,
    part_leaf_indices,
    plan_parts,
)
from prism_jax.model import init_random
from tests.model.tiny import TINY_HF_CONFIGS


@pytest.mark.parametrize("layers, per_call", [(62, 8), (62, 62), (62, 100), (5, 1), (5, 2)])
def test_parts_cover_the_layers_in_order(layers, per_call):
    parts = plan_parts(layers, per_call)
    assert [i for part in parts for i in part] == list(range(layers))
    sizes = [len(part) for part in parts]
    if per_call >= layers:
        assert sizes == [layers], "all layers in one call"
    assert sizes[0] == 1 or per_call >= layers, "the ramp starts at one layer"
    assert all(1 <= n <= per_call for n in sizes)
    assert all(b <= 2 * a for a, b in itertools.pairwise(sizes)), "each part at most doubles"
    ramp_end = next((i for i, n in enumerate(sizes) if n == per_call), len(sizes))
    assert all(n == per_call for n in sizes[ramp_end:-1]), "after the ramp, full parts"


@pytest.mark.parametrize(
    "layers, per_call, first, sizes",
    [(61, 32, 2, [2, 4, 8, 16, 31]), (61, 32, 1, [1, 2, 4, 8, 16, 30]), (5, 4, 4, [4, 1])],
)
def test_the_first_part_sets_the_ramp(layers, per_call, first, sizes):
    assert [len(part) for part in plan_parts(layers, per_call, first)] == sizes


def test_a_first_part_above_the_cap_is_refused():
    with pytest.raises(AssertionError, match="first part of 9 layers, cap 8"):
        plan_parts(62, 8, 9)
    with pytest.raises(AssertionError, match="forward_first_layers must be >= 1"):
        EngineConfig(forward_first_layers=0)


def test_the_27b_parts():
    """The engine's body is 61 layers (the last is the tail): six parts on a GPU."""
    sizes = [len(part) for part in plan_parts(61, GPU_LAYERS_PER_CALL)]
    assert sizes == [1, 2, 4, 8, 16, 30]
    assert [len(part) for part in plan_parts(61, 8)] == [1, 2, 4, 8, 8, 8, 8, 8, 8, 6]


def test_layers_per_call_resolves_by_backend():
    assert layers_per_call(None, 62, "gpu") == GPU_LAYERS_PER_CALL
    assert layers_per_call(None, 62, "cpu") == 62
    assert layers_per_call(3, 62, "cpu") == 3
    with pytest.raises(AssertionError, match="forward_layers_per_call"):
        EngineConfig(forward_layers_per_call=0)


@pytest.mark.parametrize("per_call", [1, 3, 100])
def test_each_leaf_goes_to_the_parts_that_read_it(per_call):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    params = init_random(config, "int8", seed=0)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    parts = plan_parts(config.num_layers, per_call)
    indices = part_leaf_indices(params, parts)
    for i, path in enumerate(paths):
        owners = [k for k, ix in enumerate(indices) if i in ix]
        layer = layer_of(path)
        key = jax.tree_util.keystr(path)
        if layer is None:  # the embedding and the final norm: the first and the last part
            assert owners == sorted({0, len(parts) - 1}), key
        else:
            assert owners == [k for k, part in enumerate(parts) if layer in part], key
            assert f"['layers'][{layer}]" in key
