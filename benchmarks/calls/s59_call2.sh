#!/usr/bin/env bash
# Issue 8, session 59: s59_call1's GPU tests ended with an illegal instruction in the first TMA-fed stencil7 test (the
# context lost; offline the SASS showed nothing wrong: no register past the partition's 56, the ring and its mbarriers
# apart from the GEMM's live buffers, named barriers of the partition's 256 threads). Here each TMA-fed variant runs in a
# process of its own (the partition's code alone, then beside the GEMM on both hosts), the first failure again under
# compute-sanitizer for the faulting instruction; if every variant is right, the probe of s59_call1 (its prediction there).
# First run (H100): the partition's code alone faulted too, at the x - 1 box (compute-sanitizer: illegal instruction at
# the second copy; a box's innermost coordinate off 16 bytes). Now five boxes (x-aligned) and the x neighbours by LDG.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/check" "$OUT/probe"
PYTHONPATH=. timeout "${CHECK_S:-300}" python benchmarks/experiments/ws_tma_check.py --out "$OUT/check" --sanitizer \
  --variants "${VARIANTS:-alone w8 s4,fused s6 w8 s4,fused pp128 w4 s3}" 2>&1 | grep -v Warning | tee "$OUT/check/check.log" | tail -30
if grep -q '"ok": false' "$OUT/check/tma_check.json" 2>/dev/null || [ ! -f "$OUT/check/tma_check.json" ]; then
  echo "TMA form not right: no probe"
else
  PYTHONPATH=. timeout "${PROBE_S:-200}" python benchmarks/experiments/ws_colocate_probe.py --out "$OUT/probe" \
    --shapes "${SHAPES:-ffn1}" --be stencil7 --slices "${SLICES:-0,1,4,16,32}" --warps "${WARPS:-8}" \
    --unroll "${UNROLL:-1,2}" --feed ldg,tma --hosts "${HOSTS:-pp64x128 s6}" 2>&1 | grep -v Warning | tee "$OUT/probe/probe.log" | tail -25
fi
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
