"""Issue 3's GEMM: what the bias + GELU epilogue costs, shape by shape, from session 21's probe runs.

Reads ``ws_power_probe`` results (``experiments/s21_ws_power_probe_v{3..7}.json``: each variant timed one
call a graph replay, interleaved with cuBLAS) and draws, per shape, the median over the runs of kfuse's
tuned kernel with bias + GELU, the same kernel with no epilogue, the rows kernel with no epilogue and
cuBLASLt's own fused bias + GELU, as time / the bare cuBLAS GEMM (the line at 1.0), the bars spanning the
runs' range. No GPU needed.

    python benchmarks/experiments/plot_epilogue_cost.py   # writes benchmarks/results/h200/gemm_epilogue_cost.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200"
SERIES = {  # probe label: legend
    "192x128 s4 g1 sc epi": "kfuse, bias + GELU",
    "192x128 s4 g1 sc bare": "kfuse, no epilogue",
    "rows 192x128 s4 g1 bare": "rows kernel, no epilogue",
    "cublaslt bias+gelu": "cuBLASLt bias + GELU",
}


def ratios(paths: list[Path]) -> tuple[list[str], dict[str, dict[str, list[float]]]]:
    """Per series and shape, every run's time / the bare cuBLAS GEMM."""
    cases: list[str] = []
    out: dict[str, dict[str, list[float]]] = {s: {} for s in SERIES}
    for p in paths:
        for rec in json.loads(p.read_text())["records"]:
            if rec["case"] not in cases:
                cases.append(rec["case"])
            mm = rec["ms"]["cublas mm alone"]
            for label in SERIES:
                if label in rec["ms"]:
                    out[label].setdefault(rec["case"], []).append(rec["ms"][label] / mm)
    return cases, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(RESULTS / "gemm_epilogue_cost.png"))
    args = ap.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = sorted((RESULTS / "experiments").glob("s21_ws_power_probe_v*.json"))
    cases, data = ratios(paths)
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / len(SERIES)
    for i, (label, legend) in enumerate(SERIES.items()):
        xs, med, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            runs = data[label].get(case)
            if not runs:
                continue
            m = statistics.median(runs)
            xs.append(j + (i - (len(SERIES) - 1) / 2) * width)
            med.append(m)
            lo.append(m - min(runs))
            hi.append(max(runs) - m)
        n = max((len(data[label].get(c, [])) for c in cases), default=0)
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=f"{legend} ({n} runs)")
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks(range(len(cases)), [c.replace("_", " ") for c in cases], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0.85, 1.2)
    ax.set_ylabel("time / bare cuBLAS GEMM")
    ax.set_title("Issue 3 on the H200: kfuse's GEMM is at cuBLAS's speed without its epilogue; bias + GELU is the gap")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out} from {len(paths)} runs")


if __name__ == "__main__":
    main()
