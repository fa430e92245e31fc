#!/usr/bin/env bash
# Next device call (issue 8): Aker's per-kernel fusion and `auto` beside ResNet-50 B32 on the H100 (the PTB stand-in
# LC: Aker slices PTB GEMMs). On the H200 (sessions 11-15) Aker gave ResNet-50 + histogram +21.2%, + mri-q +3.6%,
# + hotspot +3.8%; on the H100 only the partition and the backfill have run beside ResNet-50 (session 53: +4.2%,
# +1.8%, -0.2%). One compile, one experiment a BE kernel (--be-each; the LC calibrated once), the tail-fill and 1:2
# fused versions with the 16-SM partition and the backfill, so `auto` can take any of them per query.
# Prediction: histogram auto +15..+25% (Aker's fused launches, as on the H200 and beside BERT-base on the H100),
# mri-q and hotspot +0..+5% (the backfill's or Aker's, whichever plans more); ResNet-50's mean of the best per pair
# from +2.0% to ~+4..+5%.
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout "${CALL_S:-570}" python benchmarks/colocate_bench.py --out "$OUT" --lc resnet50 \
  --be "${BES:-histogram,mriq,hotspot}" --be-each --versions tail,1:2,green16 \
  --policies lc_alone,timeshare,aker,partition,backfill,auto --span-fill --max-keys 24 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/colocate.log"
grep -E "max LC-alone| p99 |fused query|fused [0-9]" "$OUT/colocate.log" | cut -c1-170
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
