#!/usr/bin/env bash
# Issue 8, session 58: the worker partition past the window. Session 57's ws run profiled its hosts out to x = 3.3 and
# gave slopes of ~1.3 (histogram, 4 warps) and ~3 (stencil7) past the GEMM's window: the partition's few warps run the BE
# at a fraction of the solo kernel's rate (docs/perf-notes.md, Session 58). Here: stencil7 with 1, 2 and 4 of its blocks
# an iteration (U x the bytes in flight a thread; built this session, checked offline: no spills) and histogram at 8
# warps, both out to 32 blocks a program, on the s6 host. First the GPU tests (the unrolled stencil7 over a split block
# range against its reference). Prediction: U = 4 at 4 warps raises stencil7's rate in the partition 2-3x (slope past
# the window ~3 -> ~1-1.5, be_free at 16 blocks a program from below -1 to about 0); histogram at 8 warps keeps y - 1
# below 0.3 x out to x ~2.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/probe"
PYTHONPATH=. timeout 180 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_ws_partition.py 2>&1 | tail -4
PYTHONPATH=. timeout "${PROBE_S:-300}" python benchmarks/experiments/ws_colocate_probe.py --out "$OUT/probe" \
  --shapes "${SHAPES:-attn_out,ffn1}" --be "${BES:-stencil7,histogram}" --slices "${SLICES:-0,1,4,16,32}" --warps "${WARPS:-4,8}" \
  --unroll "${UNROLL:-1,2,4}" --hosts "pp64x128 s6" 2>&1 | grep -v Warning | tee "$OUT/probe/probe.log" | tail -40
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
