#!/usr/bin/env bash
# Session 51, device call 2 (issue 8): the partition policy on stencil7, lbm and pathfinder (32 SMs only: call 1 showed
# the query alone 10% slower on 92 LC SMs, so green40 never pays), then histogram with Aker's fused versions and the
# partition together, under timeshare, aker, partition and the new auto policy (per query, the larger planned gain).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/p" "$OUT/h"
PYTHONPATH=. timeout "${COLO_P:-250}" python benchmarks/colocate_bench.py --out "$OUT/p" --lc bert-base --be stencil7,lbm,pathfinder \
  --versions green32 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 2>&1 \
  | grep -v Warning > "$OUT/p/colocate.log"
grep -E "^bert-base|^case|timeshare p99|partition p99" "$OUT/p/colocate.log"
PYTHONPATH=. timeout "${COLO_H:-290}" python benchmarks/colocate_bench.py --out "$OUT/h" --lc bert-base --be histogram \
  --versions tail,1:2,green32 --policies lc_alone,timeshare,aker,partition,auto --max-keys 24 --seconds 0.5 2>&1 \
  | grep -v Warning > "$OUT/h/colocate.log"
grep -E "^bert-base|^case|p99 .*BE|decisions" "$OUT/h/colocate.log"
