#!/usr/bin/env bash
# Session 47, device call 3: session 45's CPU work on the GPU (concatenations in place, norm prologues, channels-last
# elementwise, the avg-pool kernel): DenseNet-121, Inception-v3, ShuffleNet-V2, MobileNet-V3 zoo rows.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r3; mkdir -p "$R"
PYTHONPATH=. timeout 560 python benchmarks/zoo_sweep.py --set torchvision --out "$R" \
  --only tv-densenet121,tv-inception-v3,tv-shufflenet-v2-x1-0,tv-mobilenet-v3-large --baselines eager,eager_cudagraph,compile \
  --case-timeout 200 2>&1 | tee "$R/tv.log"
tar czf "$OUT/r3.tgz" -C "$OUT" r3 && rm -rf "$R"
