#!/usr/bin/env bash
# A/B of prebuilt extensions in one device call: the same end-to-end benchmark (and optionally
# the GPU tests) with each extension in turn, so build variants (e.g. a kernel's compile-time
# knob) are compared in one machine start. Run after gpu_suite.sh has installed the wheels:
#   PREBUILT='.carry/e2e/_prism_ops*.so' TESTS=none REPORT=0 bash benchmarks/gpu_suite.sh
#   VARIANTS="a=.carry/e2e b=.carry/ab8" ORDER="a b" bash benchmarks/extension_ab.sh
# Environment:
#   VARIANTS="name=dir ..."   each dir holds one _prism_ops*.so
#   ORDER="a b a"             the runs, in order (a name may repeat: alternation shows drift)
#   E2E_ARGS="..."            e2e_decide.py arguments (default: one digit, no baseline, 10 runs)
#   E2E_TIMEOUT=170           seconds per e2e run
#   AB_TESTS="..."            pytest targets run once per variant before its first e2e run
#   AB_TESTS_TIMEOUT=150
# Writes $OUT/<run index>_<name>/ (e2e.jsonl, e2e.log, breakdown.jsonl with --trace; the raw
# trace is deleted) and $OUT/pytest_<name>.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/extension_ab}
mkdir -p "$OUT"
PY=${PY:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9

declare -A dirs
for v in ${VARIANTS:?set VARIANTS=\"name=dir ...\"}; do dirs[${v%%=*}]=${v#*=}; done
declare -A tested
rc=0
i=0
for name in ${ORDER:?set ORDER=\"name ...\"}; do
  src=${dirs[$name]:?unknown variant $name}
  cp "$src"/_prism_ops*.so prism_jax/ || exit 1
  md5=$(md5sum prism_jax/_prism_ops*.so | cut -c1-12)
  if [ -n "${AB_TESTS:-}" ] && [ -z "${tested[$name]:-}" ]; then
    echo "## $name ($md5): tests"
    # shellcheck disable=SC2086 (AB_TESTS is a list of targets)
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 \
      timeout -s INT "${AB_TESTS_TIMEOUT:-150}" $PY -m pytest -q -n 4 -p no:cacheprovider \
      $AB_TESTS 2>&1 | tail -8 | tee "$OUT/pytest_$name.txt"
    rc=$(( rc || PIPESTATUS[0] ))
    tested[$name]=1
  fi
  i=$((i + 1))
  dir=$OUT/${i}_$name
  mkdir -p "$dir"
  echo "## $name ($md5): e2e run $i"
  echo "$name $src $md5" >"$dir/variant.txt"
  # shellcheck disable=SC2086 (E2E_ARGS is a list of arguments)
  timeout -s INT "${E2E_TIMEOUT:-170}" $PY benchmarks/e2e_decide.py --preset gemma3-27b \
    --out "$dir" ${E2E_ARGS:---single-digit --no-baseline --runs 10} 2>&1 | tee "$dir/e2e.log" |
    grep -E '^\[e2e|"kind": "group"' | cut -c1-200
  rc=$(( rc || PIPESTATUS[0] ))
  rm -rf "$dir/trace"
done
exit $rc
