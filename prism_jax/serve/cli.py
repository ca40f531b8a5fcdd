"""`python -m prism_jax.serve`: load a model, then serve the System One API over HTTP.

    python -m prism_jax.serve --model default --port 8000
    PRISM_API_KEY=secret python -m prism_jax.serve --model /models/my-hf-dir --host 0.0.0.0

Routes: POST /v1/systemone, GET /v1/models, POST /v1/completions, GET /health, GET /metrics.
docs/serving.md has the API with examples and every metric.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import signal
import sys
import time
from typing import Any

from prism_jax.serve.batcher import BatchPolicy
from prism_jax.serve.config import ConfigError, ServeConfig

WARMUP = {"q": {"type": "noul", "instructions": "Is this a warm-up request?"}}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m prism_jax.serve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_flags(p.add_argument)
    _listen_flags(p.add_argument)
    _limit_flags(p.add_argument)
    _startup_flags(p.add_argument)
    return p


def _model_flags(a: Any) -> None:
    a(
        "--model",
        default="default",
        help="what to serve: 'default' (Gemma 3 270M from PyPI), a "
        "registered name, an HF safetensors directory or a .gguf file (default: %(default)s)",
    )
    a(
        "--served-model-name",
        help="the name clients send and /v1/models lists (default: --model); "
        "'jev-latest' is always accepted as an alias",
    )
    a(
        "--precision",
        default="int8",
        choices=["int8", "int8-1digit", "int8-attn", "int8-1digit-attn", "bf16"],
        help="int8 (W8A8 with two INT8 digits: reproducible probabilities that decide like "
        "FP32), int8-1digit (one digit: faster, less faithful), an -attn form (the attention "
        "in INT8 digits too: ops.tree_attention_digits) or bf16 (the accuracy reference) "
        "(default: %(default)s)",
    )


def _listen_flags(a: Any) -> None:
    """Where the server listens and who may use it."""
    a(
        "--host",
        default="127.0.0.1",
        help="address to bind (default: %(default)s); a "
        "non-loopback address needs an API key or --allow-unauthenticated",
    )
    a("--port", type=int, default=8000, help="TCP port (default: %(default)s)")
    a(
        "--api-key",
        default=os.environ.get("PRISM_API_KEY"),
        help="require 'Authorization: "
        "Bearer KEY' on every route but /health (default: $PRISM_API_KEY; unset = no auth)",
    )
    a(
        "--allow-unauthenticated",
        action="store_true",
        help="allow a non-loopback --host "
        "without an API key (anyone who reaches the port can use the server)",
    )


def _limit_flags(a: Any) -> None:
    """Queueing, batching and size limits."""
    a(
        "--max-queue",
        type=int,
        default=256,
        help="requests that may wait for the engine; one "
        "more gets 429 with Retry-After (default: %(default)s)",
    )
    a(
        "--max-batch",
        type=int,
        default=16,
        help="most requests run together in one forest step (default: %(default)s)",
    )
    a(
        "--batch-window-ms",
        type=float,
        default=5.0,
        help="how long an idle engine waits for "
        "more requests to batch with the first; the most a lone request is delayed "
        "(default: %(default)s)",
    )
    a(
        "--max-body-bytes",
        type=int,
        default=8 * 1024 * 1024,
        help="largest request body, "
        "compressed and after decompression; larger gets 413 (default: %(default)s)",
    )
    a(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds to let "
        "in-flight requests finish while new ones are refused (default: %(default)s)",
    )
    a(
        "--max-completion-tokens",
        type=int,
        default=1024,
        help="/v1/completions: most prompt + generated tokens per prompt (default: %(default)s)",
    )


def _startup_flags(a: Any) -> None:
    """Start-up, shutdown and logging."""
    a(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="listen at once and compile each step bucket on first use (a slow first request "
        "per new shape) instead of compiling all of them before listening",
    )
    a(
        "--model-release-date",
        help="YYYY-MM-DD shown by /v1/models (default: the date the "
        "server loaded the model, since the registry records no release dates)",
    )
    a(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="server log level (default: %(default)s)",
    )


def config_from_args(args: argparse.Namespace, today: datetime.date) -> ServeConfig:
    date = args.model_release_date or today.isoformat()
    try:
        datetime.date.fromisoformat(date)
    except ValueError:
        raise ConfigError(f"--model-release-date {date!r} is not a YYYY-MM-DD date") from None
    name = args.served_model_name or args.model
    source = "given by --model-release-date" if args.model_release_date else "the load date"
    return ServeConfig(
        model=args.model,
        served_model_name=name,
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        allow_unauthenticated=args.allow_unauthenticated,
        precision=args.precision,
        max_body_bytes=args.max_body_bytes,
        shutdown_timeout_s=args.shutdown_timeout,
        release_date=date,
        max_completion_tokens=args.max_completion_tokens,
        warmup=args.warmup,
        description=f"{args.model} served by prism_jax ({args.precision}); release_date is "
        f"{source}",
        batch=BatchPolicy(
            window_s=args.batch_window_ms / 1000.0,
            max_batch=args.max_batch,
            max_queue=args.max_queue,
        ),
    )


def say(message: str) -> None:
    print(f"[prism_jax.serve] {message}", file=sys.stderr, flush=True)


def load_engine(config: ServeConfig) -> Any:
    from prism_jax.engine import Engine  # imports jax: after the flags are known to be good

    start = time.perf_counter()
    say(f"loading {config.model!r} and quantising to {config.precision} ...")
    engine = Engine.from_pretrained(
        config.model, precision=config.precision, name=config.served_model_name, warmup=False
    )
    say(f"loaded in {time.perf_counter() - start:.1f} s")
    if not config.warmup:
        say("--no-warmup: each step bucket compiles on its first use")
        return engine
    start = time.perf_counter()
    say("compiling every step bucket (persistent compilation cache: fast after the first run)")
    runner = getattr(engine, "runner", None)
    if runner is not None and hasattr(runner, "warmup"):
        runner.warmup(progress=True)
    engine.decide_many([("warm-up", WARMUP)])  # and one real step end to end
    say(f"compiled in {time.perf_counter() - start:.1f} s")
    return engine


def serve(config: ServeConfig, engine: Any, log_level: str) -> None:
    import uvicorn

    from prism_jax.serve.app import create_app

    app = create_app(engine, config)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # New requests on open connections get 503 while in-flight ones finish.
            app.state.server.draining = True
            super().handle_exit(sig, frame)

    uv = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=config.shutdown_timeout_s,
        access_log=False,
    )
    auth = "API key required" if config.api_key else "no API key (auth off)"
    say(f"serving {config.served_model_name!r} on http://{config.host}:{config.port} ({auth})")
    # uvicorn re-raises the signal it drained on once it is done; a no-op handler in place
    # then lets the process exit with status 0 instead of dying from that signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    DrainingServer(uv).run()
    say("stopped")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args, datetime.datetime.now(datetime.UTC).date())
    except ConfigError as e:
        print(f"python -m prism_jax.serve: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        engine = load_engine(config)
    except (FileNotFoundError, ValueError) as e:
        print(f"python -m prism_jax.serve: cannot load {config.model!r}: {e}", file=sys.stderr)
        return 1
    serve(config, engine, args.log_level)
    return 0
