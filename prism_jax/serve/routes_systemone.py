"""POST /v1/systemone: the System One wire contract (DESIGN.md), and GET /v1/models."""

from __future__ import annotations

import math
import time
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import Request

from prism_jax.questions import DecisionRequestError, parse_questions
from prism_jax.serve import bodies
from prism_jax.serve.config import JEV_ALIAS
from prism_jax.serve.errors import ApiError, LimitError, RequestValidationFailed, validation_items
from prism_jax.serve.schemas import BoxQuestion, ScoreQuestion, SystemOneRequest, engine_question
from prism_jax.serve.state import ClientGone, ServerState

router = APIRouter()


def _text_only(what: str, server: ServerState) -> LimitError:
    return LimitError(
        f"{what}: the model {server.config.served_model_name!r} reads text only; send the state "
        "and questions as text or JSON (no image assets, no box questions)"
    )


async def _parse(request: Request, server: ServerState) -> SystemOneRequest:
    ctype = request.headers.get("content-type", "")
    if ctype.lower().startswith("multipart/"):
        await bodies.read_raw(request, server.config.max_body_bytes)  # the size limit first
        raise _text_only("image assets were sent (a multipart body)", server)
    data = await bodies.read_json(request, server.config.max_body_bytes)
    try:
        body = SystemOneRequest.model_validate(data)
    except ValidationError as e:
        raise RequestValidationFailed(validation_items(e.errors(include_url=False))) from None
    if not server.config.accepts_model(body.model):
        raise ApiError(
            404,
            "not_found",
            f"the model {body.model!r} is not served here; use "
            f"{server.config.served_model_name!r} or {JEV_ALIAS!r} (GET /v1/models)",
        )
    if body.assets:
        raise _text_only("the request has assets", server)
    boxes = [qid for qid, q in body.questions.items() if isinstance(q, BoxQuestion)]
    if boxes:
        raise _text_only(f"question {boxes[0]!r} is a box question", server)
    return body


def _engine_request(body: SystemOneRequest) -> tuple[Any, dict[str, Any]]:
    questions = {qid: engine_question(q) for qid, q in body.questions.items()}
    try:
        parse_questions(questions)  # the limits, before the request takes a queue slot
    except DecisionRequestError as e:
        if e.status == 422:
            raise RequestValidationFailed(
                [{"loc": ["body", "questions"], "msg": e.detail, "type": "value_error"}]
            ) from None
        raise LimitError(e.detail) from None
    return body.state, questions


def refusal(err: DecisionRequestError) -> Exception:
    """The engine's refusal as the wire's error: 503 (busy: retry), 422, or a 400 limit."""
    if err.status == 503:
        return ApiError(503, "unavailable", err.detail, {"Retry-After": "1"})
    if err.status == 422:
        return RequestValidationFailed(
            [{"loc": ["body", "questions"], "msg": err.detail, "type": "value_error"}]
        )
    return LimitError(err.detail)


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _response(body: SystemOneRequest, result: dict[str, Any], server: ServerState) -> dict:
    answers = result["answers"]
    for qid, q in body.questions.items():
        if isinstance(q, ScoreQuestion):  # the legend shows the levels as the client sent them
            answers[qid]["legend"] = {str(i): level for i, level in enumerate(q.criteria)}
        server.metrics.decisions.labels(type=q.type).inc()
    extras = {k: v for k, v in result.items() if k.startswith("x_")}
    out = {
        "model": server.config.served_model_name,
        "answers": answers,
        "usage": result["usage"],
        **extras,
    }
    if not _finite(out):
        raise ApiError(
            500,
            "internal_error",
            "the engine produced a non-finite probability; please report this request",
        )
    return out


@router.post("/v1/systemone")
async def systemone(request: Request) -> Response:
    server: ServerState = request.app.state.server
    arrived = time.monotonic()
    server.admit(request)
    body = await _parse(request, server)
    job = server.submit(request=_engine_request(body))
    try:
        result = await server.wait(request, job)
    except ClientGone:
        return Response(status_code=499)
    server.metrics.ttft.observe(time.monotonic() - arrived)
    if isinstance(result, DecisionRequestError):
        raise refusal(result)
    if isinstance(result, Exception):
        raise ApiError(
            500,
            "internal_error",
            "the engine failed on this request; the server log has the details",
        )
    out = _response(body, result, server)
    server.metrics.e2e.observe(time.monotonic() - arrived)
    return JSONResponse(out)


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    server: ServerState = request.app.state.server
    server.admit(request)
    c = server.config
    entry = {
        "name": c.served_model_name,
        "description": c.description,
        "release_date": c.release_date,
    }
    alias = {
        **entry,
        "name": JEV_ALIAS,
        "description": f"alias of {c.served_model_name!r}: {c.description}",
    }
    return JSONResponse({"models": [entry, alias]})
