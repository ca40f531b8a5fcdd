"""System One questions: parsing and the limits of the wire contract (DESIGN.md).

A parsed Question knows its option keys (what the answer reports) and their descriptions (what
the prompt shows). The question id is kept by the caller only: it never reaches the prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["noul", "choice", "score"]
MAX_CHOICES = 255
MAX_LEVELS = 10


class DecisionRequestError(ValueError):
    """A request the engine refuses; `status` is the HTTP status the server answers with."""

    def __init__(self, detail: str, status: int = 400) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status


@dataclasses.dataclass(frozen=True)
class Question:
    kind: Kind
    instructions: str | None
    keys: tuple[str, ...]  # choice: option keys; noul: ("true", "false"); score: "0".."n-1"
    descriptions: tuple[str | None, ...]  # choice: descriptions; noul: sides; score: levels

    def __post_init__(self) -> None:
        assert len(self.keys) == len(self.descriptions), "one description per option key"
        assert self.keys, "a question has at least one option"


def _text(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise DecisionRequestError(f"{where} must be a string or null", status=422)
    return value


def _choice(instructions: str | None, criteria: Any, qid: str) -> Question:
    if not isinstance(criteria, Mapping) or not criteria:
        raise DecisionRequestError(
            f"question {qid!r}: a choice needs criteria, an object of option: description"
        )
    if len(criteria) > MAX_CHOICES:
        raise DecisionRequestError("Too many choices. Must have at most 255 choices.")
    keys = tuple(str(k) for k in criteria)
    descs = tuple(_text(v, f"question {qid!r}: criteria[{k!r}]") for k, v in criteria.items())
    return Question("choice", instructions, keys, descs)


def _noul(instructions: str | None, criteria: Any, qid: str) -> Question:
    criteria = criteria or {}
    if not isinstance(criteria, Mapping) or set(criteria) - {"true", "false"}:
        raise DecisionRequestError(
            f"question {qid!r}: noul criteria must be an object with optional 'true' and "
            "'false' descriptions",
            status=422,
        )
    true = _text(criteria.get("true"), f"question {qid!r}: criteria.true")
    false = _text(criteria.get("false"), f"question {qid!r}: criteria.false")
    if not (instructions or true or false):
        raise DecisionRequestError(
            f"question {qid!r}: a noul question needs instructions or at least one described "
            "side (criteria.true or criteria.false)"
        )
    return Question("noul", instructions, ("true", "false"), (true, false))


def _score(instructions: str | None, criteria: Any, qid: str) -> Question:
    if not isinstance(criteria, list | tuple) or not criteria:
        raise DecisionRequestError(
            f"question {qid!r}: a score needs criteria, a list of levels from lowest to highest"
        )
    if len(criteria) > MAX_LEVELS:
        raise DecisionRequestError(
            f"Too many levels. Must have at most {MAX_LEVELS} levels (got {len(criteria)})."
        )
    levels = tuple(_text(v, f"question {qid!r}: criteria[{i}]") for i, v in enumerate(criteria))
    return Question("score", instructions, tuple(str(i) for i in range(len(levels))), levels)


def parse_question(qid: str, raw: Mapping[str, Any]) -> Question:
    """One System One question body -> Question (DecisionRequestError on a bad one)."""
    if not isinstance(raw, Mapping):
        raise DecisionRequestError(f"question {qid!r} must be an object", status=422)
    kind = raw.get("type")
    instructions = _text(raw.get("instructions"), f"question {qid!r}: instructions")
    parsers = {"choice": _choice, "noul": _noul, "score": _score}
    if kind not in parsers:
        raise DecisionRequestError(
            f"question {qid!r}: type must be one of noul, choice, score (got {kind!r})",
            status=422,
        )
    return parsers[kind](instructions, raw.get("criteria"), qid)


def parse_questions(raw: Mapping[str, Any]) -> dict[str, Question]:
    if not isinstance(raw, Mapping) or not raw:
        raise DecisionRequestError("questions must be a non-empty object of id: question", 422)
    return {str(qid): parse_question(str(qid), q) for qid, q in raw.items()}
