"""Prompt rendering: root (system instructions) + trunk (the state) + branch (the question and
its options, ending at the answer slot), and each option's continuation tokens.

The prefix (root + trunk) is rendered and tokenised once per state, so every question about a
state shares it token for token. Options are tokenised as they follow the rendered branch:
the space or template text before an option belongs to the option.
"""

from __future__ import annotations

import dataclasses
import json
import string
from typing import Any, Literal

from prism_jax.chat_template import ChatTemplate
from prism_jax.questions import Question
from prism_jax.tokenizer import Tokenizer

SYSTEM_INSTRUCTIONS = (
    "You are a careful decision assistant. Read the state, then answer the question with "
    "exactly one of the listed options."
)
NOUL_WORDS = ("Yes", "No")  # shown for the "true" and "false" sides
LETTERS = string.ascii_uppercase


@dataclasses.dataclass(frozen=True)
class RenderStyle:
    """How a choice question's options are shown and answered, and whether the system
    instructions are sent. The default is the engine's format; the others exist to measure
    prompt formats (prism_jax.eval, docs/ACCURACY.md).

    options: "keys"    - each option is listed and answered by its key (the default);
             "letters" - options listed under letters A, B, ... and answered by the letter
                         (falls back to "keys" beyond 26 options);
             "text"    - each option answered by its own text: the description when the key
                         is a bare letter (the long-option convention: keys A, B, ... with
                         the text as description), the key otherwise.
    system:  send SYSTEM_INSTRUCTIONS (root) before the state.
    """

    options: Literal["keys", "letters", "text"] = "keys"
    system: bool = True

    def __post_init__(self) -> None:
        assert self.options in ("keys", "letters", "text"), f"unknown options {self.options!r}"

    @property
    def name(self) -> str:
        return self.options + ("" if self.system else "-nosys")

    @classmethod
    def from_name(cls, name: str) -> RenderStyle:
        """A style from its name: keys, letters or text, optionally followed by -nosys."""
        options, _, rest = name.partition("-")
        if rest not in ("", "nosys") or options not in ("keys", "letters", "text"):
            raise ValueError(
                f"unknown render style {name!r}: use keys, letters or text, optionally "
                "followed by -nosys (e.g. letters-nosys)"
            )
        return cls(options, system=not rest)  # type: ignore[arg-type]


DEFAULT_STYLE = RenderStyle()


@dataclasses.dataclass(frozen=True)
class RenderedQuestion:
    prefix: tuple[int, ...]  # root + trunk, shared by every question on the state
    branch: tuple[int, ...]  # question + options + answer slot (last token)
    options: tuple[tuple[int, ...], ...]  # each option's continuation tokens

    def __post_init__(self) -> None:
        assert self.prefix or self.branch, "a prompt has at least one token"
        assert all(self.options), "every option has at least one token"


def state_text(state: Any) -> str:
    """A state is shown verbatim when it is text, as indented JSON otherwise."""
    if isinstance(state, str):
        return state
    return json.dumps(state, ensure_ascii=False, indent=2)


def _own_text(key: str, description: str | None) -> str:
    bare_letter = len(key) == 1 and key in LETTERS
    return description if bare_letter and description else key


def _choice_lines(q: Question, style: RenderStyle) -> tuple[list[str], tuple[str, ...]]:
    """Option lines and answer words for the letters and text styles."""
    if style.options == "letters":
        letters = tuple(LETTERS[: len(q.keys)])
        lines = [
            f"{letter}. {k}: {d}" if d and _own_text(k, d) == k else f"{letter}. {_own_text(k, d)}"
            for letter, k, d in zip(letters, q.keys, q.descriptions, strict=True)
        ]
        return ["Options:", *lines, "Answer with the letter of one option."], letters
    texts = tuple(_own_text(k, d) for k, d in zip(q.keys, q.descriptions, strict=True))
    if len(set(texts)) < len(texts):  # two options would read the same: keep the keys
        texts = q.keys
    return ["Options:", *(f"- {t}" for t in texts), "Answer with one option."], texts


def question_text(q: Question, style: RenderStyle = DEFAULT_STYLE) -> tuple[str, tuple[str, ...]]:
    """The question as the model reads it, and the option words it answers with."""
    lines = [f"Question: {q.instructions}"] if q.instructions else ["Question:"]
    keys_style = style.options == "keys" or (style.options == "letters" and len(q.keys) > 26)
    if q.kind == "choice" and not keys_style:
        more, words = _choice_lines(q, style)
        return "\n".join(lines + more), words
    if q.kind == "choice":
        lines.append("Options:")
        pairs = zip(q.keys, q.descriptions, strict=True)
        lines += [f"- {k}: {d}" if d else f"- {k}" for k, d in pairs]
        lines.append("Answer with one option.")
        return "\n".join(lines), q.keys
    if q.kind == "noul":
        for word, desc in zip(NOUL_WORDS, q.descriptions, strict=True):
            if desc:
                lines.append(f"Answer {word} if: {desc}")
        lines.append("Answer Yes or No.")
        return "\n".join(lines), NOUL_WORDS
    lines.append("Levels, from lowest (0) to highest:")
    lines += [f"{i}: {d}" if d else f"{i}" for i, d in enumerate(q.descriptions)]
    lines.append("Answer with the level number.")
    return "\n".join(lines), q.keys


class PromptRenderer:
    """Renders questions for one tokenizer, with the model's chat template when it has one."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        style: RenderStyle = DEFAULT_STYLE,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.style = style

    def _texts(self, state: str, question: str) -> tuple[str, str, str]:
        """-> (prefix text, branch text, text between branch and option)."""
        system = self.style.system
        if self.template is None:  # a base model: plain text, options after a space
            root = f"{SYSTEM_INSTRUCTIONS}\n\n" if system else ""
            prefix = f"{root}State:\n{state}\n\n"
            return prefix, f"{question}\nAnswer:", " "
        user = f"State:\n{state}\n\n{question}"
        messages = [{"role": "system", "content": SYSTEM_INSTRUCTIONS}] if system else []
        messages.append({"role": "user", "content": user})
        full = self.template.render(messages, add_generation_prompt=True)
        cut = full.rfind(question)
        assert cut > 0, "the chat template must show the question text verbatim"
        return full[:cut], full[cut:], ""

    def _encode_prefix(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_bos=False)
        bos = self.tokenizer.bos_id
        if self.tokenizer.adds_bos and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        return ids

    def option_tokens(self, branch_text: str, branch: list[int], option: str) -> tuple[int, ...]:
        joint = self.tokenizer.encode(branch_text + option, add_bos=False)
        bos = self.tokenizer.bos_id
        if branch[:1] == [bos] and joint[:1] != [bos]:
            branch = branch[1:]  # a raw prompt's BOS was added by _encode_prefix, not the text
        if joint[: len(branch)] == branch and len(joint) > len(branch):
            return tuple(joint[len(branch) :])
        # The option merged with the branch's last token: tokenise it on its own instead.
        return tuple(self.tokenizer.encode(option, add_bos=False))

    def render(self, state: Any, q: Question) -> RenderedQuestion:
        text, words = question_text(q, self.style)
        prefix_text, branch_text, lead = self._texts(state_text(state), text)
        prefix = self._encode_prefix(prefix_text)
        branch = self.tokenizer.encode(branch_text, add_bos=False)
        options = tuple(self.option_tokens(branch_text, branch, lead + w) for w in words)
        return factor_shared_tokens(RenderedQuestion(tuple(prefix), tuple(branch), options))

    def render_raw(self, prompt: str, options: list[str]) -> RenderedQuestion:
        """A raw prompt (no template) and option strings, for engine.score."""
        ids = self._encode_prefix(prompt)
        opts = tuple(self.option_tokens(prompt, ids, o) for o in options)
        return factor_shared_tokens(RenderedQuestion((), tuple(ids), opts))


def factor_shared_tokens(q: RenderedQuestion) -> RenderedQuestion:
    """Moves a first token shared by every option (e.g. Gemma's lone space before a digit)
    into the branch. Exact: P(t, rest) = P(t) P(rest | t), and the common factor P(t) cancels
    when the options are renormalised; it often turns multi-token options into single-token
    ones that need no vocabulary pass."""
    branch, options = q.branch, q.options
    while len(options) > 1 and all(len(o) > 1 and o[0] == options[0][0] for o in options):
        branch, options = branch + options[0][:1], tuple(o[1:] for o in options)
    return RenderedQuestion(q.prefix, branch, options)
