#!/usr/bin/env bash
# Next device call (issue 8): the LC as kfuse compiles it (`--lc-gemms plan`: the plan's own GEMM kernels, not the
# PTB stand-ins; session 53: the stand-in's kernels took 1.08 ms of BERT-base B8 S128's query where the compiled model
# runs in 0.74 ms on the H100, and its 48-tile GEMMs leave most SMs idle through 44% of its kernel time). Partition and
# backfill only (Aker's fused versions need PTB GEMMs); the query's persistent kernels are captured sized for the LC's
# SMs (`codegen.sm_count`). BERT-base, then ResNet-50, one experiment a BE kernel (--be-each; the LC calibrated once).
# The other four BE kernels: `BES=sgemm,cutcp,hotspot,lbm bash benchmarks/calls/s54_call1.sh` (a second call).
# First the new code's GPU test (a segment's launches sized for a partition), then the runs.
# Prediction (docs/perf-notes.md, "Session 53", next): the partition dearer for the faithful LC (BERT-base's query on
# 100 SMs +5..+15% with no BE block, against +0.2..+4% for the stand-in), so fewer spans: BERT-base best per pair
# +0..+8% (stand-in +3.5..+13.7%), ResNet-50 +0..+5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/bert-base" "$OUT/resnet50"
PYTHONPATH=. timeout 60 python -m pytest -q -p no:cacheprovider tests/colocate/test_lc_items.py 2>&1 | tail -3
for lc in bert-base resnet50; do
  left=$(( ${CALL_S:-570} - SECONDS ))
  [ "$lc" = bert-base ] && t=$(( left / 2 )) || t=$left
  PYTHONPATH=. timeout "$t" python benchmarks/colocate_bench.py --out "$OUT/$lc" --lc "$lc" \
    --be "${BES:-pathfinder,mriq,histogram,stencil7}" --be-each --versions green16,green32 --lc-gemms plan \
    --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/$lc/colocate.log"
  grep -E "compiled in|solo query|span [a-z0-9]+ on [0-9]+ SMs \(| p99 |fused query" "$OUT/$lc/colocate.log" | cut -c1-170
done
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
