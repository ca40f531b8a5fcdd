"""Request schemas (pydantic), shaped like the official client's wire models.

Text fields (state, instructions, descriptions, levels) may be a string, an object or an
array; structured values are shown to the model as compact JSON. Documented limits (255
options, 10 levels, a noul with nothing to ask) are not schema rules: questions.py checks them
and the server answers 400 with the limit, as DESIGN.md's wire contract says.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Text = str | dict[str, Any] | list[Any]


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class NoulCriteria(BaseModel):
    model_config = ConfigDict(extra="forbid")
    true: Text | None = None
    false: Text | None = None


class NoulQuestion(_Open):
    type: Literal["noul"]
    instructions: Text | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(_Open):
    type: Literal["choice"]
    instructions: Text | None = None
    criteria: Annotated[dict[str, Text | None], Field(min_length=1)]


class ScoreQuestion(_Open):
    type: Literal["score"]
    instructions: Text | None = None
    criteria: Annotated[list[Text], Field(min_length=1)]


class BoxQuestion(_Open):
    type: Literal["box"]
    instructions: Text | None = None


Question = Annotated[
    NoulQuestion | ChoiceQuestion | ScoreQuestion | BoxQuestion, Field(discriminator="type")
]


class SystemOneRequest(_Open):
    model: str
    state: Text
    questions: Annotated[dict[str, Question], Field(min_length=1)]
    assets: dict[str, Any] | None = None


def as_text(value: Text | None) -> str | None:
    """What the model reads for a text field: strings verbatim, structures as compact JSON."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def engine_question(q: NoulQuestion | ChoiceQuestion | ScoreQuestion) -> dict[str, Any]:
    """A validated question -> the plain dict prism_jax.questions parses (text already flat)."""
    out: dict[str, Any] = {"type": q.type, "instructions": as_text(q.instructions)}
    if isinstance(q, NoulQuestion):
        if q.criteria is not None:
            sides = {"true": q.criteria.true, "false": q.criteria.false}
            out["criteria"] = {k: as_text(v) for k, v in sides.items() if v is not None}
    elif isinstance(q, ChoiceQuestion):
        out["criteria"] = {k: as_text(v) for k, v in q.criteria.items()}
    else:
        out["criteria"] = [as_text(v) for v in q.criteria]
    return out


class CompletionRequest(_Open):
    """OpenAI /v1/completions, the parts this server implements (see routes_openai.py)."""

    model: str
    prompt: str | list[str]
    max_tokens: Annotated[int, Field(ge=0)] = 16
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stop: str | list[str] | None = None
