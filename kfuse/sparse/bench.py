"""SpTRSV benchmark driver: kfuse sync-free vs level-set vs cuSPARSE, correctness in the same run.

Per matrix (fp64, one right-hand side): analysis once (timed separately as ``preprocess_ms``),
then CUDA-event medians after warm-up of
  * ``kfuse_ms``          the sync-free single-kernel solve with the automatic tiling and kernel
                          choice of ``analyze`` (``tiling``, ``sync``, ``regime``): best of eager
                          launches (``kfuse_eager_ms``) and one CUDA graph of the solve
                          (``kfuse_graph_ms``, ``plan.capture``), the level-set baseline's rule,
  * ``levelset_ms``       the level-set baseline, best of eager launches and one CUDA graph of
                          all launches (graph only up to 20k levels: capture cost),
  * ``cusparse_ms``       cuSPARSE SpSM solve phase with its analysis done once beforehand
                          (through cupy's low-level bindings), ``cusparse_analysis_ms`` aside,
  * ``cupyx_spsolve_ms``  ``cupyx.scipy.sparse.linalg.spsolve_triangular`` end to end (it redoes
                          the analysis on every call).
Correctness: every timed output is compared with scipy's ``spsolve_triangular`` in fp64
(``max_rel_err`` = max|x - x_ref| / max|x_ref|) and the fp64 residual ||Lx - b|| / ||b||.
"""

from __future__ import annotations

import datetime as _dt
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kfuse.bench.harness import time_ms
from kfuse.sparse.levelset import levelset_solve
from kfuse.sparse.matrices import make
from kfuse.sparse.sptrsv import analyze

KFUSE_VERSION = "0.1.0"
GRAPH_MAX_LEVELS = 20_000


@dataclass(frozen=True)
class Case:
    kind: str
    size: int  # rows, or grid side for Laplacians

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.size}"


SIZES: dict[str, list[Case]] = {
    "tiny": [Case("laplacian2d", 24), Case("chain", 300), Case("powerlaw", 3000)],
    "small": [
        Case("laplacian3d", 40),
        Case("laplacian2d", 256),
        Case("powerlaw", 100_000),
        Case("banded", 20_000),
        Case("chain", 20_000),
    ],
}
SIZES["full"] = SIZES["small"] + [  # most informative first: a run cut short keeps these
    Case("laplacian3d", 100),
    Case("laplacian2d", 1000),
    Case("powerlaw", 1_000_000),
    Case("chain", 200_000),
    Case("laplacian2d", 2000),
    Case("laplacian3d", 160),
    Case("powerlaw", 4_000_000),
    Case("banded", 200_000),
]
_COMPILED: set[tuple] = set()  # (level-kernel tiling, dtype) whose level kernel is already compiled


def _device() -> torch.device:
    # the CPU path (Triton interpreter, wall-clock timing) only exists to test this driver
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_cuda(fn: Callable[[], Any], warmup: int = 2, reps: int = 10, budget_s: float = 2.0) -> float:
    """Median CUDA-event time (ms) of ``fn``; fewer repetitions when one call is slow.

    A call that alone takes ``budget_s`` or more (the eager level-set on 200k-level chains,
    ~6 s) is measured once: the synchronised wall clock of the call after warm-up.
    """
    for _ in range(warmup):
        fn()
    _sync()
    t0 = time.perf_counter()
    fn()
    _sync()
    one = time.perf_counter() - t0
    if one >= budget_s:
        return one * 1e3
    reps = max(1, min(reps, int(budget_s / max(one, 1e-6))))
    return time_ms(fn, warmup=0, rep=reps)


def _rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x64 = x.double().reshape(-1).to(ref.device)
    return float((x64 - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


class CusparseSpSM:
    """cuSPARSE SpSM with the analysis done once (cupy's spsm redoes it on every call)."""

    def __init__(self, a_csr: Any, b: torch.Tensor) -> None:
        import cupy
        import cupyx.scipy.sparse as csp
        from cupy._core import _dtype
        from cupy.cuda import device as _device
        from cupy_backends.cuda.libs import cusparse as _cs
        from cupyx import cusparse as cxs

        self._cs = _cs
        n = a_csr.shape[0]
        self.a = csp.csr_matrix(
            (cupy.asarray(a_csr.data), cupy.asarray(a_csr.indices.astype(np.int32)), cupy.asarray(a_csr.indptr.astype(np.int32))),
            shape=a_csr.shape,
        )
        self.a.sum_duplicates()  # marks the canonical format spSM expects
        self.b = cupy.asfortranarray(cupy.asarray(b.reshape(n, 1)))
        self.c = cupy.zeros((n, 1), dtype=self.b.dtype, order="F")
        self.handle = _device.get_cusparse_handle()
        self.mat_a = cxs.SpMatDescriptor.create(self.a)
        self.mat_b = cxs.DnMatDescriptor.create(self.b)
        self.mat_c = cxs.DnMatDescriptor.create(self.c)
        self.descr = _cs.spSM_createDescr()
        self.alpha = np.array(1.0, dtype=self.b.dtype).ctypes
        self.dtype = _dtype.to_cuda_dtype(self.b.dtype)
        self.algo = _cs.CUSPARSE_SPSM_ALG_DEFAULT
        self.op = _cs.CUSPARSE_OPERATION_NON_TRANSPOSE
        self.mat_a.set_attribute(_cs.CUSPARSE_SPMAT_FILL_MODE, _cs.CUSPARSE_FILL_MODE_LOWER)
        self.mat_a.set_attribute(_cs.CUSPARSE_SPMAT_DIAG_TYPE, _cs.CUSPARSE_DIAG_TYPE_NON_UNIT)
        size = _cs.spSM_bufferSize(*self._args())
        self.buff = cupy.empty(max(size, 1), dtype=cupy.int8)

    def _args(self) -> tuple:
        return (
            self.handle, self.op, self.op, self.alpha.data, self.mat_a.desc, self.mat_b.desc, self.mat_c.desc,
            self.dtype, self.algo, self.descr,
        )  # fmt: skip

    def analysis(self) -> None:
        self._cs.spSM_analysis(*self._args(), self.buff.data.ptr)

    def solve(self) -> None:
        self._cs.spSM_solve(*self._args(), self.buff.data.ptr)

    def result(self) -> torch.Tensor:
        return torch.as_tensor(self.c, device="cuda").reshape(-1)


def _reference(a: Any, b: np.ndarray) -> np.ndarray:
    import scipy.sparse.linalg as sla

    return sla.spsolve_triangular(a, b, lower=True)


def run_case(case: Case, command: str, seed: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Build, analyse, time and check one matrix; returns its record."""
    a = make(case.kind, case.size, seed=seed)
    n = a.shape[0]
    rng = np.random.default_rng(seed + 1)
    b_np = rng.standard_normal(n)
    dev = _device()
    b = torch.from_numpy(b_np).to(dev)
    rec: dict[str, Any] = {
        "benchmark": "sptrsv",
        "case": case.name,
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu (interpreter)",
        "command": command,
        "date": _dt.date.today().isoformat(),
        "dtype": "fp64",
        "rows": n,
        "nnz": int(a.nnz),
        "kfuse_version": KFUSE_VERSION,
    }
    t0 = time.perf_counter()
    ref = torch.from_numpy(_reference(a, b_np)).to(dev)
    rec["reference"] = "scipy.sparse.linalg.spsolve_triangular (fp64, CPU)"
    rec["reference_s"] = round(time.perf_counter() - t0, 3)

    plan = analyze(a, device=dev)
    key = (plan.level_tiling, plan.dtype)
    if key not in _COMPILED:  # the first analysis also compiled the level kernel: redo it
        _COMPILED.add(key)
        plan = analyze(a, device=dev)
    rec["levels"] = plan.num_levels
    rec["levelset_launches"] = plan.num_levels
    rec["preprocess_ms"] = round(plan.preprocess_ms["total"], 3)
    rec["preprocess_breakdown_ms"] = {k: round(v, 3) for k, v in plan.preprocess_ms.items()}
    til = plan.tiling
    rec["tiling"] = {"mode": til.mode, "rows_per_program": til.rows_per_program, "lanes_per_row": til.lanes_per_row}
    rec["tiling"]["num_warps"] = til.num_warps
    rec["sync"] = plan.sync.name  # the kernel variant timed as kfuse_ms (kfuse.sparse.variants)
    rec["tuned"] = plan.tuned  # the candidates analyze() timed on this GPU (kfuse.sparse.tune), if any
    st = plan.stats
    if st is not None:  # what the automatic choice looked at (kfuse.sparse.analysis.RowStats)
        rec["regime"] = st.regime
        rec["row_len_p90"], rec["row_len_mean"] = st.p90, round(st.mean, 3)

    x = torch.full_like(b, float("nan"))
    plan.solve(b, out=x)
    _sync()
    rec["max_rel_err"] = _rel_err(x, ref)
    a_t = torch.sparse_csr_tensor(  # residual in fp64 through torch's own CSR matmul
        torch.from_numpy(a.indptr.astype(np.int64)), torch.from_numpy(a.indices.astype(np.int64)), torch.from_numpy(a.data), a.shape
    ).to(dev)
    rec["residual"] = float((a_t @ x.reshape(n, 1) - b.reshape(n, 1)).norm() / b.norm())
    rec["kfuse_eager_ms"] = time_cuda(lambda: plan.solve(b, out=x))
    rec["kfuse_rel_err_after_timing"] = _rel_err(x, ref)
    # the same rule as the level-set baseline: best of eager and one CUDA graph (plan.capture)
    rec["kfuse_graph_ms"] = None
    if dev.type == "cuda":
        try:
            cap = plan.capture(b)
            cap.x.fill_(float("nan"))
            rec["kfuse_graph_ms"] = time_cuda(cap.replay)
            rec["kfuse_graph_rel_err"] = _rel_err(cap.x.reshape(-1), ref)
        except Exception as e:  # report it; the eager time stands
            rec["kfuse_graph_error"] = f"{type(e).__name__}: {e}"[:300]
    graph_ok = rec["kfuse_graph_ms"] is not None and rec["kfuse_graph_rel_err"] <= max(rec["max_rel_err"] * 10, 1e-9)
    rec["kfuse_ms"] = min(rec["kfuse_eager_ms"], rec["kfuse_graph_ms"]) if graph_ok else rec["kfuse_eager_ms"]
    tag = f"{til.rows_per_program}x{til.lanes_per_row}w{til.num_warps} {plan.sync.name}"
    log(
        f"  kfuse {rec['kfuse_ms']:.3f} ms (eager {rec['kfuse_eager_ms']:.3f}, graph {rec['kfuse_graph_ms']})  err {rec['max_rel_err']:.1e}"
        f"  levels {plan.num_levels}  {rec.get('regime')}: {tag}"
    )

    xl = torch.full_like(b, float("nan"))
    rec["levelset_eager_ms"] = time_cuda(lambda: levelset_solve(plan, b, out=xl), warmup=1, reps=5, budget_s=3.0)
    rec["levelset_rel_err"] = _rel_err(xl, ref)
    rec["levelset_graph_ms"] = None
    if plan.num_levels <= GRAPH_MAX_LEVELS and dev.type == "cuda":
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                levelset_solve(plan, b, out=xl)
            xl.fill_(float("nan"))
            rec["levelset_graph_ms"] = time_cuda(g.replay, warmup=1, reps=5, budget_s=3.0)
            rec["levelset_graph_rel_err"] = _rel_err(xl, ref)
        except Exception as e:  # capture is an optimisation of the baseline, not required
            rec["levelset_graph_error"] = f"{type(e).__name__}: {e}"[:300]
    rec["levelset_ms"] = min(v for v in (rec["levelset_eager_ms"], rec["levelset_graph_ms"]) if v is not None)
    log(f"  levelset {rec['levelset_ms']:.3f} ms (eager {rec['levelset_eager_ms']:.3f}, graph {rec['levelset_graph_ms']})")

    rec["cusparse_ms"] = None
    try:
        sm = CusparseSpSM(a, b)
        _sync()
        t0 = time.perf_counter()
        sm.analysis()
        _sync()
        rec["cusparse_analysis_ms"] = (time.perf_counter() - t0) * 1e3
        sm.solve()
        _sync()
        rec["cusparse_rel_err"] = _rel_err(sm.result(), ref)
        sm.solve()  # SpSM is documented to want a zeroed output: check a second solve into it
        if _rel_err(sm.result(), ref) < 1e-8:
            rec["cusparse_ms"] = time_cuda(sm.solve, budget_s=3.0)
        else:
            rec["cusparse_ms"] = time_cuda(lambda: (sm.c.fill(0), sm.solve()), budget_s=3.0)
            rec["cusparse_note"] = "timed with a memset of the output before each solve (needed for a correct result)"
        rec["cusparse_rel_err_after_timing"] = _rel_err(sm.result(), ref)
        rec["cusparse_api"] = "cusparseSpSM_solve (analysis cached), via cupy bindings"
    except Exception as e:
        rec["cusparse_error"] = f"{type(e).__name__}: {e}"[:300]
    try:
        import cupy
        import cupyx.scipy.sparse.linalg as csla

        a_cp = sm.a if "cusparse_error" not in rec else None
        if a_cp is not None:
            b_cp = cupy.asarray(b)
            rec["cupyx_spsolve_ms"] = time_cuda(lambda: csla.spsolve_triangular(a_cp, b_cp, lower=True), warmup=1, reps=5, budget_s=3.0)
    except Exception as e:
        rec["cupyx_error"] = f"{type(e).__name__}: {e}"[:300]
    log(f"  cusparse {rec['cusparse_ms']} ms  cupyx {rec.get('cupyx_spsolve_ms')} ms  {rec.get('cusparse_error', '')}")
    rec["speedup_vs_levelset"] = rec["levelset_ms"] / rec["kfuse_ms"]
    rec["speedup_vs_cusparse"] = rec["cusparse_ms"] / rec["kfuse_ms"] if rec["cusparse_ms"] else None
    return rec


SMOKE_CASES = {  # every regime of the automatic choice: narrow (chain), long rows, short rows
    "cuda": [("chain", 3000), ("powerlaw", 5000), ("laplacian2d", 41), ("laplacian3d", 13)],
    "cpu": [("chain", 40), ("powerlaw", 150), ("laplacian2d", 9), ("laplacian3d", 5)],  # the interpreter: tiny
}


def smoke(log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Small correctness sweep (lower/upper, fp32/fp64, 1 and 20 right-hand sides) on the bench's device."""
    import scipy.sparse.linalg as sla

    dev = _device()
    out = []
    for kind, size in SMOKE_CASES[dev.type]:
        log(f"  smoke {kind}_{size}")
        a64 = make(kind, size, seed=7)
        for lower in (True, False):
            a = a64 if lower else a64.T.tocsr()
            for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-5)):
                for k in (None, 20):
                    n = a.shape[0]
                    bn = np.random.default_rng(k or 1).standard_normal((n,) if k is None else (n, k))
                    ref = sla.spsolve_triangular(a, bn, lower=lower)
                    plan = analyze(a.astype(dtype), lower=lower, device=dev)
                    x = plan.solve(torch.from_numpy(bn.astype(dtype)).to(dev))
                    xl = levelset_solve(plan, torch.from_numpy(bn.astype(dtype)).to(dev))
                    err = float(np.abs(x.cpu().numpy() - ref).max() / np.abs(ref).max())
                    err_l = float(np.abs(xl.cpu().numpy() - ref).max() / np.abs(ref).max())
                    ok = err < tol and err_l < tol
                    out.append(
                        {
                            "kind": kind,
                            "lower": lower,
                            "dtype": np.dtype(dtype).name,
                            "nrhs": k,
                            "regime": plan.info["regime"],
                            "sync": plan.sync.name,
                            "err": err,
                            "levelset_err": err_l,
                            "ok": ok,
                        }
                    )
                    if not ok:
                        log(f"  SMOKE FAIL {out[-1]}")
    log(f"smoke: {sum(r['ok'] for r in out)}/{len(out)} ok")
    return out


def format_table(records: list[dict[str, Any]]) -> str:
    """Plain-text summary table (also printed by the CLI and the script)."""
    hdr = f"{'case':<20}{'rows':>9}{'nnz':>10}{'levels':>8}{'kfuse':>10}{'levelset':>10}{'cusparse':>10}{'x lvl':>7}{'x cus':>7}{'err':>9}"
    lines = [hdr, "-" * len(hdr)]
    for r in records:
        cus = f"{r['cusparse_ms']:.3f}" if r.get("cusparse_ms") else "-"
        xc = f"{r['speedup_vs_cusparse']:.2f}" if r.get("speedup_vs_cusparse") else "-"
        lines.append(
            f"{r['case']:<20}{r['rows']:>9}{r['nnz']:>10}{r['levels']:>8}{r['kfuse_ms']:>10.3f}{r['levelset_ms']:>10.3f}{cus:>10}"
            f"{r['speedup_vs_levelset']:>7.2f}{xc:>7}{r['max_rel_err']:>9.1e}"
        )
    lines.append("times in ms (CUDA-event medians); x lvl / x cus = speedup of kfuse over level-set / cuSPARSE")
    return "\n".join(lines)


def plot(records: list[dict[str, Any]], path: str | Path) -> None:
    """Solve time vs number of levels (log-log), one marker per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label, marker in (
        ("kfuse_ms", "kfuse sync-free", "o"),
        ("levelset_ms", "level-set", "s"),
        ("cusparse_ms", "cuSPARSE SpSM", "^"),
    ):
        pts = [(r["levels"], r[key]) for r in records if r.get(key)]
        if pts:
            ax.scatter(*zip(*pts, strict=True), label=label, marker=marker)
    for r in records:
        ax.annotate(r["case"], (r["levels"], r["kfuse_ms"]), fontsize=6, alpha=0.7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("dependency levels")
    ax.set_ylabel("solve time (ms)")
    gpu = records[0]["gpu"] if records else ""
    ax.set_title(f"SpTRSV fp64, 1 RHS — {gpu}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(records: list[dict[str, Any]], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(records, indent=1, default=float))
