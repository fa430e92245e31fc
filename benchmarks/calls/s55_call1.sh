#!/usr/bin/env bash
# Next device call (issue 8): does Aker's fusion survive an LC nearer the compiled model? `--lc-gemms ptb-tuned`: the
# PTB stand-in GEMMs (which Aker's fused versions slice) on the fastest of four tiles for each shape
# (`ptb.pick_ptb_config`, 128x128x32 / 128x64x32 / 64x128x32 / 64x64x64, none above the default's 48 KB of shared
# memory), where the stand-in ran every shape on 128 x 128 (48 tiles on 132 SMs for BERT-base's 1024 x 768 GEMMs).
# Session 54: against the compiled LC no partition pays (BERT-base +0.5%, ResNet-50 +2.2% best per pair); the
# stand-in's partition gains were SMs its few-tile GEMMs left idle. BERT-base with histogram (Aker +34.8%, auto +35.2%
# on the one-tile stand-in, session 51), hotspot and mri-q; Aker, the 32-SM partition and auto.
# Predictions: the tuned tiles take the 1024 x 768 GEMMs to 64 x 64 or 128 x 64 and the query's kernels from ~1.08 ms
# to ~0.85-0.95 ms (the compiled model 0.75 ms); the partition's gains shrink toward the compiled LC's (~0..+3%);
# Aker with histogram keeps part of its gain, +10..+25% (its fused blocks use atomics and CUDA cores beside tensor-core
# tiles, which a faster GEMM does not take away, but the tail fill's idle SMs shrink); hotspot and mri-q +0..+5%.
set -u
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
PYTHONPATH=. timeout 120 python -m pytest -q -p no:cacheprovider tests/colocate/test_lc_items.py tests/colocate/test_ptb_tile_choice.py 2>&1 | tail -3
PYTHONPATH=. timeout "$(( ${CALL_S:-570} - SECONDS ))" python benchmarks/colocate_bench.py --out "$OUT" --lc bert-base \
  --be "${BES:-histogram,hotspot,mriq}" --be-each --versions tail,1:2,green32 --lc-gemms ptb-tuned \
  --policies lc_alone,timeshare,aker,partition,auto --max-keys 24 --seconds 0.5 --classify selected 2>&1 \
  | grep -v Warning > "$OUT/colocate.log"
grep -E "compiled in|tile for|solo query| p99 |fused query" "$OUT/colocate.log" | cut -c1-170
tar -czf /tmp/results.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/results.tgz "$OUT/"
ls -la "$OUT"
