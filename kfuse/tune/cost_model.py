"""A learned cost model: gradient-boosted trees (scikit-learn) over problem + config features.

It predicts, for a problem, how much slower each config is than that problem's best: the
target is ``log(time / best time of the problem)``, so problems of very different sizes share
one model and only the ranking inside a problem is learned (Ansor and Faith do the same with
xgboost). Until enough records exist, the analytic estimate of ``space.estimate_ms`` ranks
candidates instead (it is also one of the features).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kfuse.tune.hardware import Hardware
from kfuse.tune.space import Config, Problem, estimate_ms, features


class CostModel:
    def __init__(self, hw: Hardware, min_samples: int = 24, seed: int = 0) -> None:
        self.hw = hw
        self.min_samples = min_samples
        self.seed = seed
        self.model = None
        self.n_samples = 0

    @property
    def trained(self) -> bool:
        return self.model is not None

    def fit(self, samples: Sequence[tuple[Config, Problem, float]]) -> bool:
        """Train on (config, problem, measured ms) triples; False (and stay untrained) when
        there are too few, or no problem with two or more measurements."""
        best: dict[str, float] = {}
        count: dict[str, int] = {}
        for _, p, t in samples:
            key = p.signature()
            best[key] = min(best.get(key, math.inf), t)
            count[key] = count.get(key, 0) + 1
        rows = [(c, p, t) for c, p, t in samples if count[p.signature()] >= 2 and t > 0]
        if len(rows) < self.min_samples:
            return False
        from sklearn.ensemble import GradientBoostingRegressor

        x = np.array([features(c, p, self.hw) for c, p, _ in rows], dtype=np.float64)
        y = np.array([math.log(t / best[p.signature()]) for _, p, t in rows], dtype=np.float64)
        model = GradientBoostingRegressor(n_estimators=150, max_depth=4, learning_rate=0.08, subsample=0.9, random_state=self.seed)
        model.fit(x, y)
        self.model = model
        self.n_samples = len(rows)
        return True

    def predict(self, configs: Sequence[Config], problem: Problem) -> np.ndarray:
        """A score per config, lower is faster (relative log time when trained, else the
        log of the analytic estimate)."""
        if not configs:
            return np.zeros(0)
        if self.model is None:
            return np.array([math.log(estimate_ms(c, problem, self.hw)) for c in configs])
        x = np.array([features(c, problem, self.hw) for c in configs], dtype=np.float64)
        return self.model.predict(x)

    def rank(self, configs: Sequence[Config], problem: Problem) -> list[Config]:
        scores = self.predict(configs, problem)
        order = np.argsort(scores, kind="stable")
        return [configs[i] for i in order]
