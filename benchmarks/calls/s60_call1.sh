#!/usr/bin/env bash
# Issue 7, session 60. (1) The bisect of s59_call3 with the model as session 59 had it (no barrier-settle rule), each
# move also marked with today's verdict. Prediction: the wrong single moves are the STS.128 at 0x39c0 moved up to 3
# cycles after its BAR.SYNC (and maybe the LDGSTS at 0x24b0 moved up to 9 cycles after one), and today's model refuses
# every wrong one. (2) SIP again on [512, 512, 2048] from the 128 x 64 tile with today's model. Prediction: 0 wrong
# candidates of 3,000 (955 in session 59); a verified gain of 0..+2% (the search spread 0.983-1.020 there).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/bisect" "$OUT/sass"
PP=.:.whl/pyelftools-0.32-py3-none-any.whl
PYTHONPATH=$PP timeout "${BISECT_S:-200}" python benchmarks/experiments/sass_move_bisect.py \
  --case gemm_leaky_relu_512x512x2048 --config 128x64x64w4s4 --from-record benchmarks/results/h100/sass_s59_fastest_tile.json \
  --out "$OUT/bisect" 2>&1 | grep -v Warning | tee "$OUT/bisect/bisect.log" | tail -20
PYTHONPATH=$PP timeout "${SIP_S:-300}" python benchmarks/sass_bench.py --out "$OUT/sass" --cases gemm_leaky_relu_512x512x2048 \
  --gemm-configs 128x64x64w4s4 --moves memory --iters 1000 --seeds 0,1,2 --search-s 150 --deadline-s 280 \
  --samples 100000 2>&1 | grep -v Warning | tee "$OUT/sass/sass.log" | tail -15
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
