#!/usr/bin/env bash
# Nsight Compute's launch statistics and occupancy of the memory-bound ops' kernels at the
# item-3 sizes (benchmarks/occupancy_probe.py): the shared-memory configuration the driver chose,
# the blocks each resource allows an SM, theoretical and achieved occupancy, duration.
# Run on the GPU machine after gpu_suite.sh installed the extension:
#   OUT=... bash benchmarks/occupancy_ncu.sh      -> $OUT/occupancy.csv, $OUT/occupancy.txt
# NCU_SECTIONS adds sections (e.g. "WarpStateStats SchedulerStats": why warps stall, listed in
# occupancy.txt); NCU_STALLS=1 also collects every stall reason, listed per kernel in
# $OUT/stalls.txt (benchmarks/ncu_stalls.py); NCU_KERNELS picks the kernels.
set -uo pipefail
# shellcheck source=benchmarks/ncu_env.sh
source "$(dirname "$0")/ncu_env.sh"  # cd to the root; OUT, PY, NCU
export PYTHONPATH=/tmp/site:$PWD
KERNELS=${NCU_KERNELS:-'regex:NormSplit|NormRegRows|NormBulk|GluRows|CandidateRow|CandidateLogits'}
sections=()
for s in LaunchStats Occupancy SpeedOfLight ${NCU_SECTIONS:-}; do sections+=(--section "$s"); done
if [ "${NCU_STALLS:-0}" = 1 ]; then
  sections+=(--metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio')
fi
timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none "${sections[@]}" -k "$KERNELS" -f -o "$OUT/occupancy" \
  $PY benchmarks/occupancy_probe.py ${PROBE_ARGS:-} >"$OUT/occupancy_probe.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$OUT/occupancy.ncu-rep" --page details --csv >"$OUT/occupancy.csv" 2>&1
grep -E '"(Function Name|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Block Limit Shared Mem|Block Limit Registers|Theoretical Occupancy|Achieved Occupancy|Duration|Grid Size|Registers Per Thread|Memory Throughput|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler)"' \
  "$OUT/occupancy.csv" | awk -F'","' '{print $5 " | " $(NF-2) " | " $NF}' | tr -d '"' | sed 's/,$//' \
  >"$OUT/occupancy.txt"
cat "$OUT/occupancy.txt"
if [ "${NCU_STALLS:-0}" = 1 ]; then
  "$NCU" -i "$OUT/occupancy.ncu-rep" --page raw --csv >"$OUT/occupancy_raw.csv" 2>&1
  $PY benchmarks/ncu_stalls.py "$OUT/occupancy_raw.csv" | tee "$OUT/stalls.txt"
fi
