#!/usr/bin/env bash
# Issue 7 (written in session 62): find the hole left in the legality model on the mma-sync GEMM. After legality
# version 3, SIP on GEMM + LeakyReLU [512, 512, 2048] (128 x 128 x 64 w8 s3, mma-sync form) still made 28 of 1,833
# candidates wrong (4.0% before; attention 0 of 1,360). Each move of the 8 instructions every recorded wrong candidate
# displaced is applied alone (and up to 8 slots on) and verified. Prediction: an LDSM of the loop's last K step (0x1e00 or
# 0x1e20) moved 4-8 slots down past the HMMAs that reuse R136 / R32 is wrong alone (the wrong candidates move them there
# 2-40x as often as random walks of legal moves do); one or two moves wrong in all, the
# model's verdict "legal" on each.
set -u
export PYTHONUNBUFFERED=1
# Session 63 added the first step: the recorded wrong candidates themselves, rebuilt, cut into independent segments,
# each segment verified alone and the rest without it (sass_candidate_bisect.py): this finds a hole that needs two moves.
mkdir -p "$OUT/bisect" "$OUT/cand"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 240 python benchmarks/experiments/sass_candidate_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x128x64w8s3 --mma-form mma-sync --candidates 2 --samples 512 \
  --record benchmarks/results/h100/sass_s62_mma_sync_v3.json --out "$OUT/cand" 2>&1 | grep -v Warning | tail -40
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout 280 python benchmarks/experiments/sass_move_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x128x64w8s3 --mma-form mma-sync --steps 8 --samples 256 \
  --from-record benchmarks/results/h100/sass_s62_mma_sync_v3.json --out "$OUT/bisect" 2>&1 | grep -v Warning | tail -20
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
