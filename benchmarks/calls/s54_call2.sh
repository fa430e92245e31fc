#!/usr/bin/env bash
# Next device call (issue 3's "kfuse may ship records for common shapes so a first compile there needs no tuning"):
# make this GPU's shipped tuning records (benchmarks/ship_records.py: bert-base B8/B32, ResNet-50 B32/B64, GPT-2 B8
# S512, ViT-B/16 B64, each compiled with tune="fast" into an empty database), then time a first compile from an empty
# user database with them in place against one without (KFUSE_SHIPPED_RECORDS=0), for a listed shape (bert-base B32)
# and one that is not (bert-base B16: nearest-problem transfer from the shipped ones).
# Prediction: the records take ~150-250 s to make; a first bert-base B32 compile ~13 s cold (session 35) -> ~5 s with
# them (no tuning; the kernel-vs-library choices and Triton compiles remain), B16 between.
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout 360 python benchmarks/ship_records.py --out "$OUT/ship" --deadline-s 280 2>&1 | grep -v Warning | tail -12
f=$(ls "$OUT"/ship/*.json | head -1)
cp "$f" kfuse/tune/records/ && echo "shipped file: $(basename "$f")"
for shipped in 0 1; do
  for spec in 32 16; do
    rm -f "$OUT/first.sqlite"
    KFUSE_TUNE_DB="$OUT/first.sqlite" KFUSE_SHIPPED_RECORDS=$shipped PYTHONPATH=. timeout 120 python -c "
import time, torch, kfuse, kfuse.models
m, a, k = kfuse.models.build('bert-base', batch=$spec, seq=128, dtype=torch.float16, device='cuda')
t = time.perf_counter(); kfuse.compile(m, a, k, tune='fast'); dt = time.perf_counter() - t
print(f'first compile bert-base B$spec S128, shipped records {\"on\" if $shipped else \"off\"}: {dt:.1f} s')
" 2>&1 | grep -E "first compile|kfuse tune" | cut -c1-240
  done
done
rm -f "$OUT/first.sqlite" "$OUT/ship/ship.sqlite"
ls -la "$OUT/ship"
