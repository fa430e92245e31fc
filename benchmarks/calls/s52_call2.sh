#!/usr/bin/env bash
# Next device call (issue 7): SIP's search budget (1,000 iterations x 3 seeds) with the wider move set (memory
# instructions and register arithmetic: 238 legal moves at the start of the GEMM, 369 of the attention kernel, against
# 34 and 11 with memory instructions only), on the two kernels session 30 searched with the memory-only set. First
# question: 0 failed candidates now that MUFU without a scoreboard keeps its order (session 51's short run: 5 of 373
# wrong before that fix; `failed_candidates_displaced` in the JSON names the moves of any that still fail).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/sass"
PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl timeout "${SASS_S:-540}" python benchmarks/sass_bench.py --out "$OUT/sass" \
  --cases attention_sip_1x4x16384x64,gemm_leaky_relu_512x512x2048 --moves all --iters 1000 --seeds 0,1,2 \
  --search-s 230 --deadline-s 520 --samples 100000 2>&1 | grep -v Warning | tail -30
