#!/usr/bin/env bash
# (Ran in sessions 63-64 with legality version 4; its --without rules memory_spacing / lds_in_place were removed in session 64.)
# Issue 7 (session 63): the short form of s63_call2.sh for the device time left: the moves legality v4's 4-cycle memory
# spacing removes on the mma-sync GEMM only (refused ones first, each alone and 1 slot on), then SIP with v4 on that
# GEMM [512, 512, 2048]. Predictions as in s63_call2.sh: some refused LDS/LDSM moves wrong, the LDGSTS / STS / STG ones
# right; SIP 0 wrong, best accepted within +1..+2%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/gemm_mma_sync" "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 70 python benchmarks/experiments/sass_move_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x128x64w8s3 --mma-form mma-sync --without memory_spacing,lds_in_place --steps 2 \
  --samples 256 --out "$OUT/gemm_mma_sync" 2>&1 | grep -v Warning | tail -4
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 150 python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048 --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 50 --deadline-s 130 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
