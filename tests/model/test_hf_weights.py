"""params_from_hf: layouts of the fused projections and errors that name what is wrong."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from prism_jax.config import ModelConfig
from prism_jax.model import bind, hf_tensor_shapes, params_from_hf
from tests.model.tiny import TINY_HF_CONFIGS


def fake_tensors(config: ModelConfig, rng) -> dict[str, np.ndarray]:
    return {n: rng.normal(size=s).astype(np.float32) for n, s in hf_tensor_shapes(config).items()}


@pytest.fixture
def qwen2():
    return ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen2"])


def test_missing_tensor_is_named_with_its_shape(qwen2, rng):
    tensors = fake_tensors(qwen2, rng)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    del tensors["model.layers.0.self_attn.k_proj.bias"]
    with pytest.raises(KeyError, match=r"model\.layers\.0\.self_attn\.k_proj\.bias \[16\]") as e:
        params_from_hf(qwen2, tensors, "fp32")
    assert "model.layers.1.mlp.up_proj.weight [128, 64]" in str(e.value)


def test_untied_model_needs_lm_head(rng):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen3"])
    tensors = fake_tensors(config, rng)
    del tensors["lm_head.weight"]
    with pytest.raises(KeyError, match=r"lm_head\.weight \[384, 64\]"):
        params_from_hf(config, tensors, "int8")


def test_wrong_shape_is_named(qwen2, rng):
    tensors = fake_tensors(qwen2, rng)
    tensors["model.norm.weight"] = np.ones(63, np.float32)
    with pytest.raises(ValueError, match=r"model\.norm\.weight has shape \[63\].*\[64\]"):
        params_from_hf(qwen2, tensors, "bf16")


def test_bad_precision(qwen2, rng):
    with pytest.raises(ValueError, match="precision must be one of"):
        params_from_hf(qwen2, fake_tensors(qwen2, rng), "fp8")


def test_fused_layouts_follow_hf_heads(qwen2, rng):
    """qkv is (K, G + 2, H, D): query head n = k * G + g uses kv head k, as in HF's GQA."""
    tensors = fake_tensors(qwen2, rng)
    tensors["unrelated.extra.tensor"] = np.zeros(3, np.float32)  # ignored
    layer = bind(params_from_hf(qwen2, tensors, "fp32"), qwen2).layers[1]
    qkv, h, g = np.asarray(layer.attn.qkv.w[...]), qwen2.head_dim, qwen2.num_groups
    p = "model.layers.1.self_attn."
    q = tensors[p + "q_proj.weight"].reshape(qwen2.num_heads, h, -1)
    k = tensors[p + "k_proj.weight"].reshape(qwen2.num_kv_heads, h, -1)
    for n in range(qwen2.num_heads):
        np.testing.assert_array_equal(qkv[n // g, n % g], q[n])
    np.testing.assert_array_equal(qkv[:, g], k)
    np.testing.assert_array_equal(
        np.asarray(layer.attn.qkv.bias[...])[:, g + 1], tensors[p + "v_proj.bias"].reshape(-1, h)
    )
    gate_up = np.asarray(layer.mlp.gate_up.w[...])
    np.testing.assert_array_equal(gate_up[1], tensors["model.layers.1.mlp.up_proj.weight"])


def test_int8_weights_are_per_channel_quantised(qwen2, rng):
    tensors = fake_tensors(qwen2, rng)
    down = bind(params_from_hf(qwen2, tensors, "int8"), qwen2).layers[0].mlp.down
    w = tensors["model.layers.0.mlp.down_proj.weight"]
    np.testing.assert_allclose(np.asarray(down.s_w[...]), np.abs(w).max(1) / 127, rtol=1e-6)
    assert np.abs(np.asarray(down.w_q[...])).max(1).min() == 127


def test_multimodal_gemma_names(rng):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    plain = fake_tensors(config, rng)
    nested = {"model.language_model." + k.removeprefix("model."): v for k, v in plain.items()}
    nested["model.vision_tower.patch.weight"] = np.zeros(2, np.float32)
    a = jax.tree.leaves(params_from_hf(config, plain, "bf16"))
    b = jax.tree.leaves(params_from_hf(config, nested, "bf16"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
