#!/usr/bin/env bash
# Next device call (issue 3's "kfuse may ship records for common shapes so a first compile there needs no tuning"):
# make this GPU's shipped tuning records (benchmarks/ship_records.py: bert-base B8/B32, ResNet-50 B32/B64, GPT-2 B8
# S512, ViT-B/16 B64, each compiled with tune="fast" into an empty database), then time a first compile from an empty
# user database with them in place against one without (KFUSE_SHIPPED_RECORDS=0), for a listed shape (bert-base B32)
# and one that is not (bert-base B16: nearest-problem transfer from the shipped ones).
# Prediction: the records take ~150-200 s to make (the deadline stops new models at 200 s); a first bert-base B32
# compile with empty caches ~13 s (session 35) -> ~6 s with them (no tuning; the kernel-vs-library choices and
# Triton compiles remain), B16 between. Fits one 570 s call: 300 s + 4 x <= 60 s.
set -u
export PYTHONUNBUFFERED=1
PYTHONPATH=. timeout "${SHIP_S:-300}" python benchmarks/ship_records.py --out "$OUT/ship" --deadline-s "${SHIP_DEADLINE_S:-200}" 2>&1 | grep -v Warning | tail -12
f=$(ls "$OUT"/ship/*.json | head -1)
cp "$f" kfuse/tune/records/ && echo "shipped file: $(basename "$f")"
for shipped in 0 1; do
  for spec in 32 16; do
    rm -rf "$OUT/first.sqlite" /tmp/first_cache && mkdir -p /tmp/first_cache  # a true first compile: empty caches
    TRITON_CACHE_DIR=/tmp/first_cache/triton KFUSE_CACHE_DIR=/tmp/first_cache/kfuse \
    KFUSE_TUNE_DB="$OUT/first.sqlite" KFUSE_SHIPPED_RECORDS=$shipped PYTHONPATH=. timeout 60 python -c "
import time, torch, kfuse, kfuse.models
m, a, k = kfuse.models.build('bert-base', batch=$spec, seq=128, dtype=torch.float16, device='cuda')
t = time.perf_counter(); kfuse.compile(m, a, k, tune='fast'); dt = time.perf_counter() - t
print(f'first compile bert-base B$spec S128, shipped records {\"on\" if $shipped else \"off\"}: {dt:.1f} s')
" 2>&1 | grep -E "first compile|kfuse tune" | cut -c1-240
  done
done
rm -f "$OUT/first.sqlite" "$OUT/ship/ship.sqlite"
ls -la "$OUT/ship"
