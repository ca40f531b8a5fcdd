"""ModelConfig.from_hf_config: presets rebuilt from the published config.json values, HF's
defaults for omitted keys, both rope formats, and errors that name what is wrong."""

from __future__ import annotations

import dataclasses

import pytest

from prism_jax import config as C
from prism_jax.config import ModelConfig

# Config tables read best compact.
# fmt: off
_GEMMA_270M_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 3
# The published config.json files (the keys that matter; the rest take HF's defaults).
PUBLISHED = {
    "gemma3-270m": dict(
        model_type="gemma3_text", vocab_size=262_144, hidden_size=640, intermediate_size=2048,
        num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        sliding_window=512, query_pre_attn_scalar=256, rope_theta=1_000_000.0,
        rope_local_base_freq=10_000.0, rope_scaling=None, max_position_embeddings=32_768,
        layer_types=_GEMMA_270M_TYPES, final_logit_softcapping=None, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh"),
    "gemma3-1b": dict(
        model_type="gemma3_text", vocab_size=262_144, hidden_size=1152, intermediate_size=6912,
        num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
        rope_scaling=None, max_position_embeddings=32_768),
    # Multimodal checkpoints: only text_config matters, and it omits most keys.
    "gemma3-4b": dict(model_type="gemma3", text_config=dict(
        model_type="gemma3_text", hidden_size=2560, intermediate_size=10240,
        num_hidden_layers=34, sliding_window=1024,
        rope_scaling={"factor": 8.0, "rope_type": "linear"})),
    "gemma3-12b": dict(model_type="gemma3", text_config=dict(
        model_type="gemma3_text", hidden_size=3840, intermediate_size=15360,
        num_attention_heads=16, num_hidden_layers=48, num_key_value_heads=8,
        sliding_window=1024, rope_scaling={"factor": 8.0, "rope_type": "linear"})),
    "gemma3-27b": dict(model_type="gemma3", text_config=dict(
        model_type="gemma3_text", head_dim=128, hidden_size=5376, intermediate_size=21504,
        num_attention_heads=32, num_hidden_layers=62, num_key_value_heads=16,
        query_pre_attn_scalar=168, sliding_window=1024,
        rope_scaling={"factor": 8.0, "rope_type": "linear"})),
    "smollm2-135m": dict(
        model_type="llama", vocab_size=49_152, hidden_size=576, intermediate_size=1536,
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=100_000, rope_scaling=None, tie_word_embeddings=True,
        max_position_embeddings=8192, hidden_act="silu", bos_token_id=1, eos_token_id=2),
    "llama3.2-1b": dict(
        model_type="llama", vocab_size=128_256, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        rms_norm_eps=1e-5, rope_theta=500_000.0, tie_word_embeddings=True,
        max_position_embeddings=131_072, rope_scaling={
            "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"}),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        rms_norm_eps=1e-6, rope_theta=1_000_000.0, sliding_window=32_768,
        max_window_layers=21, use_sliding_window=False, tie_word_embeddings=True,
        max_position_embeddings=32_768, hidden_act="silu"),
    "qwen3-0.6b": dict(
        model_type="qwen3", vocab_size=151_936, hidden_size=1024, intermediate_size=3072,
        num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        rms_norm_eps=1e-6, rope_theta=1_000_000, rope_scaling=None, tie_word_embeddings=True,
        max_position_embeddings=40_960, attention_bias=False),
}
# fmt: on


def model_fields(config: ModelConfig) -> dict:
    """Everything but the special token ids (those live in generation_config.json)."""
    fields = dataclasses.asdict(config)
    fields.pop("bos_token_id"), fields.pop("eos_token_ids")
    return fields


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets_match_published_configs(name):
    assert set(PUBLISHED) == set(C.PRESETS), "every preset needs its published config here"
    built = ModelConfig.from_hf_config(PUBLISHED[name])
    assert model_fields(built) == model_fields(C.PRESETS[name])


def test_gemma3_27b_is_the_benchmark_shape():
    c = C.GEMMA3_27B
    assert (
        c.vocab_size,
        c.hidden_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.sliding_window,
    ) == (262_208, 5376, 62, 32, 16, 128, 21504, 1024)
    assert c.layer_types.count("global") == 10 and c.attention_scale == 168**-0.5


def test_transformers5_rope_parameters():
    gemma = dict(
        PUBLISHED["gemma3-270m"],
        rope_theta=None,
        rope_local_base_freq=None,
        rope_scaling=None,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
    c = ModelConfig.from_hf_config(gemma)
    assert (c.rope_theta, c.rope_local_theta, c.rope_scaling_factor) == (1e6, 1e4, 4.0)
    llama = dict(
        PUBLISHED["smollm2-135m"],
        rope_theta=None,
        rope_parameters={"rope_type": "default", "rope_theta": 12345.0},
    )
    assert ModelConfig.from_hf_config(llama).rope_theta == 12345.0


def test_missing_shape_keys_are_named():
    broken = dict(PUBLISHED["qwen2.5-0.5b"])
    del broken["intermediate_size"], broken["num_hidden_layers"]
    with pytest.raises(KeyError, match="'intermediate_size', 'num_hidden_layers'"):
        ModelConfig.from_hf_config(broken)
    with pytest.raises(KeyError, match="model_type"):
        ModelConfig.from_hf_config({"hidden_size": 8})


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"model_type": "mistral"}, "model_type 'mistral' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "relu"}, "activation 'relu'"),
    ],
)
def test_unsupported_features_say_so(changes, match):
    with pytest.raises(NotImplementedError, match=match):
        ModelConfig.from_hf_config(dict(PUBLISHED["qwen2.5-0.5b"], **changes))


def test_family_features():
    qwen2 = ModelConfig.from_hf_config(PUBLISHED["qwen2.5-0.5b"])
    qwen3 = ModelConfig.from_hf_config(PUBLISHED["qwen3-0.6b"])
    gemma = ModelConfig.from_hf_config(PUBLISHED["gemma3-1b"])
    assert qwen2.qkv_bias and not qwen2.qk_norm and not qwen2.sandwich_norms
    assert qwen3.qk_norm and not qwen3.qkv_bias and qwen3.norm_weight_offset == 0.0
    assert gemma.qk_norm and gemma.sandwich_norms and gemma.norm_weight_offset == 1.0
    assert gemma.layer_types == C.gemma3_layer_types(26) and gemma.embed_scale == 1152**0.5
