"""Plot session 25's baseline finding from the probe's raw JSON: eager, eager in a CUDA graph as
transformers builds it (an all-true stride-0 mask under capture), and the graph with the fix
(``kfuse/bench/hf_masks.py``), per model; and SDPA's time per mask form.

    python benchmarks/experiments/plot_baseline_fix.py   # CPU; writes benchmarks/results/h200/baseline_mask_fix.png
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "h200"


def main() -> None:
    probe = json.loads((RESULTS / "experiments" / "s25_baseline_graph_probe_fixed.json").read_text())
    rows = probe["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    sides = [("eager_ms", "eager"), ("graph_stock_ms", "CUDA graph, HF's mask"), ("graph_fixed_ms", "CUDA graph, no mask (fix)")]
    width = 0.27
    for i, (key, label) in enumerate(sides):
        xs = [j + (i - 1) * width for j in range(len(rows))]
        ax.bar(xs, [statistics.median(r[key]) for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [r["case"].replace("_", " ") for r in rows], fontsize=8)
    ax.set_ylabel("ms per call (median of two rounds)")
    ax.set_title("PyTorch baselines on the H200: what HF's mask under capture costs")
    ax.legend(fontsize=8)
    forms = probe["mask_forms"]
    bx.barh([f["mask"] for f in forms], [f["ms"] for f in forms], color=["C2" if "cudnn" in str(f["top"]) else "C3" for f in forms])
    bx.set_xscale("log")
    bx.set_xlabel("SDPA ms, B16 H12 S512 D64 (log)")
    bx.set_title("SDPA by mask form (red: FP32 math backend)")
    bx.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    out = RESULTS / "baseline_mask_fix.png"
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
