#!/usr/bin/env bash
# One device call that A/Bs a kernel patch against main in the same machine start, then runs the
# e2e suite with its baselines on main. Stages run in order, each only while DEADLINE seconds
# (from the start) allow, so the call reports before the device tool's limit:
#   1. main: build, then MAIN_TESTS (pytest targets; default none), then a traced e2e per
#      digit mode in MAIN_TRACE (default "one"; per-kernel GPU time: OUTDIR/main/ab_<mode>);
#   2. the patch (a carried file, e.g. `git show <commit> -- cc/ > .carry/x.patch`; PATCH "none"
#      skips this stage): applied, rebuilt, traced the same way (OUTDIR/patch/ab_one), then
#      TESTS on it;
#   3. main's extension back, the e2e with its generic BF16 baseline per digit mode in DIGITS
#      (default "two one": OUTDIR/main/e2e_two, e2e_one), --runs RUNS (default 10).
# Kernel times repeat within ~1 % across starts and walls do not, so stage 1 and 2 compare
# breakdown.jsonl's kernel rows. The device copy's git metadata can lag its working tree (session
# 31's JSON named 393dfc5+dirty for 0c524d7), so write this checkout's commit into the command as
# PRISM_COMMIT, which every JSON line then records. Usage (device tool, carry [".whl", ".carry"]):
#   PRISM_COMMIT=<git rev-parse --short HEAD here> TESTS="tests/ops/test_tree_attention_split.py" \
#     bash benchmarks/patch_ab.sh .carry/x.patch $OUT/ab 560
set -u
patch_file=${1:?usage: patch_ab.sh PATCH OUTDIR DEADLINE}
O=${2:?usage: patch_ab.sh PATCH OUTDIR DEADLINE}
DEADLINE=${3:?usage: patch_ab.sh PATCH OUTDIR DEADLINE}
mkdir -p "$O/main" "$O/patch"
[ -n "${PRISM_COMMIT:-}" ] ||
  echo "PRISM_COMMIT unset: the JSON records the device copy's git HEAD, which can lag its tree" >&2
T0=$(date +%s)
el() { echo $(($(date +%s) - T0)); }
left() { echo $((DEADLINE - $(date +%s) + T0)); }

OUT=$O/main TESTS=none REPORT=0 bash benchmarks/gpu_suite.sh >"$O/main/suite.log" 2>&1 ||
  { tail -30 "$O/main/suite.log"; exit 1; }
echo "main build at $(el) s"
export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 XLA_PYTHON_CLIENT_PREALLOCATE=false
e2e() { # dir seconds args...
  local dir=$1 secs=$2
  shift 2
  mkdir -p "$dir"
  timeout -s INT "$secs" python3 benchmarks/e2e_decide.py --preset gemma3-27b --out "$dir" "$@" \
    >"$dir/e2e.log" 2>&1
  echo "$dir rc=$? at $(el) s"
  rm -rf "$dir/trace"
}
traced=(--runs 30 --no-baseline --trace)
digit_args() { [ "$1" = one ] && echo --single-digit; }
if [ -n "${MAIN_TESTS:-}" ]; then
  # shellcheck disable=SC2086 (MAIN_TESTS is a list of pytest targets)
  timeout -s INT "${MAIN_TESTS_TIMEOUT:-120}" python3 -m pytest -q -n "${PYTEST_WORKERS:-8}" -p no:cacheprovider \
    $MAIN_TESTS 2>&1 | tail -8 >"$O/main/pytest.txt"
  echo "main tests: $(tail -1 "$O/main/pytest.txt") at $(el) s"
fi
for mode in ${MAIN_TRACE:-one}; do
  # shellcheck disable=SC2046 (digit_args is empty or one word)
  [ "$(left)" -gt 60 ] && e2e "$O/main/ab_$mode" 60 "${traced[@]}" $(digit_args "$mode")
done
so=$(ls prism_jax/_prism_ops*.so)
cp "$so" /tmp/main_ops.so
if [ "$patch_file" != none ] && [ "$(left)" -gt 150 ]; then
  patch -p1 <"$patch_file" >"$O/patch/patch.log" 2>&1 &&
    cmake --build build/gpu -j 16 >"$O/patch/build.log" 2>&1 && cp build/gpu/_prism_ops*.so prism_jax/
  echo "patch build rc=$? at $(el) s"
  [ "$(left)" -gt 60 ] && e2e "$O/patch/ab_one" 50 "${traced[@]}" --single-digit
  t=$(($(left) - 200))
  [ "$t" -gt 90 ] && t=90
  # shellcheck disable=SC2086 (TESTS is a list of pytest targets)
  [ "$t" -gt 15 ] && timeout -s INT "$t" python3 -m pytest -q -n "${PYTEST_WORKERS:-8}" -p no:cacheprovider \
    ${TESTS:-tests/ops} 2>&1 | tail -5 >"$O/patch/pytest.txt"
  echo "patch tests: $(tail -1 "$O/patch/pytest.txt" 2>/dev/null) at $(el) s"
  cp /tmp/main_ops.so "$so"
fi
modes=(${DIGITS:-two one})
for i in "${!modes[@]}"; do
  digits=${modes[$i]}
  t=$((($(left) - 5) / (${#modes[@]} - i)))  # an even share of what is left for each mode
  # shellcheck disable=SC2046 (digit_args is empty or one word)
  [ "$t" -gt 40 ] && e2e "$O/main/e2e_$digits" "$t" --runs "${RUNS:-10}" $(digit_args "$digits")
done
echo "end at $(el) s"
