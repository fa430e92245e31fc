"""Experiment: which sync-free variant beats the level-set baseline on wide matrices (issue 9)?

For each matrix (fp64, one right-hand side, one analysis shared by all variants) this times
``auto`` (what ``analyze`` picks for the matrix: tiling and variant by regime), then the
:data:`kfuse.sparse.variants.EXPERIMENT_DEFAULT` variants (``legacy`` = the kernel of the
H200 results in docs/sparse.md, ``default-v1`` = the first run's default, then the latency
variants: prefetch, acquire polls, st.release, value flags) under the row-length tiling of the
first two runs (``kfuse.sparse.analysis.row_length_tiling``; key = name),
``--tiling-variants`` again under each single-warp ``--tilings`` entry (key ``name@RxWwN``), the
level-set baseline replayed as one CUDA graph (eager above 20k levels), and cuSPARSE SpSM when
cupy is present. Times are CUDA-event medians after warm-up (``kfuse.sparse.bench.time_cuda``).
Every variant's output is poisoned with NaN first and checked against scipy's fp64 solve (the
level-set result above 2M rows) and by its fp64 residual; so is the level-set result.
Writes ``DIR/sptrsv_variants.json`` after every matrix (a run cut short keeps what it did) and
prints a table last. Cases run in the order below; none starts once ``--budget-s`` is spent.

    PYTHONPATH=. python benchmarks/experiments/sptrsv_variants.py --out DIR --budget-s 100
    PYTHONPATH=. python benchmarks/experiments/sptrsv_variants.py --out DIR --smoke   # CPU, interpreter
    PYTHONPATH=. python benchmarks/experiments/sptrsv_variants.py --out DIR --mixed --budget-s 60   # mixed tiling, power-law

``--mixed`` is a preset: the power-law cases (100k, 1M, 4M rows; under ``--smoke`` the small
``heavyrows`` stand-in), the variants of :data:`kfuse.sparse.variants.MIXED_EXPERIMENT`
(``default-ppsm2``, the current power-law choice, against the mixed-tiling variants) under the
row-length tiling, then ``MIXED_EXPERIMENT_TILED`` (``mixed-t16-w1``, ``mixed-t32`` under 8x4w1).
Each record then also has ``long_rows`` (rows above each threshold) and ``mixed_tiles``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not torch.cuda.is_available():  # --smoke on the CPU: kernels in the Triton interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
warnings.filterwarnings("ignore", message="Sparse (CSR tensor support|invariant checks)")
sys.path.insert(0, os.getcwd())

from kfuse.sparse.analysis import Tiling  # noqa: E402
from kfuse.sparse.bench import GRAPH_MAX_LEVELS, Case, CusparseSpSM, time_cuda  # noqa: E402
from kfuse.sparse.levelset import levelset_solve  # noqa: E402
from kfuse.sparse.matrices import make  # noqa: E402
from kfuse.sparse.sptrsv import SptrsvPlan, analyze  # noqa: E402
from kfuse.sparse.tiledeps import tile_dependencies  # noqa: E402
from kfuse.sparse.variants import EXPERIMENT_DEFAULT, MIXED_EXPERIMENT, MIXED_EXPERIMENT_TILED, VARIANTS, SyncOptions, persistent_grid  # noqa: E402

CASES = [  # wide matrices first (the ones kfuse loses on), the sequential ones as controls
    Case("laplacian3d", 40),
    Case("laplacian2d", 256),
    Case("powerlaw", 100_000),
    Case("laplacian3d", 100),
    Case("laplacian2d", 1000),
    Case("powerlaw", 1_000_000),
    Case("chain", 20_000),
    Case("banded", 20_000),
]
EXTRA_CASES = [Case("powerlaw", 4_000_000)]  # only when named in --cases, or with --mixed
SMOKE_CASES = [Case("laplacian2d", 7), Case("chain", 70), Case("powerlaw", 120)]
MIXED_CASES = [Case("powerlaw", 100_000), Case("powerlaw", 1_000_000), Case("powerlaw", 4_000_000)]
MIXED_SMOKE_CASES = [Case("heavyrows", 120)]
SCIPY_MAX_ROWS = 2_000_000  # scipy's reference solve stays under ~1 s up to here (0.57 s at 1M rows, 6.5M nonzeros)
ERR_TOL = 1e-10  # fp64
TILINGS = "16x2w1,8x4w1"  # single-warp tilings swept besides the row-length one (R x W lanes, num_warps)
TILING_VARIANTS = "default-v1,default"  # what runs under each extra tiling


def parse_tiling(s: str) -> Tiling:
    """``"16x2w1"`` -> Tiling(16, 2, 1) (R rows x W lanes per row, num_warps)."""
    try:
        rw, warps = s.split("w")
        r, w = rw.split("x")
        til = Tiling(int(r), int(w), int(warps))
    except ValueError as e:
        raise ValueError(f"tiling {s!r}: expected RxWwN, e.g. 16x2w1") from e
    for v in (til.rows_per_program, til.lanes_per_row, til.num_warps):
        if v < 1 or v & (v - 1):
            raise ValueError(f"tiling {s!r}: R, W and num_warps must be powers of two")
    return til


def tiling_tag(t: Tiling) -> str:
    return f"{t.rows_per_program}x{t.lanes_per_row}w{t.num_warps}"


def _log(s: str) -> None:
    print(s, flush=True)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((x - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item())


def _residual(a_t: torch.Tensor, x: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a_t @ x.reshape(-1, 1) - b.reshape(-1, 1)).norm() / b.norm()).item())


def _levelset(plan: SptrsvPlan, b: torch.Tensor, rec: dict[str, Any], smoke: bool) -> torch.Tensor:
    """Time the level-set baseline (a graph when it fits); returns its result."""
    xl = torch.full_like(b, float("nan"))
    levelset_solve(plan, b, out=xl)
    if b.is_cuda and plan.num_levels <= GRAPH_MAX_LEVELS:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            levelset_solve(plan, b, out=xl)
        rec["levelset_mode"] = "graph"
        rec["levelset_ms"] = time_cuda(g.replay, warmup=1, reps=10, budget_s=1.0)
    else:
        rec["levelset_mode"] = "eager"
        reps = 1 if smoke else 5
        rec["levelset_ms"] = time_cuda(lambda: levelset_solve(plan, b, out=xl), warmup=0 if smoke else 1, reps=reps, budget_s=1.0)
    return xl.clone()


def _cusparse(a: Any, b: torch.Tensor, ref: torch.Tensor, rec: dict[str, Any]) -> None:
    """cuSPARSE SpSM solve phase (analysis done once beforehand); optional, needs cupy."""
    try:
        sm = CusparseSpSM(a, b)
        sm.analysis()
        sm.solve()
        torch.cuda.synchronize()
        rec["cusparse_rel_err"] = _rel_err(sm.result(), ref)
        if rec["cusparse_rel_err"] < ERR_TOL:  # a second solve into the same output stays right
            rec["cusparse_ms"] = time_cuda(sm.solve, reps=10, budget_s=1.0)
        else:
            rec["cusparse_ms"] = time_cuda(lambda: (sm.c.fill(0), sm.solve()), reps=10, budget_s=1.0)
            rec["cusparse_note"] = "timed with a memset of the output before each solve"
    except Exception as e:  # cupy is optional on the GPU machine
        rec["cusparse_error"] = f"{type(e).__name__}: {e}"[:200]


def run_case(
    case: Case, names: list[str], smoke: bool, deadline: float, save: Any, tilings: Sequence[Tiling] = (), tiling_names: Sequence[str] = ()
) -> dict[str, Any]:
    """Analyse one matrix once, then time the baseline and every variant; returns its record.

    ``auto`` runs analyze()'s own choice (tiling and variant); the named variants run under the
    row-length tiling (key = name), then ``tiling_names`` under each of ``tilings`` that differs
    from it (key = ``name@RxWwN``).
    """
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    a = make(case.kind, case.size, seed=0)
    n = a.shape[0]
    b = torch.from_numpy(np.random.default_rng(1).standard_normal(n)).to(dev)
    rec: dict[str, Any] = {"case": case.name, "rows": n, "nnz": int(a.nnz), "variants": {}}
    plan = analyze(a, device=dev)  # the automatic choice: plan.tiling, plan.sync
    rec.update(levels=plan.num_levels, preprocess_ms=round(plan.preprocess_ms["total"], 3))
    base = plan.level_tiling or plan.tiling  # the row-length tiling of the first two runs
    r = base.rows_per_program
    rec["tiling"] = {"R": r, "W": base.lanes_per_row, "num_warps": base.num_warps}
    rec["auto"] = {"regime": plan.info["regime"], "tiling": tiling_tag(plan.tiling), "options": plan.sync.name}
    t0 = time.perf_counter()
    ptr, deps = tile_dependencies(plan.lo.rowptr, plan.lo.cols, n, r)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    rec["tile_deps_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
    rec["tiles"] = int(ptr.numel() - 1)
    rec["producers_per_tile"] = round(deps.numel() / max(1, rec["tiles"]), 2)
    lens = plan.lo.rowptr[1:] - plan.lo.rowptr[:-1]
    thresholds = sorted({VARIANTS[nm].long_row_min for nm in [*names, *tiling_names] if VARIANTS[nm].long_row_min})
    if thresholds:  # mixed tiling: how many rows get their own program, and the tile count
        rec["row_len_max"] = int(lens.max()) if n else 0
        rec["long_rows"] = {str(t): int((lens > t).sum()) for t in thresholds}
        rec["mixed_tiles"] = {str(t): int(plan.mixed_tiles(r, t).numel() - 1) for t in thresholds}
    a_t = torch.sparse_csr_tensor(
        torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64)), torch.from_numpy(a.data), a.shape
    ).to(dev)

    ref = _levelset(plan, b, rec, smoke)
    rec["levelset_residual"] = _residual(a_t, ref, b)
    if n <= SCIPY_MAX_ROWS:
        import scipy.sparse.linalg as sla

        x_sp = torch.from_numpy(sla.spsolve_triangular(a, b.cpu().numpy(), lower=True)).to(dev)
        rec["levelset_vs_scipy"] = _rel_err(ref, x_sp)
        ref = x_sp  # the variants are checked against scipy directly
    rec["reference"] = "scipy spsolve_triangular fp64" if n <= SCIPY_MAX_ROWS else "level-set (checked by its residual)"
    _log(f"  {rec['levels']} levels, R={r}: level-set {rec['levelset_ms']:.3f} ms ({rec['levelset_mode']})")
    if dev.type == "cuda":
        _cusparse(a, b, ref, rec)
        _log(f"  cusparse {rec.get('cusparse_ms')} ms {rec.get('cusparse_error', '')}")

    runs: list[tuple[str, SyncOptions, Tiling]] = [("auto", plan.sync, plan.tiling)]
    runs += [(nm, VARIANTS[nm], base) for nm in names]
    for til in tilings:
        if til != base:
            runs += [(f"{nm}@{tiling_tag(til)}", VARIANTS[nm], til) for nm in tiling_names]
    for key, opts, til in runs:
        if time.perf_counter() > deadline:
            rec["variants"][key] = {"skipped": "hard deadline"}
            continue
        _log(f"  {key} ...")  # printed before the launch: a hang names its variant
        v: dict[str, Any] = {"options": opts.name, "tiling": tiling_tag(til)}
        x = torch.full_like(b, float("nan"))
        t1 = time.perf_counter()
        try:
            plan.solve(b, out=x, sync=opts, tiling=til)  # first call compiles
            if dev.type == "cuda":
                torch.cuda.synchronize()
            v["first_call_s"] = round(time.perf_counter() - t1, 3)
            v["rel_err"] = _rel_err(x, ref)
            v["residual"] = _residual(a_t, x, b)
            x.fill_(float("nan"))
            reps = 1 if smoke else 20
            v["ms"] = time_cuda(
                lambda o=opts, t=til: plan.solve(b, out=x, sync=o, tiling=t), warmup=0 if smoke else 3, reps=reps, budget_s=0.5
            )
            v["rel_err_after_timing"] = _rel_err(x, ref)
            v["ok"] = bool(max(v["rel_err"], v["rel_err_after_timing"]) < ERR_TOL)
            v["us_per_level"] = round(v["ms"] * 1e3 / max(1, rec["levels"]), 3)
            v["speedup_vs_levelset"] = rec["levelset_ms"] / v["ms"]
            if rec.get("cusparse_ms"):
                v["speedup_vs_cusparse"] = rec["cusparse_ms"] / v["ms"]
            if opts.persistent:
                n_tiles = -(-n // til.rows_per_program)
                if opts.long_row_min:
                    n_tiles = int(plan.mixed_tiles(til.rows_per_program, opts.long_row_min).numel() - 1)
                v["grid"] = persistent_grid(dev, n_tiles, opts)
            verdict = "ok" if v["ok"] else "WRONG"
            _log(f"    {v['ms']:.3f} ms  x{v['speedup_vs_levelset']:.2f} vs level-set  err {v['rel_err']:.1e}  {verdict}")
        except Exception as e:  # one failing variant must not lose the others
            v["error"] = f"{type(e).__name__}: {e}"[:300]
            _log(f"    FAILED {v['error']}")
        rec["variants"][key] = v
        save(rec)
    return rec


def _abbrev(case: str) -> str:
    return case.replace("laplacian", "lap").replace("powerlaw", "pl")


def format_table(records: list[dict[str, Any]], names: list[str]) -> str:
    """One column per case, one row per method: ms and the speedup over level-set; best variants last."""
    width = max(15, *(len(_abbrev(r["case"])) + 2 for r in records)) if records else 15
    head = max(22, *(len(nm) + 1 for nm in names))
    lines = [f"{'':<{head}}" + "".join(f"{_abbrev(r['case']):>{width}}" for r in records)]
    lines.append("-" * len(lines[0]))
    lines.append(f"{'levels':<{head}}" + "".join(f"{r['levels']:>{width}}" for r in records))
    lines.append(f"{'level-set ms':<{head}}" + "".join(f"{r['levelset_ms']:>{width}.3f}" for r in records))
    cus = [f"{r['cusparse_ms']:.3f}" if r.get("cusparse_ms") else "-" for r in records]
    lines.append(f"{'cuSPARSE ms':<{head}}" + "".join(f"{c:>{width}}" for c in cus))
    best: dict[str, tuple[str, float]] = {}
    for nm in names:
        row = f"{nm:<{head}}"
        for r in records:
            v = r["variants"].get(nm, {})
            cell = "-"
            if "ms" in v:
                cell = f"{v['ms']:.3f} x{v['speedup_vs_levelset']:.2f}" + ("" if v.get("ok") else "!")
                if v.get("ok") and (r["case"] not in best or v["ms"] < best[r["case"]][1]):
                    best[r["case"]] = (nm, v["ms"])
            row += f"{cell:>{width}}"
        lines.append(row)
    lines.append("ms = CUDA-event medians (wall clock under --smoke); xS = speedup over level-set; ! = wrong result")
    for r in records:
        if r["case"] in best:
            nm, ms = best[r["case"]]
            vs_cus = f", x{r['cusparse_ms'] / ms:.2f} vs cuSPARSE" if r.get("cusparse_ms") else ""
            lines.append(f"best {r['case']}: {nm} {ms:.3f} ms (x{r['levelset_ms'] / ms:.2f} vs level-set{vs_cus})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for sptrsv_variants.json")
    ap.add_argument("--budget-s", type=float, default=100.0, help="start no new matrix after this many seconds")
    ap.add_argument("--smoke", action="store_true", help="tiny matrices (runs on the CPU in the interpreter)")
    ap.add_argument("--variants", default=",".join(EXPERIMENT_DEFAULT), help="comma-separated names from kfuse.sparse.variants.VARIANTS")
    ap.add_argument("--tilings", default=TILINGS, help="extra tilings RxWwN (comma-separated; '' = row-length tiling only)")
    ap.add_argument("--tiling-variants", default=TILING_VARIANTS, help="variants run under each extra tiling")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all, in order)")
    ap.add_argument("--mixed", action="store_true", help="preset: power-law cases, MIXED_EXPERIMENT variants (+ MIXED_EXPERIMENT_TILED)")
    args = ap.parse_args(argv)
    if args.mixed:
        args.variants = ",".join(MIXED_EXPERIMENT)
        args.tilings, tv = MIXED_EXPERIMENT_TILED
        args.tiling_variants = ",".join(tv)
    names = [s for s in args.variants.split(",") if s]
    tiling_names = [s for s in args.tiling_variants.split(",") if s]
    try:
        tilings = [parse_tiling(s) for s in args.tilings.split(",") if s]
    except ValueError as e:
        ap.error(str(e))
    unknown = [s for s in names + tiling_names if s not in VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    cases = SMOKE_CASES if args.smoke else CASES
    if args.mixed:
        cases = MIXED_SMOKE_CASES if args.smoke else MIXED_CASES
    if args.cases:
        pool = cases if args.mixed else cases + ([] if args.smoke else EXTRA_CASES)
        cases = [c for c in pool if c.name in args.cases.split(",")]
    if not torch.cuda.is_available() and not args.smoke:
        print("sptrsv_variants: needs a CUDA GPU (or --smoke, which runs tiny matrices in the interpreter)", file=sys.stderr)
        return 2
    out = Path(args.out) / "sptrsv_variants.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    meta = {
        "benchmark": "sptrsv_variants",
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
        "sms": torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "command": "PYTHONPATH=. python benchmarks/experiments/sptrsv_variants.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "dtype": "fp64",
        "variants": {nm: VARIANTS[nm].__dict__ for nm in dict.fromkeys(names + tiling_names)},
        "auto": "analyze()'s choice per matrix (record['auto']: regime, tiling, options)",
        "tilings": [tiling_tag(t) for t in tilings],
    }
    records: list[dict[str, Any]] = []

    def save(partial: dict[str, Any] | None = None) -> None:
        recs = records + ([partial] if partial is not None and partial not in records else [])
        out.write_text(json.dumps({"meta": meta, "records": recs}, indent=1, default=float))

    for case in cases:
        spent = time.perf_counter() - t0
        if spent > args.budget_s:
            _log(f"time budget of {args.budget_s:.0f}s spent: skipping {case.name}")
            meta.setdefault("skipped", []).append(case.name)
            continue
        _log(f"[{spent:.0f}s] {case.name}")
        deadline = t0 + 1.5 * args.budget_s  # a slow case still stops before the caller's timeout
        try:
            records.append(run_case(case, names, args.smoke, deadline, save, tilings, tiling_names))
        except Exception as e:  # one failing matrix must not lose the others
            _log(f"  FAILED {case.name}: {type(e).__name__}: {e}")
            records.append({"case": case.name, "error": f"{type(e).__name__}: {e}"[:300]})
        save()
    meta["total_s"] = round(time.perf_counter() - t0, 1)
    save()
    done = [r for r in records if "levelset_ms" in r]
    bad = [(r["case"], nm) for r in done for nm, v in r["variants"].items() if "ms" in v and not v.get("ok")]
    # a case that raised, or a variant that errored, is not a correct result either (a deadline skip is)
    failed = [r["case"] for r in records if "error" in r] + [
        f"{r['case']}:{nm}" for r in done for nm, v in r["variants"].items() if "error" in v and "ms" not in v
    ]
    verdict = (
        "all results correct"
        if not (bad or failed)
        else (f"WRONG results: {bad}; " if bad else "") + (f"FAILED: {failed}" if failed else "")
    )
    _log(f"wrote {out}; {verdict}")
    keys = list(dict.fromkeys(["auto", *names] + [k for r in done for k in r["variants"] if k not in names]))
    _log(format_table(done, keys))
    return 1 if bad or failed else 0


if __name__ == "__main__":
    sys.exit(main())
