#!/usr/bin/env bash
# Next device call (issue 8): the partition with the denser span samples (SPAN_FILL 0.85 / 0.95 / 1.05, session 51)
# on the low-HBM BE kernels beside BERT-base, then sgemm and hotspot. Session 51 measured +7.7% (mri-q), +9.4% (cutcp),
# +9.2% (histogram) with samples at 0.5 / 0.75 / 1.0; predicted now +1..+2 points each. One BERT-base compile, one
# experiment a BE kernel (--be-each: each written as it ends).
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout "${CALL_S:-570}" python benchmarks/colocate_bench.py --out "$OUT" --lc bert-base \
  --be "${BES:-mriq,cutcp,histogram,sgemm,hotspot}" --be-each --versions green32 --policies lc_alone,timeshare,partition \
  --max-keys 0 --seconds 0.5 --classify selected 2>&1 | grep -v Warning > "$OUT/colocate.log"
grep -E "span |fused query|max LC-alone| p99 |^total " "$OUT/colocate.log" | cut -c1-220
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
