"""create_app(engine, config): the FastAPI app, its error handlers, /health and /metrics.

Every error leaves as JSON in the wire contract's shapes (errors.py); an unexpected exception
is logged and answered without a traceback.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import Request

from prism_jax.serve import auth, routes_openai, routes_systemone
from prism_jax.serve.batcher import Batcher
from prism_jax.serve.config import ServeConfig
from prism_jax.serve.errors import ApiError, LimitError, RequestValidationFailed, validation_items
from prism_jax.serve.metrics import Metrics
from prism_jax.serve.state import ServerState

log = logging.getLogger("prism_jax.serve")
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _install_error_handlers(app: FastAPI) -> None:
    async def shaped(request: Request, exc: Any) -> Response:
        return exc.response()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        message = (
            f"no route {request.method} {request.url.path}; the routes are POST "
            "/v1/systemone, GET /v1/models, POST /v1/completions, GET /health, GET /metrics"
        )
        return ApiError(exc.status_code, kind, message, exc.headers).response()

    async def fastapi_validation(request: Request, exc: RequestValidationError) -> Response:
        return RequestValidationFailed(validation_items(exc.errors())).response()

    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return ApiError(
            500, "internal_error", "the server failed on this request; the log has the details"
        ).response()

    for cls in (ApiError, LimitError, RequestValidationFailed):
        app.add_exception_handler(cls, shaped)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, fastapi_validation)
    app.add_exception_handler(Exception, unexpected)


def _add_service_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        server: ServerState = request.app.state.server
        fault = server.fault or server.batcher.fault
        if server.draining or fault or not server.batcher.alive:
            why = fault or ("shutting down" if server.draining else "engine thread stopped")
            return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)
        return JSONResponse({"status": "ok", "model": server.config.served_model_name})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        server: ServerState = request.app.state.server
        auth.check(request, server.config.api_key)
        return Response(server.metrics.exposition(), media_type=PROMETHEUS_TEXT)


def create_app(engine: Any, config: ServeConfig) -> FastAPI:
    """The app around `engine` (anything with Engine's decide_many/stats interface)."""
    holder: dict[str, Batcher] = {}
    metrics = Metrics(lambda: (holder["b"].running, holder["b"].waiting), lambda: holder["b"].stats)
    batcher = Batcher(engine, config.batch, on_step=metrics.observe_step)
    holder["b"] = batcher

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        app.state.server.draining = True
        batcher.close()
        batcher.join(timeout=config.shutdown_timeout_s)

    app = FastAPI(
        title="prism_jax", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.server = ServerState(config, engine, batcher, metrics)
    _install_error_handlers(app)
    _add_service_routes(app)
    app.include_router(routes_systemone.router)
    app.include_router(routes_openai.router)
    return app
