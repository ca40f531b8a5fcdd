#!/usr/bin/env bash
# Accuracy runs (python -m prism_jax.eval) of the three PyPI models on one warm device machine,
# whose calls carry at most 64 MiB each: the three GGUFs travel as one byte stream cut into
# pieces (.carry/p/cNN, one or two per call), and each call runs `tick`, which assembles every
# model whose bytes have all arrived, checks its SHA-256 and starts its runs in the background
# (setsid: they outlive the call), so the GPU decides while later pieces travel. A last call
# runs `wait` and gets the reports back under $OUT. docs/ACCURACY.md lists the calls made.
#
#   bash benchmarks/gpu_eval.sh setup      wheels (.whl), source (.carry/src), CUDA extension
#                                          (.carry/e2e), data (.carry/ev)
#   bash benchmarks/gpu_eval.sh tick       take the pieces that arrived; start complete models
#   bash benchmarks/gpu_eval.sh wait S     wait up to S seconds for the runs, then pack $OUT
#
# Environment: PRISM_COMMIT (the commit exported into .carry/src), EVAL_PRECISIONS
# (default int8,int8-1digit,bf16,fp32), EVAL_ARGS_SHARED / EVAL_ARGS_OLMO (sample sizes and
# time caps per model run, see below), EVAL_ENV (extra VAR=value for the runs, e.g.
# PRISM_TREE_ATTENTION_KERNEL=lanes).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
W=/tmp/prism_eval  # everything the background runs use lives outside the synced tree
mkdir -p "$W/parts" "$W/runs" "$W/logs"

# name, byte offset in the stream, size, SHA-256 (prism_jax/model/registry.py), file name
MODELS=(  # Qwen first: the largest model, its runs take longest
  "qwen 0 491400064 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
  "smollm2 491400064 98362432 b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 SmolLM2-135M-Instruct.Q4_1.gguf"
  "gemma 589762496 253113024 a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 gemma-3-270m-q4_k_m.gguf"
)
PIECE=60000000

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$W/site" .whl/*.whl || exit 1
  rm -rf "$W/src" && cp -r .carry/src "$W/src" && cp .carry/e2e/_prism_ops*.so "$W/src/prism_jax/"
  rm -rf "$W/ev" && cp -r .carry/ev "$W/ev"
  (cd "$W/src" && PYTHONPATH=$W/site:$W/src python3 -c "from prism_jax import _prism_ops as m; assert m.with_cuda; print('cuda extension ok')")
}

# The stream's bytes [offset, offset + size) -> $W/<file>, if every piece holding them is here.
assemble() {
  local offset=$1 size=$2 sha=$3 file=$4
  [ -f "$W/$file" ] && return 0
  local first=$((offset / PIECE)) last=$(((offset + size - 1) / PIECE)) i
  for ((i = first; i <= last; i++)); do [ -f "$W/parts/$(printf c%02d $i)" ] || return 1; done
  for ((i = first; i <= last; i++)); do cat "$W/parts/$(printf c%02d $i)"; done |
    tail -c +$((offset - first * PIECE + 1)) | head -c "$size" >"$W/$file.tmp"
  echo "$sha  $W/$file.tmp" | sha256sum -c --quiet || { rm -f "$W/$file.tmp"; return 2; }
  mv "$W/$file.tmp" "$W/$file"
}

# One model's runs, in the background: the shared sample, then the olmo sample.
launch() {
  local name=$1 file=$2
  [ -e "$W/logs/$name.started" ] && return 0
  touch "$W/logs/$name.started"
  local p=${EVAL_PRECISIONS:-int8,int8-1digit,bf16,fp32}
  local shared=${EVAL_ARGS_SHARED:---limit 5200 --min-per-set 20 --max-minutes 6}
  local olmo=${EVAL_ARGS_OLMO:---limit 12400 --min-per-set 20 --max-minutes 7}
  local common="--model $W/$file --precision $p --seed 0 --budget 4000 --no-progress"
  # shellcheck disable=SC2086 (argument lists)
  setsid nohup env PYTHONPATH="$W/site:$W/src" PYTHONUNBUFFERED=1 \
    PRISM_EVAL_DATA="$W/ev/data" PRISM_OLMO_DATASETS="$W/ev/olmo" \
    PRISM_EVAL_COMMIT="${PRISM_COMMIT:-unknown}" PRISM_JAX_CACHE="$W/cache" ${EVAL_ENV:-} \
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION=0.25 \
    bash -c "cd $W/src && python3 -m prism_jax.eval $common --data shared $shared --out $W/runs/$name-shared;
             python3 -m prism_jax.eval $common --data olmo $olmo --out $W/runs/$name-olmo;
             touch $W/logs/$name.done" >"$W/logs/$name.log" 2>&1 </dev/null &
  echo "started $name"
}

tick() {
  cp -n .carry/p/c* "$W/parts/" 2>/dev/null
  echo "pieces: $(ls "$W/parts" | tr '\n' ' ')"
  local m name offset size sha file rc
  for m in "${MODELS[@]}"; do
    read -r name offset size sha file <<<"$m"
    assemble "$offset" "$size" "$sha" "$file"
    rc=$?
    [ $rc -eq 2 ] && echo "$name: SHA-256 mismatch"
    [ $rc -eq 0 ] && launch "$name" "$file"
  done
  for f in "$W"/logs/*.log; do [ -f "$f" ] && echo "== $f" && tail -3 "$f"; done
  nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
}

wait_runs() {
  local deadline=$(($(date +%s) + $1)) name
  for name in qwen smollm2 gemma; do
    while [ -e "$W/logs/$name.started" ] && [ ! -e "$W/logs/$name.done" ] &&
      [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  done
  mkdir -p "$OUT"
  tar -czf "$OUT/eval_reports.tgz" -C "$W" --exclude 'predictions-*' runs logs
  for name in smollm2 gemma qwen; do  # predictions apart: each file back is at most 16 MiB
    ls "$W"/runs/$name-* >/dev/null 2>&1 &&
      tar -czf "$OUT/eval_predictions_$name.tgz" -C "$W/runs" $(cd "$W/runs" && ls -d $name-*)
  done
  for f in "$W"/logs/*.log; do echo "== $f" && tail -5 "$f"; done
}

case "${1:-}" in
  setup) setup ;;
  tick) tick ;;
  wait) wait_runs "${2:-60}" ;;
  *) echo "usage: $0 setup|tick|wait SECONDS" >&2; exit 2 ;;
esac
