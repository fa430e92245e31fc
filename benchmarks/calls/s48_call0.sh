#!/usr/bin/env bash
# Session 48, the short form of call 1 for a small budget: the skinny GEMM's GPU tests (60 s cap: its in-kernel
# split-K reduction runs for real), then the B1 decode step with the sides that answer the session's question
# (kfuse against session 47's kfuse, kfuse_no_skinny; eager in a CUDA graph and compile_cudagraphs as the
# baselines), kernel profiles of kfuse and kfuse_no_skinny. LIMIT (seconds, default 330) caps the benchmark.
# Everything lands in $OUT/r0.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r0; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 60 tests/kernels/test_skinny_gemm.py tests/passes/test_fold_row_norm.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -20
PYTHONPATH=. timeout "${LIMIT:-330}" python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse,kfuse_no_skinny \
  --sides eager,eager_cudagraph,kfuse,kfuse_no_skinny,compile_cudagraphs,kfuse_no_norm_fold 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec0.log"
tar czf "$OUT/r0.tgz" -C "$OUT" r0 && rm -rf "$R"
