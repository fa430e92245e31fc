"""Adaptive fused-kernel selection and kernel split (Aker).

* ``select_version``: of the fused versions of a pair, the one whose makespan reduction at its own
  opportune load ratio is largest (no run-time table over load ratios).
* ``split_be``: how many BE blocks to fuse with an LC kernel so the load ratio lands on the
  opportune ratio, shrunk until the predicted extra time fits the QoS headroom; the rest of the
  BE kernel goes back to the queue (PTB kernels run any block range, so a split is just a range).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kfuse.colocate.predictor import LinearModel, TwoStageModel


@dataclass(frozen=True)
class Selection:
    version: Any
    model: TwoStageModel
    opportune_ratio: float
    reduction: float


def select_version(models: Mapping[Any, TwoStageModel]) -> Selection | None:
    """The version with the largest makespan reduction at its opportune ratio (None if none helps)."""
    best: Selection | None = None
    for v, m in models.items():
        r = m.best_reduction
        if best is None or r > best.reduction:
            best = Selection(v, m, m.opportune_ratio, r)
    if best is None or best.reduction <= 0.0:
        return None
    return best


@dataclass(frozen=True)
class Split:
    blocks: int  # BE blocks fused with this LC kernel (from the head of the BE kernel's remaining range)
    t_be: float  # predicted BE time of those blocks alone
    t_fused: float  # predicted fused time

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
