#!/usr/bin/env bash
# Session 47, device call 1: the decode work of sessions 46-47 on the GPU for the first time.
# The GPU-facing tests of the decode kernels / cache writes / state writes (90 s cap), then the B1 decode step
# (all PyTorch sides, kfuse's three ablations, kernel profiles). Everything lands in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 90 tests/kernels/test_decode_attention.py tests/kernels/test_rotary.py \
  tests/passes/test_fuse_query_rotary.py tests/passes/test_fuse_cache_write.py tests/frontend/test_hf_static_cache.py \
  tests/runtime/test_state_writes.py tests/runtime/test_attention_choice.py tests/test_kernel_profile.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -30
PYTHONPATH=. timeout 440 python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse,eager_cudagraph,compile_cudagraphs \
  --sides eager,eager_cudagraph,kfuse,compile_cudagraphs,compile,kfuse_no_cache_write,kfuse_no_query_rotary,kfuse_no_pdl 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec1.log"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
