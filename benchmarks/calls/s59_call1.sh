#!/usr/bin/env bash
# Issue 8, session 59: stencil7 fed by TMA in the worker partition (``ws_partition._STENCIL7_TMA``, built this session).
# Session 58: the LDG form ran stencil7 in 4-8 warps at a fraction of its rate alone ((y - 1) / x past the window 0.87 at
# best, 8 warps with U = 2, ffn1, S = 32), because a thread holds each load in a register. Here one thread has the TMA
# engine copy each block's seven [1, 8, 64] windows into a ring of 3 blocks (14 KB a block; 42 KB beside the s6 host's
# 180 KB), and the warps read them from shared memory. Floor: the whole stencil (256^3 fp32, in and out) is 134 MB, 40 us
# at 3.35 TB/s; a block brings ~2 KB new from HBM (its z + 1 window; the others hit L2), so 3 blocks a SM keep ~6 KB of
# HBM reads in flight, about half of what the SM's share of the bandwidth needs at ~1 us latency.
# Prediction: (y - 1) / x past the window on ffn1 at S = 32 from 0.87 (LDG, w8 u2) to 0.4-0.5; be_free +0.13 -> ~+0.5.
# First the GPU tests (every form, the TMA one included, over a split block range against the references).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/probe"
PYTHONPATH=. timeout 240 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_ws_partition.py 2>&1 | tail -4
PYTHONPATH=. timeout "${PROBE_S:-300}" python benchmarks/experiments/ws_colocate_probe.py --out "$OUT/probe" \
  --shapes "${SHAPES:-attn_out,ffn1}" --be stencil7 --slices "${SLICES:-0,1,4,16,32}" --warps "${WARPS:-4,8}" \
  --unroll "${UNROLL:-1,2}" --feed ldg,tma --hosts "${HOSTS:-pp64x128 s6}" 2>&1 | grep -v Warning | tee "$OUT/probe/probe.log" | tail -40
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
