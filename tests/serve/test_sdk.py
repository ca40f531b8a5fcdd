"""The official typesafe-sdk client, unchanged, against the real server: noul, choice and
score parse into typed answers (bodies of 1 KiB and more go zstd-compressed), and bad requests
come back as the SDK's typed errors."""

from __future__ import annotations

import pytest
from typesafe_sdk import (
    Choice,
    Image,
    Noul,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeBadRequestError,
    TypeSafeClient,
    TypeSafeNotFoundError,
    TypeSafeUnprocessableEntityError,
)
from typesafe_sdk._core.compression import resolve_compression

pytestmark = pytest.mark.slow

STATE = "Customer: the app crashes whenever I open settings since the last update. " * 20


@pytest.fixture(scope="module")
def sdk(real_server):
    with TypeSafeClient(api_key=real_server.key, base_url=real_server.url, timeout=300) as c:
        yield c


def test_sdk_sends_zstd_here():
    assert resolve_compression(None) == "zstd"  # so the long state below goes compressed


def test_noul_choice_score_parse(sdk):
    r = sdk.system_one(
        state=STATE,
        questions={
            "bug": Noul(instructions="Is this a bug report?"),
            "team": Choice(instructions="Which team?", criteria={"Mobile": None, "Billing": None}),
            "urgency": Score(instructions="How urgent?", criteria=["Low", "Medium", "High"]),
        },
    )
    assert 0 <= r.nouls["bug"].noul <= 1
    assert r.choices["team"].choice in ("Mobile", "Billing")
    assert {str(k) for k in r.scores["urgency"].legend} == {"0", "1", "2"}
    assert r.usage.input_tokens > 0


def test_bad_requests_raise_typed_errors(sdk, real_server):
    with pytest.raises(TypeSafeBadRequestError, match="at most 255 choices"):
        sdk.system_one(
            state="x", questions={"q": Choice(criteria={f"option {i}": None for i in range(256)})}
        )
    with pytest.raises(TypeSafeUnprocessableEntityError):
        sdk.system_one(state="x", questions={"q": {"type": "score", "criteria": {"0": "a"}}})
    with pytest.raises(TypeSafeNotFoundError):
        sdk.system_one(state="x", questions={"q": Noul(instructions="?")}, model="other")
    with pytest.raises(TypeSafeBadRequestError, match="text only"):
        sdk.system_one(state=Image(_PNG), questions={"q": Noul(instructions="A dog?")})
    with TypeSafeClient(api_key="wrong", base_url=real_server.url) as bad:
        with pytest.raises(TypeSafeAuthenticationError):
            bad.system_one(state="x", questions={"q": Noul(instructions="?")})


def test_models_list(sdk):
    names = [m.name for m in sdk.models.list().models]
    assert names == ["default", "jev-latest"]


# A 1x1 PNG.
_PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
)
