#!/usr/bin/env bash
# Issue 7, session 62: is the 1.6% ceiling of SIP on sm_90 the tensor-core form? SIP tuned Ampere code (HMMA fed by
# LDSM from shared memory) on the A100; Triton's default on sm_90 is wgmma (HGMMA reads shared memory itself, so the
# main loop has few memory instructions to place). The same GEMM + LeakyReLU and attention kernels compiled with Triton's mma-sync
# form (DISABLE_MMA_V3), searched with SIP's budget; each record also times the default form.
# Prediction (docs/perf-notes.md, session 62): 0 wrong candidates; mma-sync GEMM 1.4-1.8x the wgmma one;
# SIP's best +3..+8% on the mma-sync GEMMs, +2..+6% on the mma-sync attention kernels.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SIP_S:-570}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_bert_4096x3072x768,attention_sip_1x4x16384x64,gemm_leaky_relu_512x512x2048,attention_bert_8x12x512x64 \
  --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 220 --deadline-s 540 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -24
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
