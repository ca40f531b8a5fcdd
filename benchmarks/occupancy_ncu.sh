#!/usr/bin/env bash
# Nsight Compute's launch statistics and occupancy of the memory-bound ops' kernels at the
# item-3 sizes (benchmarks/occupancy_probe.py): the shared-memory configuration the driver chose,
# the blocks each resource allows an SM, theoretical and achieved occupancy, duration.
# Run on the GPU machine after gpu_suite.sh installed the extension:
#   OUT=... bash benchmarks/occupancy_ncu.sh      -> $OUT/occupancy.csv, $OUT/occupancy.txt
set -uo pipefail
# shellcheck source=benchmarks/ncu_env.sh
source "$(dirname "$0")/ncu_env.sh"  # cd to the root; OUT, PY, NCU
export PYTHONPATH=/tmp/site:$PWD
KERNELS=${NCU_KERNELS:-'regex:NormSplit|NormRegRows|GluRows|CandidateRow|CandidateLogits'}
timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none --section LaunchStats \
  --section Occupancy --section SpeedOfLight -k "$KERNELS" -f -o "$OUT/occupancy" \
  $PY benchmarks/occupancy_probe.py ${PROBE_ARGS:-} >"$OUT/occupancy_probe.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$OUT/occupancy.ncu-rep" --page details --csv >"$OUT/occupancy.csv" 2>&1
grep -E '"(Function Name|Shared Memory Configuration Size|Dynamic Shared Memory Per Block|Block Limit Shared Mem|Block Limit Registers|Theoretical Occupancy|Achieved Occupancy|Duration|Grid Size|Registers Per Thread|Memory Throughput)"' \
  "$OUT/occupancy.csv" | awk -F'","' '{print $5 " | " $(NF-2) " | " $NF}' | tr -d '"' | sed 's/,$//' \
  >"$OUT/occupancy.txt"
cat "$OUT/occupancy.txt"
