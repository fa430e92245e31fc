#!/usr/bin/env bash
# Session 51, device call 2 (issue 8): the partition policy on the remaining BE kernels (histogram, stencil7, lbm,
# pathfinder), 32 SMs only (call 1: on 92 LC SMs the query alone is 10% slower, so green40 never pays).
set -u
export PYTHONUNBUFFERED=1
for pair in histogram,stencil7 lbm,pathfinder; do
  d="$OUT/${pair/,/_}"; mkdir -p "$d"
  PYTHONPATH=. timeout "${COLO_S:-250}" python benchmarks/colocate_bench.py --out "$d" --lc bert-base --be "$pair" \
    --versions green32 --policies lc_alone,timeshare,partition --max-keys 24 --seconds 0.5 2>&1 \
    | grep -v Warning > "$d/colocate.log"
  grep -E "^bert-base|^case" "$d/colocate.log"
done
