"""Server fixtures: an app around the fake engine (fast), and one real server process on the
default model shared by every test that needs real answers (loading takes ~10-30 s)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from prism_jax.serve.app import create_app
from prism_jax.serve.batcher import BatchPolicy
from prism_jax.serve.config import ServeConfig
from tests.serve.fakes import FakeEngine

API_KEY = "test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


def make_client(engine: FakeEngine, **overrides) -> TestClient:
    fields = {
        "served_model_name": "fake",
        "api_key": API_KEY,
        "release_date": "2026-11-29",
        "description": "fake engine",
        "batch": BatchPolicy(window_s=0.0, max_batch=8, max_queue=16),
    }
    return TestClient(
        create_app(engine, ServeConfig(**(fields | overrides))), raise_server_exceptions=False
    )


@pytest.fixture
def client(fake_engine: FakeEngine) -> Iterator[TestClient]:
    with make_client(fake_engine) as c:
        yield c


@dataclasses.dataclass
class RealServer:
    url: str
    key: str
    proc: subprocess.Popen
    log_path: str

    def post(self, path: str, body: dict, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=AUTH, timeout=300, **kw)


def start_server(tmp_dir: str, *extra: str) -> RealServer:
    """`python -m prism_jax.serve` on the default model; waits until /health is 200."""
    port = free_port()
    log_path = os.path.join(tmp_dir, f"server-{port}.log")
    cmd = [
        sys.executable,
        "-m",
        "prism_jax.serve",
        "--model",
        "default",
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        # The first server of a run would otherwise compile every bucket (~70 s on CI's cold
        # cache); the tests reach a few. test_config.py covers the warm-up itself.
        "--no-warmup",
        *extra,
    ]
    log = open(log_path, "w")  # noqa: SIM115 - the process writes it until teardown
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited ({proc.returncode}): {open(log_path).read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return RealServer(url, API_KEY, proc, log_path)
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"the server did not become healthy in 300 s: {open(log_path).read()}")


def stop_server(server: RealServer, timeout: float = 60) -> int:
    server.proc.send_signal(signal.SIGTERM)
    return server.proc.wait(timeout=timeout)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory) -> Iterator[RealServer]:
    server = start_server(
        str(tmp_path_factory.mktemp("serve")), "--max-batch", "64", "--max-queue", "512"
    )
    yield server
    if server.proc.poll() is None:
        stop_server(server)
