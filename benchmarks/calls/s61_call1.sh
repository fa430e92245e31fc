#!/usr/bin/env bash
# Session 61, one call whatever card comes. On an H200 first issue 3's shipped records (s54_call2.sh: the H200 has none;
# every call since session 50 got an H100). Then issue 8: stencil7's TMA form with one window and mbarrier allocation a
# kind (Triton's barrier analysis had put a barrier of the partition's warps after every copy: 8 a block -> 4) and two
# blocks an iteration (U = 2), checked alone and beside the ffn1 GEMM, then probed against the LDG form.
# Prediction: alone (8 warps) 0.119 -> ~0.10 ms (U = 1, 4 slots), ~0.09 (U = 2, 2 slots); beside ffn1 at S = 32 blocks a
# program 23.2 -> ~20 us, about the LDG u2 form's 19.3: a tie, not a clear win.
set -u
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
mkdir -p "$OUT/check" "$OUT/probe"
if [[ "$gpu" == *H200* ]]; then
  SHIP_S=${SHIP_S:-260} SHIP_DEADLINE_S=${SHIP_DEADLINE_S:-180} bash benchmarks/calls/s54_call2.sh 2>&1 | tail -20
fi
PYTHONPATH=. timeout "${CHECK_S:-150}" python benchmarks/experiments/ws_tma_check.py --out "$OUT/check" --sanitizer \
  --variants "${VARIANTS:-alone w8 s4,alone w8 u2 s2,fused s6 w8 s4,fused s6 w8 u2 s2}" 2>&1 | grep -v Warning | tee "$OUT/check/check.log" | tail -12
if grep -q '"ok": false' "$OUT/check/tma_check.json" 2>/dev/null || [ ! -f "$OUT/check/tma_check.json" ]; then
  echo "TMA form not right: no probe"
else
  PYTHONPATH=. timeout "${PROBE_S:-200}" python benchmarks/experiments/ws_colocate_probe.py --out "$OUT/probe" \
    --shapes ffn1 --be stencil7 --slices "${SLICES:-0,1,4,16,32}" --warps 8 \
    --unroll 1,2 --feed ldg,tma --hosts "pp64x128 s6" 2>&1 | grep -v Warning | tee "$OUT/probe/probe.log" | tail -16
fi
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
