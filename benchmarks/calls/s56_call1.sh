#!/usr/bin/env bash
# Next device call (issue 8), written at the end of session 55: the own-tile LC with the co-location tile chosen by
# time (`plan_gemm.colocation_tiles`: the stage cut, C stored by pointers, or half the K step at twice the stages;
# built after session 55's calls), the LC compiled with tuning; then the tuned compiled LC beside pathfinder (the
# backfill's best BE kernel, +2.5% beside the untuned compiled BERT-base in session 54).
# Predictions (docs/perf-notes.md, Session 55): BERT-base's PTB GEMMs 1.50x -> ~1.15-1.25x the plan's kernels, its
# query 1.245 -> ~1.05-1.10 ms, Aker with histogram +3..+6%; ResNet-50's convs 1.62x -> ~1.3x; the tuned compiled LC
# with pathfinder's backfill +0..+2.5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/bert" "$OUT/resnet" "$OUT/plan"
PYTHONPATH=. timeout 120 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_plan_gemm.py \
  tests/colocate/test_plan_conv.py 2>&1 | tail -3
run() {  # out lc be versions gemms policies [extra...]
  local out=$1 lc=$2 be=$3 versions=$4 gemms=$5 policies=$6; shift 6
  local left=$(( ${CALL_S:-570} - SECONDS - 20 ))
  if [ "$left" -lt 40 ]; then echo "skipped $out: ${left} s left"; return; fi
  PYTHONPATH=. timeout "$left" python benchmarks/colocate_bench.py --out "$OUT/$out" --lc "$lc" \
    --be "$be" --be-each --versions "$versions" --lc-gemms "$gemms" --lc-tune fast --policies "$policies" --seconds 0.5 \
    --classify selected "$@" 2>&1 | grep -v Warning > "$OUT/$out/colocate.log"
  grep -E "compiled in|plan GEMM|fit:|solo query| p99 |FAILED|Error" "$OUT/$out/colocate.log" | cut -c1-260
}
run bert bert-base histogram,hotspot tail,1:1,green32 plan-ptb2 lc_alone,timeshare,aker,partition,auto --max-keys 24
run resnet resnet50 histogram tail,1:1,green16 plan-ptb2 lc_alone,timeshare,aker,partition,auto --max-keys 24
run plan bert-base pathfinder green16,green32 plan lc_alone,timeshare,partition,backfill --span-fill --max-keys 0
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
