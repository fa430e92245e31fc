#!/usr/bin/env bash
# Next device call (issue 8): the partition with the denser span samples (SPAN_FILL 0.85 / 0.95 / 1.05, session 51)
# on the low-HBM BE kernels beside BERT-base, one a process while the call's time allows. Session 51 measured +7.7%
# (mri-q), +9.4% (cutcp), +9.2% (histogram) with samples at 0.5 / 0.75 / 1.0; predicted now +1..+2 points each.
# Then sgemm and hotspot (session 50-51: +7.3%, +4.3%) if time is left.
set -u
export PYTHONUNBUFFERED=1
CALL_S=${CALL_S:-570}
COLO_S=${COLO_S:-210}
for be in ${BES:-mriq cutcp histogram sgemm hotspot}; do
  if (( SECONDS + COLO_S > CALL_S )); then echo "skipped $be: ${SECONDS} s used"; continue; fi
  mkdir -p "$OUT/$be"
  PYTHONPATH=. timeout "$COLO_S" python benchmarks/colocate_bench.py --out "$OUT/$be" --lc bert-base --be "$be" \
    --versions green32 --policies lc_alone,timeshare,partition --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
    | grep -v Warning > "$OUT/$be/colocate.log"
  grep -E "^bert-base\+|span |fused query|max LC-alone|^total " "$OUT/$be/colocate.log"
done
# the device tool returns at most 8 files from $OUT: everything in one archive
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
