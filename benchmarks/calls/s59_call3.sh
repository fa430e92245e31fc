#!/usr/bin/env bash
# Issue 7, session 59: which single moves the SASS legality model allows but the GPU computes wrong. Session 59's SIP on
# GEMM + LeakyReLU [512, 512, 2048] with the 128 x 64 tile found 955 of 3,000 candidates wrong (all caught, none chosen);
# here each legal move of the instructions all 20 recorded wrong candidates displaced is applied alone (1 and 2 slots)
# and verified on 64 random input sets. Prediction: one or two moves fail alone, in the epilogue (STS / STG beside the
# F2FP packs and address arithmetic) or an LDGSTS passing its read-scoreboard waiter; the LDGSTS-among-LDGSTS moves pass.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/bisect"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${BISECT_S:-240}" python benchmarks/experiments/sass_move_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x64x64w4s4 --from-record benchmarks/results/h100/sass_s59_fastest_tile.json \
  --out "$OUT/bisect" 2>&1 | grep -v Warning | tee "$OUT/bisect/bisect.log" | tail -30
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
