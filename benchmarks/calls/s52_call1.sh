#!/usr/bin/env bash
# Next device call (issue 8): the partition policy on the BE kernels session 51 did not reach (stencil7, lbm,
# pathfinder), one BE kernel a process, spans only (--max-keys 0: no per-kernel profile, which the partition policy
# never uses), then ResNet-50 B32 with mri-q and histogram.
set -u
export PYTHONUNBUFFERED=1
for be in stencil7 lbm pathfinder; do
  mkdir -p "$OUT/$be"
  PYTHONPATH=. timeout "${COLO_S:-150}" python benchmarks/colocate_bench.py --out "$OUT/$be" --lc bert-base --be "$be" \
    --versions green32 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/$be/colocate.log"
  grep -E "^bert-base\+|span " "$OUT/$be/colocate.log"
done
mkdir -p "$OUT/r50"
PYTHONPATH=. timeout "${COLO_R:-200}" python benchmarks/colocate_bench.py --out "$OUT/r50" --lc resnet50 --be mriq,histogram \
  --versions green32 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/r50/colocate.log"
grep -E "^resnet50|span " "$OUT/r50/colocate.log"
