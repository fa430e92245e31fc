"""Sync-free SpTRSV benchmark on the GPU: writes one JSON record per matrix (+ a plot).

    PYTHONPATH=. python benchmarks/sptrsv_bench.py --out $OUT/sptrsv.json --plot $OUT/sptrsv_levels.png

A small correctness sweep runs first (``--smoke``, results in ``smoke.json`` next to --out), then
the matrices of ``--sizes`` from small to large; the JSON is rewritten after every matrix so a
run cut short still leaves its finished records. The summary table is printed last. kfuse is
timed with the automatic choice of ``analyze`` (tiling and kernel per matrix regime).

On the H200 (docs/sparse.md), about 150 s of a 180 s window:

    mkdir -p $OUT && timeout 228 env PYTHONPATH=. python benchmarks/sptrsv_bench.py --out $OUT/sptrsv.json \
        --plot $OUT/sptrsv_levels.png --budget-s 150

On the CPU (Triton interpreter, tests the driver and the smoke sweep, about 1.5 minutes):

    python benchmarks/sptrsv_bench.py --sizes tiny --out /tmp/sptrsv/sptrsv.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import warnings
from pathlib import Path

import torch

if not torch.cuda.is_available():  # driver test on the CPU: kernels in the Triton interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
warnings.filterwarnings("ignore", message="Sparse (CSR tensor support|invariant checks)")

from kfuse.sparse.bench import SIZES, format_table, plot, run_case, smoke, write_json  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/h200/sptrsv.json")
    ap.add_argument("--plot", default=None, help="PNG path (default: next to --out)")
    ap.add_argument("--sizes", default="full", choices=sorted(SIZES))
    ap.add_argument("--smoke", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--budget-s", type=float, default=170.0, help="start no new matrix after this many seconds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and args.sizes != "tiny":
        print("sptrsv_bench: needs a CUDA GPU (only --sizes tiny runs on the CPU, to test the driver)", file=sys.stderr)
        return 2
    log = lambda s: print(s, flush=True)
    out = Path(args.out)
    png = Path(args.plot) if args.plot else out.with_name("sptrsv_levels.png")
    command = "PYTHONPATH=. python benchmarks/sptrsv_bench.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    t0 = time.perf_counter()
    if args.smoke:
        res = smoke(log)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_name("smoke.json").write_text(json.dumps(res, indent=1))
        log(f"[{time.perf_counter() - t0:.0f}s] smoke done: {'all ok' if all(r['ok'] for r in res) else 'FAILURES (see smoke.json)'}")
    records = []
    for case in SIZES[args.sizes]:
        if time.perf_counter() - t0 > args.budget_s:
            log(f"time budget of {args.budget_s:.0f}s spent: skipping {case.name}")
            continue
        log(f"[{time.perf_counter() - t0:.0f}s] {case.name}")
        try:
            records.append(run_case(case, command, log=log))
        except Exception as e:  # one failing matrix must not lose the others
            log(f"  FAILED {case.name}: {type(e).__name__}: {e}")
            continue
        write_json(records, out)
    plot(records, png)
    log(f"[{time.perf_counter() - t0:.0f}s] wrote {out} and {png}")
    log(format_table(records))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
