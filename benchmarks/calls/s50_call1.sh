#!/usr/bin/env bash
# Session 50, device call 1: green-context SM partitions (issue 8: do they exist, are the SM sets disjoint, what
# an LC op pays and a BE slice gets), then session 49's decode call 2 (GPU tests, the B1 decode step).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/g"
PYTHONPATH=. timeout 150 python benchmarks/experiments/green_probe.py --out "$OUT/g" 2>&1 | grep -v Warning | tee "$OUT/g/probe.log" | tail -75
bash benchmarks/calls/s49_call2.sh 2>&1 | tail -40
