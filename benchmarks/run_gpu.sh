#!/usr/bin/env bash
# Run several benchmark scripts in one device call, each under its own time limit, and pack all
# results into $OUT/results.tgz (the device returns at most 8 files).
#   benchmarks/run_gpu.sh "benchmarks/gemm_bench.py --budget-s 80:120" "benchmarks/conv_bench.py:110"
# The device kills a call at 600 s, which would lose everything not yet packed: each script's limit
# is capped by what is left of TOTAL_S (default 570 s), a script with under 20 s left is skipped,
# and the archive is rewritten after every script.
set -u
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
total="${TOTAL_S:-570}"
t0=$(date +%s)
mkdir -p "$OUT/r"
for spec in "$@"; do
  cmd="${spec%:*}"; limit="${spec##*:}"
  name=$(basename "${cmd%% *}" .py)
  left=$(( total - ($(date +%s) - t0) ))
  if (( left < 20 )); then echo "=== skip $cmd: ${left}s left of ${total}s"; continue; fi
  (( limit > left )) && limit=$left
  echo "=== $cmd (limit ${limit}s)"
  start=$(date +%s)
  timeout "$limit" python $cmd --out "$OUT/r" > "$OUT/r/$name.log" 2>&1
  rc=$?
  echo "--- $name rc=$rc in $(( $(date +%s) - start ))s; last lines:"
  grep -v -i "warning" "$OUT/r/$name.log" | tail -n 18
  tar czf "$OUT/results.tgz" -C "$OUT" r
done
tar czf "$OUT/results.tgz" -C "$OUT" r
