"""Issue 8's per-pair table from the co-location records: for every GPU and LC x BE pair, each policy's BE throughput
gain over time sharing as measured in the same run, the best policy, its p99 against QoS and its violations, and the
mean of the best over each LC's pairs (the issue's target: +30% on average, 0 violations at p99).

    python benchmarks/colocate_pairs.py                        # every benchmarks/results/*/colocate*.json
    python benchmarks/colocate_pairs.py FILE.json [FILE.json ...]

A pair measured in several files keeps each policy's latest record (files are read in name order, so a later
session's file wins); a record's gain is only ever against the time sharing of its own run.
"""

from __future__ import annotations

import argparse
import glob
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

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


def pairs(records: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(gpu, LC+BE case) -> policy -> its latest record with a gain over time sharing."""
    table: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        if r.get("policy") in BASELINES or r.get("be_gain_vs_timesharing") is None or "+" not in str(r.get("case", "")):
            continue
        table[(str(r.get("gpu")), str(r["case"]))][str(r["policy"])] = r
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", help="colocate JSON files (default: benchmarks/results/*/colocate*.json)")
    a = ap.parse_args()
    files = a.files or glob.glob(str(Path(__file__).parent / "results" / "*" / "colocate*.json"))
    print(markdown(pairs(load(files))))


if __name__ == "__main__":
    main()
