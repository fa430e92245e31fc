#!/usr/bin/env bash
# Next device call (issue 8): the backfill (session 52, CPU-built): during a whole-query span, besides the BE slice on
# its 32 SMs, low-priority BE blocks on the query's own SMs (its gaps between kernels and idle SMs). `partition` and
# `backfill` run on one profile and one arrival sequence, so the A/B is paired. One BE kernel a process while the
# call's time allows: pathfinder (partition +11.5%, session 52), histogram and stencil7 (short blocks), then mri-q.
# Prediction (docs/perf-notes.md, "Session 52"): the short-block kernels +2..+6 points over the partition; where the
# filled windows show the query slowed more than the backfill gains, the plan does not take it (backfill = partition).
set -u
export PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-570}
COLO_S=${COLO_S:-220}
# first the new code's tests on the GPU (real partitions, the fill stream's SMs and priority, every backfilled block once)
PYTHONPATH=. timeout 120 python -m pytest -q -p no:cacheprovider tests/colocate/test_span_fill.py \
  tests/colocate/test_green_version.py tests/colocate/test_cuda_backend_timing.py 2>&1 | tail -6
for be in ${BES:-pathfinder histogram stencil7 mriq}; do
  if (( SECONDS + COLO_S > CALL_S )); then echo "skipped $be: ${SECONDS} s used"; continue; fi
  mkdir -p "$OUT/$be"
  PYTHONPATH=. timeout "$COLO_S" python benchmarks/colocate_bench.py --out "$OUT/$be" --lc bert-base --be "$be" \
    --versions green32 --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 \
    --classify selected 2>&1 | grep -v Warning > "$OUT/$be/colocate.log"
  grep -E "^bert-base\+|span |fused query|max LC-alone|^total " "$OUT/$be/colocate.log"
done
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
