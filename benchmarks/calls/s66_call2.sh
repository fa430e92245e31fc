#!/usr/bin/env bash
# Issue 8, session 66: the fair baseline for all four `ws` BE kernels. `--be-form fastest` times each BE kernel's PTB
# forms (4 / 8 warps on 2 / 4 / 8 programs an SM, each checked first) and runs time sharing (and every profile's x) on
# the fastest. Prediction: histogram picks 8 warps (0.37 ms on the H100) and Aker gains -1..+4% (session 66: +0.9/+1.6%
# with 8 warps on 4 an SM); mri-q, stencil7, cutcp pick 8 programs an SM (3-9% faster than 4) and stay at +0..+1%.
set -u
export PYTHONUNBUFFERED=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $gpu"
mkdir -p "$OUT/fair"
PYTHONPATH=. timeout $(( ${CALL_S:-330} - 10 )) python benchmarks/colocate_bench.py --out "$OUT/fair" --lc bert-base \
  --be "${BES:-histogram,mriq,stencil7,cutcp}" --be-each --be-form fastest --versions ws --ws-warps 8 --ws-unroll 1 --ws-feed ldg \
  --lc-gemms plan-ws --lc-tune fast --policies lc_alone,timeshare,aker --seconds 0.5 --classify selected --max-keys 4 \
  2>&1 | grep -v Warning > "$OUT/fair/colocate.log"
grep -E "^BE | aker |timeshare|ts_rerun|BE fit" "$OUT/fair/colocate.log" | cut -c1-220
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
