#!/usr/bin/env bash
# Session 50, device call 2: session 49's decode call 2 (GPU tests, the B1 decode step with the re-check, back-to-back
# time and the prefetch ablation; B8 where B8_S is set).
set -u
bash benchmarks/calls/s49_call2.sh 2>&1 | tail -45
