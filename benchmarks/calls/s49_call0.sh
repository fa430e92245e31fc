#!/usr/bin/env bash
# Session 49, device call 0 (the short form of s49_call1, for a budget of ~450 s): the decode GPU tests (80 s cap), the
# folded norm's forms side by side, then the B1 decode step with the PyTorch sides that matter (eager, eager in a CUDA
# graph, torch.compile reduce-overhead), kfuse and three ablations (no weight prefetch, no paired writes, no norm fold), kfuse's profile.
set -u
export PYTHONUNBUFFERED=1
R=$OUT/r0; mkdir -p "$R"
OUT=$R bash benchmarks/run_suite_gpu.sh 80 tests/kernels/test_skinny_gemm.py tests/kernels/test_decode_attention.py \
  tests/runtime/test_choice.py tests/runtime/test_attention_choice.py tests/passes/test_fold_row_norm.py tests/runtime/test_state_writes.py
grep -h "^    E \|FAILED\|Error" "$R/suite.log" | head -20
PYTHONPATH=. timeout 50 python benchmarks/experiments/skinny_probe.py --folded-only --out "$R" 2>&1 | grep -v Warning | tail -6
PYTHONPATH=. timeout 290 python benchmarks/decode_bench.py --out "$R" --batches 1 --generate 0 --profile kfuse \
  --sides eager,eager_cudagraph,kfuse,compile_cudagraphs,kfuse_no_prefetch,kfuse_no_paired_writes,kfuse_no_norm_fold 2>&1 \
  | grep -v "FutureWarning\|return cls.__new__" | tee "$R/dec0.log"
tar czf "$OUT/r0.tgz" -C "$OUT" r0 && rm -rf "$R"
