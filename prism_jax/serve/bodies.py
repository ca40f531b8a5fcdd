"""Request bodies: size limit (413) and Content-Encoding zstd / gzip / identity.

The limit applies twice: to the bytes on the wire and to the decompressed JSON, so a small
compressed bomb is refused as surely as a large plain body.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

import zstandard
from starlette.requests import Request

from prism_jax.serve.errors import ApiError, validation_error

ENCODINGS = ("identity", "gzip", "zstd")


def too_large(limit: int, what: str) -> ApiError:
    return ApiError(
        413,
        "request_too_large",
        f"{what} is larger than the server's limit of {limit} bytes; send a smaller state or "
        "fewer questions, or restart the server with a larger --max-body-bytes",
    )


async def read_raw(request: Request, limit: int) -> bytes:
    """The body as sent (still encoded), refusing more than `limit` bytes without reading on."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit, "the request body")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit, "the request body")
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip(raw: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(wbits=47)  # 32 + 15: gzip or zlib header, detected
    try:
        out = d.decompress(raw, limit + 1)
    except zlib.error as e:
        raise ApiError(400, "invalid_request_error", f"the gzip body is corrupt: {e}") from None
    if len(out) > limit or d.unconsumed_tail:
        raise too_large(limit, "the decompressed request body")
    return out


def _unzstd(raw: bytes, limit: int) -> bytes:
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
        out = reader.read(limit + 1)
    except zstandard.ZstdError as e:
        raise ApiError(400, "invalid_request_error", f"the zstd body is corrupt: {e}") from None
    if len(out) > limit:
        raise too_large(limit, "the decompressed request body")
    return out


def decode(raw: bytes, encoding_header: str | None, limit: int) -> bytes:
    """Undo Content-Encoding (a list is applied in reverse order, as HTTP says)."""
    codings = [c.strip().lower() for c in (encoding_header or "").split(",") if c.strip()]
    for coding in reversed(codings):
        if coding == "gzip" or coding == "x-gzip":
            raw = _gunzip(raw, limit)
        elif coding == "zstd":
            raw = _unzstd(raw, limit)
        elif coding != "identity":
            raise ApiError(
                415,
                "unsupported_encoding",
                f"Content-Encoding {coding!r} is not supported; send zstd, gzip or an "
                "uncompressed body",
            )
    return raw


def parse_json(data: bytes) -> Any:
    """JSON text -> value; malformed JSON is a 422 like FastAPI's json_invalid. Escapes of lone
    surrogates ("\\ud800") are refused too: they are not text, and no tokenizer takes them."""
    try:
        value = json.loads(data.decode("utf-8"))
        json.dumps(value, ensure_ascii=False).encode("utf-8")
        return value
    except UnicodeDecodeError as e:
        raise validation_error([e.start], "the body is not UTF-8 text", "json_invalid") from None
    except UnicodeEncodeError:
        raise validation_error(
            [0],
            "a string holds a lone surrogate escape (e.g. \\ud800); send valid Unicode text",
            "string_unicode",
        ) from None
    except json.JSONDecodeError as e:
        raise validation_error([e.pos], f"JSON decode error: {e.msg}", "json_invalid") from None
    except ValueError as e:  # e.g. an integer longer than Python's 4300-digit limit
        raise validation_error([0], f"JSON value not accepted: {e}", "json_invalid") from None
    except RecursionError:
        raise validation_error([0], "JSON nested too deeply", "json_invalid") from None


async def read_json(request: Request, limit: int) -> Any:
    raw = await read_raw(request, limit)
    return parse_json(decode(raw, request.headers.get("content-encoding"), limit))
