#!/usr/bin/env bash
# One device call: build the extension on the H200 machine, run the op tests there (CPU and
# GPU parameters; GPU-marked tests no longer skip), then the CUDA-vs-CPU report.
# Usage (device tool): bash benchmarks/gpu_suite.sh   with carry [".whl"]: the wheels the H200
# machine lacks, installed with --no-deps (nvidia-cutlass to build there; gguf and pyyaml, which
# prism_jax.engine imports: without them tests/test_determinism.py and e2e_decide.py fail to
# import; py-spy for HOST_PROFILE). Fill it with
# `pip download --no-deps -d .whl nvidia-cutlass==4.2.0.0 gguf pyyaml py-spy`.
# Results land in $OUT (or benchmarks/results/ when OUT is unset); PACK=$OUT_OF_TOOL/x.tgz also
# packs them (traces left out) into one archive, since the device tool returns at most 8 files.
# Optional environment:
#   PREBUILT=path/_prism_ops*.so  use an extension built elsewhere if it imports (else build;
#                                 path/_prism_ops*.so.gz is unpacked first);
#                                 benchmarks/carry_prebuilt.sh NAME makes .carry/NAME/ with its
#                                 COMMIT, exported as PRISM_COMMIT (the commit the JSON records)
#   TESTS="..."                   pytest targets (default: tests/ops tests/test_extension.py
#                                 tests/test_determinism.py tests/model/test_last_layer_rows.py:
#                                 the forest invariances on the GPU)
#   REPORT=0                      skip the CUDA-vs-CPU report
#   GEMM_BENCH="--sweep ..."      then run benchmarks/gemm_bench.py with these arguments
#                                 (results in $OUT/gemm.jsonl and $OUT/gemm.md)
#   TESTS=none                    skip the op tests
#   TESTS_TIMEOUT=400             interrupt pytest after this many seconds
#   PYTEST_WORKERS=8              pytest-xdist workers (the machine's 16 cores; session 31's
#                                 default set: 2,264 tests in 145 s at 8, 2,282 in 227 s at 4)
#   E2E=1                         then run benchmarks/e2e_decide.py (27B, int8 engine vs bf16
#                                 XLA; $OUT/e2e.jsonl, E2E.md, e2e.png, compile.json), extra
#                                 arguments in E2E_ARGS (e.g. "--profile"), killed after
#                                 E2E_TIMEOUT seconds (default 560) so the call still reports;
#                                 E2E_DIGITS="two one" runs it per INT8 digit mode into
#                                 $OUT/e2e_two and $OUT/e2e_one (one = --single-digit); a mode
#                                 ending in -attn (two-attn, one-attn) adds --attention digits;
#                                 one ending in -b8 (one-b8) runs with
#                                 PRISM_TREE_ATTENTION_MERGE_BATCH=8 (8 records in every step),
#                                 one ending in -lean<n> or -reg<n> (one-reg4) with that
#                                 PRISM_RMSNORM_KERNEL (the norms' split kernel forced), one
#                                 ending in -whole (one-whole) with --whole-last-layer (the
#                                 last layer for every token), one ending in -dp (one-dp) with
#                                 PRISM_INT8_GEMM_DECOMP=d (stream-K tiles data-parallel: no
#                                 barrier memset before them), one ending in -ms (one-ms) with
#                                 PRISM_INT8_GEMM_BARRIER=memset (stream-K's barrier flags
#                                 cleared by CUTLASS's memset, not our kernel); XLA's command
#                                 buffer settings: -vt (update mode SKIP_TEMP: fixed addresses
#                                 for temporaries), -vp (SKIP_PROFILED, with --warmup 4: it
#                                 runs an executable's first 3 executions op by op), -tg
#                                 (CUDA graphs kept under the profiler, so --trace sees the
#                                 untraced runs' mode; CONCURRENT_REGIONS is not offered: XLA
#                                 0.11.2 rejects FFI calls in it, results/e2e_h100_session33/);
#                                 -wk with PRISM_QKV_ROPE_KV=off (tree_attention's write kernel
#                                 stores k and v; by default qkv_rope does); -ba with
#                                 --baseline-after (the bf16 baseline built once the int8
#                                 engine is freed: an H100 cannot hold both 27B models);
#                                 (-pg, -pa, -pf and -gc, the L2 prefetch and GLU cluster
#                                 options, were removed in session 38: slower on an H100
#                                 and an H200, results/e2e_h100_session37/ and
#                                 e2e_h200_session38/);
#                                 these suffixes combine (one-ms-whole); a mode listed twice
#                                 runs twice, into e2e_<mode> and e2e_<mode>.2
#   ATTN_BENCH=1                  then run benchmarks/attention_bench.py (tree_attention vs the
#                                 run's ceilings and XLA; $OUT/attention.jsonl, attention.md),
#                                 extra arguments in ATTN_ARGS (e.g. "--dtypes f32"), interrupted
#                                 after ATTN_TIMEOUT seconds (default 200)
#   OPS_BENCH=1                   then run benchmarks/ops_bandwidth.py ($OUT/ops_bandwidth.jsonl,
#                                 ops_bandwidth.md), extra arguments in OPS_ARGS (e.g.
#                                 "--norm-kernels lean8"), interrupted after OPS_TIMEOUT seconds
#                                 (default 150)
#   HOST_PROFILE=1                then run benchmarks/host_profile.py (py-spy's native stacks of
#                                 the forward call, untraced; $OUT/host_profile.md), probe
#                                 arguments in HOST_PROFILE_ARGS (default "--single-digit
#                                 --runs 50"), interrupted after HOST_PROFILE_TIMEOUT s (240)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# A misspelt or retired suffix (-pw, removed in session 37) would otherwise run the plain mode.
# The suffix list is the case lines' in the E2E loop below: add a suffix to both.
check_mode() {
  local part rest=${1#*-}
  case "$1" in
    default | one | two | one-* | two-*) ;;
    *) echo "E2E_DIGITS: unknown mode $1 (one, two, default, or one-/two- with suffixes)" >&2; exit 2 ;;
  esac
  [ "$rest" = "$1" ] && return 0
  for part in ${rest//-/ }; do
    case "$part" in
      attn | whole | ba | b8 | lean[248] | reg[1248] | dp | ms | wk | vt | vp | tg) ;;
      *) echo "E2E_DIGITS: unknown suffix -$part in $1 (see this script's header)" >&2; exit 2 ;;
    esac
  done
}
# Checked before anything runs, so a bad mode costs no device time.
if [ "${E2E:-0}" != 0 ]; then
  for digits in ${E2E_DIGITS:-default}; do check_mode "$digits"; done
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several pytest workers share the GPU

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

if [ -n "${PREBUILT:-}" ]; then  # carry_prebuilt.sh gzips the .so to fit the carry limit
  for gz in $PREBUILT.gz; do [ -f "$gz" ] && gunzip -f "$gz"; done
fi
# The commit every JSON line records: the prebuilt's COMMIT (benchmarks/carry_prebuilt.sh wrote it
# from the checkout that built it), since this copy's git metadata may lag its working tree.
if [ -z "${PRISM_COMMIT:-}" ] && [ -n "${PREBUILT:-}" ]; then
  commit_file=$(dirname "$(ls $PREBUILT 2>/dev/null | head -1)")/COMMIT
  if [ -f "$commit_file" ]; then export PRISM_COMMIT=$(cat "$commit_file"); fi
fi

{
  echo "## machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  nvcc --version | tail -1
  echo "${PRISM_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
} 2>&1 | tee "$OUT/machine.txt"

echo "## build"
start=$(date +%s)
if [ -n "${PREBUILT:-}" ] && cp $PREBUILT prism_jax/ &&
  $PY -c "from prism_jax import _prism_ops as m; assert m.with_cuda
assert getattr(m, 'cuda_device_opt', 3) == 3, 'a compile-check build (CUDA_DEVICE_OPT<3)'" \
    2>"$OUT/build.log"; then
  echo "using the prebuilt extension $PREBUILT"
else
  rm -f prism_jax/_prism_ops*.so
  cmake -S . -B build/gpu -G Ninja -DPython_EXECUTABLE="$(command -v $PY)" >>"$OUT/build.log" 2>&1 &&
    cmake --build build/gpu -j 16 >>"$OUT/build.log" 2>&1
  rc=$?
  echo "build rc=$rc in $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit $rc; fi
  cp build/gpu/_prism_ops*.so prism_jax/
fi

test_rc=0
if [ "${TESTS:-}" != none ]; then
  echo "## op tests (CPU + CUDA)"
  timeout -s INT "${TESTS_TIMEOUT:-400}" $PY -m pytest -q -n "${PYTEST_WORKERS:-8}" -p no:cacheprovider ${TESTS:-tests/ops tests/test_extension.py tests/test_determinism.py tests/model/test_last_layer_rows.py} \
    --junitxml="$OUT/pytest.xml" 2>&1 | tail -25 | tee "$OUT/pytest.txt"
  test_rc=${PIPESTATUS[0]}
fi

report_rc=0
if [ "${REPORT:-1}" != 0 ]; then
  echo "## CUDA vs CPU report"
  $PY benchmarks/gpu_ops_report.py --out "$OUT/gpu_ops_report.jsonl" 2>&1 | tee "$OUT/gpu_ops_report.txt"
  report_rc=${PIPESTATUS[0]}
fi
bench_rc=0
if [ -n "${GEMM_BENCH:-}" ]; then
  echo "## int8 GEMM benchmark"
  # shellcheck disable=SC2086 (GEMM_BENCH is a list of arguments)
  $PY benchmarks/gemm_bench.py --out "$OUT" $GEMM_BENCH 2>&1 | tail -60
  bench_rc=${PIPESTATUS[0]}
fi
e2e_rc=0
if [ "${E2E:-0}" != 0 ]; then
  for digits in ${E2E_DIGITS:-default}; do
    echo "## end-to-end decision benchmark ($digits)"
    dir=$OUT extra=""
    if [ "$digits" != default ]; then
      dir=$OUT/e2e_$digits repeat=2
      # A mode listed again (an A/B's ABBA order) keeps each run: e2e_one, e2e_one.2, ...
      while [ -e "$dir" ]; do dir=$OUT/e2e_$digits.$repeat; repeat=$((repeat + 1)); done
      mkdir -p "$dir"
    fi
    case "$digits" in one*) extra=--single-digit ;; esac
    case "$digits" in *-attn*) extra="$extra --attention digits" ;; esac
    case "$digits" in *-whole*) extra="$extra --whole-last-layer" ;; esac
    case "$digits" in *-ba*) extra="$extra --baseline-after" ;; esac
    batch="" norm="" decomp="" barrier="" kvstore=on
    case "$digits" in *-b8*) batch=8 ;; esac
    case "$digits" in *-lean[248] | *-reg[1248]) norm=${digits##*-} ;; esac
    case "$digits" in *-dp*) decomp=d ;; esac
    case "$digits" in *-ms*) barrier=memset ;; esac
    case "$digits" in *-wk*) kvstore=off ;; esac
    xla=""
    case "$digits" in *-vt*) xla="$xla --xla_gpu_command_buffer_update_mode=SKIP_TEMP" ;; esac
    case "$digits" in *-vp*)
      xla="$xla --xla_gpu_command_buffer_update_mode=SKIP_PROFILED" extra="$extra --warmup 4" ;;
    esac
    case "$digits" in *-tg*) xla="$xla --xla_enable_command_buffers_during_profiling=true" ;; esac
    # Both 27B models (int8 28-56 GB, bf16 ~54 GB) and the KV pool live on the card at once,
    # except with -ba (--baseline-after: the bf16 model only once the int8 engine is freed).
    # shellcheck disable=SC2086 (E2E_ARGS is a list of arguments)
    PRISM_TREE_ATTENTION_MERGE_BATCH=$batch PRISM_RMSNORM_KERNEL=$norm PRISM_QKV_ROPE_KV=$kvstore \
      PRISM_INT8_GEMM_DECOMP=$decomp PRISM_INT8_GEMM_BARRIER=$barrier \
      XLA_FLAGS="${XLA_FLAGS:-}$xla" XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 \
      timeout -s INT "${E2E_TIMEOUT:-560}" \
      $PY benchmarks/e2e_decide.py --preset gemma3-27b --out "$dir" ${E2E_ARGS:-} $extra 2>&1 |
      tee "$dir/e2e.log"
    rc=${PIPESTATUS[0]}
    e2e_rc=$(( e2e_rc || rc ))
  done
fi
attn_rc=0
if [ "${ATTN_BENCH:-0}" != 0 ]; then
  echo "## tree_attention benchmark"
  # shellcheck disable=SC2086 (ATTN_ARGS is a list of arguments)
  timeout -s INT "${ATTN_TIMEOUT:-200}" \
    $PY benchmarks/attention_bench.py --out "$OUT" ${ATTN_ARGS:-} 2>&1 | tee "$OUT/attention.log"
  attn_rc=${PIPESTATUS[0]}
fi
ops_rc=0
if [ "${OPS_BENCH:-0}" != 0 ]; then
  echo "## memory-bound ops bandwidth"
  # shellcheck disable=SC2086 (OPS_ARGS is a list of arguments)
  timeout -s INT "${OPS_TIMEOUT:-150}" \
    $PY benchmarks/ops_bandwidth.py --out "$OUT" ${OPS_ARGS:-} 2>&1 | tee "$OUT/ops_bandwidth.log"
  ops_rc=${PIPESTATUS[0]}
fi
host_rc=0
if [ "${HOST_PROFILE:-0}" != 0 ]; then
  echo "## host profile of the forward call"
  export PATH=/tmp/site/bin:$PATH  # py-spy from .whl
  # shellcheck disable=SC2086 (HOST_PROFILE_ARGS is a list of arguments)
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 timeout -s INT "${HOST_PROFILE_TIMEOUT:-240}" \
    $PY benchmarks/host_profile.py --out "$OUT" -- ${HOST_PROFILE_ARGS:---single-digit --runs 50} \
    2>&1 | tee "$OUT/host_profile.log"
  host_rc=${PIPESTATUS[0]}
  rm -f "$OUT/host_profile.raw"  # tens of MB; host_profile.json keeps the summary
fi
echo "pytest rc=$test_rc report rc=$report_rc bench rc=$bench_rc e2e rc=$e2e_rc" \
  "attn rc=$attn_rc ops rc=$ops_rc host rc=$host_rc"
if [ -n "${PACK:-}" ]; then  # the device tool returns at most 8 files: one archive of them all
  tar czf "$PACK" --exclude=trace -C "$(dirname "$OUT")" "$(basename "$OUT")" && echo "packed $PACK"
fi
exit $(( test_rc || report_rc || bench_rc || e2e_rc || attn_rc || ops_rc || host_rc ))
