"""Chat templates: the model's Jinja template rendered the way transformers renders it.

Sources, in transformers' order of preference: chat_template.jinja, then the "chat_template" key
of tokenizer_config.json (a GGUF's tokenizer.chat_template is copied there when the GGUF is
converted into the cache). Base models have none: from_dir/from_pretrained return None.
"""

from __future__ import annotations

import dataclasses
import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; for rendering it is a no-op, but templates that use it must still parse."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    # jinja's own tojson HTML-escapes; templates expect plain JSON, as transformers gives them.
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    # Sandboxed and immutable: a template comes with downloaded weights and must not reach Python.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    source: str  # the template text
    special_tokens: dict[str, str]  # bos_token, eos_token, ... as template variables
    _template: jinja2.Template = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_string(cls, source: str, **special_tokens: str) -> ChatTemplate:
        try:
            template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"the chat template does not parse (line {e.lineno}: {e})") from e
        return cls(source, dict(special_tokens), template)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> ChatTemplate | None:
        """From an HF directory, a .gguf file or a registered model name; None for base models."""
        from prism_jax.model.loader import checkpoint_dir  # lazy: the loader imports jax

        return cls.from_dir(checkpoint_dir(path))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> ChatTemplate | None:
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: [{"name": ..., "template": ...}]
            named = {t.get("name"): t.get("template") for t in source}
            source = named.get("default")
        jinja_path = directory / "chat_template.jinja"
        if jinja_path.is_file():
            source = jinja_path.read_text()
        if not source:
            return None
        special = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            value = config.get(key)
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                special[key] = value
        return cls.from_string(source, **special)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The prompt text for messages ([{"role": ..., "content": ...}, ...]).

        Extra keyword arguments (tools, documents, enable_thinking, ...) reach the template as
        variables, as in transformers' apply_chat_template.
        """
        variables = {**self.special_tokens, **kwargs}
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )
