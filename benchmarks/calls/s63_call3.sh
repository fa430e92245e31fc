#!/usr/bin/env bash
# Issue 7 (written in session 63): SIP again on the mma-sync GEMM + LeakyReLU [512, 512, 2048] with legality version 4
# (ptxas's 4-cycle memory spacing), the kernel where version 3 left 28 of 1,833 candidates wrong. Prediction: 0 wrong;
# the best accepted gain stays within +1..+2% (session 62: +1.8%), perhaps less with fewer legal moves (39 -> 28).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SIP_S:-260}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048 --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 110 --deadline-s 230 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
