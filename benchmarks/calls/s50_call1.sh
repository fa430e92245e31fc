#!/usr/bin/env bash
# Session 50, device call 1 (issue 8): green-context SM partitions. The probe (do they exist, are the two sides'
# SMs disjoint, what an LC op pays and a BE slice gets), then, if partitions were made, the co-location benchmark
# on BERT-base B8 S128: time sharing, Aker with the per-kernel SM-partition versions, and the whole-query
# partition policy (32 or 48 SMs for the BE), no fused kernel to compile.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/g" "$OUT/c"
PYTHONPATH=. timeout 60 python benchmarks/experiments/green_probe.py --out "$OUT/g" --be sgemm --be-sms 32,48 2>&1 \
  | grep -v Warning | tee "$OUT/g/probe.log" | tail -25
if grep -q '"partitions"' "$OUT/g/green_probe.json" 2>/dev/null; then
  PYTHONPATH=. timeout "${COLO_S:-400}" python benchmarks/colocate_bench.py --out "$OUT/c" --lc bert-base --be sgemm \
    --versions green32,green48 --policies lc_alone,timeshare,partition --max-keys 24 --seconds 0.5 2>&1 \
    | grep -v Warning | tee "$OUT/c/colocate.log" | tail -45
fi
