#!/usr/bin/env bash
# Issue 7, session 61: SIP with the budget on the two target kernels not yet searched with it: attention at
# BERT's shape [8, 12, 512, 64] and GEMM + LeakyReLU at BERT [4096, 3072, 768] from Triton's fastest of six tiles.
# Prediction (docs/perf-notes.md, session 61): 0 wrong candidates, best +0.5..+2% each, nothing at 5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SIP_S:-560}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases attention_bert_8x12x512x64,gemm_leaky_relu_bert_4096x3072x768 \
  --gemm-configs 128x128x64w8s3,128x128x64w4s4,64x128x64w4s4,128x64x64w4s4,64x64x64w4s4,64x64x128w4s3 \
  --moves memory --iters 1000 --seeds 0,1,2 --search-s 200 --deadline-s 500 --samples 100000 2>&1 | grep -v Warning \
  | tee "$OUT/sass/sass.log" | tail -24
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
