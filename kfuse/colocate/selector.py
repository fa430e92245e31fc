"""Adaptive fused-kernel selection and kernel split (Aker).

* ``select_version``: of the fused versions of a pair, the one whose makespan reduction at its own
  opportune load ratio is largest (no run-time table over load ratios).
* ``split_be``: how many BE blocks to fuse with an LC kernel so the load ratio lands on the
  opportune ratio, shrunk until the predicted extra time fits the QoS headroom; the rest of the
  BE kernel goes back to the queue (PTB kernels run any block range, so a split is just a range).
* ``plan_fusion``: ``split_be`` on the error-inflated prediction, kept only if fusing beats time
  sharing the same blocks: the fused extra time must stay below their marginal solo time.

A version is trusted only on *measured* overlap: the model's reduction at x* is an extrapolation
of a least-squares fit (on the H200 it promised 78% where the launch measured 21%), so selection
ranks versions by their best measured overlap, against ``min_overlap``; the scheduler plans with the
measured samples interpolated (``predictor.SampleModel``), aimed at the best measured load ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kfuse.colocate.predictor import LinearModel, OnlineTwoStage, SampleModel, TwoStageModel

MIN_OVERLAP = 0.05  # below this measured overlap, fusion is within noise of time sharing: do not fuse


@dataclass(frozen=True)
class Selection:
    version: Any
    model: TwoStageModel | SampleModel
    opportune_ratio: float
    reduction: float  # the model's, at the opportune ratio
    measured: float = math.nan  # measured overlap of the profile sample nearest the opportune ratio


def select_version(
    models: Mapping[Any, TwoStageModel | SampleModel], measured: Mapping[Any, float] | None = None, min_overlap: float = 0.0
) -> Selection | None:
    """The version with the largest *measured* overlap (None if none helps by more than ``min_overlap``);
    a version without a measurement counts its model's reduction at its opportune ratio. Session 3
    counted min(model, measured at the model's x*): the two-stage fit's x* often sat away from the best
    measured ratio, so 10 of 12 H200 pairs with 16-61% measured overlap were dropped."""
    best: Selection | None = None
    score = -math.inf
    for v, m in models.items():
        r = m.best_reduction
        meas = measured.get(v, math.nan) if measured is not None else math.nan
        s = r if math.isnan(meas) else meas
        if s > score:
            best, score = Selection(v, m, m.opportune_ratio, r, meas), s
    if best is None or score <= max(0.0, min_overlap):
        return None
    return best


@dataclass(frozen=True)
class Split:
    blocks: int  # BE blocks fused with this LC kernel (from the head of the BE kernel's remaining range)
    t_be: float  # predicted BE time of those blocks alone
    t_fused: float  # predicted fused time
    saving: float = 0.0  # time-sharing time of those blocks (what fusing them saves later)
    extra: float = 0.0  # pessimistic fused extra time over T_lc
    reason: str = ""  # why a plan is empty (``REASONS``), "fused" otherwise
    tried: int = 0  # declined for efficiency: the blocks of the candidate (its extra and saving are kept above)

    @property
    def empty(self) -> bool:
        return self.blocks == 0


def split_be(
    t_lc: float, be_model: LinearModel, fused: TwoStageModel, blocks_left: int, headroom: float, x_target: float | None = None
) -> Split:
    """BE blocks to fuse with an LC kernel of predicted time ``t_lc``: aim at the opportune ratio
    (or ``x_target``), never more than remain, and only as many as keep ``T_fused - T_lc < headroom``."""
    x = fused.opportune_ratio if x_target is None else x_target
    n = min(blocks_left, int(be_model.blocks_for(x * t_lc)))
    # the predicted extra time grows with n: halve, then step down, until it fits the headroom
    while n > 0 and fused.predict(t_lc, be_model.predict(n)) - t_lc >= headroom:
        n = n // 2 if n > 8 else n - 1
    if n <= 0:
        return Split(0, 0.0, t_lc)
    t_be = be_model.predict(n)
    return Split(n, t_be, fused.predict(t_lc, t_be))


def fit_slice(be_model: LinearModel, blocks_left: int, budget: float) -> int:
    """BE blocks that run alone within ``budget`` (time sharing a gap with a split kernel)."""
    return min(blocks_left, int(be_model.blocks_for(budget)))


REASONS = ("fused", "no_blocks", "headroom", "efficiency")


def plan_fusion(
    t_lc: float, be_model: LinearModel, online: OnlineTwoStage, blocks_left: int, headroom: float, min_gain: float = MIN_OVERLAP
) -> Split:
    """BE blocks to fuse, or an empty split (``reason`` says why) where time sharing does as well.

    Candidates: the blocks at the opportune ratio, and the whole rest of the BE kernel. Each is kept only if
    its pessimistic fused extra time (prediction x (1 + recent p75 error)) fits ``headroom`` and stays below
    (1 - ``min_gain``) x what time sharing would pay for those blocks: ``T_be(left) - T_be(left - n)``, which is
    ``a + b n`` when the fusion finishes the kernel (time sharing launches whole kernels, so it pays the launch
    cost and the partial last wave too) and ``b n`` otherwise. Session 4 only had the first candidate and only
    its slope ``b n``: on the H200, sgemm's linear fit over 128..1024 blocks on a 528-program grid has a 0.072 ms
    intercept (one wave costs the same for 128 or 512 blocks) and a slope half the mean per-block cost, so every
    fusion looked worse than time sharing (0 fused launches); x* T_lc below the intercept gave no blocks at all.
    Of those that pass, the one that saves most time-sharing time per ms of extra wins (the per-query
    allowance binds, so BE time bought per ms of headroom matters, as for the opportune ratio)."""
    if headroom <= 0.0 or blocks_left <= 0:
        return Split(0, 0.0, t_lc, reason="headroom" if blocks_left > 0 else "no_blocks")
    m = online.model

    def extra(n: int) -> float:
        # a fit can dip below T_lc near its knee; the LC blocks still take T_lc, so extra is never negative
        return max(0.0, online.upper(t_lc, be_model.predict(n)) - t_lc)

    def saving(n: int) -> float:
        return be_model.predict(blocks_left) - (be_model.predict(blocks_left - n) if n < blocks_left else 0.0)

    best: tuple[float, int] | None = None
    probe: tuple[int, float, float] | None = None  # the most efficient candidate declined for efficiency
    failed: set[str] = set()  # the reason reported is the last stage a candidate reached: efficiency > headroom > no_blocks
    for n in (min(blocks_left, int(be_model.blocks_for(m.opportune_ratio * t_lc))), blocks_left):
        shrunk = False
        while n > 0 and extra(n) >= headroom:
            shrunk = True
            n = n // 2 if n > 8 else n - 1
        if n <= 0:
            failed.add("headroom" if shrunk else "no_blocks")
            continue
        e, s = extra(n), saving(n)
        if e > (1.0 - min_gain) * s:
            failed.add("efficiency")
            if probe is None or s / max(e, 1e-9) > probe[2] / max(probe[1], 1e-9):
                probe = (n, e, s)
            continue
        if best is None or s / max(e, 1e-9) > best[0]:
            best = (s / max(e, 1e-9), n)
    reason = next((r for r in ("efficiency", "headroom", "no_blocks") if r in failed), "no_blocks")
    if best is None:
        if reason == "efficiency" and probe is not None:
            return Split(0, 0.0, t_lc, saving=probe[2], extra=probe[1], reason=reason, tried=probe[0])
        return Split(0, 0.0, t_lc, reason=reason)
    n = best[1]
    t_be = be_model.predict(n)
    return Split(n, t_be, online.predict(t_lc, t_be), saving=saving(n), extra=extra(n), reason="fused")
