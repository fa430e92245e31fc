"""Is SIP's paired timing biased by position? (issue 7)

The search times each candidate against the original as A B B A with the **candidate as A** (``make_fitness``), the
acceptance re-times the best as A B B A with the **original as A** (``api._ab_time``). On the H100 the GEMM + LeakyReLU
kernels on the 128 x 128 w8 tile show a gap between the two: at BERT [4096, 3072, 768] (session 61) the median of
3,000 candidates read 0.945 of the original in the search, the best 0.932, and the best re-timed +1.6%; at [4096, 768,
768] (session 59) 0.969 / 0.953 and +1.6%. If whichever kernel is A reads faster by x, the search's ratios are
``r (1 - x)`` and the re-timing's gain ``(1 - x) / r - 1``: x ~ 2% and a true gain ~3.5% for the median candidate
would fit both. This measures x directly, on the kernel SIP tuned:

- the original against itself, A B B A (x alone: the ratio is 1 - x);
- candidates of ``--moves-per-candidate`` random legal moves, each timed in both orders (candidate as A, then the
  original as A): the two ratios' geometric mean cancels x, their quotient measures it.

    PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl python benchmarks/experiments/sass_timing_bias.py --out $OUT/bias
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (sass_bench's cases)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="gemm_leaky_relu_bert_4096x3072x768")
    ap.add_argument("--config", default="128x128x64w8s3", help="the GEMM tile (sass_bench.py --gemm-configs form)")
    ap.add_argument("--self-pairs", type=int, default=12, help="A B B A timings of the original against itself")
    ap.add_argument("--candidates", type=int, default=12, help="random candidates, each timed in both orders")
    ap.add_argument("--moves-per-candidate", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="folder for timing_bias.json")
    a = ap.parse_args()

    import sass_bench  # noqa: E402

    from kfuse.sass.api import launch_spec
    from kfuse.sass.cubin import load_cubin
    from kfuse.sass.disasm import disassemble
    from kfuse.sass.emit import emit
    from kfuse.sass.schedule import Schedule, move_set
    from kfuse.sass.search import random_walk
    from kfuse.sass.verify import Evaluator

    ck, args, grid, vargs, vgrid, per, _choice = sass_bench.CASES[a.case]([sass_bench.parse_gemm_config(a.config)])
    original = bytes(ck.asm["cubin"])
    cub = load_cubin(original)
    kname = ck.name
    start = Schedule.build(disassemble(cub, kname), move_set("memory"), frozenset(cub.kernel(kname).pinned_offsets()))
    spec = launch_spec(ck, args, grid, vargs, vgrid, per)
    rng = random.Random(a.seed)
    out: dict[str, Any] = {"case": a.case, "config": a.config, "kernel": kname, "self": [], "candidates": []}
    t0 = time.time()
    with Evaluator(spec) as ev:
        identity = emit(cub, kname, start).data
        out["identity_bytes_equal"] = identity == original
        for _ in range(a.self_pairs):
            p = ev.time_pair(original, original)
            out["self"].append(None if p is None else p[2])
        for k in range(a.candidates):
            cand = random_walk(start, a.moves_per_candidate, rng)
            data = emit(cub, kname, cand).data
            ok, _, why = ev.check(data, 4)
            if not ok:
                out["candidates"].append({"moves": len(cand.applied), "wrong": why})
                continue
            first = ev.time_pair(data, original)  # the search's order: candidate as A
            second = ev.time_pair(original, data)  # the re-timing's order: original as A
            if first is None or second is None:
                continue
            r_cand_a, r_orig_a = first[2], second[2]  # t_cand / t_orig (cand as A); t_orig / t_cand (orig as A)
            out["candidates"].append({
                "moves": len(cand.applied), "cand_over_orig_cand_first": r_cand_a, "orig_over_cand_orig_first": r_orig_a,
                "unbiased_cand_over_orig": math.sqrt(r_cand_a / r_orig_a),  # x cancels
                "position_factor": math.sqrt(r_cand_a * r_orig_a),  # = 1 - x
            })  # fmt: skip
            unbiased, factor = math.sqrt(r_cand_a / r_orig_a), math.sqrt(r_cand_a * r_orig_a)
            print(f"candidate {k}: {len(cand.applied)} moves, cand/orig as A {r_cand_a:.4f}, orig/cand as A {r_orig_a:.4f} "
                  f"-> unbiased {unbiased:.4f}, A factor {factor:.4f}", flush=True)  # fmt: skip
    selfs = [r for r in out["self"] if r is not None]
    good = [c for c in out["candidates"] if "unbiased_cand_over_orig" in c]
    med = statistics.median
    out["summary"] = {
        "self_ratio_median": med(selfs) if selfs else None,
        "position_factor_median": med(c["position_factor"] for c in good) if good else None,
        "unbiased_median": med(c["unbiased_cand_over_orig"] for c in good) if good else None,
        "cand_first_median": med(c["cand_over_orig_cand_first"] for c in good) if good else None,
        "seconds": round(time.time() - t0, 1),
    }
    print(json.dumps(out["summary"]), flush=True)
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "timing_bias.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
