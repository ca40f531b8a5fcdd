#!/usr/bin/env bash
# One device call for a kernel patch not on main: apply PATCH (a carried file, e.g. from
# `git show <commit> -- cc/ > .carry/x.patch`), build, trace the one-digit 27B steps (per-kernel
# GPU time in OUTDIR/e2e_one/breakdown.jsonl, to set against main's in an earlier folder: kernel
# times repeat within ~1 % across machine starts, walls do not), then run TESTS on it.
# Usage (device tool, carry [".whl", ".carry"]):
#   TESTS="tests/ops/test_tree_attention_split.py" bash benchmarks/patch_trace.sh .carry/x.patch DIR
set -u
patch_file=${1:?usage: patch_trace.sh PATCH OUTDIR}
O=${2:?usage: patch_trace.sh PATCH OUTDIR}
mkdir -p "$O"
patch -p1 < "$patch_file" > "$O/patch.log" 2>&1 || { cat "$O/patch.log"; exit 1; }
OUT=$O TESTS=none REPORT=0 E2E=1 E2E_DIGITS=one E2E_ARGS="--runs 30 --no-baseline --trace" \
  E2E_TIMEOUT=${E2E_TIMEOUT:-60} bash benchmarks/gpu_suite.sh > "$O/suite.log" 2>&1
echo "suite rc=$?"
rm -rf "$O/e2e_one/trace"
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
# shellcheck disable=SC2086 (TESTS is a list of pytest targets)
timeout -s INT "${TESTS_TIMEOUT:-90}" python3 -m pytest -q -n 4 -p no:cacheprovider \
  ${TESTS:-tests/ops} 2>&1 | tail -5 > "$O/pytest.txt"
echo "tests: $(tail -1 "$O/pytest.txt")"
