#!/usr/bin/env bash
# Next device call (issue 8): the partition policy again on the low-HBM BE kernels, with the denser span samples
# (SPAN_FILL 0.85 / 0.95 / 1.05). Session 51 measured +7.7% (mri-q), +9.4% (cutcp), +9.2% (histogram) with samples at
# 0.5 / 0.75 / 1.0; predicted now: +1..+2 points each (slices 10-25% larger where the window, not the allowance, binds).
set -u
export PYTHONUNBUFFERED=1
for be in mriq cutcp histogram; do
  mkdir -p "$OUT/$be"
  PYTHONPATH=. timeout "${COLO_S:-170}" python benchmarks/colocate_bench.py --out "$OUT/$be" --lc bert-base --be "$be" \
    --versions green32 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/$be/colocate.log"
  grep -E "^bert-base\+|span |fused query" "$OUT/$be/colocate.log"
done
