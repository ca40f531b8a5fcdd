"""`python -m prism_jax.eval` with other INT8 digits than the config default, for before/after
runs on the same items (docs/ACCURACY.md "INT8 quantisation"):

    .venv/bin/python benchmarks/eval_int8_digits.py --rows= --weights= -- \\
        --model default --data shared --precision int8,bf16,fp32 --limit 300 --out /tmp/one

--rows / --weights: comma lists of qkv, o, gate_up, down (empty: one digit); everything after
`--` goes to prism_jax.eval unchanged. Only the int8 engine is affected.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prism_jax import config as config_lib  # noqa: E402


def main() -> int:
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=",".join(config_lib.INT8_PROJECTIONS))
    ap.add_argument("--weights", default=",".join(config_lib.INT8_PROJECTIONS))
    args = ap.parse_args(argv[:cut])
    rows = tuple(filter(None, args.rows.split(",")))
    weights = tuple(filter(None, args.weights.split(",")))
    original = config_lib.ModelConfig.from_hf_config.__func__

    def from_hf_config(cls, d):
        c = original(cls, d)
        return c.replace(int8_two_digit_rows=rows, int8_two_digit_weights=weights)

    config_lib.ModelConfig.from_hf_config = classmethod(from_hf_config)
    from prism_jax.eval.__main__ import main as eval_main  # noqa: PLC0415

    print(f"int8 two-digit rows {rows}, weights {weights}", file=sys.stderr)
    return eval_main(argv[cut + 1 :])


if __name__ == "__main__":
    sys.exit(main())
