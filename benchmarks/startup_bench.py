"""Start-up time: compiling every step bucket of an EngineConfig, cold and from the cache.

    python3 benchmarks/startup_bench.py --out DIR --cache DIR [--preset gemma3-27b]
        [--single-digit] [--token-buckets 64,...] [--row-buckets ...] [--candidate-buckets ...]
        [--whole-last-layer]

Builds the engine on random INT8 weights with warmup off, then compiles every bucket key
(`Runner.bucket_keys`: forward per token bucket, the last layer per (tokens, rows), readout
per (rows, candidates), lse per (rows, lse rows)) and times each kind. The persistent
compilation cache lives in --cache: run the script twice with the same directory, and the
second run measures a start that loads every executable from it. Bucket lists default to
EngineConfig's. Appends one JSON line to DIR/startup.jsonl and prints it.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.e2e_decide import PRESETS, commit  # noqa: E402
from prism_jax import model  # noqa: E402
from prism_jax.config import EngineConfig  # noqa: E402
from prism_jax.engine import Engine  # noqa: E402


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def engine_config(args) -> EngineConfig:
    """EngineConfig's defaults, but for the bucket lists given and the pool size."""
    chosen = {
        "token_buckets": args.token_buckets,
        "row_buckets": args.row_buckets,
        "candidate_buckets": args.candidate_buckets,
    }
    return EngineConfig(
        kv_pages=args.kv_pages,
        readout_only_last_layer=not args.whole_last_layer,
        **{k: v for k, v in chosen.items() if v},
    )


def compile_all(engine: Engine) -> dict:
    """Seconds per key kind and the number of executables, compiling every bucket key."""
    seconds: dict[str, float] = {}
    keys = engine.runner.bucket_keys()
    for key in keys:
        start = time.perf_counter()
        engine.runner.executable(key)
        seconds[key[0]] = seconds.get(key[0], 0.0) + time.perf_counter() - start
    counts = {kind: sum(k[0] == kind for k in keys) for kind in seconds}
    return {
        "executables": len(keys),
        "count": counts,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "total_s": round(sum(seconds.values()), 2),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gemma3-27b")
    p.add_argument("--out", required=True)
    p.add_argument("--cache", required=True, help="persistent compilation cache directory")
    p.add_argument("--single-digit", action="store_true", help="INT8 with one digit")
    p.add_argument("--kv-pages", type=int, default=320)
    p.add_argument("--token-buckets", type=ints)
    p.add_argument("--row-buckets", type=ints)
    p.add_argument("--candidate-buckets", type=ints)
    p.add_argument(
        "--whole-last-layer",
        action="store_true",
        help="EngineConfig.readout_only_last_layer=False (no tail executables; readouts per T)",
    )
    args = p.parse_args(argv)
    jax.config.update("jax_compilation_cache_dir", args.cache)  # before Engine enables it
    config = PRESETS[args.preset]
    if args.single_digit:
        config = config.replace(int8_two_digit_rows=(), int8_two_digit_weights=())
    e = engine_config(args)
    params = jax.block_until_ready(model.init_random(config, "int8", 0))
    engine = Engine(config, params, None, None, engine_config=e, warmup=False)
    cache = pathlib.Path(args.cache)  # files already there (init_random's jits count too)
    cached_before = sum(1 for _ in cache.rglob("*")) if cache.exists() else 0
    row = {
        "preset": args.preset,
        "digits": 1 if args.single_digit else 2,
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "token_buckets": list(e.token_buckets),
        "row_buckets": list(e.row_buckets),
        "candidate_buckets": list(e.candidate_buckets),
        "readout_only_last_layer": e.readout_only_last_layer,
        "cache_files_before": cached_before,
        **compile_all(engine),
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "startup.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
