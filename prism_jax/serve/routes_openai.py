"""POST /v1/completions, OpenAI-compatible, for generic scoring.

Implemented: `prompt` (one string or a list), `echo`, `logprobs` (0-5), `max_tokens` (greedy
continuation, rerunning the prefix per token: fine for short answers), `stop`. Refused with a
400 that says so: sampling (temperature > 0), n > 1, streaming. Omitted temperature means 0.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.requests import Request

from prism_jax.serve import bodies
from prism_jax.serve.errors import ApiError, LimitError, RequestValidationFailed, validation_items
from prism_jax.serve.schemas import CompletionRequest
from prism_jax.serve.scoring import Scorer
from prism_jax.serve.state import ClientGone, ServerState

router = APIRouter()
MAX_PROMPTS = 64  # per request: each runs on the engine thread, one after another


def _check(body: CompletionRequest, server: ServerState) -> None:
    if not server.config.accepts_model(body.model):
        raise ApiError(
            404,
            "not_found",
            f"the model {body.model!r} is not served here; use "
            f"{server.config.served_model_name!r} (GET /v1/models)",
        )
    refusals = [
        (bool(body.temperature), "sampling is not implemented: send temperature 0 (greedy)"),
        (body.n != 1, "n > 1 is not implemented: send n = 1"),
        (body.stream, "streaming is not implemented: send stream = false"),
    ]
    for refused, why in refusals:
        if refused:
            raise LimitError(why)


def _logprobs(
    tok: Any, ids: list[int], lps: list[float | None], tops: list[Any], k: int, offset: int
) -> dict[str, Any]:
    tokens = [tok.decode([i]) for i in ids]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    top = [None if t is None else {tok.decode([i]): lp for i, lp in t[:k]} for t in tops]
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


def _complete(
    engine: Any, scorer: Scorer, prompt: str, body: CompletionRequest, limit: int
) -> dict[str, Any]:
    tok = engine.tokenizer
    ids = tok.encode(prompt, add_bos=tok.bos_id is not None)
    start = 1 if tok.bos_id is not None else 0
    if len(ids) + body.max_tokens > limit or len(ids) < 1:
        raise LimitError(
            f"the prompt has {len(ids)} tokens and max_tokens is {body.max_tokens}; "
            f"together they may be at most {limit} tokens on this server"
        )
    k = body.logprobs or 0
    scores = scorer.score(ids, k) if body.echo and len(ids) > 1 else None
    lps: list[float | None] = [None] + (scores.token_logprobs if scores else [])
    tops: list[Any] = [None] + (scores.top if scores else [])
    gen: list[int] = []
    text, finish = "", "length"
    for _ in range(body.max_tokens):
        nxt, lp, top = scorer.next_token(ids + gen, k)
        if nxt in tok.eos_ids:
            finish = "stop"
            break
        gen.append(nxt)
        lps.append(lp)
        tops.append(top)
        text = tok.decode(gen)
        stops = [body.stop] if isinstance(body.stop, str) else body.stop or []
        cut = min((text.find(s) for s in stops if s and s in text), default=-1)
        if cut >= 0:
            text, finish = text[:cut], "stop"
            break
    shown = (ids[start:] if body.echo else []) + gen
    first = start if body.echo else len(ids)
    logprobs = None
    if body.logprobs is not None:
        logprobs = _logprobs(
            tok, shown, lps[first : first + len(shown)], tops[first : first + len(shown)], k, 0
        )
    return {
        "text": (prompt if body.echo else "") + text,
        "finish_reason": finish,
        "logprobs": logprobs,
        "prompt_tokens": len(ids),
        "completion_tokens": len(gen),
    }


def _job(body: CompletionRequest, server: ServerState):
    prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
    limit = server.config.max_completion_tokens

    def run(engine: Any) -> list[dict[str, Any]]:
        if server.scorer is None:  # built on first use, on the engine thread
            server.scorer = Scorer(engine, limit)
        try:
            return [_complete(engine, server.scorer, p, body, limit) for p in prompts]
        except LimitError as e:
            return e  # type: ignore[return-value]

    return run


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    server: ServerState = request.app.state.server
    server.admit(request)
    data = await bodies.read_json(request, server.config.max_body_bytes)
    try:
        body = CompletionRequest.model_validate(data)
    except ValidationError as e:
        raise RequestValidationFailed(validation_items(e.errors(include_url=False))) from None
    _check(body, server)
    if isinstance(body.prompt, list) and not 1 <= len(body.prompt) <= MAX_PROMPTS:
        raise LimitError(f"prompt lists {len(body.prompt)} prompts; send 1 to {MAX_PROMPTS}")
    job = server.submit(call=_job(body, server))
    try:
        results = await server.wait(request, job)
    except ClientGone:
        return Response(status_code=499)
    if isinstance(results, LimitError | ApiError):
        raise results
    if isinstance(results, Exception):
        raise ApiError(500, "internal_error", "completion failed; the server log has the details")
    choices = [
        {
            "index": i,
            "text": r["text"],
            "logprobs": r["logprobs"],
            "finish_reason": r["finish_reason"],
        }
        for i, r in enumerate(results)
    ]
    prompt_tokens = sum(r["prompt_tokens"] for r in results)
    completion_tokens = sum(r["completion_tokens"] for r in results)
    return JSONResponse(
        {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": server.config.served_model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    )
