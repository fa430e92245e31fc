#!/usr/bin/env python3
"""Leave-one-problem-out: how good are the nearest neighbours' best configs for a problem, judged by its own measured
candidates (shipped records, one GPU)?"""

import json, collections, sys
from kfuse.tune.space import config_from_dict, problem_from_dict
from kfuse.tune.search import transfer_candidates
from kfuse.tune.hardware import lookup

f = sys.argv[1]  # e.g. kfuse/tune/records/nvidia-h200.json
recs = [r for r in json.load(open(f))["records"] if r["status"] == "ok"]
hw = lookup(recs[0]["gpu"])
by = collections.defaultdict(dict)
probs = {}
for r in recs:
    key = (r["template"], r["problem"])
    probs[key] = problem_from_dict(r["problem_json"])
    cfg = config_from_dict(r["template"], r["config"])
    t = r["time_ms"]
    by[key][cfg] = min(t, by[key].get(cfg, t))
best = {k: min(v, key=v.get) for k, v in by.items()}
stats = collections.Counter()
ratios = []
for key, p in probs.items():
    others = [(probs[k], best[k]) for k in probs if k != key and k[0] == key[0]]
    for k_ in (1, 3):
        cands = transfer_candidates(p, others, hw, k_)
        known = [by[key][c] for c in cands if c in by[key]]
        if not known:
            stats[f"top{k_} unmeasured"] += 1
            continue
        r = min(known) / by[key][best[key]]
        stats[f"top{k_} measured"] += 1
        stats[f"top{k_} within 3%"] += r <= 1.03
        if k_ == 3:
            ratios.append(r)
print(f, len(probs), dict(stats))
import numpy as np

print("top3 known ratio: median %.3f p90 %.3f max %.3f" % (np.median(ratios), np.percentile(ratios, 90), max(ratios)))
