#!/usr/bin/env bash
# Issue 7: SIP from Triton's fastest GEMM + LeakyReLU tile instead of the tutorial's 128 x 128 (which keeps 16 of 132
# SMs busy at [512, 512, 2048] and is ~65% bound by their tensor cores: docs/sass.md, session 57). sass_bench.py
# --gemm-configs checks and times each tile, then SIP (1,000 iterations x 3 seeds, memory move set) starts from the
# fastest. Prediction (docs/perf-notes.md, Session 57): a 64-row or 64-column tile wins at [512, 512, 2048] at ~5-8 us
# (13.4 us for 128 x 128); on the BERT shape the 128 x 128 tile or a 4-warp one; SIP's best re-timed +0.5..+2%, not 5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SASS_S:-540}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048,gemm_leaky_relu_bert_4096x768x768 \
  --gemm-configs 128x128x64w8s3,128x128x64w4s4,64x128x64w4s4,128x64x64w4s4,64x64x64w4s4,64x64x128w4s3 \
  --moves memory --iters 1000 --seeds 0,1,2 --search-s 200 --deadline-s 520 --samples 100000 2>&1 | grep -v Warning | tail -30
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
