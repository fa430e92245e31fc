#!/usr/bin/env bash
# Issue 7, session 62: SIP again on two mma-sync kernels after the legality fixes (legality version 3: warp MMA
# register groups and latency, loads covered by a later load's scoreboard). Call 1 found 60 of 1,493 and 27 of
# 2,633 candidates wrong on them. Prediction (docs/perf-notes.md, session 62): 0 wrong (at most a few: 3 of the 60
# recorded wrong orders stay reachable); the best gains as before, +1..+2%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SIP_S:-320}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048,attention_sip_1x4x16384x64 --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 110 --deadline-s 280 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
