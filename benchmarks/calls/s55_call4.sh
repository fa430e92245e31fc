#!/usr/bin/env bash
# Device call (issue 8): calls 2-3 compiled the LC untuned (`kfuse.compile`'s default `tune="none"`, as every
# co-location run before), so the plan ran cuBLAS for BERT-base's four GEMMs and the PTB forms took the default tiles.
# Here the LC is compiled with `--lc-tune fast` (the shipped H100 records: no tuning time), so the plan-ptb2 LC slices
# kfuse's tuned tiles; the per-GEMM times now come from CUDA-graph replays (call 2's were host-bound single launches).
# Then the compiled tuned LC itself (`--lc-gemms plan`, partition and backfill) as its reference.
# First the failing GPU test with its traceback.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/ptb2" "$OUT/plan"
PYTHONPATH=. timeout 90 python -m pytest -q -x --tb=short -p no:cacheprovider \
  "tests/colocate/test_plan_gemm.py::test_the_plans_tiles_take_an_sm_and_the_cut_ones_share_it" 2>&1 | tail -25
PYTHONPATH=. timeout "$(( ${CALL_S:-480} * 6 / 10 - SECONDS ))" python benchmarks/colocate_bench.py --out "$OUT/ptb2" --lc bert-base \
  --be histogram --be-each --versions tail,1:1,green32 --lc-gemms plan-ptb2 --lc-tune fast \
  --policies lc_alone,timeshare,aker,partition,auto --max-keys 24 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/ptb2/colocate.log"
grep -E "compiled in|plan GEMM|solo query| p99 |FAILED|Error" "$OUT/ptb2/colocate.log" | cut -c1-230
PYTHONPATH=. timeout "$(( ${CALL_S:-480} - SECONDS ))" python benchmarks/colocate_bench.py --out "$OUT/plan" --lc bert-base \
  --be histogram --be-each --versions green16,green32 --lc-gemms plan --lc-tune fast \
  --policies lc_alone,timeshare,partition,backfill --span-fill --max-keys 0 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/plan/colocate.log"
grep -E "compiled in|solo query| p99 |FAILED|Error" "$OUT/plan/colocate.log" | cut -c1-200
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
