"""HF state-dict tensors -> Params: names, expected shapes, fusion into our layouts.

Shape letters: D model dim, F ffw dim, N query heads, K kv heads, G = N / K, H head dim,
V vocab. HF Linear weights are [out, in], as ours; the fusions are
  q [N*H, D], k [K*H, D], v [K*H, D] -> qkv [K, G + 2, H, D]   (per kv head: G queries, k, v)
  gate [F, D], up [F, D]             -> gate_up [2, F, D]
Gemma's norm weights are stored as gamma (the model applies 1 + gamma), as in HF.
The int8 model is smoothed first (smoothing.py): the same function with the activation outliers
moved into the weights.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Mapping, Sequence

import numpy as np

from prism_jax.config import ModelConfig, Precision
from prism_jax.model import smoothing as smoothing_lib
from prism_jax.model.layers import check_precision
from prism_jax.model.transformer import DecoderLayer, Params, abstract_model, to_params

# Multimodal Gemma 3 checkpoints nest the text model under one of these prefixes.
_PREFIXES = ("model.language_model.", "language_model.model.")


def hf_tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every HF tensor the model needs, with its shape."""
    c = config
    d, f, h = c.hidden_size, c.intermediate_size, c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, d)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        for name, out in (
            ("q", c.num_heads * h),
            ("k", c.num_kv_heads * h),
            ("v", c.num_kv_heads * h),
        ):
            shapes[f"{p}self_attn.{name}_proj.weight"] = (out, d)
            if c.qkv_bias:
                shapes[f"{p}self_attn.{name}_proj.bias"] = (out,)
        shapes[f"{p}self_attn.o_proj.weight"] = (d, c.num_heads * h)
        if c.qk_norm:
            shapes[f"{p}self_attn.q_norm.weight"] = (h,)
            shapes[f"{p}self_attn.k_norm.weight"] = (h,)
        for norm in _norm_names(c):
            shapes[f"{p}{norm}.weight"] = (d,)
        shapes[f"{p}mlp.gate_proj.weight"] = (f, d)
        shapes[f"{p}mlp.up_proj.weight"] = (f, d)
        shapes[f"{p}mlp.down_proj.weight"] = (d, f)
    return shapes


def _norm_names(config: ModelConfig) -> dict[str, str]:
    """HF norm name -> our DecoderLayer attribute. HF Llama's post_attention_layernorm is the
    norm before the MLP; Gemma's is the post-norm of the attention output."""
    if config.sandwich_norms:
        return {
            "input_layernorm": "input_norm",
            "post_attention_layernorm": "post_attn_norm",
            "pre_feedforward_layernorm": "pre_mlp_norm",
            "post_feedforward_layernorm": "post_mlp_norm",
        }
    return {"input_layernorm": "input_norm", "post_attention_layernorm": "pre_mlp_norm"}


def _strip_prefix(tensors: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """Renames a multimodal Gemma 3 checkpoint's text tower to the plain causal-LM names."""
    if "model.embed_tokens.weight" in tensors:
        return tensors
    for prefix in _PREFIXES:
        if prefix + "embed_tokens.weight" in tensors:
            out = {
                "model." + k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)
            }
            for head in ("lm_head.weight", "language_model.lm_head.weight"):
                if head in tensors:
                    out["lm_head.weight"] = tensors[head]
            return out
    return tensors


def check_hf_tensors(config: ModelConfig, tensors: Mapping[str, np.ndarray]) -> None:
    """Raises KeyError naming missing tensors (with shapes) or ValueError for wrong shapes."""
    expected = hf_tensor_shapes(config)
    missing = [n for n in expected if n not in tensors]
    if missing:
        listed = ", ".join(f"{n} {list(expected[n])}" for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise KeyError(
            f"the checkpoint lacks {len(missing)} tensor(s) this {config.family} config needs: "
            f"{listed}{more}. Check that the weights belong to this config.json"
        )
    for name, shape in expected.items():
        got = tuple(np.shape(tensors[name]))
        if got != shape:
            raise ValueError(
                f"tensor {name} has shape {list(got)}, the config implies {list(shape)}: the "
                "weights and config.json do not belong to the same model"
            )


def _fuse_qkv(config: ModelConfig, q, k, v) -> np.ndarray:
    """q [N*H, ...], k and v [K*H, ...] -> [K, G + 2, H, ...] (trailing D for weights)."""
    c = config
    rest = np.shape(q)[1:]
    q = np.asarray(q).reshape(c.num_kv_heads, c.num_groups, c.head_dim, *rest)  # (K, G, H, ...)
    k = np.asarray(k).reshape(c.num_kv_heads, 1, c.head_dim, *rest)  # (K, 1, H, ...)
    v = np.asarray(v).reshape(c.num_kv_heads, 1, c.head_dim, *rest)
    return np.concatenate([q, k, v], axis=1)  # (K, G+2, H, ...)


def _load_layer(
    config: ModelConfig, layer: DecoderLayer, t: Mapping[str, np.ndarray], p: str
) -> None:
    a = p + "self_attn."
    qkv = [t[f"{a}{n}_proj.weight"] for n in "qkv"]
    bias = None
    if config.qkv_bias:
        bias = _fuse_qkv(config, *[t[f"{a}{n}_proj.bias"] for n in "qkv"])
    layer.attn.qkv.load(_fuse_qkv(config, *qkv), bias, what=f"{a}qkv")
    layer.attn.o.load(t[a + "o_proj.weight"], what=a + "o_proj.weight")
    if config.qk_norm:
        layer.attn.q_norm.load(t[a + "q_norm.weight"], what=a + "q_norm.weight")
        layer.attn.k_norm.load(t[a + "k_norm.weight"], what=a + "k_norm.weight")
    for hf_name, ours in _norm_names(config).items():
        getattr(layer, ours).load(t[f"{p}{hf_name}.weight"], what=f"{p}{hf_name}.weight")
    m = p + "mlp."
    gate_up = np.stack([np.asarray(t[m + "gate_proj.weight"]), np.asarray(t[m + "up_proj.weight"])])
    layer.mlp.gate_up.load(gate_up, what=m + "gate_up")  # (2, F, D)
    layer.mlp.down.load(t[m + "down_proj.weight"], what=m + "down_proj.weight")


def params_from_hf(
    config: ModelConfig,
    tensors: Mapping[str, np.ndarray],
    precision: Precision,
    *,
    smoothing: float | Mapping[str, float] | None = smoothing_lib.DEFAULT_ALPHA,
    calibration_tokens: Sequence[Sequence[int]] | None = None,
) -> Params:
    """Builds Params from an HF state dict ({name: array}; extra tensors are ignored).

    Args:
      config: ModelConfig.from_hf_config(config.json).
      tensors: HF-named arrays (fp32, bf16 or fp16); a multimodal Gemma 3 checkpoint's text
        tower is found under its language_model prefix.
      precision: "int8" (quantised here, per output channel), "bf16" or "fp32".
      smoothing: int8 only: SmoothQuant migration strength alpha folded into the weights
        (smoothing.py), or {projection: alpha} to smooth only some of "qkv", "gate_up",
        "down", "o"; None quantises the weights as given. Float precisions ignore it.
      calibration_tokens: token sequences (BOS first) whose fp32 activations set the
        smoothing; default: the built-in calibration text, tokenized with the tokenizer.json
        beside the memory-mapped checkpoint (loader.load_checkpoint); tensors built in memory
        without tokens are not smoothed. Statistics are cached in the user cache.

    Returns:
      Params on the default device.
    """
    check_precision(precision)
    t = _strip_prefix(tensors)
    check_hf_tensors(config, t)
    fold = None
    if precision == "int8" and smoothing is not None:
        fold = smoothing_lib.layer_folding(config, t, smoothing, calibration_tokens)
    model = abstract_model(config, precision)
    model.embed.load(t["model.embed_tokens.weight"], what="model.embed_tokens.weight")
    for i, layer in enumerate(model.layers):
        layer_tensors = t if fold is None else ChainMap(fold(i), t)
        _load_layer(config, layer, layer_tensors, f"model.layers.{i}.")
    model.final_norm.load(t["model.norm.weight"], what="model.norm.weight")
    if model.lm_head is not None:
        model.lm_head.load(t["lm_head.weight"], what="lm_head.weight")
    return to_params(model)
