#!/usr/bin/env bash
# Session 51, device call 1 (issue 8): the partition policy on the BE kernels other than sgemm (session 50 ran
# only BERT-base + sgemm), two BE kernels a process so a time-out keeps what ran; then session 50's fixed GPU test.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/c1" "$OUT/c2" "$OUT/t"
PYTHONPATH=. timeout "${COLO_S:-240}" python benchmarks/colocate_bench.py --out "$OUT/c1" --lc bert-base --be histogram,mriq \
  --versions green32,green40 --policies lc_alone,timeshare,partition --max-keys 24 --seconds 0.5 2>&1 \
  | grep -v Warning > "$OUT/c1/colocate.log"
tail -8 "$OUT/c1/colocate.log"
PYTHONPATH=. timeout "${COLO_S:-240}" python benchmarks/colocate_bench.py --out "$OUT/c2" --lc bert-base --be cutcp,hotspot \
  --versions green32,green40 --policies lc_alone,timeshare,partition --max-keys 24 --seconds 0.5 2>&1 \
  | grep -v Warning > "$OUT/c2/colocate.log"
tail -8 "$OUT/c2/colocate.log"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 60 python -m pytest -q -p no:cacheprovider \
  tests/colocate/test_green_version.py -k run_span 2>&1 | tail -3
