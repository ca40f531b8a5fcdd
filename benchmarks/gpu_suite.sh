#!/usr/bin/env bash
# One device call: build the extension on the H200 machine, run the op tests there (CPU and
# GPU parameters; GPU-marked tests no longer skip), then the CUDA-vs-CPU report.
# Usage (device tool): bash benchmarks/gpu_suite.sh   with carry [".whl"] (nvidia-cutlass wheel)
# Results land in $OUT (or benchmarks/results/ when OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several pytest workers share the GPU

if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi

{
  echo "## machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
  $PY -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, jax.devices())"
  nvcc --version | tail -1
  git rev-parse --short HEAD 2>/dev/null || true
} 2>&1 | tee "$OUT/machine.txt"

echo "## build"
start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DPython_EXECUTABLE="$(command -v $PY)" >"$OUT/build.log" 2>&1 &&
  cmake --build build/gpu -j 16 >>"$OUT/build.log" 2>&1
rc=$?
echo "build rc=$rc in $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; exit $rc; fi
cp build/gpu/_prism_ops*.so prism_jax/

echo "## op tests (CPU + CUDA)"
$PY -m pytest -q -n 4 -p no:cacheprovider tests/ops tests/test_extension.py \
  --junitxml="$OUT/pytest.xml" 2>&1 | tail -25 | tee "$OUT/pytest.txt"
test_rc=${PIPESTATUS[0]}

echo "## CUDA vs CPU report"
$PY benchmarks/gpu_ops_report.py --out "$OUT/gpu_ops_report.jsonl" 2>&1 | tee "$OUT/gpu_ops_report.txt"
report_rc=${PIPESTATUS[0]}
echo "pytest rc=$test_rc report rc=$report_rc"
exit $(( test_rc || report_rc ))
