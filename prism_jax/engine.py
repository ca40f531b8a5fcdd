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
from prism_jax.config import EngineConfig, ModelConfig, Precision
from prism_jax.decide import answer, option_probabilities_host
from prism_jax.forest import Forest, build_forest
from prism_jax.kv_pages import OutOfPages, PagePool, kv_bytes_per_page
from prism_jax.model.loader import load_checkpoint
from prism_jax.model.registry import cache_root
from prism_jax.prefix_cache import PrefixCache
from prism_jax.prompts import PromptRenderer, RenderedQuestion
from prism_jax.questions import DecisionRequestError, parse_questions
from prism_jax.runner import Runner
from prism_jax.scheduler import (
    Placement,
    place,
    plan_steps,
    release,
    step_arrays,
    term_index,
)
from prism_jax.tokenizer import Tokenizer


def enable_compilation_cache() -> None:
    """Persists compiled steps across processes (first run compiles, later runs load)."""
    if jax.config.jax_compilation_cache_dir is None:  # else the user's own directory
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "xla"))
    # Every bucket is cached, however fast it compiles (also in a directory the user chose):
    # the readouts are per (T, R, C) (258 executables for the default EngineConfig), each well
    # under a second, and together most of a start-up's compile time.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@dataclasses.dataclass(frozen=True)
class StepResult:
    probabilities: list[list[float]]  # per question, per option
    computed_tokens: int  # tokens the run computed (shared segments once, cache hits never)
    chains: list[list[int]]  # per question: the forest segments it reads
    segment_tokens: list[int]  # per segment: its token count
    segment_cached: list[bool]  # per segment: served by the prefix cache
    steps: int  # forward steps the run took
    seconds: float

    def cached_tokens(self, question: int) -> int:
        return sum(self.segment_tokens[s] for s in self.chains[question] if self.segment_cached[s])


class PoolTooSmall(DecisionRequestError):
    """The forest needs more KV pages than the whole pool holds."""


def _root_length(renderer: PromptRenderer) -> int:
    """How many leading prefix tokens are the same for every state (the instructions): the
    common token prefix of two renders with unrelated states, less one token for safety at
    the boundary. Only used to split a prefix that really starts with these tokens."""
    from prism_jax.questions import Question

    q = Question("noul", "x", ("true", "false"), (None, None))
    a = renderer.render("alpha 1", q).prefix
    b = renderer.render("{Zeta}", q).prefix
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return max(n - 1, 0)


class Engine:
    def __init__(
        self,
        config: ModelConfig,
        params: model.Params,
        tokenizer: Tokenizer | None,
        template: ChatTemplate | None,
        name: str = "prism",
        engine_config: EngineConfig | None = None,
        warmup: bool = False,
        progress: bool = True,
    ) -> None:
        self.config = config
        self.params = params
        self.tokenizer = tokenizer
        # Without a tokenizer (random-weight benchmarks, tests) only `run` on pre-rendered
        # token ids is available.
        self.renderer = PromptRenderer(tokenizer, template) if tokenizer else None
        self.name = name
        self.engine_config = engine_config or EngineConfig()
        enable_compilation_cache()
        self.pool = PagePool(self.engine_config.kv_pages, self.engine_config.page_size)
        self.cache = PrefixCache(self.pool, self.engine_config.prefix_cache_pages)
        self.runner = Runner(config, params, self.engine_config)
        self.root_len = _root_length(self.renderer) if self.renderer else 0
        self.shared_prefix_tokens_total = 0  # tokens computed once for several questions
        if warmup:
            self.runner.warmup(progress)

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str = "default",
        precision: Precision = "int8",
        name: str | None = None,
        engine_config: EngineConfig | None = None,
        warmup: bool = True,
        progress: bool = True,
    ) -> Engine:
        """Loads an HF safetensors directory, a .gguf file or a registered model name
        ("default" = Gemma 3 270M from PyPI), quantising to INT8 when precision is "int8" (two
        INT8 digits per row and weight: decides like FP32 at least as well as BF16) or
        "int8-1digit" (one digit: faster, less faithful; docs/ACCURACY.md); "int8-attn" and
        "int8-1digit-attn" attend in INT8 digits too (ops.tree_attention_digits).
        warmup=True (the default) compiles every step bucket now, with a progress bar, so no
        request ever waits for a compilation (the persistent compilation cache makes this fast
        after the first start); warmup=False compiles each bucket the first time it is used."""
        checkpoint = load_checkpoint(name_or_path)
        config, model_precision = ModelConfig.from_hf_config(checkpoint.hf_config).for_precision(
            precision
        )
        params = model.params_from_hf(config, checkpoint.tensors, model_precision)
        tokenizer = Tokenizer.from_dir(checkpoint.directory)
        template = ChatTemplate.from_dir(checkpoint.directory)
        return cls(
            config,
            params,
            tokenizer,
            template,
            name or str(name_or_path),
            engine_config,
            warmup,
            progress,
        )

    @property
    def precision(self) -> str:
        """The user-facing precision (config.PRECISIONS), e.g. "int8" or "int8-1digit"."""
        return self.config.precision_name(self.params.precision)

    def _check_fits(self, forest: Forest) -> None:
        longest = max(s.start + len(s.tokens) for s in forest.segments)
        if longest > self.config.max_position_embeddings:
            raise DecisionRequestError(
                f"prompt too long: {longest} positions; the model's context is "
                f"{self.config.max_position_embeddings} (shorten the state)"
            )
        pages = sum(self.pool.pages_for(len(s.tokens)) for s in forest.segments)
        if pages > self.pool.usable_pages:
            raise PoolTooSmall(
                f"request too large for the KV pool: needs {pages} pages of "
                f"{self.pool.page_size} tokens, the pool has {self.pool.usable_pages} "
                "(send fewer questions at once, or start the engine with more kv_pages)"
            )

    def run(
        self, rendered: list[RenderedQuestion], chunk: int | None = None, min_tokens: int = 0
    ) -> StepResult:
        """Option probabilities for rendered questions: one forest, prefix-cache lookups, then
        as many forward steps as the tokens to compute need (at most `chunk` tokens each;
        default the largest token bucket). min_tokens pads every step to at least that
        bucket (audits: 'a larger bucket gives the same bits')."""
        forest = build_forest(rendered, self.root_len)
        self._check_fits(forest)
        chunk = chunk or self.engine_config.max_step_tokens
        assert 1 <= chunk <= self.engine_config.max_step_tokens, (
            f"chunk must be in [1, {self.engine_config.max_step_tokens}], got {chunk}"
        )
        try:
            placements = place(forest, self.cache)
        except OutOfPages as err:
            raise DecisionRequestError(f"KV pool busy: {err}; retry later", status=503) from err
        start = time.perf_counter()
        completed = False
        try:
            table, steps = self._execute(forest, placements, chunk, min_tokens)
            completed = True
        finally:
            release(placements, self.cache, completed)
        seconds = time.perf_counter() - start
        rows = {r: r for r in range(len(forest.row_at))}  # the table is in forest row order
        probs = option_probabilities_host(table, term_index(forest, rows, table.shape[1]))
        return self._result(forest, placements, probs, steps, seconds)

    def _execute(self, forest: Forest, placements: list[Placement], chunk: int, min_tokens: int):
        """Runs the steps; returns the log-probability table f32 [R, Cmax] and the step count."""
        cmax = max(len(c) for c in forest.candidates)
        table = np.full((len(forest.row_at), cmax), -np.inf, np.float32)
        plans = plan_steps(forest, placements, chunk)
        for plan in plans:
            arrays = step_arrays(
                forest, placements, plan, self.engine_config, self.pool.num_pages, min_tokens
            )
            hidden = self.runner.forward(arrays)
            if not plan.rows:
                continue
            logits, logprobs, lse = self.runner.read(hidden, arrays)
            lse_at = {int(i): j for j, i in enumerate(arrays["lse_of"])}
            for i, r in enumerate(plan.rows):
                n = len(forest.candidates[r])
                if forest.use_lse[r]:  # f32 subtraction, as make_table_fn computes it
                    table[r, :n] = logits[i, :n] - lse[lse_at[i]]
                else:
                    table[r, :n] = logprobs[i, :n]
        return table, len(plans)

    def _result(self, forest, placements, probs, steps, seconds) -> StepResult:
        sizes = [len(s.tokens) for s in forest.segments]
        cached = [not p.computed for p in placements]
        computed = sum(n for n, c in zip(sizes, cached, strict=True) if not c)
        per_question = sum(
            sizes[s] for chain in forest.question_chains for s in chain if not cached[s]
        )
        self.shared_prefix_tokens_total += per_question - computed
        return StepResult(probs, computed, forest.question_chains, sizes, cached, steps, seconds)

    def decide(self, state: Any, questions: Mapping[str, Any]) -> dict[str, Any]:
        """System One: {id: question} about one state -> {"model", "answers", "usage",
        "x_cached_tokens"}. Raises DecisionRequestError (with its HTTP status) on bad input."""
        (response,) = self.decide_many([(state, questions)])
        if isinstance(response, DecisionRequestError):
            raise response
        return response

    def decide_many(self, requests: list[tuple[Any, Mapping[str, Any]]]) -> list[Any]:
        """Several System One requests in one forest (the server's batching entry): shared
        segments are computed once across requests, and each answer's bits equal those of the
        request sent alone.

        Returns, per request, its response dict or the DecisionRequestError that refuses it
        (one bad request never fails the others)."""
        parsed: list[Any] = []
        rendered: list[RenderedQuestion] = []
        for state, questions in requests:
            try:
                qs = parse_questions(questions)
                mine = [self._render(state, q) for q in qs.values()]
            except DecisionRequestError as err:
                parsed.append(err)
                continue
            parsed.append((qs, len(rendered), len(mine)))
            rendered.extend(mine)
        try:
            result = self.run(rendered) if rendered else None
        except PoolTooSmall:
            if len(requests) == 1:
                raise
            # Together they do not fit the pool: each request on its own (same bits).
            return [r for req in requests for r in self.decide_many([req])]
        return [
            item if isinstance(item, DecisionRequestError) else self._response(result, *item)
            for item in parsed
        ]

    def _render(self, state: Any, q) -> RenderedQuestion:
        try:
            return self.renderer.render(state, q)
        except (TypeError, UnicodeError) as err:  # the tokenizer refuses e.g. lone surrogates
            raise DecisionRequestError(
                f"the state or question is not valid Unicode text ({err}); send UTF-8 text "
                "without unpaired surrogate escapes",
                status=422,
            ) from err

    def _response(self, result: StepResult, qs, first: int, count: int) -> dict[str, Any]:
        probs = result.probabilities[first : first + count]
        answers = {
            qid: answer(q, np.asarray(p)) for (qid, q), p in zip(qs.items(), probs, strict=True)
        }
        segments = set().union(*result.chains[first : first + count])
        return {
            "model": self.name,
            "answers": answers,
            "usage": {
                "input_tokens": sum(result.segment_tokens[s] for s in segments),
                "output_tokens": 0,
            },
            "x_cached_tokens": sum(
                result.segment_tokens[s] for s in segments if result.segment_cached[s]
            ),
        }

    def stats(self) -> dict[str, float]:
        """Counters for /metrics (KV pool and prefix cache)."""
        c = self.cache.counters
        return {
            "kv_pages_total": self.pool.usable_pages,
            "kv_pages_used": self.pool.used_pages,
            "kv_cache_usage_perc": self.pool.used_pages / self.pool.usable_pages,
            "prefix_cache_pages": self.cache.cached_pages,
            "prefix_cache_hits": c.hits,
            "prefix_cache_queries": c.queries,
            "prefix_cache_hit_tokens": c.hit_tokens,
            "shared_prefix_tokens_total": self.shared_prefix_tokens_total,
            "kv_pool_bytes": self.pool.num_pages
            * kv_bytes_per_page(self.config, self.pool.page_size, self.params.precision),
            "compilations": self.runner.compilations,
        }

    def score(self, prompt: str, options: list[str]) -> dict[str, float]:
        """Raw candidate scoring: P(option | prompt) renormalised over `options` (each option
        is scored exactly over all its tokens; include a leading space where the text needs
        one)."""
        if not options:
            raise DecisionRequestError("score needs at least one option")
        result = self.run([self.renderer.render_raw(prompt, list(options))])
        return dict(zip(options, result.probabilities[0], strict=True))
