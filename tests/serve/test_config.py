"""Start-up policy: flags, the non-loopback rule, release dates; refusals happen before the
model loads."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import time

import pytest

from prism_jax.serve import cli
from prism_jax.serve.config import ConfigError, ServeConfig, is_loopback


def test_non_loopback_needs_a_key_or_the_explicit_flag():
    ServeConfig(host="127.0.0.1")
    ServeConfig(host="0.0.0.0", api_key="k")
    ServeConfig(host="0.0.0.0", allow_unauthenticated=True)
    with pytest.raises(ConfigError, match="--allow-unauthenticated"):
        ServeConfig(host="0.0.0.0")
    assert is_loopback("::1") and is_loopback("localhost") and not is_loopback("10.0.0.1")


def test_refusal_exits_before_loading_the_model():
    start = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "prism_jax.serve", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env_without_key(),
    )
    assert r.returncode == 2, r.stderr
    assert "API key" in r.stderr and "loading" not in r.stderr
    assert time.monotonic() - start < 60


def _env_without_key() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PRISM_API_KEY"}


def test_help_explains_every_flag():
    text = cli.build_parser().format_help()
    for flag in (
        "--model",
        "--host",
        "--port",
        "--api-key",
        "--served-model-name",
        "--precision",
        "--max-queue",
        "--max-body-bytes",
        "--shutdown-timeout",
        "--allow-unauthenticated",
        "--max-batch",
        "--batch-window-ms",
        "--model-release-date",
    ):
        assert flag in text
    for action in cli.build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_release_date_is_the_flag_or_the_load_date():
    today = datetime.date(2026, 11, 29)
    args = cli.build_parser().parse_args(["--model-release-date", "2025-08-14"])
    assert cli.config_from_args(args, today).release_date == "2025-08-14"
    config = cli.config_from_args(cli.build_parser().parse_args([]), today)
    assert config.release_date == "2026-11-29" and "load date" in config.description
    with pytest.raises(ConfigError, match="YYYY-MM-DD"):
        cli.config_from_args(cli.build_parser().parse_args(["--model-release-date", "soon"]), today)


def test_api_key_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("PRISM_API_KEY", "from-env")
    args = cli.build_parser().parse_args([])
    assert cli.config_from_args(args, datetime.date.today()).api_key == "from-env"


class _FakeRunner:
    def __init__(self):
        self.warmed = False

    def warmup(self, progress=True):
        self.warmed = True


class _FakeEngine:
    def __init__(self):
        self.runner, self.asked = _FakeRunner(), []

    def decide_many(self, requests):
        self.asked += requests


@pytest.mark.parametrize("flags,warmed", [([], True), (["--no-warmup"], False)])
def test_warmup_compiles_every_bucket_unless_told_not_to(monkeypatch, flags, warmed):
    from prism_jax.engine import Engine

    engine = _FakeEngine()
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, *a, **k: engine))
    config = cli.config_from_args(cli.build_parser().parse_args(flags), datetime.date.today())
    assert config.warmup is warmed
    assert cli.load_engine(config) is engine
    assert engine.runner.warmed is warmed and (len(engine.asked) == 1) is warmed
