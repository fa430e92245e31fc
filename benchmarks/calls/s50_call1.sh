#!/usr/bin/env bash
# Session 50, device call 1 (issue 8): green-context SM partitions. The probe (do they exist, are the two sides'
# SMs disjoint, what an LC op pays and a BE slice gets), then, if partitions were made, the co-location benchmark
# on BERT-base B8 S128 with the SM-partition versions only (no fused kernel to compile), against time sharing.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/g" "$OUT/c"
PYTHONPATH=. timeout 120 python benchmarks/experiments/green_probe.py --out "$OUT/g" --be sgemm,lbm --be-sms 16,32,64 2>&1 \
  | grep -v Warning | tee "$OUT/g/probe.log" | tail -40
if grep -q '"partitions"' "$OUT/g/green_probe.json" 2>/dev/null; then
  PYTHONPATH=. timeout "${COLO_S:-400}" python benchmarks/colocate_bench.py --out "$OUT/c" --lc bert-base --be sgemm,lbm \
    --versions green32,green64 --max-keys 24 --seconds 0.6 2>&1 | grep -v Warning | tee "$OUT/c/colocate.log" | tail -45
fi
