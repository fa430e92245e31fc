#!/usr/bin/env bash
# Session 47, device call 1: session 46's decode work on the GPU for the first time.
# The GPU-facing tests of the state writes / decode attention / cache writes, then the B1 decode step
# (all PyTorch sides and kfuse's two ablations). Everything lands in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 150 tests/runtime/test_state_writes.py tests/runtime/test_attention_choice.py \
  tests/frontend/test_hf_static_cache.py tests/frontend/test_mutation.py tests/kernels/test_decode_attention.py \
  tests/kernels/test_rotary.py tests/passes/test_fuse_cache_write.py tests/test_decode_bench_script.py tests/test_kernel_profile.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -30
PYTHONPATH=. timeout 400 python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse,eager_cudagraph,compile_cudagraphs \
  --sides eager,eager_cudagraph,compile,compile_cudagraphs,kfuse,kfuse_no_cache_write,kfuse_no_query_rotary,kfuse_no_pdl 2>&1 | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec1.log"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
