#!/usr/bin/env bash
# Next device call (issue 8): ResNet-50 B32 with smaller SM partitions. Session 52: with 32 BE SMs no span was ever
# planned (the query alone loses 5-6% on the other 100 SMs, mri-q's smallest slice costs it +17%). Here 8 and 16 BE
# SMs, spans only, one BE kernel a process (pathfinder: the best partition pair with BERT-base; mri-q: session 52's
# pair). Prediction (docs/perf-notes.md, "Session 52"): pathfinder +2..+5%, mri-q 0..+2%.
set -u
export PYTHONUNBUFFERED=1
for be in pathfinder mriq; do
  mkdir -p "$OUT/r50_$be"
  PYTHONPATH=. timeout "${COLO_R:-280}" python benchmarks/colocate_bench.py --out "$OUT/r50_$be" --lc resnet50 --be "$be" \
    --versions green8,green16 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/r50_$be/colocate.log"
  grep -E "^resnet50|span |fused query|total " "$OUT/r50_$be/colocate.log"
done
