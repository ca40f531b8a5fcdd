"""ServeConfig: everything the server is told at start-up, validated once."""

from __future__ import annotations

import dataclasses
import ipaddress

from prism_jax.serve.batcher import BatchPolicy

JEV_ALIAS = "jev-latest"


class ConfigError(ValueError):
    """A flag combination the server refuses to start with (the message says what to do)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    model: str = "default"
    served_model_name: str = "default"
    description: str = ""
    release_date: str = ""  # YYYY-MM-DD (cli fills it: --model-release-date, else the load date)
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allow_unauthenticated: bool = False
    precision: str = "int8"
    max_body_bytes: int = 8 * 1024 * 1024
    shutdown_timeout_s: float = 30.0
    batch: BatchPolicy = dataclasses.field(default_factory=BatchPolicy)
    max_completion_tokens: int = 1024  # prompt + generated tokens on /v1/completions
    # Compile every step bucket before listening (else each on its first use: a slow first
    # request per new shape, a fast start; tests and short-lived servers).
    warmup: bool = True

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty; give a non-empty --api-key or unset it")
        if not is_loopback(self.host) and self.api_key is None and not self.allow_unauthenticated:
            raise ConfigError(
                f"refusing to listen on {self.host} (reachable from other machines) without an "
                "API key: give --api-key KEY (or set PRISM_API_KEY), bind 127.0.0.1, or pass "
                "--allow-unauthenticated if an open server is really what you want"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError("--max-body-bytes must be at least 1024")
        if self.batch.max_queue < 1 or self.batch.max_batch < 1 or self.batch.window_s < 0:
            raise ConfigError("--max-queue and --max-batch must be >= 1, --batch-window-ms >= 0")
        if self.shutdown_timeout_s < 0:
            raise ConfigError("--shutdown-timeout must be >= 0 seconds")

    def accepts_model(self, name: str) -> bool:
        return name in (self.served_model_name, JEV_ALIAS)
