"""Error bodies of the wire contract, in one place.

validation (422): {"detail": [{"loc": ["body", ...], "msg", "type"}]}   (FastAPI's shape)
limits (400):     {"detail": "..."}                                   (DESIGN.md's runtime limits)
others:           {"detail": {"error_type": str, "message": str}}     (auth, 404, 413, 429, 503)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fastapi.responses import JSONResponse


class ApiError(Exception):
    """An error the client caused or must act on; rendered as {"detail": {error_type, message}}."""

    def __init__(
        self, status: int, error_type: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.headers = dict(headers or {})

    def response(self) -> JSONResponse:
        body = {"detail": {"error_type": self.error_type, "message": self.message}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


class LimitError(Exception):
    """A request over a documented limit (options, levels, context): 400 {"detail": message}."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.message}, status_code=400)


class RequestValidationFailed(Exception):
    """Schema failures, already in FastAPI's item shape (loc starts with "body")."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        super().__init__(items[0]["msg"] if items else "invalid request")
        self.items = items

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": self.items}, status_code=422)


def validation_items(errors: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic error dicts -> the wire's {"loc": ["body", ...], "msg", "type"} items."""
    out = []
    for err in errors:
        loc = [p if isinstance(p, int) else str(p) for p in err.get("loc", ())]
        out.append(
            {
                "loc": ["body", *loc],
                "msg": str(err.get("msg", "invalid")),
                "type": str(err.get("type", "value_error")),
            }
        )
    return out or [{"loc": ["body"], "msg": "invalid request body", "type": "value_error"}]


def validation_error(loc: list[str | int], msg: str, type_: str) -> RequestValidationFailed:
    return RequestValidationFailed([{"loc": ["body", *loc], "msg": msg, "type": type_}])
