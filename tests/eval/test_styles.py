"""Prompt render styles: the default text is the engine's format, unchanged."""

import pytest

from prism_jax.prompts import DEFAULT_STYLE, RenderStyle, question_text
from prism_jax.questions import parse_question

MMLU = parse_question(
    "q", {"type": "choice", "instructions": "Which is right?", "criteria": {"A": "one", "B": "two"}}
)
ROUTE = parse_question(
    "q",
    {"type": "choice", "instructions": "Team?", "criteria": {"billing": "charges", "tech": None}},
)


def test_default_style_text_is_unchanged():
    text, words = question_text(MMLU)
    assert text == (
        "Question: Which is right?\nOptions:\n- A: one\n- B: two\nAnswer with one option."
    )
    assert words == ("A", "B")
    assert question_text(ROUTE, DEFAULT_STYLE) == question_text(ROUTE)


def test_letters_and_text_styles():
    text, words = question_text(ROUTE, RenderStyle("letters"))
    assert words == ("A", "B")
    assert "A. billing: charges\nB. tech\n" in text
    text, words = question_text(MMLU, RenderStyle("letters"))
    assert "A. one\nB. two\n" in text
    text, words = question_text(MMLU, RenderStyle("text"))
    assert words == ("one", "two") and "- one\n- two\n" in text
    assert question_text(ROUTE, RenderStyle("text"))[1] == ("billing", "tech")


def test_style_names_round_trip():
    for name in ("keys", "letters", "text", "keys-nosys", "text-nosys"):
        assert RenderStyle.from_name(name).name == name
    with pytest.raises(ValueError):
        RenderStyle.from_name("letters-bold")
