"""Shape and dtype checks shared by the op wrappers: errors name the argument and the shape
that was expected, so a caller never reaches a handler with inputs it cannot serve."""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

FLOAT_ACTIVATIONS = (jnp.float32, jnp.bfloat16)


def _dtype_names(dtypes: Sequence) -> str:
    return " or ".join(np.dtype(d).name for d in dtypes)


def describe(x) -> str:
    return f"{np.dtype(x.dtype).name} {list(x.shape)}"


def require(op: str, name: str, x, *, rank: int, dtypes: Sequence, expected: str) -> None:
    """Checks rank and dtype of argument `name`; `expected` reads like 'int8 [M, K]'."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{op}: {name} must be an array {expected}, got {type(x).__name__}")
    if x.ndim != rank or np.dtype(x.dtype) not in [np.dtype(d) for d in dtypes]:
        raise ValueError(
            f"{op}: {name} must be {expected} ({_dtype_names(dtypes)}), got {describe(x)}"
        )


def require_dim(op: str, name: str, x, axis: int, size: int, expected: str) -> None:
    if x.shape[axis] != size:
        raise ValueError(f"{op}: {name} must be {expected}, got {describe(x)}")


def require_nonempty(op: str, name: str, x, expected: str) -> None:
    if 0 in x.shape:
        raise ValueError(f"{op}: {name} must be a non-empty {expected}, got {describe(x)}")
