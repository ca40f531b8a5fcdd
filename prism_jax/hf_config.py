"""HF config.json -> ModelConfig, one parser per family (ModelConfig.from_hf_config).

transformers fills keys that config.json omits from its config class defaults (Gemma 3 4B's
text_config has no num_attention_heads, 27B's none of vocab_size), so we do the same with the
defaults of transformers 4.57; keys that define the model's shape are required instead.
"""

from __future__ import annotations

import math
from typing import Any

from prism_jax.config import Llama3Rope, ModelConfig, gemma3_layer_types

# fmt: off
_MODEL_TYPES = {"gemma3": "gemma3", "gemma3_text": "gemma3", "llama": "llama", "qwen2": "qwen2",
                "qwen3": "qwen3"}
_REQUIRED = {
    "gemma3": ("hidden_size", "intermediate_size", "num_hidden_layers"),
    "llama": ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads"),
}
_REQUIRED["qwen2"] = _REQUIRED["qwen3"] = _REQUIRED["llama"]
_QWEN_DEFAULTS = dict(rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=32_768,
                      hidden_act="silu", tie_word_embeddings=False, num_key_value_heads=32,
                      attention_bias=False, use_sliding_window=False)
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": dict(vocab_size=262_208, num_attention_heads=8, num_key_value_heads=4,
                   head_dim=256, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                   rope_local_base_freq=10_000.0, query_pre_attn_scalar=256,
                   sliding_window=4096, max_position_embeddings=131_072,
                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                   bos_token_id=2, eos_token_id=1, sliding_window_pattern=6),
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10_000.0, max_position_embeddings=2048,
                  hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
                  mlp_bias=False, bos_token_id=1, eos_token_id=2),
    "qwen2": _QWEN_DEFAULTS,
    "qwen3": dict(_QWEN_DEFAULTS, head_dim=128),
}
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh", "silu": "silu"}
_LAYER_TYPES = {"sliding_attention": "sliding", "full_attention": "global"}
# fmt: on


class _HFConfig:
    """Key lookup with the family's defaults and errors that name the missing key."""

    def __init__(self, d: dict[str, Any], family: str) -> None:
        self.d, self.family = d, family
        missing = [k for k in _REQUIRED[family] if d.get(k) is None]
        if missing:
            raise KeyError(
                f"config.json ({d.get('model_type')}) is missing {', '.join(map(repr, missing))}: "
                "these define the model's shape; copy them from the model's published config.json"
            )

    def __getitem__(self, key: str) -> Any:
        value = self.d.get(key)
        if value is None:
            value = _DEFAULTS[self.family].get(key)
        if value is None:
            raise KeyError(f"config.json ({self.family}) has no {key!r} and HF has no default")
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.d.get(key)
        return _DEFAULTS[self.family].get(key, default) if value is None else value

    def unsupported(self, key: str, ok: Any) -> None:
        if self.get(key, ok) != ok:
            raise NotImplementedError(
                f"config.json sets {key}={self.get(key)!r}; prism_jax supports only {ok!r} for "
                f"the {self.family} family"
            )


def _rope_scaling(spec: dict[str, Any] | None, where: str) -> tuple[float, Llama3Rope | None]:
    """HF rope_scaling / rope_parameters dict -> (linear factor, llama3 scaling)."""
    kind = (spec or {}).get("rope_type", (spec or {}).get("type", "default"))
    if kind == "default":
        return 1.0, None
    if kind == "linear":
        return float(spec["factor"]), None
    if kind == "llama3":
        return 1.0, Llama3Rope(
            float(spec["factor"]),
            float(spec["low_freq_factor"]),
            float(spec["high_freq_factor"]),
            int(spec["original_max_position_embeddings"]),
        )
    raise NotImplementedError(
        f"rope_type {kind!r} in {where} is not supported (supported: default, linear, llama3)"
    )


def _eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list | tuple) else (int(value),)


def _common(c: _HFConfig, family: str) -> dict[str, Any]:
    d = c.d
    act = c.get("hidden_activation") or c["hidden_act"]
    if act not in _ACTIVATIONS:
        raise NotImplementedError(f"activation {act!r} is not supported: {sorted(_ACTIVATIONS)}")
    return dict(
        family=family,
        vocab_size=int(c["vocab_size"]),
        hidden_size=int(d["hidden_size"]),
        intermediate_size=int(d["intermediate_size"]),
        num_layers=int(d["num_hidden_layers"]),
        num_heads=int(c["num_attention_heads"]),
        num_kv_heads=int(c.get("num_key_value_heads") or c["num_attention_heads"]),
        head_dim=int(c.get("head_dim") or d["hidden_size"] // c["num_attention_heads"]),
        rms_norm_eps=float(c["rms_norm_eps"]),
        activation=_ACTIVATIONS[act],
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
        max_position_embeddings=int(c["max_position_embeddings"]),
        bos_token_id=c.get("bos_token_id"),
        eos_token_ids=_eos(c.get("eos_token_id")),
    )


def _gemma3_from_hf(d: dict[str, Any]) -> ModelConfig:
    c = _HFConfig(d, "gemma3")
    c.unsupported("attn_logit_softcapping", None)
    c.unsupported("use_bidirectional_attention", False)
    params = d.get("rope_parameters")  # transformers >= 5: one rope dict per layer type
    if params and "full_attention" in params:
        glob, local = params["full_attention"], params.get("sliding_attention", {})
        theta, local_theta = glob.get("rope_theta", c["rope_theta"]), local.get("rope_theta")
    else:
        glob, local, theta, local_theta = d.get("rope_scaling"), None, c["rope_theta"], None
    linear, llama3 = _rope_scaling(glob, "the global layers' rope")
    assert llama3 is None, "Gemma 3 global layers use default or linear rope"
    _rope_scaling(local, "the sliding layers' rope")  # must be default
    n = int(d["num_hidden_layers"])
    types = d.get("layer_types")
    layer_types = (
        tuple(_LAYER_TYPES[t] for t in types)
        if types
        else gemma3_layer_types(n, int(c["sliding_window_pattern"]))
    )
    return ModelConfig(
        **_common(c, "gemma3"),
        rope_theta=float(theta),
        rope_local_theta=float(local_theta or c["rope_local_base_freq"]),
        rope_scaling_factor=linear,
        sliding_window=int(c["sliding_window"]),
        layer_types=layer_types,
        norm_weight_offset=1.0,
        embed_scale=math.sqrt(int(d["hidden_size"])),
        qk_norm=True,
        sandwich_norms=True,
        query_pre_attn_scalar=float(c["query_pre_attn_scalar"]),
        final_logit_softcap=float(c.get("final_logit_softcapping") or 0.0),
    )


def _llama_like_from_hf(d: dict[str, Any], family: str) -> ModelConfig:
    c = _HFConfig(d, family)
    c.unsupported("use_sliding_window", False)
    if family == "llama":
        c.unsupported("mlp_bias", False)
    if family != "qwen2":  # Qwen2 always has q/k/v biases and no o bias
        c.unsupported("attention_bias", False)
    params = d.get("rope_parameters")  # transformers >= 5
    spec = params if params else d.get("rope_scaling")
    linear, llama3 = _rope_scaling(spec, "rope_scaling")
    theta = (params or {}).get("rope_theta", None) or c["rope_theta"]
    if any(t != "full_attention" for t in d.get("layer_types") or ()):
        raise NotImplementedError(f"{family}: only full-attention layers are supported")
    return ModelConfig(
        **_common(c, family),
        rope_theta=float(theta),
        rope_scaling_factor=linear,
        rope_llama3=llama3,
        qk_norm=family == "qwen3",
        qkv_bias=family == "qwen2",
    )


def model_config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig.from_hf_config: the family's parser for a parsed config.json dict."""
    if not isinstance(d, dict):
        raise TypeError(f"from_hf_config takes the parsed config.json dict, got {type(d).__name__}")
    if "model_type" not in d:
        raise KeyError(f"config.json has no 'model_type'; expected one of {sorted(_MODEL_TYPES)}")
    if d["model_type"] == "gemma3" and "text_config" in d:  # multimodal wrapper: text tower only
        ids = {k: d[k] for k in ("bos_token_id", "eos_token_id") if k in d}
        d = {"model_type": "gemma3_text", **ids, **d["text_config"]}
    family = _MODEL_TYPES.get(d["model_type"])
    if family is None:
        raise NotImplementedError(
            f"model_type {d['model_type']!r} is not supported; supported: {sorted(_MODEL_TYPES)}"
        )
    return _gemma3_from_hf(d) if family == "gemma3" else _llama_like_from_hf(d, family)
