#!/usr/bin/env bash
# Issue 8, session 65: the compiled LC's first co-location run on an H200 (sessions 50-64 got H100s; 13-19 ran the stand-in LC on an H200). s57_call1's `ws` form:
# histogram in a worker partition (8 BE warps) of the tuned compiled BERT-base B8 S128's GEMMs, against time sharing.
# H100 record: +6.4%, -1.2%, +4.4%, -0.1% over four runs (sessions 58-59). Prediction on the H200: the same band,
# -1..+7%, QoS kept at p99 (the H200's faster HBM helps the LC and histogram alike).
set -u
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
mkdir -p "$OUT/ws8"
[ -n "${SKIP_TESTS:-}" ] || PYTHONPATH=. timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_ws_partition.py 2>&1 | tail -3
left=$(( ${CALL_S:-420} - SECONDS - 10 ))
PYTHONPATH=. timeout "$left" python benchmarks/colocate_bench.py --out "$OUT/ws8" --lc bert-base --be "${BES:-histogram}" \
  --be-each --versions ws --ws-warps 8 --ws-unroll 1 --ws-feed ldg --lc-gemms plan-ws --lc-tune fast \
  --policies "${POLICIES:-lc_alone,timeshare,aker}" --seconds 0.5 --classify selected --max-keys 4 \
  2>&1 | grep -v Warning > "$OUT/ws8/colocate.log"
grep -E "compiled in|solo query|allowance| p99 |FAILED|Error|overlap|decisions" "$OUT/ws8/colocate.log" | cut -c1-240
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
