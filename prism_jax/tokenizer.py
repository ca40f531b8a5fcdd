"""Tokenizer: a thin wrapper over a `tokenizers.Tokenizer` read from tokenizer.json.

For a GGUF, tokenizer.json is built once from the file's metadata when the checkpoint is
converted into the cache (loader.py) with transformers' GGUF tokenizer conversion, the
maintained implementation of llama.cpp's tokenizer conventions (Gemma's SentencePiece-style BPE
with byte fallback; GPT-2 byte-level BPE with per-model split regexes). The runtime path needs
only `tokenizers`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers


class Tokenizer:
    """encode / decode with explicit BOS control and the model's special ids."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        adds_bos: bool,
    ) -> None:
        self.backend = backend
        self.bos_id = bos_id
        self.eos_ids = eos_ids
        self.adds_bos = adds_bos  # whether the model expects BOS at the start of a prompt

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str]) -> Tokenizer:
        """From an HF directory, a .gguf file (via its cached conversion) or a registered name."""
        from prism_jax.model.loader import checkpoint_dir  # lazy: the loader imports jax

        return cls.from_dir(checkpoint_dir(path))

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> Tokenizer:
        directory = Path(directory)
        path = directory / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {directory}: an HF model directory needs the fast "
                "tokenizer file tokenizer.json (save it with transformers' "
                "tokenizer.save_pretrained)"
            )
        backend = tokenizers.Tokenizer.from_file(str(path))
        tok_cfg = _read_json(directory / "tokenizer_config.json")
        config = _read_json(directory / "config.json")
        gen = _read_json(directory / "generation_config.json")
        bos = config.get("bos_token_id")
        if bos is None and (text := _token_text(tok_cfg.get("bos_token"))):
            bos = backend.token_to_id(text)
        eos: list[int] = []
        for value in (config.get("eos_token_id"), gen.get("eos_token_id")):
            eos += value if isinstance(value, list) else [] if value is None else [value]
        if (text := _token_text(tok_cfg.get("eos_token"))) and backend.token_to_id(
            text
        ) is not None:
            eos.append(backend.token_to_id(text))
        adds_bos = tok_cfg.get("add_bos_token")
        if adds_bos is None:  # Llama 3 style: the post-processor is what adds BOS
            probe = backend.encode("a", add_special_tokens=True).ids
            adds_bos = bos is not None and probe[:1] == [bos]
        return cls(backend, bos, tuple(dict.fromkeys(int(i) for i in eos)), bool(adds_bos))

    def encode(self, text: str, add_bos: bool) -> list[int]:
        """Token ids of text; special-token text (e.g. "<start_of_turn>") maps to its id."""
        # add_special_tokens=False: BOS is ours to place, never the post-processor's.
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos=True but this tokenizer has no BOS token")
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json spells special tokens as strings or AddedToken dicts."""
    return value.get("content") if isinstance(value, dict) else value


# --- GGUF metadata -> tokenizer files (conversion time only) -----------------------------------

# llama.cpp's "smollm" pre-tokenizer splits digits one by one before GPT-2's byte-level regex,
# as SmolLM2's own tokenizer.json does; transformers has no entry for it.
_PRE_TOKENIZERS = {
    "smollm": lambda: tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Digits(individual_digits=True),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    ),
}


def tokenizer_files_from_gguf(metadata: dict[str, Any]) -> dict[str, str]:
    """{"tokenizer.json": ..., "tokenizer_config.json": ...} for a GGUF's tokenizer metadata."""
    key_names, convert_gguf_tokenizer = _transformers_gguf_tokenizer()
    spec = {
        name: _plain(metadata[f"tokenizer.{key}"])
        for key, name in key_names["tokenizer"].items()
        if f"tokenizer.{key}" in metadata
    }
    backend, _ = convert_gguf_tokenizer(str(metadata["general.architecture"]), spec)
    if (pre := _PRE_TOKENIZERS.get(spec.get("pre_tokenizer_type", ""))) is not None:
        backend.pre_tokenizer = pre()
    tokens = spec["tokens"]

    def text(key: str) -> str | None:
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[int(token_id)] if token_id is not None else None

    config = {
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        # llama.cpp adds BOS to SentencePiece vocabularies that do not say otherwise.
        "add_bos_token": bool(
            metadata.get("tokenizer.ggml.add_bos_token", spec.get("tokenizer_type") == "llama")
        ),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
    }
    if (template := metadata.get("tokenizer.chat_template")) is not None:
        config["chat_template"] = template
    return {
        "tokenizer.json": backend.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2),
    }


def _transformers_gguf_tokenizer() -> tuple[Any, Any]:
    fresh = "transformers" not in sys.modules
    previous = os.environ.get("TRANSFORMERS_VERBOSITY")
    # Without torch, importing transformers logs "PyTorch was not found. Models won't be
    # available": true, irrelevant here (we use its tokenizer code only) and alarming to read.
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping
        from transformers.utils import logging as hf_logging
    except ImportError as e:
        raise ImportError(
            f"building a tokenizer from GGUF metadata needs transformers>=5.24 ({e}): "
            "pip install 'transformers>=5.24'"
        ) from e
    finally:
        if previous is None:
            os.environ.pop("TRANSFORMERS_VERBOSITY", None)
        else:
            os.environ["TRANSFORMERS_VERBOSITY"] = previous
    if fresh:  # give later users of transformers its usual verbosity back
        hf_logging.set_verbosity(hf_logging.log_levels.get(previous or "", hf_logging.WARNING))
    return mapping.GGUF_TOKENIZER_MAPPING, mapping.convert_gguf_tokenizer


def _plain(value: Any) -> Any:
    """numpy arrays from the GGUF parser -> the Python lists transformers expects."""
    return value.tolist() if isinstance(value, np.ndarray) else value
