"""API-key checks: `Authorization: Bearer <key>` on every route but /health.

Without a configured key any Authorization header is accepted and ignored (the SDKs always
send one). A missing key is 403 and a wrong key 401, both with error_type
"authentication_error", as the reference server answers.
"""

from __future__ import annotations

import hmac

from starlette.requests import Request

from prism_jax.serve.errors import ApiError

OPEN_PATHS = frozenset({"/health"})


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return None


def check(request: Request, api_key: str | None) -> None:
    """Raises ApiError(401/403) unless the request may proceed."""
    if api_key is None or request.url.path in OPEN_PATHS:
        return
    given = presented_key(request)
    if given is None:
        raise ApiError(
            403,
            "authentication_error",
            "Must supply an API key: send the header 'Authorization: Bearer <key>'.",
        )
    if not hmac.compare_digest(given.encode(), api_key.encode()):
        raise ApiError(
            401,
            "authentication_error",
            "Cannot authenticate with the server: the API key is not valid.",
        )
