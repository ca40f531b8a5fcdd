"""A labelled decision (a System One question about a state with its right option) and the
seeded stratified sample the evaluation runs on."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from prism_jax.questions import Question, parse_question


@dataclasses.dataclass(frozen=True)
class Item:
    id: str
    set: str  # a report row: the shared file's stem or the olmo set's name
    stratum: str  # a finer group for sampling (BIG-bench task, MMLU subject, ...)
    state: Any
    question: dict[str, Any]  # the System One question body, sent as is
    gold: int  # index of the right option in the question's option order

    def parsed(self) -> Question:
        return parse_question(self.id, self.question)

    def state_key(self) -> str:
        """Items with equal keys share one state (one trunk in a forest)."""
        if isinstance(self.state, str):
            return self.state
        return json.dumps(self.state, sort_keys=True, ensure_ascii=False)


def gold_index(q: Question, gold: Any) -> int:
    """The index of `gold` among q's options: a key (choice), a boolean (noul: true is option
    0) or a 0-based level (score). Raises ValueError when gold is not one of them."""
    if q.kind == "noul":
        if not isinstance(gold, bool):
            raise ValueError(f"noul gold must be true or false, got {gold!r}")
        return 0 if gold else 1
    if q.kind == "score":
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(q.keys):
            raise ValueError(f"score gold must be a level index below {len(q.keys)}, got {gold!r}")
        return gold
    if gold not in q.keys:
        raise ValueError(f"choice gold {gold!r} is not an option key")
    return q.keys.index(gold)


def largest_remainder(total: int, sizes: dict[str, int]) -> dict[str, int]:
    """Splits `total` in proportion to `sizes` (Hamilton's method; ties by name), never giving
    a group more than its size."""
    whole = sum(sizes.values())
    if total >= whole:
        return dict(sizes)
    exact = {k: total * n / whole for k, n in sizes.items()}
    out = {k: int(v) for k, v in exact.items()}
    order = sorted(sizes, key=lambda k: (-(exact[k] - out[k]), k))
    for k in order[: total - sum(out.values())]:
        out[k] += 1
    return out


def set_quotas(total: int, sizes: dict[str, int], min_per_set: int) -> dict[str, int]:
    """Per-set sample sizes: proportional, except that every set gets at least
    min(size, min_per_set) (the small hand-written decision files would otherwise all but
    vanish next to BIG-bench and MMLU)."""
    if total >= sum(sizes.values()):
        return dict(sizes)
    fixed: dict[str, int] = {}
    while True:
        free = {k: n for k, n in sizes.items() if k not in fixed}
        quota = largest_remainder(max(total - sum(fixed.values()), 0), free)
        low = {k for k, q in quota.items() if q < min(sizes[k], min_per_set)}
        if not low:
            return {**fixed, **quota}
        fixed.update({k: min(sizes[k], min_per_set) for k in low})


def stratified_sample(
    items: Sequence[Item], limit: int | None, seed: int = 0, min_per_set: int = 0
) -> list[Item]:
    """A seeded stratified sample of `limit` items (all items when limit is None or larger).

    Sets get set_quotas(); inside a set, strata get largest-remainder shares and are sampled
    without replacement with random.Random(f"{seed}:{stratum}"), so a stratum's draw does not
    depend on the others. The result is shuffled with the seed: any prefix of it (a run cut
    short) is itself spread over the sets."""
    by_set: dict[str, dict[str, list[Item]]] = defaultdict(lambda: defaultdict(list))
    for item in items:
        by_set[item.set][item.stratum].append(item)
    if limit is None or limit >= len(items):
        chosen = list(items)
    else:
        quotas = set_quotas(
            limit, {s: sum(map(len, g.values())) for s, g in by_set.items()}, min_per_set
        )
        chosen = []
        for name, strata in sorted(by_set.items()):
            shares = largest_remainder(quotas[name], {k: len(v) for k, v in strata.items()})
            for stratum, members in sorted(strata.items()):
                rng = random.Random(f"{seed}:{name}:{stratum}")
                chosen += rng.sample(members, shares[stratum])
    chosen.sort(key=lambda it: (it.set, it.id))
    random.Random(f"{seed}:order").shuffle(chosen)
    return chosen
