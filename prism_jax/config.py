"""Model and engine configuration: frozen dataclasses, validated once, with named presets.

Shape letters used across the model: D model dim, F ffw dim, N query heads, K kv heads,
H head dim, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, get_args

Family = Literal["gemma3", "llama", "qwen2", "qwen3"]
FAMILIES: tuple[str, ...] = ("gemma3", "llama", "qwen2", "qwen3")
LayerType = Literal["global", "sliding"]
# "-attn": the int8 model with its attention in INT8 digits too (attention_numerics="digits").
Precision = Literal["int8", "int8-1digit", "int8-attn", "int8-1digit-attn", "bf16", "fp32"]
# What a user asks for: "int8" is INT8 as ModelConfig says (two digits by default),
# "int8-1digit" the faster single-digit INT8 (one INT8 digit per row and per weight).
PRECISIONS: tuple[str, ...] = get_args(Precision)
INT8_PROJECTIONS: tuple[str, ...] = ("qkv", "o", "gate_up", "down")
AttentionNumerics = Literal["canonical", "digits"]
ATTENTION_NUMERICS: tuple[str, ...] = ("canonical", "digits")
# ModelConfig.replace(**INT8_TWO_DIGITS) / (**INT8_ONE_DIGIT): docs/ACCURACY.md "INT8 quantisation".
INT8_TWO_DIGITS = dict(
    int8_two_digit_rows=INT8_PROJECTIONS, int8_two_digit_weights=INT8_PROJECTIONS
)
INT8_ONE_DIGIT = dict(int8_two_digit_rows=(), int8_two_digit_weights=())


@dataclasses.dataclass(frozen=True)
class Llama3Rope:
    """Llama 3.1+ frequency-dependent rope scaling (HF rope_type "llama3")."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    family: Family
    vocab_size: int  # V
    hidden_size: int  # D
    intermediate_size: int  # F
    num_layers: int  # L
    num_heads: int  # N
    num_kv_heads: int  # K
    head_dim: int  # H
    rms_norm_eps: float
    rope_theta: float  # global layers
    activation: Literal["gelu_tanh", "silu"]
    tie_word_embeddings: bool = True
    rope_local_theta: float | None = None  # sliding layers (Gemma 3)
    rope_scaling_factor: float = 1.0  # linear position scaling on global layers (Gemma 3 4B+)
    rope_llama3: Llama3Rope | None = None  # Llama 3.1+ scaling (all layers are global there)
    sliding_window: int | None = None
    layer_types: tuple[LayerType, ...] = ()
    norm_weight_offset: float = 0.0  # 1.0: Gemma's (1 + gamma)
    embed_scale: float = 1.0  # Gemma multiplies embeddings by sqrt(D)
    qk_norm: bool = False  # Gemma 3, Qwen3
    qkv_bias: bool = False  # Qwen2
    sandwich_norms: bool = False  # Gemma: post-attention and post-ffw norms
    query_pre_attn_scalar: float | None = None  # attention scale 1/sqrt(this); default H
    final_logit_softcap: float = 0.0  # 0 = none
    max_position_embeddings: int = 32768
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # INT8 numerics, not the checkpoint (layers.py; docs/ACCURACY.md "INT8 quantisation"):
    # the projections whose INT8 input rows carry a second INT8 digit (the row's rounding
    # remainder at its own per-token scale), and those whose INT8 weights carry one (the
    # remainder at its own per-output-channel scale). The default, two digits everywhere
    # (INT8_TWO_DIGITS), is what makes INT8 decide like FP32 at least as faithfully as BF16
    # (single-digit INT8 flips 3-5x more decisions than BF16 does: docs/ACCURACY.md); it costs
    # 3x the INT8 multiply-adds and twice the weight memory. () and () (INT8_ONE_DIGIT, the
    # precision "int8-1digit") is the single-digit model, for throughput over fidelity.
    int8_two_digit_rows: tuple[str, ...] = INT8_PROJECTIONS
    int8_two_digit_weights: tuple[str, ...] = INT8_PROJECTIONS
    # The paged attention's arithmetic (ops.tree_attention vs ops.tree_attention_digits):
    # "canonical" fp32 dots in numerics.h's order on CUDA cores; "digits" q, k, v and the
    # softmax weights as two INT8 digits per row, dots on INT8 tensor cores, CPU and CUDA
    # bit-identical (cc/ops/attention_digits.h). Both are batch- and paging-invariant.
    attention_numerics: AttentionNumerics = "canonical"

    def __post_init__(self) -> None:
        assert self.attention_numerics in ATTENTION_NUMERICS, (
            f"attention_numerics must be one of {ATTENTION_NUMERICS}, "
            f"got {self.attention_numerics!r}"
        )
        for name in ("int8_two_digit_rows", "int8_two_digit_weights"):
            unknown = set(getattr(self, name)) - set(INT8_PROJECTIONS)
            assert not unknown, f"{name}: unknown {sorted(unknown)}, expected {INT8_PROJECTIONS}"
        assert self.num_heads % self.num_kv_heads == 0, (
            f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
        )
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("global",) * self.num_layers)
        assert len(self.layer_types) == self.num_layers, (
            f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers"
        )
        if "sliding" in self.layer_types:
            assert self.sliding_window, "sliding layers need a sliding_window"
        for name in ("vocab_size", "hidden_size", "intermediate_size", "head_dim"):
            assert getattr(self, name) > 0, f"{name} must be positive"
        assert self.family in FAMILIES, f"family must be one of {FAMILIES}, got {self.family!r}"
        assert self.head_dim % 2 == 0, f"rotary needs an even head_dim, got {self.head_dim}"
        assert self.rope_llama3 is None or self.rope_scaling_factor == 1.0, (
            "rope_llama3 and linear rope_scaling_factor are exclusive"
        )

    def for_precision(self, precision: str) -> tuple[ModelConfig, str]:
        """A user-facing precision (PRECISIONS) -> (this config with its INT8 digits, the
        model's precision "int8" / "bf16" / "fp32")."""
        assert precision in PRECISIONS, f"precision must be one of {PRECISIONS}, got {precision!r}"
        config = self
        if precision.endswith("-attn"):
            config, precision = config.replace(attention_numerics="digits"), precision[:-5]
        if precision == "int8-1digit":
            return config.replace(**INT8_ONE_DIGIT), "int8"
        return config, precision

    def precision_name(self, model_precision: str) -> str:
        """The inverse of for_precision: "int8-1digit" for a model without any second digit,
        "-attn" appended when the int8 model attends in digits."""
        if model_precision != "int8":
            return model_precision
        one = not self.int8_two_digit_rows and not self.int8_two_digit_weights
        name = "int8-1digit" if one else "int8"
        return name + "-attn" if self.attention_numerics == "digits" else name

    @classmethod
    def from_hf_config(cls, d: dict[str, Any]) -> ModelConfig:
        """Builds the config from an HF config.json dict (one code path per family).

        Missing optional keys take HF's defaults for that model type, as transformers does;
        missing shape-defining keys raise a KeyError that names them.
        """
        from prism_jax.hf_config import model_config_from_hf  # it builds ModelConfigs

        return model_config_from_hf(d)

    @property
    def num_groups(self) -> int:
        """G: query heads per kv head."""
        return self.num_heads // self.num_kv_heads

    @property
    def attention_scale(self) -> float:
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    def rope_theta_for(self, layer: int) -> float:
        if self.layer_types[layer] == "sliding" and self.rope_local_theta is not None:
            return self.rope_local_theta
        return self.rope_theta

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes`; layer_types is re-derived when num_layers changes alone."""
        if "num_layers" in changes and "layer_types" not in changes and self.family == "gemma3":
            changes["layer_types"] = gemma3_layer_types(changes["num_layers"])
        elif "num_layers" in changes and "layer_types" not in changes:
            changes["layer_types"] = ()
        return dataclasses.replace(self, **changes)


def gemma3_layer_types(num_layers: int, pattern: int = 6) -> tuple[LayerType, ...]:
    """Gemma 3: five sliding-window layers then one global layer, repeated."""
    return tuple("global" if (i + 1) % pattern == 0 else "sliding" for i in range(num_layers))


def _gemma3(**kw: Any) -> ModelConfig:
    layers = kw["num_layers"]
    base = dict(
        family="gemma3",
        activation="gelu_tanh",
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        rope_local_theta=10_000.0,
        layer_types=gemma3_layer_types(layers),
        norm_weight_offset=1.0,
        embed_scale=math.sqrt(kw["hidden_size"]),
        qk_norm=True,
        sandwich_norms=True,
        bos_token_id=2,
        eos_token_ids=(1, 106),
    )
    base.update(kw)
    return ModelConfig(**base)


# Values from the published HF config.json files of each model (tests/model/test_config.py
# rebuilds each preset from those values through from_hf_config). Kept as compact tables.
# fmt: off
GEMMA3_270M = _gemma3(
    vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
    num_kv_heads=1, head_dim=256, sliding_window=512, query_pre_attn_scalar=256,
)
GEMMA3_1B = _gemma3(
    vocab_size=262_144, hidden_size=1152, intermediate_size=6912, num_layers=26, num_heads=4,
    num_kv_heads=1, head_dim=256, sliding_window=512, query_pre_attn_scalar=256,
)
GEMMA3_4B = _gemma3(
    vocab_size=262_208, hidden_size=2560, intermediate_size=10240, num_layers=34, num_heads=8,
    num_kv_heads=4, head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
    rope_scaling_factor=8.0, max_position_embeddings=131_072,
)
GEMMA3_12B = _gemma3(
    vocab_size=262_208, hidden_size=3840, intermediate_size=15360, num_layers=48, num_heads=16,
    num_kv_heads=8, head_dim=256, sliding_window=1024, query_pre_attn_scalar=256,
    rope_scaling_factor=8.0, max_position_embeddings=131_072,
)
GEMMA3_27B = _gemma3(
    vocab_size=262_208, hidden_size=5376, intermediate_size=21504, num_layers=62, num_heads=32,
    num_kv_heads=16, head_dim=128, sliding_window=1024, query_pre_attn_scalar=168,
    rope_scaling_factor=8.0, max_position_embeddings=131_072,
)
SMOLLM2_135M = ModelConfig(
    family="llama", vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_layers=30,
    num_heads=9, num_kv_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100_000.0,
    activation="silu", max_position_embeddings=8192, bos_token_id=1, eos_token_ids=(2,),
)
LLAMA3_2_1B = ModelConfig(
    family="llama", vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_layers=16,
    num_heads=32, num_kv_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500_000.0,
    activation="silu", max_position_embeddings=131_072, bos_token_id=128_000,
    eos_token_ids=(128_001,), rope_llama3=Llama3Rope(32.0, 1.0, 4.0, 8192),
)
QWEN2_5_0_5B = ModelConfig(
    family="qwen2", vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_layers=24,
    num_heads=14, num_kv_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    activation="silu", qkv_bias=True, bos_token_id=151_643, eos_token_ids=(151_645, 151_643),
)
QWEN3_0_6B = ModelConfig(
    family="qwen3", vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_layers=28,
    num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    activation="silu", qk_norm=True, max_position_embeddings=40_960, bos_token_id=151_643,
    eos_token_ids=(151_645,),
)

PRESETS: dict[str, ModelConfig] = {
    "gemma3-270m": GEMMA3_270M,
    "gemma3-1b": GEMMA3_1B,
    "gemma3-4b": GEMMA3_4B,
    "gemma3-12b": GEMMA3_12B,
    "gemma3-27b": GEMMA3_27B,
    "smollm2-135m": SMOLLM2_135M,
    "llama3.2-1b": LLAMA3_2_1B,
    "qwen2.5-0.5b": QWEN2_5_0_5B,
    "qwen3-0.6b": QWEN3_0_6B,
}
# fmt: on


def _increasing(values: tuple[int, ...], what: str) -> None:
    assert values and all(v > 0 for v in values), f"{what} must be positive, got {values}"
    assert list(values) == sorted(set(values)), f"{what} must be increasing, got {values}"


# EngineConfig.command_buffers -> the XLA compiler options of every step executable.
COMMAND_BUFFERS = {"xla": {}, "off": {"xla_gpu_enable_command_buffer": ""}}
READOUT_MEMORIES = ("pinned_host", "device")  # EngineConfig.readout_memory


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """How the engine lays out work: KV pages, prefix cache, and the static step shapes.

    Every step is padded to one of the buckets and every bucket is compiled at start-up, so
    fewer buckets start faster and more buckets waste less padding."""

    page_size: int = 16  # tokens per KV page
    kv_pages: int = 1024  # pool size in pages, page 0 (the dummy page) included
    prefix_cache_pages: int | None = None  # cap on cached pages; None = the whole pool
    token_buckets: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048)  # tokens per step
    row_buckets: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)  # readout rows per step
    candidate_buckets: tuple[int, ...] = (2, 4, 8, 16, 64, 256)  # candidates per row
    chain_depth: int = 4  # segments per chain (root, trunk, branch, leaf)
    # Whether XLA may capture a step's kernels in CUDA graphs (its command buffers): "xla"
    # keeps XLA's default, "off" launches kernel by kernel. No effect on the CPU.
    command_buffers: str = "xla"
    # Decoder layers per executable of a forward step (forward_parts.py): XLA spends ~55 us of
    # host time per 27B layer before the first kernel of an executable runs, so one call for
    # all layers idles the GPU for ~4 ms; parts that start at forward_first_layers and double
    # up to this many let the GPU start after the first part while the host launches the rest.
    # None: 32 on GPUs, every layer in one call elsewhere (a CPU step's launch cost is small
    # next to its compute).
    forward_layers_per_call: int | None = None
    forward_first_layers: int = 1  # the first part's layers: the host work the GPU waits for
    # The last decoder layer carries only the step's readout rows past its attention (it still
    # writes every token's k/v): the same bits as the whole layer's rows, without the other
    # tokens' attention, MLP and norms there (llama.cpp's "output ids"). It runs as a one-layer
    # executable per (token bucket, row bucket). False: the whole layer for every token.
    readout_only_last_layer: bool = True
    # Where the readout executables put their results: "pinned_host" has XLA copy them to host
    # memory inside the executable, in stream order behind the readout, so reading them waits
    # for the step and nothing else; "device" leaves them on the device and the read copies
    # them back after the step (a host round trip between the step's end and the copy).
    readout_memory: str = "pinned_host"

    def __post_init__(self) -> None:
        assert self.command_buffers in COMMAND_BUFFERS, (
            f"command_buffers must be one of {sorted(COMMAND_BUFFERS)}, "
            f"got {self.command_buffers!r}"
        )
        per_call = self.forward_layers_per_call
        assert per_call is None or per_call >= 1, (
            f"forward_layers_per_call must be None (automatic) or >= 1, got {per_call}"
        )
        assert self.readout_memory in READOUT_MEMORIES, (
            f"readout_memory must be one of {READOUT_MEMORIES}, got {self.readout_memory!r}"
        )
        first = self.forward_first_layers
        assert first >= 1, f"forward_first_layers must be >= 1, got {first}"
        assert self.page_size > 0, f"page_size must be > 0, got {self.page_size}"
        assert self.kv_pages >= 2, (
            f"kv_pages must be >= 2 (page 0 is the dummy page), got {self.kv_pages}"
        )
        cap = self.prefix_cache_pages
        assert cap is None or 0 <= cap < self.kv_pages, (
            f"prefix_cache_pages must be in [0, kv_pages = {self.kv_pages}), got {cap}"
        )
        _increasing(self.token_buckets, "token_buckets")
        _increasing(self.row_buckets, "row_buckets")
        _increasing(self.candidate_buckets, "candidate_buckets")
        assert self.candidate_buckets[-1] >= 256, "candidate_buckets must reach 256 (255 options)"
        assert self.chain_depth >= 4, f"chain_depth must be >= 4, got {self.chain_depth}"

    @property
    def max_step_tokens(self) -> int:
        return self.token_buckets[-1]
