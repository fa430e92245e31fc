#!/usr/bin/env bash
# Device call (issue 8): Aker beside ResNet-50 B32's own convolutions. `--lc-gemms plan-ptb2`: every conv_epilogue
# step of the compiled model as the PTB form of kfuse's implicit-GEMM conv template (`kfuse.colocate.plan_conv`: the
# plan's tuned tile, packed weight and epilogue on its real input), its stages cut so two blocks share an SM.
# The log prints each conv shape's PTB time beside the plan's own kernel (cuDNN where the plan chose it).
# Session 54, the compiled LC (partition / backfill only): ResNet-50 +2.2% best per pair (pathfinder backfill +6.7%).
# Predictions (docs/perf-notes.md, Session 55): the PTB convs ~5-20% slower than the plan's kernels (cuDNN's fused
# conv runs 16 of its 23 layers faster than the template, issue 3's table), the query ~1.4-1.6 ms against 1.32;
# Aker with histogram +3..+15% (the stand-in: +21%), mri-q +0..+5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PYTHONPATH=. timeout "$(( ${CALL_S:-450} - SECONDS ))" python benchmarks/colocate_bench.py --out "$OUT" --lc resnet50 \
  --be "${BES:-histogram,mriq}" --be-each --versions tail,1:1,green16 --lc-gemms "${FORM:-plan-ptb2}" \
  --policies lc_alone,timeshare,aker,partition,auto --max-keys 24 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/colocate.log"
grep -E "compiled in|plan GEMM|solo query| p99 |fused query|FAILED|Error" "$OUT/colocate.log" | cut -c1-190
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
