"""GGUF -> HF: the config.json dict and the state-dict tensors a GGUF file stands for.

llama.cpp's convert_hf_to_gguf.py changes some tensors on the way in; we undo exactly that:
  - llama arch: q_proj / k_proj rows (weights and biases) are permuted per head from HF's
    rotate-half rope layout to the interleaved-pairs layout (`LlamaModel.permute`). Qwen2, Qwen3
    and Gemma 3 use NeoX-style rope in llama.cpp and are stored unpermuted.
  - gemma3 arch: every tensor whose HF name ends in "norm.weight" is stored as 1 + gamma
    (`Gemma3Model.norm_shift`), including q_norm / k_norm and the final norm.
Quantised tensors are dequantised with gguf.quants.dequantize to float32, which holds every
dequantised value exactly.

The header is parsed here rather than with gguf.GGUFReader: the reader builds one Python object
per array element, which takes ~18 s for Gemma's 262K-token vocabulary; this parser takes < 1 s.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
_GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete or malformed; the message says what was expected."""


class GGUFFormatError(CheckpointError):
    """The file is not a GGUF file we can read, or holds a model we cannot map to HF."""


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order (GGUF stores dims innermost first)
    qtype: GGMLQuantizationType
    offset: int  # absolute byte offset in the file


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # strings, ints, floats, bools; arrays as lists or numpy arrays
    tensors: dict[str, GGUFTensor]
    _buf: Any = dataclasses.field(repr=False, compare=False)

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def dequantize(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy order, exactly as the file's quantisation encodes it."""
        t = self.tensors[name]
        block, type_size = GGML_QUANT_SIZES[t.qtype]
        n = math.prod(t.shape)
        raw = np.frombuffer(self._buf, np.uint8, n // block * type_size, t.offset)
        row_bytes = t.shape[-1] // block * type_size
        out = dequantize(raw.reshape(*t.shape[:-1], row_bytes), t.qtype)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(t.shape)


class _Cursor:
    """Sequential little-endian reads over the memory-mapped file."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = self.buf[self.pos : self.pos + n]
        if len(raw) != n:
            raise struct.error("string runs past the end of the file")
        self.pos += n
        return raw.decode("utf-8")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            itype, count = self.scalar("<I"), self.scalar("<Q")
            if itype in _SCALARS:  # numeric arrays in one numpy read
                dtype = np.dtype(_SCALARS[itype])
                arr = np.frombuffer(self.buf, dtype, count, self.pos).copy()
                self.pos += dtype.itemsize * count
                return arr
            return [self.value(itype) for _ in range(count)]
        if vtype in _SCALARS:
            value = np.frombuffer(self.buf, _SCALARS[vtype], 1, self.pos)[0].item()
            self.pos += np.dtype(_SCALARS[vtype]).itemsize
            return value
        raise GGUFFormatError(f"unknown GGUF value type {vtype}")


def read_gguf(path: str | Path) -> GGUFFile:
    """Parses a GGUF file's header; tensor data stays memory-mapped until dequantize()."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:  # empty file
            raise GGUFFormatError(f"{path} is empty: expected a GGUF model file") from e
    try:
        return _parse(path, buf)
    except (struct.error, UnicodeDecodeError, ValueError, KeyError) as e:
        if isinstance(e, GGUFFormatError):
            raise
        raise GGUFFormatError(
            f"{path} is not a readable GGUF file ({type(e).__name__}: {e}); it may be truncated: "
            "re-download or re-assemble it"
        ) from e


def _parse(path: Path, buf: mmap.mmap) -> GGUFFile:
    if buf[:4] != _GGUF_MAGIC:
        raise GGUFFormatError(f"{path} does not start with the GGUF magic bytes: not a GGUF file")
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.scalar("<I")
    if version not in (2, 3):
        raise GGUFFormatError(
            f"{path} is GGUF version {version}; only versions 2 and 3 (little-endian) are read"
        )
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
        infos.append(
            (name, tuple(reversed(dims)), GGMLQuantizationType(cur.scalar("<I")), cur.scalar("<Q"))
        )
    align = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
    data_start = -(-cur.pos // align) * align
    tensors = {}
    for name, shape, qtype, offset in infos:
        block, type_size = GGML_QUANT_SIZES[qtype]
        end = data_start + offset + math.prod(shape) // block * type_size
        if end > len(buf):
            raise GGUFFormatError(
                f"{path}: tensor {name} ends at byte {end} but the file has {len(buf)} bytes; "
                "the file is truncated: re-download or re-assemble it"
            )
        tensors[name] = GGUFTensor(name, shape, qtype, data_start + offset)
    return GGUFFile(path, metadata, tensors, buf)


# --- config ------------------------------------------------------------------------------------

_HF_ARCH = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
}
# Tokens llama.cpp also treats as end of generation when the vocabulary marks them as control.
_EOG_TEXTS = ("<end_of_turn>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>")
_CONTROL = 3  # tokenizer.ggml.token_type value for control tokens
_REQUIRED = object()


def _f32(x: float) -> float:
    """GGUF stores floats as float32: 1e-6 reads back as 9.99999997e-07; give HF's value."""
    return float(str(np.float32(x)))


def hf_config_from_gguf(g: GGUFFile) -> dict[str, Any]:
    """The config.json an HF checkpoint of this model would have."""
    arch, md = g.arch, g.metadata
    if arch not in SUPPORTED_ARCHS:
        raise GGUFFormatError(
            f"{g.path}: architecture {arch!r} is not supported; supported: {SUPPORTED_ARCHS}"
        )

    def key(name: str, default: Any = _REQUIRED) -> Any:
        value = md.get(f"{arch}.{name}")
        if value is not None:
            return value
        if default is _REQUIRED:
            raise GGUFFormatError(f"{g.path} has no {arch}.{name} in its metadata")
        return default

    heads, kv_heads = int(key("attention.head_count")), key("attention.head_count_kv", None)
    if isinstance(kv_heads, np.ndarray | list):
        raise GGUFFormatError(f"{g.path}: per-layer kv head counts are not supported")
    hidden = int(key("embedding_length"))
    hf_arch, model_type = _HF_ARCH[arch]
    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(g.tensors["token_embd.weight"].shape[0]),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv_heads if kv_heads is not None else heads),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": _f32(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(key("rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(key("context_length")),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "rope_scaling": _rope_scaling(md, arch),
        "torch_dtype": "float32",
    }
    cfg.update(_special_token_ids(md))
    if arch == "gemma3":
        cfg.update(_gemma3_config(g, key, cfg))
    else:
        cfg["hidden_act"] = "silu"
        if arch == "qwen2":
            cfg["use_sliding_window"] = False
    return cfg


def _rope_scaling(md: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = md.get(f"{arch}.rope.scaling.type")
    factor = md.get(f"{arch}.rope.scaling.factor")
    if kind in (None, "none") or not factor or factor == 1.0:
        return None
    spec: dict[str, Any] = {"rope_type": kind, "factor": _f32(factor)}
    if (orig := md.get(f"{arch}.rope.scaling.original_context_length")) is not None:
        spec["original_max_position_embeddings"] = int(orig)
    return spec


def _special_token_ids(md: dict[str, Any]) -> dict[str, Any]:
    tokens, types = md.get("tokenizer.ggml.tokens"), md.get("tokenizer.ggml.token_type")
    out: dict[str, Any] = {}
    if (bos := md.get("tokenizer.ggml.bos_token_id")) is not None:
        out["bos_token_id"] = int(bos)
    if (pad := md.get("tokenizer.ggml.padding_token_id")) is not None:
        out["pad_token_id"] = int(pad)
    eos = [
        int(md[k])
        for k in (
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        )
        if md.get(k) is not None
    ]
    if tokens is not None and types is not None:
        index = {t: i for i, t in enumerate(tokens) if t in _EOG_TEXTS}
        eos += [i for t, i in sorted(index.items()) if types[i] == _CONTROL]
    if eos:
        out["eos_token_id"] = list(dict.fromkeys(eos))
    return out


def _gemma3_config(g: GGUFFile, key: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    n_layers = cfg["num_hidden_layers"]
    pattern = g.metadata.get("gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, np.ndarray | list):  # per-layer flags: True = sliding
        types = ["sliding_attention" if s else "full_attention" for s in pattern]
        pattern = 6
    else:  # llama.cpp's default: five sliding layers, then one global
        pattern = int(pattern)
        types = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n_layers)
        ]
    # llama.cpp scales Gemma 3 27B's queries by 1/sqrt(D/N) and every other size by
    # 1/sqrt(H), matching HF's query_pre_attn_scalar (168 vs 256); the GGUF does not store it.
    scalar = cfg["hidden_size"] // cfg["num_attention_heads"] if n_layers == 62 else cfg["head_dim"]
    softcap = g.metadata.get("gemma3.final_logit_softcapping")
    return {
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": scalar,
        "sliding_window": int(key("attention.sliding_window")),
        "sliding_window_pattern": pattern,
        "layer_types": types,
        # llama.cpp hard-codes 10000 for Gemma 3's sliding layers unless the file says otherwise.
        "rope_local_base_freq": _f32(g.metadata.get("gemma3.rope.freq_base_swa", 10_000.0)),
        "final_logit_softcapping": _f32(softcap) if softcap else None,
        "attn_logit_softcapping": None,
    }


# --- tensors -----------------------------------------------------------------------------------

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}


def hf_name(gguf_name: str, arch: str) -> str:
    """llama.cpp tensor name -> HF state-dict name."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] in ("weight", "bias"):
        _, layer, base, kind = parts
        # ffn_norm is the norm before the MLP: Llama calls it post_attention_layernorm, while in
        # Gemma that name is the attention output's post-norm and ffn_norm is pre_feedforward.
        if base == "ffn_norm":
            mapped = "pre_feedforward_layernorm" if arch == "gemma3" else "post_attention_layernorm"
        else:
            mapped = _LAYER_NAMES.get(base)
        if mapped is not None:
            return f"model.layers.{layer}.{mapped}.{kind}"
    raise GGUFFormatError(
        f"GGUF tensor {gguf_name!r} has no HF counterpart that prism_jax knows for arch {arch!r} "
        "(e.g. llama-3 rope_freqs or a multimodal tensor); use the HF safetensors checkpoint"
    )


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of convert_hf_to_gguf's LlamaModel.permute on q/k rows (weights or biases).

    llama.cpp reorders each head's rows from [first half | second half] to interleaved pairs:
    reshape(n_head, 2, H/2, ...).swapaxes(1, 2). The inverse swaps the same axes back.
    """
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_tensors_from_gguf(g: GGUFFile, cfg: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, float32 array) for every tensor, with llama.cpp's conversions undone."""
    arch = g.arch
    for gname in g.tensors:
        name = hf_name(gname, arch)
        w = g.dequantize(gname)
        if arch == "llama" and ".self_attn.q_proj." in name:
            w = unpermute_rope_rows(w, cfg["num_attention_heads"])
        elif arch == "llama" and ".self_attn.k_proj." in name:
            w = unpermute_rope_rows(w, cfg["num_key_value_heads"])
        if arch == "gemma3" and name.endswith("norm.weight"):
            w = w - np.float32(1.0)
        yield name, np.ascontiguousarray(w)
