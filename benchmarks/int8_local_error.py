"""Per layer and projection of the (smoothed) fp32 model on real decision prompts: the crest
factor of the projection's input rows (max|x| / rms(x) per token: a single-digit INT8 row's
error grows with it, ~crest / (127 sqrt 12) relative) and the relative output error of
quantising the activations only, the weights only, and both, one digit each.

    .venv/bin/python benchmarks/int8_local_error.py [--alpha 0.65 | --alpha -1 (unsmoothed)]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from int8_error_proxy import PROJ, build_rows, fake_quant  # noqa: E402

from prism_jax.config import ModelConfig  # noqa: E402
from prism_jax.model import params_from_hf  # noqa: E402
from prism_jax.model import smoothing as sm  # noqa: E402
from prism_jax.model.attention_backends import MaskedAttention  # noqa: E402
from prism_jax.model.loader import load_checkpoint  # noqa: E402
from prism_jax.model.transformer import bind  # noqa: E402
from prism_jax.ops.quantize import dequantize_rows, quantize_rows  # noqa: E402


class _Probe:
    def __init__(self, linear, key: str, sink: dict) -> None:
        self.linear, self.key, self.sink = linear, key, sink

    def __call__(self, x):
        y = self.linear(x)
        y2 = y.reshape(y.shape[0], -1)  # (T, N)
        w = self.linear.w[...].reshape(-1, self.linear.in_dim)  # (N, K)
        wq = dequantize_rows(*quantize_rows(w))
        xq = fake_quant(x)

        def sq_err(a, b):
            return jnp.sum((jnp.dot(a, b.T, precision="highest") - y2) ** 2)

        self.sink[self.key + "/err"] = jnp.stack(
            [sq_err(xq, w), sq_err(x, wq), sq_err(xq, wq), jnp.sum(y2**2)]
        )
        rms = jnp.sqrt(jnp.mean(x * x, axis=-1))
        self.sink[self.key + "/crest"] = jnp.max(jnp.abs(x), axis=-1) / jnp.maximum(rms, 1e-30)
        return y


def _probe_pass(params, config, tokens, positions, mask):
    model = bind(params, config)
    sink: dict = {}
    for i, layer in enumerate(model.layers):
        for owner, attr in (
            (layer.attn, "qkv"),
            (layer.attn, "o"),
            (layer.mlp, "gate_up"),
            (layer.mlp, "down"),
        ):
            setattr(owner, attr, _Probe(getattr(owner, attr), f"{i}.{attr}", sink))
    model(tokens, positions, MaskedAttention(config, positions, mask))
    return sink


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--alpha", type=float, default=sm.DEFAULT_ALPHA, help="-1: no smoothing")
    ap.add_argument("--items", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rows", type=int, default=3, help="packed 512-token rows to run")
    args = ap.parse_args()
    from prism_jax.chat_template import ChatTemplate  # noqa: PLC0415
    from prism_jax.tokenizer import Tokenizer  # noqa: PLC0415

    ck = load_checkpoint(args.model)
    c = ModelConfig.from_hf_config(ck.hf_config)
    tok, template = Tokenizer.from_dir(ck.directory), ChatTemplate.from_dir(ck.directory)
    rows, _ = build_rows(tok, template, args.items, args.seed)
    t = dict(ck.tensors)
    if args.alpha >= 0:
        fold = sm.layer_folding(c, t, args.alpha)
        for i in range(c.num_layers):
            t.update(fold(i))
    params = params_from_hf(c, t, "fp32")
    probe = jax.jit(_probe_pass, static_argnames="config")
    err: dict = {}
    crest: dict = {}
    for r in rows[: args.rows]:
        out = probe(params, c, *map(jnp.asarray, (r.tokens, r.positions, r.mask)))
        for k, v in out.items():
            name, kind = k.split("/")
            if kind == "err":
                err[name] = err.get(name, 0) + np.asarray(v)
            else:
                crest.setdefault(name, []).append(np.asarray(v)[r.valid])
    print(
        f"{args.model}, alpha {args.alpha}: crest factor per token (median, p99, max); "
        "relative output error of INT8 activations only, weights only, both"
    )
    print("| layer | projection | crest med | p99 | max | x only | w only | both |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for i in range(c.num_layers):
        for p in PROJ:
            k = f"{i}.{p}"
            e, cr = err[k], np.concatenate(crest[k])
            rel = np.sqrt(e[:3] / e[3])
            print(
                f"| {i} | {p} | {np.median(cr):.1f} | {np.percentile(cr, 99):.1f} | "
                f"{cr.max():.1f} | {rel[0]:.4f} | {rel[1]:.4f} | {rel[2]:.4f} |"
            )


if __name__ == "__main__":
    main()
