#!/usr/bin/env bash
# (Ran in sessions 63-64 with legality version 4; its --without rules memory_spacing / lds_in_place were removed in session 64.)
# Issue 7 (written in session 63). Part 1: is ptxas's 4-cycle spacing of memory instructions a correctness rule for every
# kind of memory instruction, or only for some? Session 63's bisect found one wrong single move, an LDS.128 taken from 4
# to 3 cycles after the previous LDS.128; legality version 4 refuses every move that brings two memory instructions of
# a block under 4 cycles (the wgmma GEMM loses 22 of its 32 legal moves at the start). Here every legal move of the model
# without that rule (each also 1 slot on) is verified alone on both tensor-core forms of the GEMM, and the report says
# which of them today's model refuses. Prediction: some refused LDS/LDSM moves compute wrong; the LDGSTS / STS / STG
# pairs under 4 cycles compute right (session 63: one LDGSTS at 2 cycles did).
# Part 2 (was s63_call3.sh): SIP again on the mma-sync GEMM [512, 512, 2048] with version 4, where version 3 left 28 of
# 1,833 candidates wrong. Prediction: 0 wrong; the best accepted gain within +1..+2% (session 62: +1.8%).
set -u
export PYTHONUNBUFFERED=1
run() {  # case config form out timeout
  mkdir -p "$OUT/$4"
  PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "$5" python benchmarks/experiments/sass_move_bisect.py \
    --case "$1" --config "$2" --mma-form "$3" --without memory_spacing,lds_in_place --steps 2 --samples 256 --out "$OUT/$4" 2>&1 \
    | grep -v Warning | tail -4
}
run gemm_leaky_relu_512x512x2048 128x128x64w8s3 mma-sync gemm_mma_sync 80
run gemm_leaky_relu_512x512x2048 128x128x64w8s3 wgmma gemm_wgmma 60
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 170 python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases gemm_leaky_relu_512x512x2048 --mma-form mma-sync \
  --gemm-configs 128x128x64w8s3 --moves memory --iters 1000 --seeds 0,1,2 --search-s 60 --deadline-s 150 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -8
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
