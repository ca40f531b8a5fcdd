#!/usr/bin/env bash
# tree_attention's tile dots on CUDA cores (fma, the default) against tensor cores
# (PRISM_TREE_ATTENTION_DOTS=tf32x3), one device call after gpu_suite.sh built the extension:
# attention_bench.py on the e2e steps' cases per dots mode ($OUT/<mode>/attention.md), then
# Nsight Compute's stall reasons of split pass 1 per mode on the question case
# ($OUT/stalls_<mode>.txt). Usage: OUT=... bash benchmarks/attention_dots_ab.sh
set -uo pipefail
# shellcheck source=benchmarks/ncu_env.sh
source "$(dirname "$0")/ncu_env.sh"  # cd to the root; OUT, PY, NCU
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
CASES=${AB_CASES:-question,followup}
for mode in fma tf32x3; do
  echo "## attention_bench, dots $mode"
  mkdir -p "$OUT/$mode"
  PRISM_TREE_ATTENTION_DOTS=$mode timeout -s INT "${AB_TIMEOUT:-90}" \
    $PY benchmarks/attention_bench.py --cases "$CASES" --dtypes f32 --runs 10 --cap-s 0.5 \
    --budget-s 60 --out "$OUT/$mode" >"$OUT/$mode/attention.log" 2>&1
  echo "rc=$?"
  grep -v '^{' "$OUT/$mode/attention.md" 2>/dev/null | head -20
done
metrics='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
for mode in fma tf32x3; do
  echo "## ncu stalls, dots $mode"
  PRISM_TREE_ATTENTION_DOTS=$mode timeout "${NCU_TIMEOUT:-90}" "$NCU" --clock-control none \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
    --section Occupancy --metrics "$metrics" -k 'regex:PartialKernel' --launch-count 1 \
    -f -o "$OUT/ncu_$mode" $PY benchmarks/attention_bench.py --cases question --dtypes f32 \
    --runs 3 --cap-s 0.2 --budget-s 30 --out "/tmp/ncu_ab_$mode" >"$OUT/ncu_$mode.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$OUT/ncu_$mode.ncu-rep" --page raw --csv >"$OUT/ncu_raw_$mode.csv" 2>&1
  $PY benchmarks/ncu_stalls.py "$OUT/ncu_raw_$mode.csv" --top 8 | tee "$OUT/stalls_$mode.txt"
  "$NCU" -i "$OUT/ncu_$mode.ncu-rep" --page details --csv 2>/dev/null |
    grep -E '"(Duration|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|SM Active Cycles|Elapsed Cycles|Eligible Warps Per Scheduler)"' |
    awk -F'","' '{print $(NF-2) " = " $NF}' | tee "$OUT/ncu_summary_$mode.txt"
done
