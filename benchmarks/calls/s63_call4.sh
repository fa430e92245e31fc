#!/usr/bin/env bash
# Issue 7 (session 63): SIP with legality v4 on the mma-sync GEMM [512, 512, 2048] still made 7 of 1,340 candidates
# wrong (sass_s63_spacing_rule.json; ~1,500 outputs each). Rebuild 3 of them, cut into segments, verify each alone.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/cand"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 100 python benchmarks/experiments/sass_candidate_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x128x64w8s3 --mma-form mma-sync --candidates 3 --samples 512 \
  --record benchmarks/results/h100/sass_s63_spacing_rule.json --without-spacing --out "$OUT/cand" 2>&1 | grep -v Warning | tail -30
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
