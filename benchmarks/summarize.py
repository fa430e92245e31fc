"""Regenerate BENCHMARKS.md tables from benchmarks/results/h200/*.json.

    python benchmarks/summarize.py            # rewrites the generated part of BENCHMARKS.md

Records in the DESIGN.md §5 schema (with ``kfuse_ms`` and ``baselines_ms``) become one table per
benchmark with the speedup over the best baseline; other records (tuning, SASS, co-location,
sparse) are shown with their own fields.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "h200"
OUT = ROOT.parent / "BENCHMARKS.md"
BEGIN, END = "<!-- generated:begin -->", "<!-- generated:end -->"
# the columns worth a table for records outside the kfuse-vs-baselines schema
PREFERRED = [
    "case",
    "kind",
    "class",
    "compute_util",
    "memory_util",
    "heldout",
    "policy",
    "rows",
    "nnz",
    "levels",
    "kfuse_ms",
    "levelset_ms",
    "cusparse_ms",
    "triton_ms",
    "verified_samples",
    "moves_applied",
    "search_s",
    "reason",
    "qos_ms",
    "p99_ms",
    "violations",
    "be_throughput",
    "be_gain_vs_timesharing",
    "cold_s",
    "warm_s",
    "candidates_measured",
    "gap_vs_exhaustive",
    "mean_abs_rel_err",
    "max_rel_err",
]
SKIP = {
    "profile_top",
    "memory",
    "memory_plan",
    "profile",
    "benchmark",
    "gpu",
    "date",
    "kfuse_version",
    "torch_version",
    "command",
    "baselines_ms",
    "notes",
}


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    return str(v)


def _case_axes(n_cases: int) -> tuple[Any, Any]:
    """A figure with one row a case (matplotlib on the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 0.32 * n_cases + 1.6))


def _finish(fig: Any, ax: Any, cases: list[str], path: Path, ncol: int, **legend: Any) -> Path:
    """Case labels top to bottom, a parity line, the legend under the axes; saved to ``path``."""
    import matplotlib.pyplot as plt

    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_yticks(range(len(cases)), cases, fontsize=7)
    ax.invert_yaxis()
    anchor = (0.5, -0.35 / (0.32 * len(cases) + 1.2) - 0.06)
    ax.legend(**legend, fontsize=7, loc="upper center", bbox_to_anchor=anchor, ncol=ncol, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_for(name: str, records: list[dict]) -> Path | None:
    """For kfuse-vs-baselines records: one PNG per benchmark with, per case, kfuse's time as a
    fraction of the best baseline's (bars; < 1 is faster) and of the floor's (dots; 1 = at the
    roofline). Returns the path, or None for other record shapes or fewer than two cases."""
    rows = [r for r in records if isinstance(r.get("baselines_ms"), dict) and r["baselines_ms"] and r.get("kfuse_ms")]
    if len(rows) < 2 or "policy" in rows[0]:
        return None
    rel = [r["kfuse_ms"] / min(r["baselines_ms"].values()) for r in rows]
    floor = [r["floor_ms"] / r["kfuse_ms"] if r.get("floor_ms") else float("nan") for r in rows]
    fig, ax = _case_axes(len(rows))
    y = list(range(len(rows)))
    ax.barh(y, rel, color=["#2a9d8f" if v <= 1 else "#e76f51" for v in rel], label="kfuse / best PyTorch baseline")
    ax.scatter(floor, y, color="black", s=14, zorder=3, label="floor / kfuse (1 = at the roofline)")
    ax.set_xlabel("fraction (lower bars are faster)")
    ax.set_title(f"{name}: kfuse against the best baseline and the floor (H200)", fontsize=9)
    return _finish(fig, ax, [str(r["case"]) for r in rows], RESULTS / f"summary_{name}.png", ncol=2)


ROUNDS_KEY = "kfuse_over_gemm_only_rounds"  # gemm_bench: kfuse / gemm_only round by round (harness.paired_ratio_band)


def rounds_plot_for(name: str, records: list[dict], out_dir: Path = RESULTS) -> Path | None:
    """For records with kfuse / gemm_only measured round by round (issue 3's ``gemm_epilogue``): per case
    the median ratio with its quartiles as a whisker, against parity, coloured by the band's verdict
    (faster in most rounds, a tie within the rounds' spread, slower). Returns the path, or None."""
    rows = [r for r in records if isinstance(r.get(ROUNDS_KEY), dict) and "median" in r[ROUNDS_KEY]]
    if len(rows) < 2:
        return None
    colour = {-1: "#2a9d8f", 0: "#8d99ae", 1: "#e76f51"}
    label = {-1: "faster in most rounds", 0: "a tie within the rounds' spread", 1: "slower in most rounds"}
    fig, ax = _case_axes(len(rows))
    for y, b in enumerate(r[ROUNDS_KEY] for r in rows):
        v = int(b.get("verdict", 0))
        ax.plot([b["q1"], b["q3"]], [y, y], color=colour[v], lw=2)
        ax.scatter([b["median"]], [y], color=colour[v], s=22, zorder=3, label=label[v])
    handles, labels = ax.get_legend_handles_labels()
    seen = dict(zip(labels, handles, strict=True))  # one legend entry a verdict
    ax.set_xlabel("kfuse / cuBLAS GEMM alone: median and quartiles over the rotated rounds (< 1: kfuse faster)")
    ax.set_title(f"{name}: kfuse with its epilogue against the bare GEMM, round by round (H200)", fontsize=9)
    cases = [str(r["case"]) for r in rows]
    return _finish(fig, ax, cases, out_dir / f"summary_{name}_rounds.png", ncol=3, handles=list(seen.values()), labels=list(seen))


def table_for(name: str, records: list[dict]) -> str:
    lines = [f"### {name}", ""]
    if not records:
        return ""
    first = records[0]
    lines.append(f"GPU {first.get('gpu')}, {first.get('date')}, torch {first.get('torch_version', '?')}. Command: `{first.get('command')}`")
    lines.append("")
    # records without baselines (tuning: kfuse_ms None, baselines_ms {}) show their own fields
    if "kfuse_ms" in first and isinstance(first.get("baselines_ms"), dict) and first["baselines_ms"] and "policy" not in first:
        bases = sorted({b for r in records for b in (r.get("baselines_ms") or {})})
        head = ["case", "kfuse ms"] + [f"{b} ms" for b in bases] + ["speedup vs best", "floor ms", "max_rel_err"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for r in records:
            bm = r.get("baselines_ms") or {}
            best = min(bm.values()) if bm else None
            k = r.get("kfuse_ms")
            sp = f"{best / k:.2f}x" if best and k else "-"
            row = (
                [str(r.get("case")), _fmt(k)]
                + [_fmt(bm.get(b, "-")) for b in bases]
                + [sp, _fmt(r.get("floor_ms")), _fmt(r.get("max_rel_err"))]
            )
            lines.append("| " + " | ".join(row) + " |")
    else:
        keys = [k for k in PREFERRED if any(k in r for r in records)]
        if len(keys) < 3:  # records of another shape (e.g. smoke checks): show their own fields
            keys = [k for k in first if k not in SKIP]
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "---|" * len(keys))
        for r in records:
            lines.append("| " + " | ".join(_fmt(r.get(k, "-")) for k in keys) + " |")
    notes = sorted({_fmt(r["notes"]) for r in records if r.get("notes")})
    for n in notes:
        lines.append(f"\nNote: {n}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parts = []
    for path in sorted(RESULTS.glob("*.json")):
        try:
            records = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            print(f"skipping {path}: {e}", file=sys.stderr)
            continue
        if isinstance(records, dict):
            records = [records]
        part = table_for(path.stem, records)
        png = plot_for(path.stem, records)
        if part and png is not None:
            part += f"\n![{path.stem}]({png.relative_to(ROOT.parent).as_posix()})\n"
        rounds_png = rounds_plot_for(path.stem, records)
        if part and rounds_png is not None:
            part += f"\n![{path.stem} round by round]({rounds_png.relative_to(ROOT.parent).as_posix()})\n"
        parts.append(part)
    generated = "\n".join(p for p in parts if p)
    text = OUT.read_text() if OUT.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN not in text:
        text += f"\n{BEGIN}\n{END}\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    OUT.write_text(f"{head}{BEGIN}\n{generated}\n{END}{tail}")
    print(f"wrote {OUT} ({len(parts)} result files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
