"""SIGTERM: in-flight requests finish, new ones are refused, the process exits cleanly."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.serve.conftest import AUTH, start_server, stop_server

pytestmark = pytest.mark.slow


def test_sigterm_drains_then_exits(tmp_path):
    server = start_server(str(tmp_path), "--shutdown-timeout", "120")
    try:
        body = {
            "model": "default",
            "state": "A long ticket. " * 300,
            "questions": {
                "q": {
                    "type": "score",
                    "instructions": "How long is it?",
                    "criteria": ["short", "medium", "long"],
                }
            },
        }
        result: dict = {}

        def in_flight():
            result["r"] = httpx.post(
                server.url + "/v1/systemone", json=body, headers=AUTH, timeout=300
            )

        t = threading.Thread(target=in_flight)
        t.start()
        time.sleep(1.0)  # the request is in the engine now
        code = {}
        stopper = threading.Thread(target=lambda: code.setdefault("rc", stop_server(server, 180)))
        stopper.start()
        time.sleep(0.5)
        with pytest.raises(httpx.TransportError):  # the listening socket is closed
            httpx.get(server.url + "/health", timeout=5)
        t.join(300)
        stopper.join(300)
        assert result["r"].status_code == 200, result["r"].text
        assert result["r"].json()["answers"]["q"]["type"] == "score"
        assert code["rc"] == 0
        log = open(server.log_path).read()
        assert "Traceback" not in log and "stopped" in log
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
