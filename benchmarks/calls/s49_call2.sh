#!/usr/bin/env bash
# Session 49, device call 2: the plan re-check of the decode attention's one-launch merge, the back-to-back time a step
# (GPU time vs one call's latency), the B1 decode step with kfuse, its prefetch and paired-write ablations and the
# PyTorch sides, then B8 where B8_S (seconds) is set. Everything lands in $OUT/r2.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r2; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 40 tests/runtime/test_attention_choice.py tests/kernels/test_gated_gemm.py tests/passes/test_fold_row_norm.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -20
PYTHONPATH=. timeout 200 python benchmarks/decode_bench.py --out "$R/b1" --batches 1 --generate 0 --profile kfuse \
  --sides eager_cudagraph,kfuse,compile_cudagraphs,kfuse_no_prefetch 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__\|UserWarning\|warn" | tee "$R/dec1.log"
[ "${B8_S:-0}" -gt 0 ] && PYTHONPATH=. timeout "$B8_S" python benchmarks/decode_bench.py --out "$R/b8" --batches 8 --generate 0 \
  --sides eager_cudagraph,kfuse,compile_cudagraphs 2>&1 | grep -v "FutureWarning\|return cls.__new__\|UserWarning\|warn" | tee "$R/dec8.log"
tar czf "$OUT/r2.tgz" -C "$OUT" r2 && rm -rf "$R"
