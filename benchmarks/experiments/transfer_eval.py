#!/usr/bin/env python3
"""Leave one problem out of a GPU's shipped tuning records: how good are the configs ``transfer_candidates`` proposes
from the other problems, judged by that problem's own measured candidates? (issue 3, session 65; docs/perf-notes.md)

    PYTHONPATH=. python benchmarks/experiments/transfer_eval.py kfuse/tune/records/nvidia-h200.json
"""

from __future__ import annotations

import collections
import json
import sys

import numpy as np

from kfuse.tune.hardware import lookup
from kfuse.tune.search import transfer_candidates
from kfuse.tune.space import config_from_dict, problem_from_dict


def main(path: str) -> None:
    recs = [r for r in json.load(open(path))["records"] if r["status"] == "ok"]
    hw = lookup(recs[0]["gpu"])
    times: dict[tuple[str, str], dict] = collections.defaultdict(dict)
    problems = {}
    for r in recs:
        key = (r["template"], r["problem"])
        problems[key] = problem_from_dict(r["problem_json"])
        cfg = config_from_dict(r["template"], r["config"])
        times[key][cfg] = min(r["time_ms"], times[key].get(cfg, r["time_ms"]))
    best = {k: min(v, key=v.get) for k, v in times.items()}
    stats: collections.Counter[str] = collections.Counter()
    ratios = []
    for key, p in problems.items():
        others = [(problems[k], best[k]) for k in problems if k != key and k[0] == key[0]]
        for k in (1, 3):
            known = [times[key][c] for c in transfer_candidates(p, others, hw, k) if c in times[key]]
            if not known:  # the proposed configs were never measured on this problem: no verdict
                stats[f"top{k} unmeasured"] += 1
                continue
            ratio = min(known) / times[key][best[key]]
            stats[f"top{k} measured"] += 1
            stats[f"top{k} within 3%"] += ratio <= 1.03
            if k == 3:
                ratios.append(ratio)
    print(path, f"{len(problems)} problems", dict(stats))
    print(f"top-3 ratio to the best measured: median {np.median(ratios):.3f} p90 {np.percentile(ratios, 90):.3f} max {max(ratios):.3f}")


if __name__ == "__main__":
    main(sys.argv[1])
