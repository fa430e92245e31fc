#!/usr/bin/env bash
# Run several benchmark scripts in one device call, each under its own time limit, and pack all
# results into $OUT/results.tgz (the device returns at most 8 files).
#   benchmarks/run_gpu.sh "benchmarks/gemm_bench.py --budget-s 80:120" "benchmarks/conv_bench.py:110"
set -u
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
mkdir -p "$OUT/r"
for spec in "$@"; do
  cmd="${spec%:*}"; limit="${spec##*:}"
  name=$(basename "${cmd%% *}" .py)
  echo "=== $cmd (limit ${limit}s)"
  start=$(date +%s)
  timeout "$limit" python $cmd --out "$OUT/r" > "$OUT/r/$name.log" 2>&1
  rc=$?
  echo "--- $name rc=$rc in $(( $(date +%s) - start ))s; last lines:"
  grep -v -i "warning" "$OUT/r/$name.log" | tail -n 18
done
tar czf "$OUT/results.tgz" -C "$OUT" r
