"""Which implementation the ops run: the custom calls ("ffi") or the pure-jnp references.

The choice is made at trace time. Select it per call (`impl=`) or for a scope with
`use_impl(...)`; scopes do not nest, so a reference run can never half-use kernels.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Literal

Impl = Literal["ffi", "reference"]
IMPLS: tuple[str, ...] = ("ffi", "reference")

_state = threading.local()


def env_switch(name: str, default: bool) -> bool:
    """An on/off environment knob the model reads when a step is traced (the benchmarks' A/B
    settings; executables compiled before a change keep what they were built with): unset or
    empty gives `default`, "on" and "off" set it, anything else is an error naming the knob."""
    value = os.environ.get(name) or ("on" if default else "off")
    if value not in ("on", "off"):
        raise ValueError(f"{name} must be unset, on or off; got {value!r}")
    return value == "on"


def current_impl() -> Impl:
    return getattr(_state, "impl", "ffi")


def resolve_impl(impl: Impl | None) -> Impl:
    chosen = current_impl() if impl is None else impl
    if chosen not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {chosen!r}")
    return chosen


@contextlib.contextmanager
def use_impl(impl: Impl) -> Iterator[None]:
    """Runs every op in the scope with `impl` ("ffi" or "reference")."""
    resolve_impl(impl)
    assert not hasattr(_state, "impl"), "use_impl scopes do not nest"
    _state.impl = impl
    try:
        yield
    finally:
        del _state.impl
