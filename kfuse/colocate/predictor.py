"""Duration predictor (Aker).

* Per kernel: time linear in the number of blocks it runs, ``t = a + b * n``.
* Per fused pair and version: fused time two-stage linear in the load ratio ``x = T_be / T_lc``:
  ``T_fused / T_lc = c0 + c1 * x + c2 * max(0, x - x*)``. Below the inflection ``x*`` the BE
  blocks hide in the LC kernel's idle resources (co-run stage, small slope); above it the BE part
  outlasts the LC part and runs alone (solo-run stage, slope near 1). ``x*`` is the *opportune
  load ratio*: both parts end together and the makespan reduction is largest there.
* Online: every observation is checked against the prediction; when the error passes 10% the
  sample joins the training set and the model is refitted. A single sample far off the prediction
  (a stall: a JIT compile or a preempted launch timed with the kernel) is held back; it joins the
  fit only when the next observation is far off too (then the law has really changed). The scheduler
  plans with ``upper`` = prediction x (1 + ``error_bound``), the recent p75 relative error.
* ``SampleModel``: what the scheduler plans with. The two-stage fit misses the measured launches
  (H200: held-out error mean 24%, max 527%; its x* can sit far from the best measured ratio), so the
  planning model interpolates the measured samples themselves (piecewise linear, ``(0, 1)`` anchored,
  slope 1 past the last sample). Its opportune ratio is a *measured* sample (the most time saved) and its starting
  error bound comes from leave-one-out errors over the samples of that pair and version (each one
  held out in turn), not from a global or two-sample maximum.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

REFIT_ERROR = 0.10
OUTLIER = 3.0  # a measurement beyond 3x (or below 1/3 of) the prediction is a stall until repeated
ERROR_WINDOW = 32  # recent observations that set the error bound
ERROR_QUANTILE = 75  # percentile of those errors the planner inflates predictions by (not their max: one misfit must not veto a pair)
MIN_ERROR_BOUND = 0.02
EFFICIENCY = 3.0  # SampleModel aims where each ms of fused extra buys >= 3 ms of BE (sim: +15% vs +4% for max saving)
AIM_RULES = ("average", "marginal", "priced")  # SampleModel.opportune_ratio's rules ("priced": E per model, Profile.price_aims)
OPPORTUNE_RULE = "average"
MERGE_X = 0.05  # samples whose load ratios differ by less than 5% are one point (their mean)


@dataclass
class LinearModel:
    """t = a + b * n (n: blocks)."""

    a: float = 0.0
    b: float = 0.0

    @classmethod
    def fit(cls, ns: Sequence[float], ts: Sequence[float]) -> LinearModel:
        n, t = np.asarray(ns, float), np.asarray(ts, float)
        if len(n) == 0:
            raise ValueError("LinearModel.fit: no samples")
        if len(set(n.tolist())) < 2:  # one block count: proportional model through the origin
            return cls(0.0, float(t.mean() / max(n.mean(), 1e-12)))
        b, a = np.polyfit(n, t, 1)
        return cls(float(a), float(b))

    def predict(self, n: float) -> float:
        return self.a + self.b * n

    def blocks_for(self, t: float) -> float:
        """How many blocks fit in time t (fractional, >= 0)."""
        return max(0.0, (t - self.a) / self.b) if self.b > 0 else 0.0


class FusedTimeModel:
    """T_fused / T_lc as a function ``g`` of the load ratio x = T_be / T_lc; what follows from it."""

    def g(self, x: float) -> float:
        raise NotImplementedError

    def predict(self, t_lc: float, t_be: float) -> float:
        return t_lc * self.g(t_be / t_lc) if t_lc > 0 else t_be

    def reduction(self, x: float) -> float:
        """Makespan reduction of fusing at load ratio x: (T_lc + T_be - T_fused) / (T_lc + T_be)."""
        return (1.0 + x - self.g(x)) / (1.0 + x)


@dataclass
class TwoStageModel(FusedTimeModel):
    """T_fused / T_lc = c0 + c1 x + c2 max(0, x - x_star), continuous at x_star."""

    c0: float
    c1: float
    c2: float
    x_star: float

    def g(self, x: float) -> float:
        return self.c0 + self.c1 * x + self.c2 * max(0.0, x - self.x_star)

    @property
    def opportune_ratio(self) -> float:
        return self.x_star

    @property
    def best_reduction(self) -> float:
        return self.reduction(self.x_star)

    def as_dict(self) -> dict[str, float]:
        return {"c0": self.c0, "c1": self.c1, "c2": self.c2, "x_star": self.x_star, "best_reduction": self.best_reduction}

    @classmethod
    def fit(cls, xs: Sequence[float], ys: Sequence[float]) -> TwoStageModel:
        """Least squares for every candidate inflection (a fine grid plus the sample points); keep the best."""
        x, y = np.asarray(xs, float), np.asarray(ys, float)
        if len(x) < 3:
            raise ValueError(f"TwoStageModel.fit needs at least 3 samples, got {len(x)}")
        lo, hi = float(x.min()), float(x.max())
        if hi - lo <= 1e-12 * max(1.0, abs(hi)):
            # every sample at one load ratio (a BE kernel of one block): no slope to fit from them; the
            # line from (0, 1) (no BE blocks: the LC kernel's own time) through their mean
            c1 = (float(y.mean()) - 1.0) / hi if hi > 0 else 0.0
            return cls(1.0, c1, 0.0, hi)
        cands = np.unique(np.concatenate([np.linspace(lo, hi, 64), x]))
        best: tuple[float, TwoStageModel] | None = None
        for xs_ in cands:
            basis = np.stack([np.ones_like(x), x, np.maximum(0.0, x - xs_)], 1)
            coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
            err = float(((basis @ coef - y) ** 2).sum())
            if best is None or err < best[0] - 1e-15:
                best = (err, cls(float(coef[0]), float(coef[1]), float(coef[2]), float(xs_)))
        assert best is not None
        m = best[1]
        if abs(m.c2) < 1e-9 or m.x_star <= lo or m.x_star >= hi:  # no visible knee: one line, knee at the edge
            c1, c0 = np.polyfit(x, y, 1)
            return cls(float(c0), float(c1), 0.0, hi)
        return m


@dataclass(frozen=True)
class SampleModel(FusedTimeModel):
    """T_fused / T_lc interpolated piecewise linearly between measured samples (x, y), with (0, 1)
    below the first (no BE blocks: the LC kernel's time) and slope 1 past the last (the BE part runs
    alone). Same interface as ``TwoStageModel``; the opportune ratio is a measured sample."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    efficiency: float | None = None  # this model's own E (a price of the allowance): aims by the marginal rule

    @classmethod
    def fit(cls, xs: Sequence[float], ys: Sequence[float]) -> SampleModel:
        pts = sorted((float(x), float(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0)
        if not pts:
            raise ValueError("SampleModel.fit: no samples")
        groups: list[list[tuple[float, float]]] = []
        for p in pts:
            if groups and p[0] <= groups[-1][0][0] * (1.0 + MERGE_X):
                groups[-1].append(p)
            else:
                groups.append([p])
        mx = tuple(float(np.mean([p[0] for p in g])) for g in groups)
        my = tuple(float(np.mean([p[1] for p in g])) for g in groups)
        return cls(mx, my)

    def g(self, x: float) -> float:
        if x >= self.xs[-1]:
            return self.ys[-1] + (x - self.xs[-1])
        k = bisect.bisect_right(self.xs, x)  # piecewise linear through (0, 1) and the samples (np.interp, without its host cost)
        x0, y0 = (self.xs[k - 1], self.ys[k - 1]) if k else (0.0, 1.0)
        x1, y1 = self.xs[k], self.ys[k]
        return y0 + (y1 - y0) * (max(x, 0.0) - x0) / (x1 - x0) if x1 > x0 else y1

    @property
    def opportune_ratio(self) -> float:
        """The measured ratio to aim a fused slice at. ``OPPORTUNE_RULE`` "marginal": the x maximising
        x - E (y - 1), where the marginal BE time bought per ms of extra falls to E = ``EFFICIENCY``
        (the Lagrangian of the most gain under a per-query allowance). "average": the largest x whose
        slice buys E ms per ms on average (x >= E (y - 1)); if none qualifies, the most efficient sample.
        A model with its own ``efficiency`` (priced from the allowance) aims by the marginal rule at that E."""
        if self.efficiency is not None:
            return self.aim(self.efficiency)
        if OPPORTUNE_RULE == "marginal":
            return self.aim(EFFICIENCY)
        ok = [x for x, y in zip(self.xs, self.ys, strict=True) if x >= EFFICIENCY * (y - 1.0)]
        return max(ok) if ok else max(self.xs, key=lambda x: x / max(self.g(x) - 1.0, 1e-3))

    def aim(self, efficiency: float) -> float:
        """The measured x maximising x - E (y - 1): what a slice gains over time sharing (1 + x - y) less what its
        extra time (y - 1) costs at the price E - 1 of a ms of the allowance."""
        return max(self.xs, key=lambda x: x - efficiency * (self.g(x) - 1.0))

    @property
    def best_reduction(self) -> float:
        return self.reduction(self.opportune_ratio)

    @property
    def best_measured_overlap(self) -> float:
        return max(self.reduction(x) for x in self.xs)

    def as_dict(self) -> dict[str, Any]:
        return {"x_star": self.opportune_ratio, "best_reduction": self.best_reduction, "points": len(self.xs)}


def leave_one_out_errors(xs: Sequence[float], ys: Sequence[float]) -> list[float]:
    """Relative error of ``SampleModel`` at each merged sample, fitted without that sample."""
    m = SampleModel.fit(xs, ys)
    errs = []
    for k in range(len(m.xs)):
        rest_x, rest_y = m.xs[:k] + m.xs[k + 1 :], m.ys[:k] + m.ys[k + 1 :]
        if rest_x:
            errs += relative_errors([SampleModel(rest_x, rest_y).g(m.xs[k])], [m.ys[k]])
    return errs


def relative_errors(pred: Sequence[float], meas: Sequence[float]) -> list[float]:
    return [abs(p - m) / m for p, m in zip(pred, meas, strict=True) if m > 0]


def error_summary(errs: Sequence[float]) -> dict[str, float]:
    """Count, mean, median, p90 and max of relative errors (a tail of stalled launches moves the mean, not the median)."""
    if not errs:
        return {"n": 0, "mean": math.nan, "median": math.nan, "max": math.nan, "p90": math.nan}
    e = np.asarray(errs, float)
    return {"n": len(e), "mean": float(e.mean()), "median": float(np.median(e)), "max": float(e.max()),
            "p90": float(np.percentile(e, 90))}  # fmt: skip


@dataclass
class OnlineTwoStage:
    """A two-stage model that refits itself when a prediction misses by more than ``threshold``."""

    model: TwoStageModel | SampleModel
    xs: list[float] = field(default_factory=list)
    ys: list[float] = field(default_factory=list)
    threshold: float = REFIT_ERROR
    refits: int = 0
    errors: list[float] = field(default_factory=list)  # relative errors, held-out ones first
    outliers: int = 0
    _held: tuple[float, float] | None = None  # the last outlier sample, fitted only if the next one is off too

    @classmethod
    def fit(cls, xs: Sequence[float], ys: Sequence[float], threshold: float = REFIT_ERROR) -> OnlineTwoStage:
        return cls(TwoStageModel.fit(xs, ys), list(xs), list(ys), threshold)

    @classmethod
    def from_samples(cls, xs: Sequence[float], ys: Sequence[float], threshold: float = REFIT_ERROR) -> OnlineTwoStage:
        """The planning model: measured samples interpolated, error bound seeded with their leave-one-out errors.
        A sample beyond ``OUTLIER`` x its leave-one-out prediction (a stall) is dropped, as online, so it does not
        also spoil its neighbours' errors; its own error stays in the list (one of many: the quantile skips it)."""
        xs, ys, dropped = list(xs), list(ys), []
        while len(xs) > 3:
            m = SampleModel.fit(xs, ys)
            if len(m.xs) != len(xs):
                break  # merged points: leave-one-out indices no longer match the samples
            ratios = [y / SampleModel(m.xs[:k] + m.xs[k + 1 :], m.ys[:k] + m.ys[k + 1 :]).g(x)
                      for k, (x, y) in enumerate(zip(m.xs, m.ys, strict=True))]  # fmt: skip
            k = max(range(len(ratios)), key=lambda k: max(ratios[k], 1.0 / ratios[k]))
            if 1.0 / OUTLIER <= ratios[k] <= OUTLIER:
                break
            dropped.append(abs(1.0 / ratios[k] - 1.0))  # relative error |pred - meas| / meas
            j = next(j for j, (x, y) in enumerate(zip(xs, ys, strict=True)) if (x, y) == (m.xs[k], m.ys[k]))
            del xs[j], ys[j]
        return cls(SampleModel.fit(xs, ys), xs, ys, threshold, errors=dropped + leave_one_out_errors(xs, ys))

    def predict(self, t_lc: float, t_be: float) -> float:
        return self.model.predict(t_lc, t_be)

    @property
    def error_bound(self) -> float:
        """p75 of the recent relative errors (the held-out ones before any online observation); cached until the
        errors change (the planner asks for it several times per LC kernel: host time the GPU idles through)."""
        key = (len(self.errors), self.errors[-1] if self.errors else None)
        cached = self.__dict__.get("_bound")
        if cached is not None and cached[0] == key:
            return cached[1]
        recent = self.errors[-ERROR_WINDOW:]
        bound = max(MIN_ERROR_BOUND, float(np.percentile(recent, ERROR_QUANTILE))) if recent else REFIT_ERROR
        self.__dict__["_bound"] = (key, bound)
        return bound

    def upper(self, t_lc: float, t_be: float) -> float:
        """A fused time the measurement stays below about 3 times in 4."""
        return self.predict(t_lc, t_be) * (1.0 + self.error_bound)

    def observe(self, t_lc: float, t_be: float, t_fused: float) -> bool:
        """Record a measured fused run; refit (and return True) if the prediction was off by more than the threshold."""
        pred = self.predict(t_lc, t_be)
        err = abs(pred - t_fused) / t_fused if t_fused > 0 else 0.0
        sample = (t_be / t_lc, t_fused / t_lc)
        if pred > 0 and not 1.0 / OUTLIER <= t_fused / pred <= OUTLIER:
            self.outliers += 1
            if self._held is None:  # one stall must not wreck the fit (or the error bound)
                self._held = sample
                return False
            self.xs.append(self._held[0])
            self.ys.append(self._held[1])
        self._held = None
        self.errors.append(err)
        if err <= self.threshold:
            return False
        self.xs.append(sample[0])
        self.ys.append(sample[1])
        refit = type(self.model).fit(self.xs, self.ys)
        if isinstance(refit, SampleModel) and isinstance(self.model, SampleModel):
            refit = replace(refit, efficiency=self.model.efficiency)  # a refit keeps the model's price
        self.model = refit
        self.refits += 1
        return True

    def as_dict(self) -> dict[str, Any]:
        return {**self.model.as_dict(), "samples": len(self.xs), "refits": self.refits, "outliers": self.outliers,
                "error_bound": self.error_bound}  # fmt: skip
