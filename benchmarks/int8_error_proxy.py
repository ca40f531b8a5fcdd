"""Where INT8's error comes from: a cheap teacher-forced proxy for the decision flips.

Real decision prompts (a seeded stratified sample of ../shared/data, rendered as the engine
renders them) followed by their gold option are run teacher-forced through
  fp32   the reference,
  bf16   the yardstick,
  int8   the real INT8 model (custom calls),
  emu    an fp32 model of the same smoothed weights in which chosen projections are fake-
         quantised exactly as the INT8 model quantises them (weights per output channel,
         activations per token over the whole row); `emu` with every projection quantised
         reproduces `int8` (checked by the first lines), so switching single projections or
         layers back to fp32 in `emu` shows which ones carry the error.
Per variant (JSON lines): mean KL(fp32 || variant) over the full vocabulary at every branch
and option position, top-1 agreement with fp32, mean |dp| and flips of the answer-slot
decision (probabilities renormalised over the options' first tokens).

Other modes: --digits "rows/weights;..." (emu with a second INT8 digit on the rows and/or
weights of the projections named, "+"-joined; --alphas re-smooths), --sensitivity (each
model against itself with the embedding scale nudged by 1e-6: how far fp32-rounding-sized
differences such as CPU vs CUDA carry) and --timing N (CPU time of one packed row).

    .venv/bin/python benchmarks/int8_error_proxy.py --items 30 --ablate types,layers
    .venv/bin/python benchmarks/int8_error_proxy.py --items 30 --skip-int8 \
        --digits "qkv+o+gate_up+down/;qkv+o+gate_up+down/qkv+o+gate_up+down"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prism_jax.config import INT8_TWO_DIGITS, ModelConfig  # noqa: E402
from prism_jax.model import full_logits, params_from_hf  # noqa: E402
from prism_jax.model import smoothing as sm  # noqa: E402
from prism_jax.model.attention_backends import MaskedAttention  # noqa: E402
from prism_jax.model.loader import load_checkpoint  # noqa: E402
from prism_jax.model.steps import forward  # noqa: E402
from prism_jax.model.transformer import bind  # noqa: E402
from prism_jax.ops.quantize import dequantize_rows, quantize_rows  # noqa: E402

PROJ = ("qkv", "o", "gate_up", "down")
_forward = jax.jit(forward, static_argnames="config")
_logits = jax.jit(full_logits, static_argnames="config")


def fake_quant(x: jax.Array, digits=1) -> jax.Array:
    """What the INT8 model feeds a GEMM, in fp32: per-row codes times the row's scale; with
    digits=2 plus the INT8 codes of the row's remainder at their own per-row scale."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).astype(jnp.float32)
    y = dequantize_rows(*quantize_rows(x2))
    if digits == 2:
        y = y + dequantize_rows(*quantize_rows(x2 - y))
    return y.reshape(shape)


class _FakeQuant:
    def __init__(self, linear, flag: jax.Array) -> None:
        self.linear, self.flag = linear, flag

    def __call__(self, x: jax.Array) -> jax.Array:
        one, two = fake_quant(x), fake_quant(x, 2)
        return self.linear(jnp.where(self.flag > 1.5, two, jnp.where(self.flag > 0.5, one, x)))

    def partials_or_output(self, x: jax.Array) -> jax.Array:
        """Linear's: the fp32 model has no partial products, so its output (the layers ask for
        the down and o projections' this way)."""
        return self(x)


def _emu_forward(params, config, flags, tokens, positions, mask):
    """flags float [L, 4]: 1 fake-quantises that projection's input (weights are prepared)."""
    model = bind(params, config)
    for i, layer in enumerate(model.layers):
        for j, (owner, attr) in enumerate(
            ((layer.attn, "qkv"), (layer.attn, "o"), (layer.mlp, "gate_up"), (layer.mlp, "down"))
        ):
            setattr(owner, attr, _FakeQuant(getattr(owner, attr), flags[i, j]))
    return model(tokens, positions, MaskedAttention(config, positions, mask))


_emu_jit = jax.jit(_emu_forward, static_argnames="config")


def emu_params(config, tensors, quantised, embed_bf16=True, alpha=None, w_digits=()):
    """fp32 params of the (smoothed) tensors with the chosen projections' weights replaced by
    their per-output-channel INT8 round trip, and the embedding rounded to bf16 as INT8 keeps
    it."""
    t = dict(tensors)
    if alpha is not None:
        fold = sm.layer_folding(config, t, alpha)
        for i in range(config.num_layers):
            t.update(fold(i))
    if embed_bf16:
        e = np.asarray(t["model.embed_tokens.weight"], np.float32)
        t["model.embed_tokens.weight"] = np.asarray(jnp.asarray(e, jnp.bfloat16), np.float32)
    names = {
        "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "o": ("self_attn.o_proj",),
        "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        "down": ("mlp.down_proj",),
    }
    for i, p in quantised:
        for n in names[p]:
            k = f"model.layers.{i}.{n}.weight"
            w = jnp.asarray(np.asarray(t[k], np.float32))
            wq = dequantize_rows(*quantize_rows(w))
            if p in w_digits:
                wq = wq + dequantize_rows(*quantize_rows(w - wq))
            t[k] = np.asarray(wq)
    return params_from_hf(config, t, "fp32")


def build_rows(tok, template, n_items: int, seed: int):
    """Packed rows and, per item, (row, answer slot, scored positions, first tokens, gold)."""
    from prism_jax.eval.__main__ import load_items  # noqa: PLC0415
    from prism_jax.eval.items import stratified_sample  # noqa: PLC0415
    from prism_jax.prompts import PromptRenderer  # noqa: PLC0415

    items, _ = load_items("shared", None)
    sample = stratified_sample(items, n_items, seed, min_per_set=2)
    renderer = PromptRenderer(tok, template)
    seqs, meta = [], []
    for it in sample:
        r = renderer.render(it.state, it.parsed())
        firsts = [o[0] for o in r.options]
        seq = list(r.prefix + r.branch + r.options[it.gold])
        if len(seq) > sm.ROW_LEN:
            continue
        seqs.append(seq)
        meta.append((len(r.prefix) + len(r.branch) - 1, len(r.branch), firsts, it.set))
    rows = sm.pack_sequences(seqs, row_len=sm.ROW_LEN)
    # pack_sequences sorts by length: find each sequence again by its tokens.
    where = {}
    for ri, row in enumerate(rows):
        for seg in range(row.segment.max() + 1):
            idx = np.flatnonzero(row.segment == seg)
            where.setdefault(tuple(row.tokens[idx]), []).append((ri, idx[0]))
    out = []
    for seq, (slot, nb, firsts, set_name) in zip(seqs, meta, strict=True):
        ri, start = where[tuple(seq)].pop()
        scored = np.arange(start + slot - nb + 1, start + len(seq) - 1)  # branch and options
        out.append((ri, start + slot, scored, firsts, set_name))
    return rows, out


def logprobs(hidden_fn, params, config, rows, items):
    """Per item: log-softmax [n_scored, V] is too big to keep: returns (lp at scored positions
    concatenated, answer-slot logits over the first tokens)."""
    hidden = [np.asarray(hidden_fn(ri)) for ri in range(len(rows))]
    scored_lp, slot = [], []
    for ri, s, scored, firsts, _ in items:
        pos = np.concatenate([[s], scored])
        lg = _logits(params, config, jnp.asarray(hidden[ri][pos]))
        lp = np.asarray(jax.nn.log_softmax(lg, axis=-1))
        scored_lp.append(lp[1:])
        slot.append(lp[0][np.asarray(firsts)])
    return scored_lp, slot


def metrics(ref, got, items) -> dict:
    ref_lp, ref_slot = ref
    lp, slot = got
    kl, top1, n = 0.0, 0, 0
    for a, b in zip(ref_lp, lp, strict=True):
        kl += float((np.exp(a) * (a - b)).sum())
        top1 += int((a.argmax(-1) == b.argmax(-1)).sum())
        n += len(a)
    dps, flips = [], 0
    for a, b, (_, _, _, firsts, _) in zip(ref_slot, slot, items, strict=True):
        if len(set(firsts)) < len(firsts):
            continue  # options that share a first token: not decided at the slot alone
        pa, pb = np.exp(a - a.max()), np.exp(b - b.max())
        pa, pb = pa / pa.sum(), pb / pb.sum()
        dps.append(float(np.abs(pa - pb).max()))
        flips += int(pa.argmax() != pb.argmax())
    return dict(
        kl=kl / n,
        top1=top1 / n,
        positions=n,
        slot_mean_dp=float(np.mean(dps)),
        slot_flips=flips,
        slot_n=len(dps),
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--items", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ablate", default="", help="comma list of: types, layers")
    ap.add_argument("--only", default="", help="comma list of extra emu variants: L.proj")
    ap.add_argument("--digits", default="", help="act+projs/weight+projs;... e.g. down/;qkv+o/")
    ap.add_argument("--alphas", nargs="*", type=float, default=[])
    ap.add_argument("--skip-int8", action="store_true")
    ap.add_argument("--sensitivity", action="store_true", help="nudge the input by 1e-6")
    ap.add_argument("--timing", type=int, default=0, metavar="N", help="time N int8 forwards")
    return ap.parse_args()


@dataclass(frozen=True)
class Proxy:
    """The checkpoint, its config and the teacher-forced rows every variant runs."""

    ck: object
    config: ModelConfig
    rows: list
    items: list
    arrays: list  # (tokens, positions, mask) per row, on the device

    def run(self, params, cfg=None, hidden_fn=None):
        """(logprobs, seconds) of a variant: its params through `cfg` (default: the model's)."""
        t = time.perf_counter()
        cfg = cfg or self.config
        hidden_fn = hidden_fn or (lambda ri: _forward(params, cfg, *self.arrays[ri]))
        got = logprobs(hidden_fn, params, cfg, self.rows, self.items)
        return got, time.perf_counter() - t

    def emit(self, name, ref, got, secs) -> None:
        row = dict(variant=name, **metrics(ref, got, self.items), seconds=round(secs, 1))
        print(json.dumps(row), flush=True)


def load_proxy(args: argparse.Namespace) -> Proxy:
    from prism_jax.chat_template import ChatTemplate  # noqa: PLC0415
    from prism_jax.tokenizer import Tokenizer  # noqa: PLC0415

    ck = load_checkpoint(args.model)
    config = ModelConfig.from_hf_config(ck.hf_config)
    tok, template = Tokenizer.from_dir(ck.directory), ChatTemplate.from_dir(ck.directory)
    rows, items = build_rows(tok, template, args.items, args.seed)
    arrays = [tuple(map(jnp.asarray, (r.tokens, r.positions, r.mask))) for r in rows]
    return Proxy(ck, config, rows, items, arrays)


def timing_mode(px: Proxy, runs: int) -> None:
    """CPU cost of the digits: one packed 512-token row through the decoder (no readout)."""
    tok_arrays = px.arrays[0]
    for name, rows_, weights_ in (
        ("one digit", (), ()),
        ("two-digit rows", PROJ, ()),
        ("two digits", PROJ, PROJ),
    ):
        cfg = px.config.replace(int8_two_digit_rows=rows_, int8_two_digit_weights=weights_)
        params = params_from_hf(cfg, px.ck.tensors, "int8")
        _forward(params, cfg, *tok_arrays).block_until_ready()
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            _forward(params, cfg, *tok_arrays).block_until_ready()
            times.append(time.perf_counter() - t)
        row = dict(variant=f"int8 {name}", tokens=int(px.rows[0].valid.sum()))
        print(json.dumps(row | dict(median_s=round(float(np.median(times)), 3))), flush=True)


def sensitivity_mode(px: Proxy) -> None:
    """How far does an fp32-rounding-sized difference carry (CPU vs CUDA FP32 agree to ~1e-6)?
    Every model's embedding scale times (1 + 1e-6), against the same model."""
    config = px.config
    one = config.replace(int8_two_digit_rows=(), int8_two_digit_weights=())
    for name, prec, cfg in (
        ("fp32", "fp32", config),
        ("bf16", "bf16", config),
        ("int8 one digit", "int8", one),
        ("int8 two digits", "int8", config.replace(**INT8_TWO_DIGITS)),
    ):
        params = params_from_hf(cfg, px.ck.tensors, prec)
        ref, _ = px.run(params, cfg=cfg)
        nudged = cfg.replace(embed_scale=cfg.embed_scale * (1 + 1e-6))
        px.emit(f"{name}: embedding scale x (1 + 1e-6)", ref, *px.run(params, cfg=nudged))


def precision_variants(px: Proxy, skip_int8: bool):
    """bf16 and the INT8 models against fp32; returns fp32's logprobs (every later reference)."""
    fp32 = params_from_hf(px.config, px.ck.tensors, "fp32")
    ref, _ = px.run(fp32)
    variants = [("bf16", "bf16", px.config)]
    if not skip_int8:
        two = px.config.replace(**INT8_TWO_DIGITS)
        variants += [("int8", "int8", px.config), ("int8 two digits", "int8", two)]
    for name, prec, cfg in variants:
        params = params_from_hf(cfg, px.ck.tensors, prec)
        px.emit(name, ref, *px.run(params, cfg=cfg))
    return ref


def smoothed_tensors(px: Proxy, alpha: float) -> dict:
    """The checkpoint's tensors with every layer's smoothing folded in at `alpha`."""
    fold = sm.layer_folding(px.config, px.ck.tensors, alpha)
    tensors = dict(px.ck.tensors)
    for i in range(px.config.num_layers):
        tensors.update(fold(i))
    return tensors


def emulation_mode(px: Proxy, ref, args: argparse.Namespace) -> None:
    """The emu variants: --digits (and --alphas), else all, none, --ablate and --only."""
    L = px.config.num_layers
    every = {(i, p) for i in range(L) for p in PROJ}
    # Smoothed fp32 tensors once; each variant then only re-rounds the weights it quantises.
    smoothed = smoothed_tensors(px, sm.DEFAULT_ALPHA)

    def emu(name, quantised: set, a_digits=(), w_digits=(), tensors=None):
        flags = np.zeros((L, 4), np.float32)
        for i, p in quantised:
            flags[i, PROJ.index(p)] = 2 if p in a_digits else 1
        params = emu_params(px.config, tensors or smoothed, quantised, w_digits=w_digits)
        fl = jnp.asarray(flags)
        fn = lambda ri: _emu_jit(params, px.config, fl, *px.arrays[ri])  # noqa: E731
        px.emit(name, ref, *px.run(params, hidden_fn=fn))

    if args.digits:
        specs = [
            [part.split("+") if part else [] for part in spec.split("/")]
            for spec in args.digits.split(";")
        ]
        for a, w in specs:
            emu(f"emu 2-digit act {a} weights {w}", every, tuple(a), tuple(w))
        for alpha in args.alphas:
            t = smoothed_tensors(px, alpha)
            for a, w in specs:
                emu(f"emu a={alpha} 2-digit act {a} weights {w}", every, tuple(a), tuple(w), t)
        return
    emu("emu all", every)
    emu("emu none (bf16 embedding only)", set())
    kinds = set(args.ablate.split(",")) - {""}
    if "types" in kinds:
        for p in PROJ:
            emu(f"emu all but {p}", {q for q in every if q[1] != p})
            emu(f"emu only {p}", {q for q in every if q[1] == p})
    if "layers" in kinds:
        for i in range(L):
            emu(f"emu all but layer {i}", {q for q in every if q[0] != i})
    for spec in filter(None, args.only.split(",")):
        keep = {(int(s.split(".")[0]), s.split(".")[1]) for s in spec.split("+")}
        emu(f"emu all but {spec}", every - keep)


def main() -> None:
    args = parse_args()
    px = load_proxy(args)
    if args.timing:
        timing_mode(px, args.timing)
        return
    if args.sensitivity:
        sensitivity_mode(px)
        return
    ref = precision_variants(px, args.skip_int8)
    emulation_mode(px, ref, args)


if __name__ == "__main__":
    main()
