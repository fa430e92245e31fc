#!/usr/bin/env bash
# A/B of two source trees on one GPU in one device call, alternating A B A B, with the GPU's clock,
# power and temperature logged before each run. The runs share one tuning database (the first tunes,
# the rest reuse its choices where the code accepts them), so the comparison is of the code, not of
# the tuner's draws. Usage (from the directory that holds both trees):
#   benchmarks/experiments/ab_snapshots.sh TREE_A TREE_B ROUNDS "benchmarks/bert_bench.py --cases B32_S128"
set -u
a="$1"; b="$2"; rounds="$3"; cmd="$4"
export KFUSE_TUNE_DB="${KFUSE_TUNE_DB:-$OUT/ab_tune.sqlite}" PYTHONUNBUFFERED=1
mkdir -p "$OUT/ab"
for i in $(seq 1 "$rounds"); do
  for tree in "$a" "$b"; do
    tag="$(basename "$tree")_r$i"
    nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader > "$OUT/ab/$tag.gpu" 2>&1
    (cd "$tree" && PYTHONPATH=".:${EXTRA_PATH:-}" python $cmd --out "$OUT/ab/$tag" > "$OUT/ab/$tag.log" 2>&1)
    echo "$tag rc=$? gpu: $(cat "$OUT/ab/$tag.gpu")"
    grep -E "^ +kfuse +[0-9]|^ +eager_cudagraph|kernel problems" "$OUT/ab/$tag.log" | head -4
  done
done
tar czf "$OUT/ab.tgz" -C "$OUT" ab
