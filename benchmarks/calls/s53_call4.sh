#!/usr/bin/env bash
# Session 53, device call 4 (issue 8): the per-pair table's remaining pairs with the backfill. s53 calls 1 and 3 ran
# partition + backfill with pathfinder, mri-q, stencil7, histogram; here sgemm, cutcp, hotspot, lbm, first beside
# ResNet-50 B32 (16 BE SMs, the partition that call 1 found cheapest for its query, and the backfill alone), then beside
# BERT-base B8 S128 (32 BE SMs). One compile an LC, one experiment a BE kernel (--be-each: each written as it ends).
# Predictions (docs/perf-notes.md, "Session 53"): ResNet-50: no partition span (as with 3 of 4 kernels in call 1), the
# backfill alone +2..+8% (taken with every kernel); BERT-base: backfill within +-2 points of the partition.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/resnet50" "$OUT/bert-base"
PYTHONPATH=. timeout 260 python benchmarks/colocate_bench.py --out "$OUT/resnet50" --lc resnet50 \
  --be "${BES_R:-sgemm,cutcp,hotspot,lbm}" --be-each --versions green16 \
  --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/resnet50/colocate.log"
grep -E " p99 |fused query" "$OUT/resnet50/colocate.log" | cut -c1-160
PYTHONPATH=. timeout $(( ${CALL_S:-570} - SECONDS )) python benchmarks/colocate_bench.py --out "$OUT/bert-base" \
  --lc bert-base --be "${BES_B:-lbm,sgemm,cutcp,hotspot}" --be-each --versions green32 \
  --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/bert-base/colocate.log"
grep -E " p99 |fused query" "$OUT/bert-base/colocate.log" | cut -c1-160
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
