"""Two-digit INT8 (config.int8_two_digit_rows / _weights): the named projections really carry
the second digit, it brings int8 to within fp32 rounding of the planted-outlier models that
single-digit int8 (smoothed or not) gets visibly wrong, and the step stays batch-invariant."""

from __future__ import annotations

import numpy as np
import pytest

from prism_jax.config import INT8_PROJECTIONS, INT8_TWO_DIGITS, PRECISIONS, ModelConfig
from prism_jax.model import init_random, params_from_hf
from prism_jax.model.transformer import bind
from tests.model.helpers import causal, mean_kl, run
from tests.model.test_smoothing import case, logits
from tests.model.tiny import TINY_HF_CONFIGS

ONE_DIGIT = dict(int8_two_digit_rows=(), int8_two_digit_weights=())


def linears(model):
    for i, layer in enumerate(model.layers):
        yield f"{i}.qkv", "qkv", layer.attn.qkv
        yield f"{i}.o", "o", layer.attn.o
        yield f"{i}.gate_up", "gate_up", layer.mlp.gate_up
        yield f"{i}.down", "down", layer.mlp.down


def test_default_is_two_digits_and_names_are_checked():
    """Two digits are the default (config.py says why), "int8-1digit" turns them off."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    assert config.int8_two_digit_rows == config.int8_two_digit_weights == INT8_PROJECTIONS
    assert config == config.replace(**INT8_TWO_DIGITS)
    one, precision = config.for_precision("int8-1digit")
    assert (one.int8_two_digit_rows, one.int8_two_digit_weights, precision) == ((), (), "int8")
    assert one.precision_name("int8") == "int8-1digit"
    assert config.for_precision("int8") == (config, "int8")
    assert config.precision_name("int8") == "int8"
    with pytest.raises(AssertionError, match="precision must be one of"):
        config.for_precision("int4")
    with pytest.raises(AssertionError, match="unknown.*'mlp'"):
        config.replace(int8_two_digit_weights=("mlp",))


@pytest.mark.parametrize("name", PRECISIONS)
def test_precision_names_round_trip(name):
    """Every user-facing precision maps to a model precision and back; "-attn" turns the
    attention's INT8 digits on (ops.tree_attention_digits) and nothing else."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    assert config.attention_numerics == "canonical"
    mapped, model_precision = config.for_precision(name)
    assert mapped.precision_name(model_precision) == name
    assert (mapped.attention_numerics == "digits") == name.endswith("-attn")
    base, _ = config.for_precision(name.removesuffix("-attn"))
    assert mapped.replace(attention_numerics="canonical") == base


@pytest.mark.parametrize("named", [(), ("down",), ("qkv", "o")])
def test_only_named_projections_get_weight_remainders(named):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen2"]).replace(
        int8_two_digit_weights=named
    )
    model = bind(init_random(config, "int8", seed=0), config)
    for where, kind, linear in linears(model):
        assert (linear.w_q2 is not None) == (kind in named), where
        if linear.w_q2 is not None:
            w1 = np.asarray(linear.w_q[...], np.float32) * np.asarray(linear.s_w[...])[..., None]
            w2 = np.asarray(linear.w_q2[...], np.float32) * np.asarray(linear.s_w2[...])[..., None]
            # The remainder is at most half a step of the first digit: s_w2 <= s_w / 254.
            assert np.all(np.asarray(linear.s_w2[...]) <= np.asarray(linear.s_w[...]) / 254 * 1.001)
            assert np.abs(w2).max() > 0 and np.abs(w1).max() > 100 * np.abs(w2).max()
    fp32 = bind(init_random(config, "fp32", seed=0), config)
    assert all(lin.w_q2 is None for _, _, lin in linears(fp32)), "float models have no digits"


@pytest.mark.parametrize("family", list(TINY_HF_CONFIGS))
def test_two_digits_fix_planted_outliers(family, rng):
    """The planted-outlier models of test_smoothing: single-digit int8 is far from fp32 even
    smoothed; two digits (rows and weights) are close to the bf16 embedding's own rounding."""
    config, tensors, tokens = case(family, rng, outliers=True)
    one = config.replace(**ONE_DIGIT)
    ref = logits(config, tensors, "fp32", tokens)
    kl_one = mean_kl(ref, logits(one, tensors, "int8", tokens, smoothing=0.65))
    kl_rows = mean_kl(
        ref,
        logits(
            one.replace(int8_two_digit_rows=INT8_PROJECTIONS),
            tensors,
            "int8",
            tokens,
            smoothing=0.65,
        ),
    )
    two = config.replace(**INT8_TWO_DIGITS)
    kl_two = mean_kl(ref, logits(two, tensors, "int8", tokens, smoothing=0.65))
    print(
        f"{family}: int8 KL one digit {kl_one:.1e}, two-digit rows {kl_rows:.1e}, both {kl_two:.1e}"
    )
    assert kl_rows < kl_one, "a second digit on the rows should help"
    assert kl_two < kl_one / 10, f"{family}: two digits {kl_two:.2e} vs one {kl_one:.2e}"


def test_two_digit_step_is_batch_invariant(rng):
    """A sequence's hidden states are bitwise the same alone and behind another sequence (the
    XLA-side remainders are elementwise; the GEMM sees twice the rows)."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"]).replace(**INT8_TWO_DIGITS)
    params = init_random(config, "int8", seed=1)
    a = rng.integers(0, config.vocab_size, 12).tolist()
    b = rng.integers(0, config.vocab_size, 9).tolist()
    alone = run(params, config, a)
    both = np.asarray(a + b)
    mask = np.zeros((21, 21), bool)
    mask[:12, :12] = np.asarray(causal(12))
    mask[12:, 12:] = np.asarray(causal(9))
    positions = np.concatenate([np.arange(12), np.arange(9)])
    packed = run(params, config, both, positions, mask)
    assert np.array_equal(alone.view(np.uint32), packed[:12].view(np.uint32))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["default", "smollm2-135m"])
def test_real_model_int8_is_closer_to_fp32_than_bf16(name):
    """The issue's target in miniature: on real text, two-digit int8 is at least as close to
    fp32 as bf16 is (measured: default 2.3e-5 vs bf16 ~4e-4; one digit ~1e-2)."""
    from prism_jax.model.gguf_convert import CheckpointError  # noqa: PLC0415
    from prism_jax.model.loader import load_checkpoint  # noqa: PLC0415
    from prism_jax.tokenizer import Tokenizer  # noqa: PLC0415
    from tests.model.test_smoothing import REAL_TEXT, _full_logits  # noqa: PLC0415

    try:
        ck = load_checkpoint(name)
    except (FileNotFoundError, CheckpointError) as e:
        pytest.skip(f"{name} not available: {e}")
    config = ModelConfig.from_hf_config(ck.hf_config).replace(**INT8_TWO_DIGITS)
    tokens = Tokenizer.from_dir(ck.directory).encode(REAL_TEXT, add_bos=True)

    def logits_of(precision, cfg=config):
        params = params_from_hf(cfg, ck.tensors, precision)
        return np.asarray(_full_logits(params, cfg, run(params, cfg, tokens)))

    ref = logits_of("fp32")
    kl = {p: mean_kl(ref, logits_of(p)) for p in ("bf16", "int8")}
    kl["one digit"] = mean_kl(ref, logits_of("int8", config.replace(**ONE_DIGIT)))
    print(f"{name}: KL to fp32 {kl}")
    assert kl["int8"] < kl["bf16"] and kl["int8"] < kl["one digit"] / 10
