#!/usr/bin/env bash
# Session 47, the short form of call 1 for a nearly spent budget: the B1 decode step only (no tests), kfuse right
# after the eager sides, then transformers' compile and the two fold ablations; kernel profiles of kfuse and eager
# in a CUDA graph. LIMIT (seconds, default 400) caps the benchmark. Everything lands in $OUT/r0.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r0; mkdir -p "$R"
PYTHONPATH=. timeout "${LIMIT:-400}" python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse,eager_cudagraph \
  --sides eager,eager_cudagraph,kfuse,compile_cudagraphs,kfuse_no_query_rotary,kfuse_no_cache_write 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec1.log"
tar czf "$OUT/r0.tgz" -C "$OUT" r0 && rm -rf "$R"
