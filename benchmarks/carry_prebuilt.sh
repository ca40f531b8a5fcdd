#!/usr/bin/env bash
# Builds the extension here (make build) and copies it into .carry/NAME/ for the device tool, with
# .carry/NAME/COMMIT: this checkout's short HEAD (+dirty when tracked files differ). gpu_suite.sh
# exports it as PRISM_COMMIT when PREBUILT points into that folder, because the device copy's
# own git metadata can lag the working tree it runs, and every JSON line records the commit.
# Usage: bash benchmarks/carry_prebuilt.sh NAME; then the device tool's run with
#   carry [".carry/NAME", ".whl"] and PREBUILT='.carry/NAME/_prism_ops*.so' bash benchmarks/gpu_suite.sh
#   (the folder holds the .so gzipped; gpu_suite.sh unpacks a PREBUILT whose .gz is there)
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: benchmarks/carry_prebuilt.sh NAME}
make build >/dev/null
dir=.carry/$name
mkdir -p "$dir"
# gzipped: the .so (~32 MB of sm_90a code) with the tracked tree (~29 MB) and .whl passes the
# device tool's 64 MiB; gpu_suite.sh unpacks it (session 33's first try was refused).
rm -f "$dir"/_prism_ops*.so*
for so in build/cp312-cp312-linux_x86_64/_prism_ops*.so; do gzip -9 -c "$so" >"$dir/$(basename "$so").gz"; done
dirty=$(git status --porcelain --untracked-files=no)
echo "$(git rev-parse --short HEAD)${dirty:++dirty}" >"$dir/COMMIT"
echo "$dir: $(ls "$dir" | tr '\n' ' ')commit $(cat "$dir/COMMIT")"
