"""e2e_decide.py with the two-digit norms as they were before session 13 ("old": the float norm,
then ops.quantize_digits, two custom calls) or as they are ("new": one call, digits=2), for a
same-machine A/B of the fused second digit (results/e2e_h200_session13/digits_ab/).

    python3 benchmarks/digit_norms_ab.py old|new [e2e_decide.py arguments]

Both variants compute the same bits (tests/ops/test_norm_digits.py); only the launches differ.
"""

from __future__ import annotations

import pathlib
import runpy
import sys

import jax.numpy as jnp

from prism_jax import ops

HERE = pathlib.Path(__file__).resolve().parent
_rmsnorm_quant, _add_rmsnorm_quant = ops.rmsnorm_quant, ops.add_rmsnorm_quant


def unfused_rmsnorm_quant(x, gamma, *, digits: int = 1, **kw):
    if digits == 1:
        return _rmsnorm_quant(x, gamma, **kw)
    y = ops.rmsnorm(x, gamma, **kw)
    return ops.quantize_digits(y.astype(jnp.float32), digits=2)


def unfused_add_rmsnorm_quant(x, residual, gamma, *, digits: int = 1, **kw):
    if digits == 1:
        return _add_rmsnorm_quant(x, residual, gamma, **kw)
    y, h = ops.add_rmsnorm(x, residual, gamma, **kw)
    return (*ops.quantize_digits(y.astype(jnp.float32), digits=2), h)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("old", "new"):
        raise SystemExit("usage: digit_norms_ab.py old|new [e2e_decide.py arguments]")
    if argv[0] == "old":  # the model calls ops.<name> at trace time, so this reroutes it
        ops.rmsnorm_quant, ops.add_rmsnorm_quant = unfused_rmsnorm_quant, unfused_add_rmsnorm_quant
    sys.path.insert(0, str(HERE))
    sys.argv = [str(HERE / "e2e_decide.py"), *argv[1:]]
    runpy.run_path(str(HERE / "e2e_decide.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
