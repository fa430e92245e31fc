#!/usr/bin/env bash
# Issue 7 (written in session 63): is ptxas's 4-cycle spacing of memory instructions a correctness rule for every kind
# of memory instruction, or only for some? Session 63's bisect found one wrong single move, an LDS.128 taken from 4 to 3
# cycles after the previous LDS.128; legality version 4 now refuses every move that brings two memory instructions of
# a block under 4 cycles (the wgmma GEMM loses 22 of its 32 legal moves at the start). Here every legal move of the
# model without that rule (each also 2-4 slots on) is verified alone, on both tensor-core forms of both SIP kernels, and
# the report says which of them today's model refuses. Prediction: some of the refused ones with LDS/LDSM pairs
# compute wrong; the LDGSTS / STS / STG pairs under 4 cycles compute right (session 63: one LDGSTS at 2 cycles did).
set -u
export PYTHONUNBUFFERED=1
run() {  # case config form out timeout
  mkdir -p "$OUT/$4"
  PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "$5" python benchmarks/experiments/sass_move_bisect.py \
    --case "$1" --config "$2" --mma-form "$3" --without memory_spacing --steps 4 --samples 256 --out "$OUT/$4" 2>&1 \
    | grep -v Warning | tail -6
}
run gemm_leaky_relu_512x512x2048 128x128x64w8s3 mma-sync gemm_mma_sync 150
run gemm_leaky_relu_512x512x2048 128x128x64w8s3 wgmma gemm_wgmma 120
run attention_sip_1x4x16384x64 128x128x64w8s3 mma-sync attention_mma_sync 120
run attention_sip_1x4x16384x64 128x128x64w8s3 wgmma attention_wgmma 100
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
