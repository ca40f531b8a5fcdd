#!/usr/bin/env bash
# A/B of e2e_decide.py settings in one device call: the same extension and tree, each variant's
# extra arguments in turn (engine options such as --layers-per-call, --readout-memory), so the
# settings are compared in one machine start. Run after gpu_suite.sh has installed the wheels
# and the extension:
#   PREBUILT='.carry/s44/_prism_ops*.so' TESTS=none REPORT=0 bash benchmarks/gpu_suite.sh
#   VARIANTS="old=--layers-per-call,8,--first-layers,2,--readout-memory,device new=" \
#     ORDER="old new new old" bash benchmarks/args_ab.sh
# Environment:
#   VARIANTS="name=arg,arg ..."  each variant's extra e2e_decide.py arguments, comma-separated
#                                (empty: the defaults)
#   ORDER="a b b a"              the runs, in order (ABBA shows drift)
#   E2E_ARGS="..."               arguments of every run (default: one digit, no baseline, 20 runs)
#   E2E_TIMEOUT=120              seconds per run
# Writes $OUT/<run index>_<name>/ (e2e.jsonl, e2e.log) and prints each run's medians, then
# $OUT/summary.md (benchmarks/args_ab_summary.py).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/args_ab}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD

declare -A extra
for v in ${VARIANTS:?set VARIANTS=\"name=arg,arg ...\"}; do extra[${v%%=*}]=${v#*=}; done
rc=0
i=0
for name in ${ORDER:?set ORDER=\"name ...\"}; do
  [ -n "${extra[$name]+set}" ] || { echo "ORDER names $name, which VARIANTS lacks" >&2; exit 2; }
  i=$((i + 1))
  dir=$OUT/${i}_$name
  mkdir -p "$dir"
  args=${extra[$name]//,/ }
  echo "$name: $args" >"$dir/variant.txt"
  # shellcheck disable=SC2086 (E2E_ARGS and args are lists of arguments)
  timeout -s INT "${E2E_TIMEOUT:-120}" $PY benchmarks/e2e_decide.py --preset "${PRESET:-gemma3-27b}" \
    --out "$dir" ${E2E_ARGS:---single-digit --no-baseline --runs 20} $args >"$dir/e2e.log" 2>&1
  rc=$(( rc || $? ))
done
$PY benchmarks/args_ab_summary.py "$OUT" | tee "$OUT/summary.md"
exit $rc
