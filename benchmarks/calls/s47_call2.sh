#!/usr/bin/env bash
# Session 47, device call 2: the B8 decode step (all sides, kfuse's ablations), then whole generate loops at B1
# (eager, transformers' own compile, kfuse as its backend). Everything lands in $OUT/r2.tgz.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r2; mkdir -p "$R"
PYTHONPATH=. timeout 330 python benchmarks/decode_bench.py --out "$R/b8" --batches 8 --generate 0 --profile kfuse,eager_cudagraph,compile_cudagraphs \
  --sides eager,eager_cudagraph,kfuse,compile_cudagraphs,compile,kfuse_no_cache_write,kfuse_no_query_rotary,kfuse_no_pdl 2>&1 | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec8.log"
PYTHONPATH=. timeout 230 python benchmarks/decode_bench.py --out "$R/gen" --batches 1 --generate 32 --sides eager \
  2>&1 | grep -v "FutureWarning\|return cls.__new__" | tee "$R/gen.log"
tar czf "$OUT/r2.tgz" -C "$OUT" r2 && rm -rf "$R"
