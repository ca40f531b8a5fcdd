"""Bad inputs raise ValueError naming the argument and the expected shape, before any handler
runs; handlers reached directly through ffi_call refuse bad shapes with an error, not a crash."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops


def i8(*shape):
    return np.zeros(shape, np.int8)


def f32(*shape):
    return np.zeros(shape, np.float32)


CASES = [
    # (call, argument named in the message, expected-shape text in the message)
    (lambda: ops.int8_gemm(f32(4, 8), f32(4), i8(3, 8), f32(3)), "x_q", "int8 [..., K]"),
    (lambda: ops.int8_gemm(i8(4, 8), f32(4), i8(3, 9), f32(3)), "x_q", "K = 9"),
    (lambda: ops.int8_gemm(i8(4, 8), f32(4), i8(3, 8, 1), f32(3)), "w_q", "[N, K]"),
    (lambda: ops.int8_gemm(i8(4, 8), f32(5), i8(3, 8), f32(3)), "s_x", "[4]"),
    (lambda: ops.int8_gemm(i8(4, 8), f32(4), i8(3, 8), f32(2)), "s_w", "[3]"),
    (
        lambda: ops.int8_gemm(i8(4, 8), f32(4), i8(3, 8), f32(3), out_dtype=jnp.int32),
        "out_dtype",
        "float32 or bfloat16",
    ),
    (lambda: ops.int8_gemm(i8(4, 8), f32(4), i8(3, 8), f32(3), rows=5), "rows", "rows <= 4"),
    (lambda: ops.int8_gemm(i8(2, 2, 8), f32(2, 2), i8(3, 8), f32(3), rows=1), "rows", "2-D x_q"),
    (lambda: ops.rmsnorm_quant(i8(2, 8), f32(8), eps=1e-6), "x", "[..., D]"),
    (lambda: ops.rmsnorm_quant(f32(2, 8), f32(7), eps=1e-6), "gamma", "D = 8"),
    (lambda: ops.add_rmsnorm_quant(f32(2, 8), f32(2, 7), f32(8), eps=1e-6), "residual", "[2, 8]"),
    (lambda: ops.rmsnorm(f32(2, 8), f32(8, 1), eps=1e-6), "gamma", "[8]"),
    (lambda: ops.glu_quant(f32(2, 8), f32(2, 9), activation="silu"), "up", "[2, 8]"),
    (lambda: ops.glu_quant(f32(2, 8), f32(2, 8), activation="relu"), "activation", "silu"),
    (lambda: ops.glu_quant_pair(f32(2, 3, 8), activation="silu"), "gate_up", "[..., 2, F]"),
    (lambda: ops.glu_quant2_pair(i8(2, 2, 8), activation="silu"), "gate_up", "float32"),
    (
        lambda: ops.glu_quant2_sum(f32(4, 2, 8), f32(2, 3, 8), activation="silu"),
        "y_w2",
        "[M, 2, F]",
    ),
    (lambda: ops.glu_quant2_sum(f32(2, 2, 8), f32(2, 2, 8), activation="silu"), "y2", "[4, 2, 8]"),
    (
        lambda: ops.glu_quant2_sum(f32(4, 2, 8), f32(2, 2, 8), activation="relu"),
        "activation",
        "silu",
    ),
    (
        lambda: ops.candidate_head(
            f32(2, 8), f32(10, 7), np.zeros((2, 3), np.int32), np.ones(2, np.int32)
        ),
        "embedding",
        "D = 8",
    ),
    (
        lambda: ops.candidate_head(
            f32(2, 8), f32(10, 8), np.zeros((2, 3), np.int64), np.ones(2, np.int32)
        ),
        "ids",
        "int32 [R, C]",
    ),
    (
        lambda: ops.candidate_head(
            f32(2, 8), f32(10, 8), np.zeros((2, 0), np.int32), np.zeros(2, np.int32)
        ),
        "ids",
        "C >= 1",
    ),
    (
        lambda: ops.candidate_head(
            f32(2, 8), f32(10, 8), np.zeros((2, 3), np.int32), np.array([1, 0], np.int32)
        ),
        "counts",
        "empty candidate row",
    ),
    (
        lambda: ops.candidate_head(
            f32(2, 8), f32(10, 8), np.full((2, 3), 10, np.int32), np.ones(2, np.int32)
        ),
        "ids",
        "[0, V = 10)",
    ),
    (lambda: ops.vocab_logsumexp(f32(2, 8), f32(0, 8)), "embedding", "non-empty"),
    (lambda: ops.vocab_logsumexp(f32(8), f32(3, 8)), "hidden", "[R, D]"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_value_error_names_argument(case):
    call, argument, expected = CASES[case]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert re.search(rf"\b{argument}\b", message), f"{argument!r} not named in: {message}"
    assert expected in message, f"{expected!r} not in: {message}"


def test_handler_rejects_bad_shapes_directly():
    ops.register()
    outs = (jax.ShapeDtypeStruct((4, 3), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.uint8))
    call = jax.ffi.ffi_call("prism_int8_gemm", outs)
    with pytest.raises(Exception, match="w_q must be \\[N, K\\]"):
        jax.block_until_ready(call(i8(4, 8), f32(4), i8(3, 9), f32(3)))
    with pytest.raises(Exception, match="M at most x_q's 2 rows"):  # y [4, 3]: more rows than x
        jax.block_until_ready(call(i8(2, 8), f32(2), i8(3, 8), f32(3)))
    with pytest.raises(Exception, match="one scale per row of x_q"):
        jax.block_until_ready(call(i8(4, 8), f32(5), i8(3, 8), f32(3)))
    codes, scales = jax.ShapeDtypeStruct((4, 8), jnp.int8), jax.ShapeDtypeStruct((4,), jnp.float32)
    call = jax.ffi.ffi_call("prism_glu_quant2_sum", (codes, scales))
    with pytest.raises(Exception, match="y2 must be \\[2M, 2F\\]"):
        jax.block_until_ready(call(f32(2, 16), f32(2, 16), activation=np.int32(1)))
    call = jax.ffi.ffi_call("prism_quantize_rows", (codes, scales))  # [2M, D] for one digit
    with pytest.raises(Exception, match="q must be \\[digits \\* M, D\\]"):
        jax.block_until_ready(call(f32(2, 8), digits=np.int32(1)))


def test_impl_scope_does_not_nest():
    with ops.use_impl("reference"):
        assert ops.current_impl() == "reference"
        with pytest.raises(AssertionError, match="do not nest"):
            with ops.use_impl("ffi"):
                pass
    assert ops.current_impl() == "ffi"
    with pytest.raises(ValueError, match="impl must be one of"):
        ops.int8_gemm(i8(1, 1), f32(1), i8(1, 1), f32(1), impl="cuda")


def test_env_switch_defaults_and_rejects_typos(monkeypatch):
    """The model's on/off knobs: unset and empty give the default, a typo is an error."""
    from prism_jax.ops.dispatch import env_switch

    monkeypatch.delenv("PRISM_TEST_SWITCH", raising=False)
    assert env_switch("PRISM_TEST_SWITCH", True) and not env_switch("PRISM_TEST_SWITCH", False)
    monkeypatch.setenv("PRISM_TEST_SWITCH", "")
    assert env_switch("PRISM_TEST_SWITCH", True)
    monkeypatch.setenv("PRISM_TEST_SWITCH", "off")
    assert not env_switch("PRISM_TEST_SWITCH", True)
    monkeypatch.setenv("PRISM_TEST_SWITCH", "1")
    with pytest.raises(ValueError, match="PRISM_TEST_SWITCH must be unset, on or off"):
        env_switch("PRISM_TEST_SWITCH", False)
