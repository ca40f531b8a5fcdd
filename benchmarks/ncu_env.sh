# Sourced by the *_ncu.sh scripts: the repository root as the working directory, OUT (results
# folder), PY (the Python) and NCU (Nsight Compute's command line), or exit when there is none.
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
PY=${PY:-python3}
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
[ -n "$NCU" ] || { echo "ncu not found" >&2; exit 1; }
