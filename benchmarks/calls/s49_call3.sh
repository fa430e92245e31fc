#!/usr/bin/env bash
# Session 49, device call 3 (the last ~300 s of the budget): the B1 decode step only, with the plan re-check of the
# attention's one-launch merge, the K-contiguous folded weights, the back-to-back time a step, and the prefetch ablation.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r3; mkdir -p "$R"
PYTHONPATH=. timeout 200 python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse \
  --sides eager_cudagraph,kfuse,compile_cudagraphs,kfuse_no_prefetch 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__\|UserWarning\|warn" | tee "$R/dec3.log"
tar czf "$OUT/r3.tgz" -C "$OUT" r3 && rm -rf "$R"
