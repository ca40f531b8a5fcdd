#!/usr/bin/env bash
# Launch-overhead probe on the GPU: the 27B engine (no bf16 baseline) under several XLA
# command-buffer settings, each traced, so the forward's wall time, its kernel time and its idle
# gaps (benchmarks/trace_gaps.py rows in breakdown.jsonl) can be compared setting by setting.
# Usage (device tool, after gpu_suite.sh's set-up or with PYTHONPATH set):
#   OUT=dir PROBE_ARGS="--single-digit" bash benchmarks/launch_probe.sh
# Optional: PROBES="default off all" (names below), PROBE_SCENARIOS, PROBE_TIMEOUT (s per probe).
# Each probe writes $OUT/probe_<name>/ (e2e.jsonl, breakdown.jsonl, e2e.log). Whether command
# buffers ran shows in the trace (command_buffer::* host events), not in the optimized HLO: this
# XLA forms them from thunks after the HLO passes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/launch_probe}
PY=${PY:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

flags_for() {
  case $1 in
    default) echo "" ;;  # jaxlib's own command-buffer defaults
    off) echo "--xla_gpu_enable_command_buffer=" ;;
    all) echo "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN" \
      "--xla_gpu_graph_min_graph_size=1" ;;
    *) echo "unknown probe $1 (default, off, all)" >&2; return 1 ;;
  esac
}

rc=0
for probe in ${PROBES:-default off all}; do
  flags=$(flags_for "$probe") || exit 2
  dir=$OUT/probe_$probe
  mkdir -p "$dir"
  echo "## probe $probe: XLA_FLAGS=$flags"
  # shellcheck disable=SC2086 (PROBE_ARGS is a list of arguments)
  XLA_FLAGS="$flags" XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
    timeout -s INT "${PROBE_TIMEOUT:-150}" $PY benchmarks/e2e_decide.py --preset gemma3-27b \
    --out "$dir" --no-baseline --profile --trace --runs 10 \
    --scenarios "${PROBE_SCENARIOS:-one_question,state_3_questions,follow_up_4k}" \
    ${PROBE_ARGS:-} >"$dir/e2e.log" 2>&1
  r=$?
  rc=$(( rc || r ))
  grep -h '"kind": "gaps"\|prism_jax ' "$dir/e2e.log" | tail -8
done
exit $rc
