"""The forward's split into executables of consecutive layers (prism_jax/forward_parts.py); that
the parts keep the single call's bits is tests/test_determinism.py's (h)."""

from __future__ import annotations

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
    assert all(1 <= len(part) <= per_call for part in parts)
    assert all(len(part) == per_call for part in parts[:-1]), "only the last part is short"


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
