"""Registers the extension's XLA FFI targets with JAX, once, at import of prism_jax.ops."""

from __future__ import annotations

import threading

import jax

_lock = threading.Lock()
_registered: dict[str, tuple[str, ...]] | None = None
_import_error: ImportError | None = None


def _load_extension():
    from prism_jax import _prism_ops  # noqa: PLC0415 (optional compiled module)

    return _prism_ops


def register() -> dict[str, tuple[str, ...]]:
    """Registers every handler of prism_jax._prism_ops; returns {platform: target names}.

    Safe to call repeatedly. If the extension is not built, returns {} and ops that need it
    raise `extension_missing_error()`.
    """
    global _registered, _import_error
    with _lock:
        if _registered is not None:
            return _registered
        try:
            module = _load_extension()
        except ImportError as e:
            _import_error = e
            _registered = {}
            return _registered
        registered: dict[str, tuple[str, ...]] = {}
        for platform, targets in module.registrations().items():
            for name, capsule in targets.items():
                jax.ffi.register_ffi_target(name, capsule, platform=platform)
            registered[platform] = tuple(sorted(targets))
        _registered = registered
        return _registered


def extension_module():
    """The compiled extension module, or None when it is not built."""
    register()
    return None if _import_error is not None else _load_extension()


def extension_missing_error() -> RuntimeError:
    return RuntimeError(
        "prism_jax's compiled kernels (prism_jax._prism_ops) are not built: run `make build` "
        "(or `pip install .`) in the prism_jax checkout, or select the pure-JAX reference with "
        f"`prism_jax.ops.use_impl('reference')`. Import error: {_import_error}"
    )


def require_target(name: str) -> None:
    """Raises a helpful error if the custom call `name` is not available on any platform."""
    targets = register()
    if not any(name in names for names in targets.values()):
        raise extension_missing_error()
