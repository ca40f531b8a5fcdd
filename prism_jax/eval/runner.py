"""Runs labelled items through engines: items about one state become one request (one trunk,
many branches), requests are packed into forest steps under a token budget, and every step
is decided once per variant (precision x render style) so that all variants see the same
items in the same order. Probabilities stream to JSONL as they come (a run can resume).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from prism_jax.eval.items import Item
from prism_jax.prompts import DEFAULT_STYLE, PromptRenderer, RenderStyle
from prism_jax.questions import DecisionRequestError, Question


@dataclasses.dataclass(frozen=True)
class Variant:
    precision: str
    style: RenderStyle = DEFAULT_STYLE

    @property
    def name(self) -> str:
        return (
            self.precision if self.style == DEFAULT_STYLE else f"{self.precision}/{self.style.name}"
        )


@dataclasses.dataclass
class RunResult:
    probs: dict[str, dict[str, list[float]]]  # variant name -> item id -> option probabilities
    failed: dict[str, str]  # item id -> why a variant could not decide it
    seconds: dict[str, float]  # variant name -> engine seconds in this process
    items: int  # items decided by every variant in this process (not refused)
    stopped_early: bool = False


def answer_probs(q: Question, answer: Mapping[str, Any]) -> list[float]:
    """Option probabilities in q's option order from a System One answer."""
    if q.kind == "noul":
        p = float(answer["noul"])
        return [p, 1.0 - p]
    table = answer["probabilities"]
    if q.kind == "choice":
        return [float(table[k]) for k in q.keys]
    return [float(table[str(i)]) for i in range(len(q.keys))]


def group_by_state(items: Sequence[Item]) -> list[list[Item]]:
    """Items about the same state, in order of first appearance: one request each."""
    groups: dict[str, list[Item]] = {}
    for item in items:
        groups.setdefault(item.state_key(), []).append(item)
    return list(groups.values())


def request_tokens(renderers: Iterable[PromptRenderer], group: Sequence[Item]) -> int:
    """Tokens a request adds to a step under the most verbose renderer: the prefix once,
    then every question's branch and option tokens."""
    most = 0
    for renderer in renderers:
        rendered = [renderer.render(group[0].state, it.parsed()) for it in group]
        total = len(rendered[0].prefix) + sum(
            len(r.branch) + sum(map(len, r.options)) for r in rendered
        )
        most = max(most, total)
    return most


def plan_steps(sizes: Sequence[int], budget: int) -> list[list[int]]:
    """Greedy packing of requests (in order) into steps of at most `budget` tokens; a request
    larger than the budget gets a step of its own."""
    steps: list[list[int]] = []
    used = budget + 1
    for i, size in enumerate(sizes):
        if used + size > budget:
            steps.append([])
            used = 0
        steps[-1].append(i)
        used += size
    return steps


def load_done(path: Path) -> dict[str, list[float]]:
    if not path.is_file():
        return {}
    done = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = row["probs"]
    return done


def predictions_path(out: Path, variant: Variant) -> Path:
    return out / f"predictions-{variant.name.replace('/', '_')}.jsonl"


class Runner:
    """Decides items with one engine per precision (Engine.decide_many, one forest a step)."""

    def __init__(
        self, engines: Mapping[str, Any], variants: Sequence[Variant], budget_tokens: int = 512
    ) -> None:
        self.engines = engines
        self.variants = list(variants)
        self.budget = budget_tokens
        first = next(iter(engines.values()))
        self.renderers = {
            v.style: PromptRenderer(first.tokenizer, first.renderer.template, v.style)
            for v in self.variants
        }

    def _decide(self, variant: Variant, group_list: Sequence[Sequence[Item]]) -> list[Any]:
        engine = self.engines[variant.precision]
        default = engine.renderer
        engine.renderer = self.renderers[variant.style]
        requests = [(g[0].state, {it.id: it.question for it in g}) for g in group_list]
        try:
            try:
                return engine.decide_many(requests)
            except DecisionRequestError:  # the step as a whole is refused: one at a time
                out = []
                for request in requests:
                    try:
                        out.extend(engine.decide_many([request]))
                    except DecisionRequestError as err:
                        out.append(err)
                return out
        finally:
            engine.renderer = default

    @staticmethod
    def _record(
        variant: Variant,
        chosen: Sequence[Sequence[Item]],
        answers: Sequence[Any],
        probs: dict[str, list[float]],
        failed: dict[str, str],
        sink: Any,
    ) -> None:
        """Option probabilities of one variant's step into probs (and the sink), refusals into
        failed."""
        for group, response in zip(chosen, answers, strict=True):
            for it in group:
                if isinstance(response, Exception):
                    failed[it.id] = f"{variant.name}: {response}"
                    continue
                p = answer_probs(it.parsed(), response["answers"][it.id])
                probs[it.id] = p
                if sink:
                    sink.write(json.dumps({"id": it.id, "probs": p}) + "\n")
        if sink:
            sink.flush()

    def run(
        self,
        items: Sequence[Item],
        out: Path | None = None,
        progress: bool = True,
        max_seconds: float | None = None,
    ) -> RunResult:
        files = {}
        probs: dict[str, dict[str, list[float]]] = {}
        for v in self.variants:
            probs[v.name] = load_done(predictions_path(out, v)) if out else {}
            if out:
                files[v.name] = open(predictions_path(out, v), "a", encoding="utf-8")
        todo = [it for it in items if not all(it.id in probs[v.name] for v in self.variants)]
        groups = group_by_state(todo)
        sizes = [request_tokens(self.renderers.values(), g) for g in groups]
        steps = plan_steps(sizes, self.budget)
        failed: dict[str, str] = {}
        seconds = {v.name: 0.0 for v in self.variants}
        decided = 0
        start = time.perf_counter()
        bar = tqdm(
            total=len(items),
            initial=len(items) - len(todo),
            unit="item",
            disable=not progress,
            file=sys.stderr,
            dynamic_ncols=True,
            smoothing=0.05,
        )
        stopped = False
        try:
            for step in steps:
                if max_seconds is not None and time.perf_counter() - start > max_seconds:
                    stopped = True
                    break
                chosen = [groups[i] for i in step]
                for v in self.variants:
                    t = time.perf_counter()
                    answers = self._decide(v, chosen)
                    seconds[v.name] += time.perf_counter() - t
                    self._record(v, chosen, answers, probs[v.name], failed, files.get(v.name))
                n = sum(len(g) for g in chosen)
                decided += sum(it.id not in failed for g in chosen for it in g)
                bar.update(n)
        finally:
            bar.close()
            for f in files.values():
                f.close()
        return RunResult(probs, failed, seconds, decided, stopped)


def paired(items: Sequence[Item], result: RunResult) -> list[Item]:
    """The items every variant decided (the ones metrics compare)."""
    return [
        it
        for it in items
        if it.id not in result.failed and all(it.id in p for p in result.probs.values())
    ]
