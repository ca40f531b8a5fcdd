"""Shared fixtures: fresh random inputs with a printed seed, and one device per platform."""

from __future__ import annotations

import os
import secrets

# pytest-xdist workers share one GPU: each would otherwise preallocate most of its memory and
# the others fail with out-of-memory errors (benchmarks/gpu_suite.sh sets the same).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402 (after the allocator setting)
import numpy as np
import pytest

jax.config.update("jax_enable_x64", False)


def _has_gpu() -> bool:
    try:
        return len(jax.devices("gpu")) > 0
    except RuntimeError:
        return False


HAS_GPU = _has_gpu()
PLATFORMS = [pytest.param("cpu", id="cpu"), pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture
def rng(request) -> np.random.Generator:
    """Fresh inputs every run; PRISM_TEST_SEED=<n> replays a failure (the seed is printed)."""
    seed = int(os.environ.get("PRISM_TEST_SEED", secrets.randbits(32)))
    print(f"\n[{request.node.name}] PRISM_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture(params=PLATFORMS)
def device(request) -> jax.Device:
    if request.param == "gpu" and not HAS_GPU:
        pytest.skip("no CUDA device here; benchmarks/gpu_suite.sh runs these on the H200")
    return jax.devices(request.param)[0]


@pytest.fixture
def gpu() -> jax.Device:
    if not HAS_GPU:
        pytest.skip("no CUDA device here; benchmarks/gpu_suite.sh runs these on the H200")
    return jax.devices("gpu")[0]


def run_on(device: jax.Device, fn, *args, **kwargs):
    """Runs jit(fn) on `device` and returns numpy results (a tuple stays a tuple)."""
    placed = [jax.device_put(a, device) for a in args]
    with jax.default_device(device):
        out = jax.jit(lambda *a: fn(*a, **kwargs))(*placed)
    return jax.tree.map(np.asarray, out)


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bit pattern of a float array, for bitwise comparisons (bf16 via ml_dtypes)."""
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bitwise_equal(a, b, what: str = "") -> None:
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shapes differ {a.shape} vs {b.shape}"
    differ = bits(a) != bits(b)
    assert not differ.any(), (
        f"{what}: {int(differ.sum())} of {a.size} elements differ in bits; first at "
        f"{np.argwhere(differ)[0].tolist()}: {a[differ][0]!r} vs {b[differ][0]!r}"
    )


def embed_row(row: np.ndarray, others: np.ndarray, index: int) -> np.ndarray:
    """A batch of len(others) + 1 rows with `row` at `index`."""
    assert 0 <= index <= len(others), f"index {index} outside a batch of {len(others) + 1}"
    return np.concatenate([others[:index], row[None], others[index:]], axis=0)


def assert_same_bits_under(monkeypatch, knob: str, settings, device, fn, *args, what="") -> None:
    """fn's outputs (jit on `device`) under each setting of the environment knob `knob`, which a
    handler reads at launch, equal the first setting's bit for bit; the knob is unset after."""
    outs = []
    for value in settings:
        monkeypatch.setenv(knob, value)
        outs.append(jax.tree.leaves(run_on(device, fn, *args)))
    monkeypatch.delenv(knob)
    for value, got in zip(settings[1:], outs[1:], strict=True):
        for i, (a, b) in enumerate(zip(got, outs[0], strict=True)):
            assert_bitwise_equal(a, b, f"{what} output {i}: {knob}={value} vs {settings[0]}")
