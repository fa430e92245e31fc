#!/usr/bin/env bash
# Issue 7 (written in session 63): SIP with legality version 4 as shipped (plain LDS kept in place, memory kept 4 cycles
# from them) on both mma-sync kernels, where version 3 left 28 of 1,833 GEMM candidates wrong and session 63's broader
# spacing rule 7 of 1,340. Prediction: 0 wrong on both; best accepted within +1..+2% (GEMM), +1..+2% (attention).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 320 python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048,attention_sip_1x4x16384x64 --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 110 --deadline-s 280 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
