#!/usr/bin/env bash
# Device call (issue 8): Aker's fusion beside the LC's *own* GEMM kernels. `--lc-gemms plan-ptb2`: every gemm_epilogue
# step of the compiled BERT-base as the PTB form of kfuse's template (the plan's tuned tile and generated epilogue on
# its real operands, `kfuse.colocate.plan_gemm`), its pipeline stages cut so two blocks share an SM: offline sm_90
# compiles (session 55) put the plan's tuned tiles at 160-213 KB of shared memory, one block an SM, and a fused
# kernel's blocks all take the larger branch's shared memory, so with the plan's stages no BE block could sit beside
# an LC block. The log prints each GEMM shape's PTB time beside the plan's own kernel (what the LC pays to be sliceable).
# Predictions (docs/perf-notes.md, Session 55): the PTB GEMMs within ~5-15% of the plan's kernels (two stages instead
# of four; the Gluon ping-pong tiles on Triton's 128 x 128 TMA tile), the LC query ~0.80-0.90 ms against the plan's
# ~0.75; Aker with histogram +5..+20% (the stand-in's +35% came partly from its 48-tile GEMMs' idle SMs), hotspot and
# mri-q +0..+5%; the partition ~0..+3% as for the compiled LC.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PYTHONPATH=. timeout 150 python -m pytest -q -p no:cacheprovider tests/colocate/test_plan_gemm.py tests/colocate/test_plan_conv.py tests/colocate/test_lc_items.py 2>&1 | tail -3
PYTHONPATH=. timeout "$(( ${CALL_S:-560} - SECONDS ))" python benchmarks/colocate_bench.py --out "$OUT" --lc bert-base \
  --be "${BES:-histogram,hotspot,mriq}" --be-each --versions tail,1:1,green32 --lc-gemms "${FORM:-plan-ptb2}" \
  --policies lc_alone,timeshare,aker,partition,auto --max-keys 24 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/colocate.log"
grep -E "compiled in|plan GEMM|solo query| p99 |fused query|FAILED|Error" "$OUT/colocate.log" | cut -c1-190
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
