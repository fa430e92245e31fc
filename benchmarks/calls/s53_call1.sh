#!/usr/bin/env bash
# Next device call (issue 8): ResNet-50 B32 with smaller SM partitions. Session 52: with 32 BE SMs no span was ever
# planned (the query alone loses 5-6% on the other 100 SMs, mri-q's smallest slice costs it +17%). Here 8, 16 and 32
# BE SMs (the plan takes the best per query), spans only, one BE kernel a process, as many as the call's time allows
# (a process is started only while COLO_R seconds are left of CALL_S). Prediction (docs/perf-notes.md, "Session 52"):
# pathfinder +2..+5%, mri-q 0..+2%; a process ~100 s now that the timing spin shrinks back (session 52: ~200-220 s).
# With --span-fill the same run has `backfill` too (paired with `partition`): the backfill alone beside the query on
# every SM (no slice) is a candidate where no partition pays (predicted +0..+3% with stencil7 and mri-q, not taken with
# pathfinder or histogram: their 9-12 us blocks delay the query's kernel starts).
set -u
export PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-570}
COLO_R=${COLO_R:-230}
for be in ${BES:-pathfinder mriq stencil7 histogram}; do
  if (( SECONDS + COLO_R > CALL_S )); then echo "skipped $be: ${SECONDS} s used"; continue; fi
  mkdir -p "$OUT/r50_$be"
  PYTHONPATH=. timeout "$COLO_R" python benchmarks/colocate_bench.py --out "$OUT/r50_$be" --lc resnet50 --be "$be" \
    --versions green8,green16,green32 --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/r50_$be/colocate.log"
  grep -E "^resnet50|span |fused query|max LC-alone|^total " "$OUT/r50_$be/colocate.log"
done
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
