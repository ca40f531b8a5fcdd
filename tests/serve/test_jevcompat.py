"""jevcompat (PyPI), the conformance suite, against the real server with the API key on.

The test runs every case but `choice-options` (26, 64, 128 and 255 options with multi-token
names: minutes per request on 2 CPU cores); 3-option choices still exercise choice.options.
docs/jevcompat_report.md holds a full `jevcompat test` run with the exact command.

Known and deliberate: errors.validation-shape (a SHOULD) fails on 256 options and 11 levels,
which DESIGN.md's wire contract answers with 400 {"detail": "Too many choices. ..."} while
jevcompat expects FastAPI's 422. That is the only finding this test tolerates.
"""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn
from jevcompat import checks, report, runner

from prism_jax.serve.app import create_app
from prism_jax.serve.config import ServeConfig
from tests.serve.conftest import free_port
from tests.serve.fakes import FakeEngine

SLOW_CASES = {"choice-options"}
TOLERATED = {"errors.validation-shape"}


@pytest.mark.slow
def test_every_must_and_should_passes(real_server, tmp_path):
    only = {c.name for c in checks.CASES} - SLOW_CASES
    rep = runner.run(real_server.url, key=real_server.key, timeout=300, only=only)
    (tmp_path / "jevcompat.md").write_text(report.markdown(rep))
    assert rep.aborted is None
    assert not rep.inconclusive and not rep.case_errors, rep.inconclusive + rep.case_errors
    failed = {r.id: [f.message for f in r.findings] for r in rep.results if r.status == "fail"}
    assert set(failed) <= TOLERATED, failed
    for f in (f for r in rep.results if r.id in failed for f in r.findings):
        assert f.case in ("out-of-range:choice-256", "out-of-range:score-11"), f
    skipped = {r.id for r in rep.results if r.status == "skip"}
    assert skipped == {"auth.ignored-when-off"}, skipped  # conditional: auth is on here


def test_auth_off_accepts_the_header_sdks_always_send(tmp_path):
    """auth.ignored-when-off (the MUST the keyed run above cannot reach), on the fake engine:
    it is about the HTTP layer, not the model."""
    port = free_port()
    app = create_app(FakeEngine(), ServeConfig(served_model_name="fake", release_date="2026-11-29"))
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        rep = runner.run(f"http://127.0.0.1:{port}", timeout=30, only={"noul-basic", "auth"})
    finally:
        server.should_exit = True
        thread.join(10)
    status = {r.id: r.status for r in rep.results}
    assert status["auth.ignored-when-off"] == "pass" and status["http.endpoint"] == "pass"
