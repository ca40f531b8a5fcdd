#!/usr/bin/env bash
# Nsight Compute profiles of tree_attention's kernels on the e2e steps' shapes (device tool):
# for each attention_bench.py case prefix in NCU_CASES, the first NCU_COUNT launches of the
# attention kernels with the full section set, written as $OUT/ncu_<case>.ncu-rep and as the
# details page in CSV ($OUT/ncu_<case>.csv). Clocks are left alone (METHOD.md).
# Usage: OUT=... bash benchmarks/attention_ncu.sh   (after gpu_suite.sh built or installed the
# extension into prism_jax/). NCU_BENCH_ARGS: more attention_bench.py arguments (e.g.
# "--numerics digits" with NCU_KERNELS=regex:DigitAttend). Per-instruction view: ncu -i REPORT --page source --print-source
# sass --csv > src.csv on the device, then benchmarks/ncu_regions.py src.csv anywhere.
set -uo pipefail
# shellcheck source=benchmarks/ncu_env.sh
source "$(dirname "$0")/ncu_env.sh"  # cd to the root; OUT, PY, NCU
# Split pass 1 by default: profiling MergeKernel after it stalled twice on the H200 (ncu backs up
# the 512 MiB workspace and the pools for every replay pass) until the timeout killed the run.
KERNELS=${NCU_KERNELS:-'regex:PartialKernel|BlockAttend|LaneAttend'}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for c in ${NCU_CASES:-question forest followup}; do
  echo "## ncu $c"
  timeout "${NCU_TIMEOUT:-150}" "$NCU" --clock-control none --set full -k "$KERNELS" \
    --launch-count "${NCU_COUNT:-4}" -f -o "$OUT/ncu_$c" \
    $PY benchmarks/attention_bench.py --cases "$c" --dtypes f32 --runs 3 --cap-s 0.2 \
    --budget-s 60 --out "/tmp/ncu_bench_$c" ${NCU_BENCH_ARGS:-} >"$OUT/ncu_$c.log" 2>&1
  echo "rc=$?"
  "$NCU" -i "$OUT/ncu_$c.ncu-rep" --page details --csv >"$OUT/ncu_$c.csv" 2>&1
  tail -3 "$OUT/ncu_$c.log"
done
