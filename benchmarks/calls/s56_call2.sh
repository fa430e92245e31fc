#!/usr/bin/env bash
# Issue 8, session 56: a BE kernel as a Gluon worker partition of the ping-pong GEMM (kfuse.colocate.ws_partition),
# beside BERT-base B8 S128's four GEMM shapes. First the GPU test (both outputs against their references, odd shapes),
# then the probe (benchmarks/experiments/ws_colocate_probe.py; prediction in its docstring and docs/perf-notes.md,
# Session 56).
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/probe"
PYTHONPATH=. timeout 150 python -m pytest -q -p no:cacheprovider -p no:logging tests/colocate/test_ws_partition.py 2>&1 | tail -4
PYTHONPATH=. timeout "${PROBE_S:-330}" python benchmarks/experiments/ws_colocate_probe.py --out "$OUT/probe" \
  --slices "${SLICES:-0,1,2,4,8}" --warps "${WARPS:-4}" --hosts "${HOSTS:-pp64x128 s6,pp128 s4,pp192 s4 sc,pp64x128 k128 s3}" 2>&1 | grep -v Warning | tee "$OUT/probe/probe.log" | tail -60
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
