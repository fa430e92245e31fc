"""The per-pair table from co-location records (issue 8): for every GPU and LC x BE pair, each policy's BE throughput
gain over time sharing as measured in the same run, the best policy, its p99 against QoS and its violations, and the
mean of the best over each LC's pairs (the issue's target: +30% on average, 0 violations at p99).

    kfuse colocate pairs                                  # every benchmarks/results/*/colocate*.json under the cwd
    kfuse colocate pairs OUT/colocate.json [...]          # the records a `kfuse colocate run --out OUT` wrote
    kfuse colocate pairs --png pairs.png --gpu H100       # and a plot of one GPU's pairs
    python benchmarks/colocate_pairs.py ...               # the same, from the repository

A pair measured in several files keeps each policy's latest record (files are read in name order, so a later
session's file wins); a record's gain is only ever against the time sharing of its own run. Records of the LC as kfuse
compiles it (``--lc-gemms plan``) and of the PTB stand-in LC (``ptb``, the default and every record before session
54) are separate tables: one LC's numbers never stand in for the other's.
"""

from __future__ import annotations

import argparse
import glob
import json
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

BASELINES = ("lc_alone", "timeshare", "timeshare_rerun")


def load(paths: list[str]) -> list[dict[str, Any]]:
    """The records of ``paths`` (a JSON list, or an object with ``records``), each tagged with its file's name."""
    out = []
    for p in sorted(paths):
        data = json.loads(Path(p).read_text())
        for r in data if isinstance(data, list) else data.get("records", []):
            if r.get("benchmark") == "colocate":
                out.append({**r, "_file": Path(p).name})
    return out


LC_FORMS = {
    "ptb": "LC: PTB stand-in GEMMs",
    "ptb-tuned": "LC: PTB stand-in GEMMs, a tile per shape",
    "plan": "LC: as kfuse compiles it",
    "plan-ptb": "LC: kfuse's own GEMM tiles, sliceable",
    "plan-ptb2": "LC: kfuse's own GEMM tiles, sliceable, two an SM",
    "plan-ws": "LC: as kfuse compiles it, its GEMMs hosting BE worker partitions",
}


def group(r: dict[str, Any]) -> str:
    """A record's table: its GPU and the LC's form (``lc_gemms``; records without it ran the PTB stand-in)."""
    form = str(r.get("lc_gemms") or "ptb")
    tuned = ", tuned" if r.get("lc_tune") not in (None, "none") else ""  # --lc-tune (session 55): the LC compiled with tuning
    return f"{r.get('gpu')}, {LC_FORMS.get(form, 'LC: ' + form)}{tuned}"


def pairs(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(GPU and LC form, LC+BE case) -> policy -> its latest record with a gain over time sharing."""
    table: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        if r.get("policy") in BASELINES or r.get("be_gain_vs_timesharing") is None or "+" not in str(r.get("case", "")):
            continue
        table[(group(r), str(r["case"]))][str(r["policy"])] = r
    return dict(table)


def qos_kept(r: dict[str, Any]) -> bool:
    """The issue's QoS rule: p99 latency within the target (zero violations at p99)."""
    return float(r["p99_ms"]) <= float(r["qos_ms"])


def markdown(table: dict[tuple[str, str], dict[str, dict[str, Any]]]) -> str:
    """One table per GPU: a row per pair, its best policy among those that kept QoS, then the mean of the best gain
    per LC."""
    lines: list[str] = []
    for gpu in sorted({g for g, _ in table}):
        lines += [f"### {gpu}", "", "| pair | policies (gain over time sharing) | best | p99 / QoS ms | violations | files |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        best_by_lc: dict[str, list[float]] = defaultdict(list)
        for g, case in sorted(k for k in table if k[0] == gpu):
            pols = table[(g, case)]
            kept = {p: r for p, r in pols.items() if qos_kept(r)} or {"-": None}
            name, rec = max(kept.items(), key=lambda kv: -1.0 if kv[1] is None else kv[1]["be_gain_vs_timesharing"])
            gains = ", ".join(f"{p} {r['be_gain_vs_timesharing']:+.1%}{'' if qos_kept(r) else ' (QoS missed)'}"
                              for p, r in sorted(pols.items()))  # fmt: skip
            files = ", ".join(sorted({r["_file"] for r in pols.values()}))
            if rec is None:
                lines.append(f"| {case} | {gains} | none keeps QoS | - | - | {files} |")
                continue
            lines.append(f"| {case} | {gains} | {name} {rec['be_gain_vs_timesharing']:+.1%} | {rec['p99_ms']:.2f} / {rec['qos_ms']:.2f} | "
                         f"{rec['violations']} | {files} |")  # fmt: skip
            best_by_lc[case.split("+")[0]].append(rec["be_gain_vs_timesharing"])
        lines.append("")
        for lc, gains_ in sorted(best_by_lc.items()):
            lines.append(f"{lc}: best per pair, mean over {len(gains_)} pairs: {sum(gains_) / len(gains_):+.1%}")
        lines.append("")
    return "\n".join(lines)


TARGET = 0.30  # the mean gain over time sharing


def summary(records: list[dict[str, Any]], file: str = "colocate.json") -> str:
    """The per-pair table of one run's records (all written to ``file``); empty where no pair has a gain to show."""
    table = pairs([{**r, "_file": file} for r in records])
    return markdown(table) if table else ""


def plot_pairs(table: dict[tuple[str, str], dict[str, dict[str, Any]]], path: str | Path, gpu: str) -> Path:
    """One GPU's pairs (the first table whose name, GPU and LC form, contains ``gpu``): each policy's gain over time
    sharing as a bar per pair, a hatched bar where the policy missed QoS, the issue's +30% as a line, and each LC's
    mean of the best per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({g for g, _ in table if gpu.lower() in g.lower()})
    if not names:
        raise SystemExit(f"no records for a GPU matching {gpu!r}: have {sorted({g for g, _ in table})}")
    cases = sorted(c for g, c in table if g == names[0])
    pols = sorted({p for c in cases for p in table[(names[0], c)]})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(cases) + 2.5), 4.2))
    w = 0.8 / len(pols)
    for j, pol in enumerate(pols):
        for i, c in enumerate(cases):
            r = table[(names[0], c)].get(pol)
            if r is None:
                continue
            ax.bar(i + j * w, 100 * r["be_gain_vs_timesharing"], w, color=f"C{j}", hatch="" if qos_kept(r) else "//",
                   label=pol if i == cases.index(next(cc for cc in cases if pol in table[(names[0], cc)])) else None)  # fmt: skip
    ax.axhline(100 * TARGET, color="k", ls="--", lw=1, label=f"target +{TARGET:.0%} (mean)")
    ax.axhline(0.0, color="k", lw=0.8)
    best: dict[str, list[float]] = defaultdict(list)
    for c in cases:
        kept = [r["be_gain_vs_timesharing"] for r in table[(names[0], c)].values() if qos_kept(r)]
        if kept:
            best[c.split("+")[0]].append(max(kept))
    means = ", ".join(f"{lc} {sum(v) / len(v):+.1%}" for lc, v in sorted(best.items()))
    ax.set_xticks(np.arange(len(cases)) + w * (len(pols) - 1) / 2, [c.replace("+", "\n+") for c in cases], fontsize=7)
    ax.set_ylabel("BE throughput vs time sharing (%)")
    # the GPU and LC form can outrun a narrow figure: wrapped, not cut at the edges
    head = textwrap.fill(f"{names[0]}: every LC x BE pair (hatched: QoS missed)", width=int(12 * fig.get_figwidth()))
    ax.set_title(f"{head}\nmean of the best per pair: {means}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def default_files(root: str | Path = ".") -> list[str]:
    """The repository's committed co-location records under ``root``."""
    return sorted(glob.glob(str(Path(root) / "benchmarks" / "results" / "*" / "colocate*.json")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="colocate JSON files (default: benchmarks/results/*/colocate*.json)")
    ap.add_argument("--png", help="also plot one GPU's pairs to this PNG (with --gpu)")
    ap.add_argument("--gpu", default="H100", help="the table to plot: a part of its name, GPU and LC form (default H100)")
    a = ap.parse_args()
    table = pairs(load(a.files or default_files(Path(__file__).parents[2])))
    print(markdown(table))
    if a.png:
        print(f"wrote {plot_pairs(table, a.png, a.gpu)}")


if __name__ == "__main__":
    main()
