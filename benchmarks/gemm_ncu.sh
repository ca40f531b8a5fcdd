#!/usr/bin/env bash
# int8_gemm kernels under Nsight Compute (device tool): every case of benchmarks/gemm_ncu.py run,
# GEMM kernels only, a few metrics (duration, DRAM bytes, grid), clocks left alone (METHOD.md).
# ncu matches -k against the function's base name: CUTLASS's kernels are all "device_kernel".
# Usage: OUT=... GEMM_NCU_ARGS="--ms 64,128 --kernels dispatch,..." bash benchmarks/gemm_ncu.sh
# (after gpu_suite.sh built or installed the extension into prism_jax/). Writes $OUT/gemm_ncu.md,
# $OUT/gemm_ncu_raw.csv and $OUT/gemm_ncu_cases.json.
set -uo pipefail
# shellcheck source=benchmarks/ncu_env.sh
source "$(dirname "$0")/ncu_env.sh"  # cd to the root; OUT, PY, NCU
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size
# shellcheck disable=SC2086 (GEMM_NCU_ARGS is a list of arguments)
timeout "${GEMM_NCU_TIMEOUT:-300}" "$NCU" --clock-control none --metrics "$metrics" \
  -k 'regex:device_kernel|DecodeKernel|Int8GemmKernel' -f -o "$OUT/gemm_ncu" \
  $PY benchmarks/gemm_ncu.py run --cases "$OUT/gemm_ncu_cases.json" ${GEMM_NCU_ARGS:-} \
  >"$OUT/gemm_ncu.log" 2>&1
echo "ncu rc=$?"
"$NCU" -i "$OUT/gemm_ncu.ncu-rep" --page raw --csv >"$OUT/gemm_ncu_raw.csv" 2>&1
$PY benchmarks/gemm_ncu.py report "$OUT/gemm_ncu_raw.csv" "$OUT/gemm_ncu_cases.json" \
  | tee "$OUT/gemm_ncu.md"
