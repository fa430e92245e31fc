#!/usr/bin/env bash
# Next device call (issue 8): ResNet-50 B32 with smaller SM partitions and the backfill. Session 52: with 32 BE SMs no
# span was ever planned (the query alone loses 5-6% on the other 100 SMs, mri-q's smallest slice costs it +17%). Here 8,
# 16 and 32 BE SMs (the plan takes the best per query), spans only, and with --span-fill the `backfill` policy paired
# with `partition` (the backfill alone beside the query on every SM is a candidate where no partition pays). One
# ResNet-50 compile, one experiment a BE kernel (--be-each: each written as it ends).
# Prediction (docs/perf-notes.md, "Session 52"): partition with pathfinder +2..+5%, mri-q 0..+2%; backfill +0..+3% with
# stencil7 and mri-q, not taken with pathfinder or histogram (their 9-12 us blocks delay the query's kernel starts).
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout "${CALL_S:-570}" python benchmarks/colocate_bench.py --out "$OUT" --lc resnet50 \
  --be "${BES:-pathfinder,mriq,stencil7,histogram}" --be-each --versions green8,green16,green32 \
  --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/colocate.log"
grep -E "span |fused query|max LC-alone| p99 |^total " "$OUT/colocate.log" | cut -c1-220
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
