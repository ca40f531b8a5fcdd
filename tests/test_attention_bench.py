"""benchmarks/attention_bench.py: the CPU smoke run (--quick) and its work accounting against
hand counts (the timings it prints here are not results)."""

import json
import pathlib
import subprocess
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "attention_bench.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import attention_cases as ac  # noqa: E402

PRISM_FIELDS = set(
    "scenario what kv_dtype window impl tokens step_tokens keys_attended kv_rows_read flops "
    "kv_bytes bytes reps median_us min_us max_us runs tflops tbps of_bf16_mm of_copy".split()
)


def _tables(positions, chain_of, segs, pages_flat):
    return {
        "positions": np.asarray(positions, np.int32),
        "chain_of": np.asarray(chain_of, np.int32),
        "chain_segments": np.asarray(segs, np.int32),
        "pages_flat": np.asarray(pages_flat, np.int32),
    }


def test_account_one_chain_by_hand():
    # One segment of 5 keys (positions 0..4) on page 1 (L = 8: rows 8..12); queries at 3 and 4,
    # then a padding token. N = 2, K = 1, H = 4, 4-byte q and KV.
    arrays = _tables([3, 4, -1], [0, 0, -1], [[[0, 5, 0]]], [1])
    a = ac.account(arrays, 8, 0, n=2, k=1, h=4, kv_item=4, q_item=4)
    assert a["tokens"] == 2 and a["step_tokens"] == 3
    assert a["keys_attended"] == 4 + 5
    assert a["flops"] == 2 * 2 * 2 * 4 * 9  # (q.k + p.v) * N * H * keys
    assert a["kv_rows_read"] == 5 and a["kv_bytes"] == 2 * 5 * 1 * 4 * 4
    # + q read and out written (2 tokens * N * H * 4) + k/v read and written (2 * 2 * 2 * K * H * 4)
    assert a["bytes"] == 160 + 2 * 2 * 2 * 4 * 4 + 2 * 2 * 2 * 1 * 4 * 4
    w = ac.account(arrays, 8, 2, n=2, k=1, h=4, kv_item=4, q_item=4)  # window 2
    assert w["keys_attended"] == 2 + 2 and w["kv_rows_read"] == 3  # positions 2, 3, 4
    assert w["bytes"] == 2 * 3 * 16 + 256


def test_account_reads_a_shared_segment_once():
    # Chains 0 = [root 0..3] and 1 = [root, branch 4..5], page size 4: the root is read once.
    segs = [[[0, 4, 0], [0, 0, 0]], [[0, 4, 0], [4, 2, 1]]]
    arrays = _tables([3, 4, 5], [0, 1, 1], segs, [1, 2])
    a = ac.account(arrays, 4, 0, n=1, k=1, h=1, kv_item=2, q_item=2)
    assert a["keys_attended"] == 4 + 5 + 6
    assert a["kv_rows_read"] == 6 and a["kv_bytes"] == 2 * 6 * 2
    b, tq, s, mask = ac.dense_problem(arrays, 4, 0)
    assert (b, tq, s) == (1, 3, 6) and mask.sum() == 15


def test_engine_cases_by_hand():
    from prism_jax.config import EngineConfig

    e = EngineConfig(token_buckets=(8, 16, 32, 64))
    dec = ac.decode(e, 3, 20)  # 3 x (20 cached + 1 new): each new token sees 21 keys
    a = ac.account(dec.arrays, 16, 0, n=2, k=1, h=4, kv_item=4, q_item=4)
    assert (a["tokens"], a["step_tokens"], a["keys_attended"]) == (3, 8, 63)
    b, tq, s, mask = ac.dense_problem(dec.arrays, 16, 0)
    assert (b, tq, s) == (3, 1, 21) and mask.all()
    f = ac.forest_prefill(e, 8, 16, 3, 4)
    keys = 8 * 9 // 2 + (16 * 8 + 16 * 17 // 2) + 3 * (4 * 24 + 4 * 5 // 2)
    assert ac.account(f.arrays, 16, 0, 4, 2, 32, 4, 4)["keys_attended"] == keys == 618
    q = ac.one_question(e, 20)  # one chain, causal: token i sees i + 1 keys
    a = ac.account(q.arrays, 16, 0, 4, 2, 32, 4, 4)
    assert (a["tokens"], a["step_tokens"], a["keys_attended"]) == (20, 32, 20 * 21 // 2)
    fu = ac.follow_up(e, 8, 40, 4)  # 4 new tokens at 48..51 on a cached 48-token prefix
    a = ac.account(fu.arrays, 16, 0, 4, 2, 32, 4, 4)
    assert (a["tokens"], a["step_tokens"], a["keys_attended"]) == (4, 8, 49 + 50 + 51 + 52)
    assert a["kv_rows_read"] == 52
    last = ac.state_chunk(e, 256, -1)  # chunk 4/4: queries 192..255 over the whole prefix
    chunk = ac.account(last.arrays, 16, 32, 4, 2, 32, 4, 4)
    assert chunk["keys_attended"] == 64 * 32 and chunk["kv_rows_read"] == 64 + 31


def test_quick_run_writes_rows(tmp_path):
    cmd = [sys.executable, str(SCRIPT), "--quick", "--runs", "3", "--dtypes", "f32"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    rows = [json.loads(x) for x in (tmp_path / "attention.jsonl").read_text().splitlines()]
    assert printed == rows and rows[0]["meta"]["quick"]
    prism = [r for r in rows if r.get("impl") == "prism"]
    # question, forest, follow-up, first chunk, 2 last chunks, decode; windowed: no question or
    # forest (they have fewer tokens than the window)
    assert len(prism) == 7 + 5
    windowed_names = {r["scenario"] for r in prism if r["window"]}
    assert not any(n.startswith(("question", "forest")) for n in windowed_names)
    assert "followup_8+120+4" in windowed_names
    for r in prism:
        assert PRISM_FIELDS <= set(r), PRISM_FIELDS - set(r)
        assert r["runs"] == 3 and 0 < r["min_us"] <= r["median_us"] <= r["max_us"]
        assert r["flops"] > 0 and r["bytes"] > r["kv_bytes"] > 0 and r["tflops"] > 0
        assert r["flops"] == 4 * 4 * 32 * r["keys_attended"]
    forest = next(r for r in prism if r["scenario"].startswith("forest"))
    assert forest["keys_attended"] == 618 and forest["tokens"] == 36
    windowed = {r["scenario"]: r for r in prism if r["window"]}
    full = {r["scenario"]: r for r in prism if not r["window"]}
    assert windowed["state256_last_chunk"]["kv_bytes"] < full["state256_last_chunk"]["kv_bytes"]
    xla = [r for r in rows if r.get("impl") == "xla_dense"]
    assert len(xla) == len(prism) and all(r["median_us"] > 0 for r in xla)
    whole = [r for r in rows if r.get("impl") == "prism_estimate"]
    assert len(whole) == 4 and all(r["estimate_us"] > 0 for r in whole)
    assert {"xla_copy", "xla_matmul_bf16", "xla_matmul_f32_highest"} <= {
        r.get("impl") for r in rows
    }
    assert "| state256_last_chunk |" in (tmp_path / "attention.md").read_text()
