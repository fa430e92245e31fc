#!/usr/bin/env bash
# Issue 8: Aker with the BE kernel in a worker partition of the plan's own GEMM (--lc-gemms plan-ws, version ws), the
# LC compiled with tuning (the deployed BERT-base B8 S128). Prediction (docs/perf-notes.md, Session 56; the probe curves
# through the scheduler on the simulated GPU, ws_whatif_sim.py): histogram +0..+7%, mri-q +0..+4%, stencil7 and cutcp
# ~0%, QoS kept (beside the tuned compiled LC nothing has gained before: +0.0%). BES / POLICIES / CALL_S: shorter runs.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/ws"
PYTHONPATH=. timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_ws_partition.py 2>&1 | tail -3
left=$(( ${CALL_S:-570} - SECONDS - 15 ))
PYTHONPATH=. timeout "$left" python benchmarks/colocate_bench.py --out "$OUT/ws" --lc bert-base --be "${BES:-histogram,mriq,stencil7,cutcp}" \
  --be-each --versions "${VERSIONS:-ws,green32}" --lc-gemms plan-ws --lc-tune fast \
  --policies "${POLICIES:-lc_alone,timeshare,aker,partition,auto}" --seconds "${SECONDS_RUN:-0.5}" --classify selected --max-keys 4 \
  2>&1 | grep -v Warning > "$OUT/ws/colocate.log"
grep -E "compiled in|ws host|solo query|allowance| p99 |FAILED|Error|overlap|decisions" "$OUT/ws/colocate.log" | cut -c1-300
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
