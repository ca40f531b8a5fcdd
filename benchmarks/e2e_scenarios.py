"""The end-to-end benchmark's workload (benchmarks/e2e_decide.py): the three scenarios of
DESIGN.md's performance targets with random token ids, the token buckets their steps pad to,
the runner executables they need, and the model presets. Imported by e2e_decide.py and the
probes that replay its scenarios (dispatch_probe.py, host_prep.py, host_after_forward.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from prism_jax.config import GEMMA3_27B
from prism_jax.forest import bucket
from prism_jax.prompts import RenderedQuestion

# The scoreboard (DESIGN.md): our targets and the published Prism figures on an H200, in ms.
TARGET_MS = {"one_question": 12.0, "state_3_questions": 15.0, "follow_up_4k": 7.0}
PRISM_MS = {"one_question": 19.0, "state_3_questions": 17.4, "follow_up_4k": 5.4}
TITLES = {
    "one_question": "one question, ~256-token prompt",
    "state_3_questions": "one state + 3 questions (root 64, state 256, 3x32)",
    "follow_up_4k": "follow-up question on a cached 4,096-token state",
}
ROOT_LEN, BRANCH, OPTIONS = 64, 32, 4
# Small Gemma 3 (one sliding and one global layer) for CPU smoke tests of this script.
TINY = GEMMA3_27B.replace(
    vocab_size=4096, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
    num_kv_heads=1, head_dim=16, query_pre_attn_scalar=16, embed_scale=32**0.5,
    layer_types=("sliding", "global"),
)  # fmt: skip
PRESETS = {"gemma3-27b": GEMMA3_27B, "tiny": TINY}


# --- workload ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Scenario:
    name: str
    questions: list[RenderedQuestion]  # the timed request (one forest)
    prefill: list[RenderedQuestion]  # run once, untimed, before the timed runs (fills the cache)
    cold: bool  # clear the prefix cache before each timed run
    shapes: dict


def _question(rng, vocab: int, prefix: tuple[int, ...]) -> RenderedQuestion:
    branch = tuple(int(t) for t in rng.integers(0, vocab, BRANCH))
    options = rng.choice(vocab, OPTIONS, replace=False)  # distinct: the single-token fast path
    return RenderedQuestion(prefix, branch, tuple((int(o),) for o in options))


def scenarios(vocab: int, seed: int = 0) -> list[Scenario]:
    rng = np.random.default_rng(seed)

    def ids(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(0, vocab, n))

    root = ids(ROOT_LEN)
    one = _question(rng, vocab, root + ids(160))
    state = root + ids(256)
    three = [_question(rng, vocab, state) for _ in range(3)]
    long_state = root + ids(4096 - ROOT_LEN)
    first, follow = _question(rng, vocab, long_state), _question(rng, vocab, long_state)
    base = dict(branch=BRANCH, options=OPTIONS, option_tokens=1, root=ROOT_LEN)
    long = dict(base, state=4096 - ROOT_LEN, questions=1, cached_tokens=4096)
    return [
        Scenario("one_question", [one], [], True,
                 dict(base, state=160, questions=1, prompt_tokens=256)),
        Scenario("state_3_questions", three, [], True,
                 dict(base, state=256, questions=3, forest_tokens=416)),
        Scenario("follow_up_4k", [follow], [first], False,
                 dict(long, prompt_tokens=4096 + BRANCH)),
    ]  # fmt: skip


# Steps pad to the next multiple of 64 up to 512 (32 for a lone branch), then 1024 and 2048:
# padding is computed work (the forest's 416 tokens padded to 512 cost ~20 % more GEMM time),
# and only the buckets a scenario uses are compiled.
TOKEN_BUCKETS = (32, 64, 128, 192, 256, 320, 384, 448, 512, 1024, 2048)


def step_keys(runner, steps: list[tuple[int, int]]) -> list[tuple]:
    """Runner executables for steps of (tokens, readout rows), single-token options."""
    e = runner.engine
    keys = []
    c = bucket(OPTIONS, e.candidate_buckets, "candidates")
    for tokens, rows in steps:
        t = bucket(tokens, e.token_buckets, "tokens")
        r = bucket(max(rows, 1), e.row_buckets, "rows")
        keys += runner.step_keys(t, r, c if rows else None)
    return list(dict.fromkeys(keys))


def engine_steps(s: Scenario, chunk: int) -> list[tuple[int, int]]:
    """The steps the engine takes for the scenario's prefill and timed runs."""
    if s.name == "follow_up_4k":
        n = len(s.prefill[0].prefix) + BRANCH
        prefill = [(min(chunk, n - lo), int(lo + chunk >= n)) for lo in range(0, n, chunk)]
        return prefill + [(BRANCH, 1)]
    q = s.questions
    tokens = len(q[0].prefix) + BRANCH * len(q)
    assert tokens <= chunk, f"{s.name}: {tokens} tokens do not fit one step of {chunk}"
    return [(tokens, len(q))]
