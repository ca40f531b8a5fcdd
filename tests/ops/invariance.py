"""Row invariance, bitwise: a row's outputs must not depend on the rest of the batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import numpy as np

from tests.conftest import assert_bitwise_equal, embed_row, run_on

# (other rows, index of the row under test): alone, among 7, among 300 at both ends and inside.
LAYOUTS = ((7, 3), (300, 0), (300, 300), (300, 157))


def check_row_invariance(
    device: jax.Device,
    fn: Callable,
    row_args: Sequence[np.ndarray],
    make_others: Callable[[int], Sequence[np.ndarray]],
    shared_args: Sequence = (),
    **kwargs,
) -> None:
    """row_args hold one row each (no leading axis); make_others(n) returns n rows per arg.

    Every output of fn must have the row axis first.
    """
    alone = run_on(device, fn, *[a[None] for a in row_args], *shared_args, **kwargs)
    alone_leaves = jax.tree.leaves(alone)
    for n_others, index in LAYOUTS:
        others = make_others(n_others)
        batch = [embed_row(r, o, index) for r, o in zip(row_args, others, strict=True)]
        leaves = jax.tree.leaves(run_on(device, fn, *batch, *shared_args, **kwargs))
        for k, (a, b) in enumerate(zip(alone_leaves, leaves, strict=True)):
            assert_bitwise_equal(
                a[0], b[index], f"output {k}: row alone vs at {index} among {n_others} others"
            )
