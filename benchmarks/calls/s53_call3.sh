#!/usr/bin/env bash
# Next device call (issue 8): the backfill (session 52, CPU-built): during a whole-query span, besides the BE slice on
# its 32 SMs, low-priority BE blocks on the query's own SMs (its gaps between kernels and idle SMs). `partition` and
# `backfill` run on one profile and one arrival sequence, so the A/B is paired. One BERT-base compile, one experiment a
# BE kernel (--be-each: each written as it ends, so the time-out keeps the finished ones): stencil7 and mri-q (the
# shortest blocks: 1.1 and 2.4 us), then pathfinder and histogram (~9-12 us).
# Prediction (docs/perf-notes.md, "Session 52"): stencil7 +2..+6 points over the partition, mri-q +0..+2; pathfinder and
# histogram: a resident BE block delays each of the query's kernel starts, so the plan does not take it.
set -u
export PYTHONUNBUFFERED=1
# first the new code's tests on the GPU (real partitions, the fill stream's SMs and priority, every backfilled block once)
PYTHONPATH=. timeout 120 python -m pytest -q -p no:cacheprovider tests/colocate/test_span_fill.py \
  tests/colocate/test_green_version.py tests/colocate/test_cuda_backend_timing.py 2>&1 | tail -6
PYTHONPATH=. timeout $(( ${CALL_S:-570} - SECONDS )) python benchmarks/colocate_bench.py --out "$OUT" --lc bert-base \
  --be "${BES:-stencil7,mriq,pathfinder,histogram}" --be-each --versions green32 --policies lc_alone,timeshare,partition,backfill \
  --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 | grep -v Warning > "$OUT/colocate.log"
grep -E "span |fused query|max LC-alone| p99 |^total " "$OUT/colocate.log" | cut -c1-220
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
