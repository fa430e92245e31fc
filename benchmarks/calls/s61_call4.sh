#!/usr/bin/env bash
# Issue 7, session 61: SIP with the wider move set (memory and register arithmetic) on the two BERT GEMM + LeakyReLU
# shapes, Triton's fastest tile (128 x 128 x 64 w8 s3). Prediction (docs/perf-notes.md): 0 wrong, +1.5..+3% each.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SIP_S:-560}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_bert_4096x768x768,gemm_leaky_relu_bert_4096x3072x768 --gemm-configs 128x128x64w8s3 \
  --moves all --iters 1000 --seeds 0,1,2 --search-s 200 --deadline-s 500 --samples 100000 2>&1 | grep -v Warning \
  | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
