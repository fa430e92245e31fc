#!/usr/bin/env bash
# Session 49, device call 1: session 48's call (the decode work of sessions 46-48) plus the races compiled together and the one-launch decode attention and the weight prefetch (session 49).
# The GPU-facing tests of the skinny GEMM (its in-kernel split-K reduction runs for real here), the decode kernels,
# cache writes, state writes and the norm fold (100 s cap), then the B1 decode step: the PyTorch sides, kfuse, and
# its ablations (no skinny kernel + no norm fold = session 47's kfuse; no norm fold; no cache write; no query
# rotary; no PDL), with kernel profiles. Everything lands in $OUT/r.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 100 tests/kernels/test_skinny_gemm.py tests/kernels/test_decode_attention.py \
  tests/kernels/test_rotary.py tests/passes/test_fold_row_norm.py tests/passes/test_fuse_query_rotary.py \
  tests/passes/test_fuse_cache_write.py tests/frontend/test_hf_static_cache.py tests/runtime/test_state_writes.py \
  tests/runtime/test_choice.py tests/passes/test_fuse_gated_mlp.py tests/runtime/test_attention_choice.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -30
# the folded norm's forms side by side (in-loop squares, the slice, norm + cuBLAS / skinny / gated tile; both weight layouts)
PYTHONPATH=. timeout 60 python benchmarks/experiments/skinny_probe.py --folded-only --out "$R" 2>&1 | grep -v Warning | tail -6
PYTHONPATH=. timeout 380 python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse,kfuse_no_skinny,eager_cudagraph \
  --sides eager,eager_cudagraph,kfuse,kfuse_no_prefetch,kfuse_no_skinny,compile_cudagraphs,kfuse_no_norm_fold,kfuse_no_paired_writes,compile,kfuse_no_cache_write 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec1.log"
tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"
