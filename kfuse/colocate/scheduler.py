"""QoS-aware co-location scheduler and its baselines, over a pluggable GPU backend.

The GPU runs one launch at a time on a virtual clock: each launch's duration is what the backend
returns (measured with CUDA events on the real backend, a known function on the simulated one);
LC queries arrive as a Poisson process on the same clock. Policies:

* ``lc_alone``  — LC queries only (the QoS reference and the max-load search).
* ``timeshare`` — Baymax-like: whole BE kernels go into the gaps, and between the kernels of an LC
  query only when the predicted BE time fits every waiting query's QoS slack.
* ``streams``   — plain concurrent streams: every LC kernel is co-launched with the next whole BE
  kernel, no QoS awareness.
* ``partition`` — time sharing plus SM partitions across a whole query: when a query starts, its LC kernels run
  back to back on ``N - S`` SMs while a BE slice runs on the other ``S`` (green contexts, ``green.py``), the slice
  sized so the query's predicted extra time fits the headroom and costs less than time sharing those blocks; one
  BE launch a query, not one per LC kernel, so its launch cost is paid once. Everything else is ``timeshare``.
* ``backfill`` — ``partition`` with a backfill: BE blocks also on the query's own SMs, on a lowest-priority stream, in
  what the query leaves idle (gaps between its kernels, SMs its kernels do not fill); or the backfill alone beside the
  query on every SM where no partition pays. Planned from profiled windows like the slices (``profile_spans``).
* ``aker``      — time sharing plus fusion. A fusible LC kernel runs fused with a BE slice sized to
  the pair's opportune load ratio only where fusing beats time sharing those blocks: the pair's
  *measured* overlap passes ``min_overlap`` and the pessimistic fused extra time (prediction x
  (1 + recent p75 error)) fits ``T_qos - T_solo - T_queue`` (the minimum slack over waiting queries)
  and stays below the blocks' solo time. Everything else is exactly ``timeshare``: whole (rest of)
  BE kernels under the same headroom test, less the extra time this query's remaining trusted
  fusions are predicted to take; idle gaps run whole kernels. So where no pair overlaps, Aker *is*
  time sharing, and each fusion buys BE blocks for less headroom than time sharing pays for them.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kfuse.colocate.fuser import any_kernel, applies
from kfuse.colocate.predictor import LinearModel, OnlineTwoStage, SampleModel, error_summary, relative_errors
from kfuse.colocate.selector import MIN_OVERLAP, Selection, plan_fusion, select_version

# backfill: the partition, its query's own SMs also taking low-priority BE blocks (profiled with fill_shares);
# auto: per query, the whole-query SM partition (backfilled where profiled) or per-kernel fusion (aker), whichever plans
# the larger gain
POLICIES = ("lc_alone", "timeshare", "streams", "aker", "partition", "backfill", "auto")


@dataclass(frozen=True)
class LCKernel:
    name: str
    fusible: bool  # a PTB GEMM/conv the fuser can pair with a BE kernel, or a plan GEMM that hosts one (``ws``)
    key: str  # kernels with one key share one fused-time model (same GEMM problem)
    host: bool = False  # a plan GEMM step that carries a BE slice in a worker partition: the ``ws`` version's only kind


class Backend:
    """What the scheduler needs from a GPU. Times are milliseconds."""

    sms: int | None = None  # the GPU's SM count (an SM-partition version's share is its BE SMs over it)

    def lc_kernels(self) -> list[LCKernel]:
        raise NotImplementedError

    def be_blocks(self, be: str) -> int:
        raise NotImplementedError

    def run_lc(self, i: int) -> float:
        raise NotImplementedError

    def run_be(self, be: str, start: int, end: int) -> float:
        raise NotImplementedError

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        raise NotImplementedError

    def run_concurrent(self, i: int, be: str, start: int, end: int) -> float:
        """LC kernel i and BE blocks [start, end) launched on two streams; time until both are done."""
        raise NotImplementedError

    def run_span(self, be: str, start: int, end: int, be_sms: int, fill: int = 0) -> float:
        """A whole query's LC kernels back to back on the SMs a ``be_sms`` partition leaves, BE blocks [start, end) on
        the other ``be_sms`` at the same time; time until both are done. ``be_sms`` 0: the query alone on the whole GPU
        in the same form (the reference its partitioned windows are read against). ``fill``: that many more blocks,
        [end, end + fill), on the query's own SMs at a lower priority than the query (its gaps and idle SMs)."""
        raise NotImplementedError


# ---- profile: everything the scheduler predicts with ---------------------------------------------


@dataclass
class Profile:
    lc_ms: list[float]  # solo time of each LC kernel
    lc: list[LCKernel]
    be: dict[str, LinearModel]  # BE time vs blocks
    be_blocks: dict[str, int]
    fused: dict[tuple[str, str], dict[Any, OnlineTwoStage]]  # (lc key, be) -> version -> model
    chosen: dict[tuple[str, str], Selection] = field(default_factory=dict)
    heldout: dict[str, Any] = field(default_factory=dict)  # predictor errors on held-out runs
    # measured (x = T_be/T_lc, T_fused/T_lc) of every profiled launch, fit and held-out: what selection trusts
    samples: dict[tuple[str, str], dict[Any, list[tuple[float, float]]]] = field(default_factory=dict)
    min_overlap: float = MIN_OVERLAP
    # whole-query SM partitions: (BE, S) -> [(BE blocks, window ms)] with blocks 0 first; span_solo_ms: the query's
    # window alone in the same form. A window w counts on the policies' clock as lc_total x w / span_solo_ms.
    spans: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)
    span_solo_ms: float = 0.0
    # the same with a backfill of m BE blocks on the query's own SMs at low priority: (BE, S, m) -> [(slice, window)]
    filled_spans: dict[tuple[str, int, int], list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def lc_total(self) -> float:
        return float(sum(self.lc_ms))

    def measured_overlap(self, pair: tuple[str, str], version: Any, x: float) -> float:
        """Overlap (1 + x - y) / (1 + x) of the profiled launch whose load ratio is nearest ``x`` (nan: none)."""
        pts = self.samples.get(pair, {}).get(version, [])
        if not pts:
            return math.nan
        px, py = min(pts, key=lambda p: abs(p[0] - x))
        return (1.0 + px - py) / (1.0 + px)

    def best_measured(self, pair: tuple[str, str], version: Any) -> tuple[float, float]:
        """(load ratio, overlap) of the profiled launch of this pair and version with the largest overlap."""
        pts = self.samples.get(pair, {}).get(version, [])
        if not pts:
            return math.nan, math.nan
        return max(((x, (1.0 + x - y) / (1.0 + x)) for x, y in pts), key=lambda p: p[1])

    def choose(self) -> None:
        """Per (LC shape, BE): the version with the best *measured* overlap (not the fit's reduction at its x*).
        Priced models (``price_aims``) rank by what they gain at their aim net of the allowance they spend,
        x - E (y - 1), among the versions whose best measured overlap passes ``min_overlap``."""
        self.chosen = {}
        for pair, models in self.fused.items():
            meas = {v: self.measured_overlap(pair, v, m.model.opportune_ratio) for v, m in models.items()}
            best = {v: self.best_measured(pair, v)[1] for v in models}
            sel = select_version({v: m.model for v, m in models.items()}, best, self.min_overlap)
            if sel is None:
                continue
            v = sel.version
            priced = {u: _net_gain(m.model) for u, m in models.items() if best[u] > self.min_overlap}
            if priced and all(g is not None for g in priced.values()):
                v = max(priced, key=lambda u: priced[u])
            m = models[v].model
            self.chosen[pair] = Selection(v, m, m.opportune_ratio, m.best_reduction, meas[v])

    def rescale_lc(self, scale: float) -> None:
        """LC times x ``scale`` (the solo calibration: launches on the run's clock take longer than the profile's
        medians), with the fused samples moved along: a sample's x is a BE time over T_lc, so it shrinks by
        ``scale``, and its y is kept (the run's fused launches were measured as inflated as its LC launches: session
        13, 1.24 vs 1.29). Session 13 scaled only the LC times, so a slice aimed at a sample's x cut ``scale`` x
        the blocks that sample had measured; on the steep curves (lbm, pathfinder) that meant 2-3x its T_fused."""
        self.lc_ms = [t * scale for t in self.lc_ms]
        for pair, per_v in self.samples.items():
            for v, pts in per_v.items():
                per_v[v] = [(x / scale, y) for x, y in pts]
                if pair in self.fused and v in self.fused[pair]:
                    self.fused[pair][v] = OnlineTwoStage.from_samples([p[0] for p in per_v[v]], [p[1] for p in per_v[v]])
        self.choose()

    def price_aims(self, be: str, allowance_ms: float) -> float:
        """Price the per-query allowance for ``be`` and aim every fused slice by it: the smallest E (from
        ``PRICE_GRID``) at which the slices of one query, each at the x maximising x - E (y - 1) of its best
        version, spend no more than ``allowance_ms`` of extra LC time. That is the Lagrangian of the most
        gain over time sharing under the allowance: E = 1 where it does not bind (each slice at its largest
        saving), higher where it does (only the cheap part of each curve). Returns E; ``unprice`` undoes it."""
        launches = [(t, k.key) for t, k in zip(self.lc_ms, self.lc, strict=True) if (k.key, be) in self.fused]

        def spend() -> float:  # one query's extra LC time with every slice at its chosen version's aim
            total = 0.0
            for t, key in launches:
                sel = self.chosen.get((key, be))
                if sel is not None:  # a slice that gains nothing at this price (x - E (y - 1) <= 0) is not counted
                    x, y = sel.model.opportune_ratio, sel.model.g(sel.model.opportune_ratio)
                    price = getattr(sel.model, "efficiency", None) or 1.0
                    total += t * max(0.0, y - 1.0) if x - price * (y - 1.0) > 0 else 0.0
            return total

        for e in PRICE_GRID:
            self._set_price(be, e)  # re-chooses the versions at this price
            if spend() <= allowance_ms:
                break
        return e

    def unprice(self, be: str) -> None:
        """Back to the global aim rule for ``be``."""
        self._set_price(be, None)

    def _set_price(self, be: str, e: float | None) -> None:
        for (_, b), models in self.fused.items():
            if b == be:
                for m in models.values():
                    if isinstance(m.model, SampleModel):
                        m.model = dataclasses.replace(m.model, efficiency=e)
        self.choose()


def version_name(v: Any) -> str:
    """A fused version as the records and logs name it ("tail", "1:2", ...)."""
    return v.describe() if hasattr(v, "describe") else str(v)


def _net_gain(model: Any) -> float | None:
    """x - E (y - 1) at a priced model's aim (None for an unpriced one)."""
    e = getattr(model, "efficiency", None)
    if e is None:
        return None
    x = model.opportune_ratio
    return x - e * (model.g(x) - 1.0)


PRICE_GRID = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0)
FIT_RATIOS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
HELDOUT_RATIOS = (0.75, 2.5)
# an SM-partition version's load ratios, as fractions of the BE partition's share of the SMs: its slice is cheap up to
# about that share (the BE's own SMs busy for the LC kernel's length) and costs T_lc / share per x past it
PARTITION_FIT = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
PARTITION_HELDOUT = (0.6, 1.1)


KNEE_SAMPLES = 0  # extra samples between the last cheap slice and the first steep one (``knee_blocks``; opt-in until measured)
KNEE_JUMP = 0.05  # a step smaller than 5% of T_lc is launch noise between close samples, not a wave


def knee_blocks(xs: Sequence[float], ys: Sequence[float], be: LinearModel, t_lc: float, k: int = KNEE_SAMPLES) -> list[int]:
    """Block counts to sample inside the first step of a fused curve: ``k`` evenly spaced between the two samples (in
    order of x) where T_fused / T_lc first rises faster than x (slope > 1: past it the slice costs more than time
    sharing the same blocks). BE blocks run in waves, so a curve is flat until the slots the LC kernel leaves free are
    full, then jumps by a wave; the fit ratios land on either side of that step, far apart in blocks when the launch
    cost is a large share of T_lc (session 13, pathfinder: 63 blocks flat, 308 steep; the run aimed at 63)."""
    pts = sorted(zip(xs, ys, strict=True))
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x1 > x0 and y1 - y0 > KNEE_JUMP and (y1 - y0) / (x1 - x0) > 1.0:
            n0, n1 = (int(round(be.blocks_for(x * t_lc))) for x in (x0, x1))
            return sorted({n0 + (n1 - n0) * j // (k + 1) for j in range(1, k + 1)} - {n0, n1}) if n1 - n0 > 1 else []
    return []


IMPLAUSIBLE_Y0, IMPLAUSIBLE_SLOPE = 3.0, 4.0  # the steepest fused curves measured: y ~1 + 3 x (stencil7 in a worker partition)


def implausible(x: float) -> float:
    """T_fused / T_lc above which a fused sample at load ratio ``x`` is a stall, not the co-run: no fused launch measured
    has run its BE slice at under a quarter of the solo kernel's rate (session 57-58: stencil7's worker partition, slope ~3)."""
    return IMPLAUSIBLE_Y0 + IMPLAUSIBLE_SLOPE * x


def build_profile(
    backend: Backend, be_names: Sequence[str], versions: Sequence[Any], reps: int = 3, min_fuse_ms: float = 0.0,
    fit_ratios: Sequence[float] = FIT_RATIOS, heldout_ratios: Sequence[float] = HELDOUT_RATIOS, log: Any = None,
    max_fuse_keys: int | None = None, min_overlap: float = MIN_OVERLAP, knee_samples: int = KNEE_SAMPLES,
    span_sms: Sequence[int] = (), fill_shares: Sequence[float] = (),
) -> Profile:  # fmt: skip
    """Measure solo LC times, fit BE linear models and fused two-stage models, then report held-out errors.
    ``max_fuse_keys``: profile fused versions only for the LC kernel shapes with the most total time
    (each profiled shape x BE x version is one more kernel to compile); the others run unfused. ``span_sms``: BE SM
    counts of the whole-query partitions to profile (``profile_spans``, for the ``partition`` policy); ``fill_shares``:
    with each, the backfill sizes to profile (``FILL_SHARES``; empty: spans without backfill)."""

    def med(f: Any) -> float:
        f()  # untimed first call: JIT compilation of a new kernel must not count as its duration
        ts = [f() for _ in range(reps)]
        # two that disagree by over 2x: one held a one-off (a compile the first call did not cover, a stall), which
        # their mean would keep; a third decides (session 57: ws samples at 4-43,000x the GEMM's time, all compiles)
        if len(ts) == 2 and max(ts) > 2.0 * min(ts):
            ts.append(f())
        return float(np.median(ts))

    lc = backend.lc_kernels()
    lc_ms = [med(lambda i=i: backend.run_lc(i)) for i in range(len(lc))]
    be_models: dict[str, LinearModel] = {}
    be_blocks = {b: backend.be_blocks(b) for b in be_names}
    cursor = dict.fromkeys(be_names, 0)

    def fresh(b: str, n: int) -> tuple[int, int]:
        """A range of n BE blocks that the last launches did not touch, as in a run, where the slices walk
        through the BE kernel's data. Until session 12 every sample repeated [0, n), so its timed launches
        found that data in L2; the simulator reproduces the H200's gains only if the runs' fused launches
        take 6-12% longer than their samples (benchmarks/experiments/opportune_rule_sim.py --bias)."""
        start = cursor[b] if cursor[b] + n <= be_blocks[b] else 0
        cursor[b] = start + n
        return start, start + n

    lin_err: list[float] = []
    for b in be_names:
        nb = be_blocks[b]
        counts = sorted({max(1, nb * f // 8) for f in (1, 2, 4, 8)})
        be_models[b] = LinearModel.fit(counts, [med(lambda n=n: backend.run_be(b, *fresh(b, n))) for n in counts])
        for n in {max(1, nb * 3 // 8), max(1, nb * 5 // 8)}:
            lin_err += relative_errors([be_models[b].predict(n)], [med(lambda n=n: backend.run_be(b, *fresh(b, n)))])
    # one representative (the first) LC kernel per fusible key; with a version that co-runs with any LC kernel (SM
    # partitions), per key of every LC kernel, the segments profiled with those versions only
    any_versions = [v for v in versions if any_kernel(v)]
    reps_of: dict[str, int] = {}
    total_of: dict[str, float] = {}
    for i, k in enumerate(lc):
        if (k.fusible or any_versions) and lc_ms[i] >= min_fuse_ms:
            reps_of.setdefault(k.key, i)
            total_of[k.key] = total_of.get(k.key, 0.0) + lc_ms[i]
    if max_fuse_keys is not None:
        keep = sorted(total_of, key=lambda key: -total_of[key])[:max_fuse_keys]
        reps_of = {key: i for key, i in reps_of.items() if key in keep}
    fused: dict[tuple[str, str], dict[Any, OnlineTwoStage]] = {}
    samples: dict[tuple[str, str], dict[Any, list[tuple[float, float]]]] = {}
    # (key, BE, version) -> (LC kernel, each sample's blocks, fit samples, held-out samples): fitted after the retake below
    taken: dict[tuple[str, str, Any], tuple[int, list[int], int, int]] = {}
    for key, i in reps_of.items():
        t_lc = lc_ms[i]
        for b in be_names:
            samples[(key, b)] = {}
            for v in [v for v in versions if applies(v, lc[i])]:

                def sample(x: float) -> tuple[float, float]:
                    """(T_be, T_fused) of the slice a run would cut for load ratio x. T_be is the linear model's time
                    for its n blocks, the coordinate the run plans in (``split_be``: n = blocks_for(x T_lc)) and
                    observes in. Until session 13 it was the slice's measured solo time: BE blocks run in waves,
                    so 1 and 151 lbm blocks both measured x = 1.0 (one 16.8 us wave) while the run turned x = 1.0
                    into 488 blocks, which this very profile had measured at 2.7 T_lc, not the 1.16 it planned."""
                    return sample_blocks(min(be_blocks[b], max(1, int(be_models[b].blocks_for(x * t_lc)))))

                blocks: list[int] = []

                def sample_blocks(n: int, i: int = i, b: str = b, v: Any = v, blocks: list[int] = blocks) -> tuple[float, float]:
                    blocks.append(n)
                    t_f = med(lambda: backend.run_fused(i, b, *fresh(b, n), v))
                    return be_models[b].predict(n), t_f

                fit, held = fit_ratios, heldout_ratios
                if any_kernel(v) and getattr(backend, "sms", None):  # scaled to the BE partition's share of the SMs
                    share = v.r2 / backend.sms
                    fit, held = tuple(share * f for f in PARTITION_FIT), tuple(share * f for f in PARTITION_HELDOUT)
                pts = [sample(x) for x in [*fit, *held]]
                xs = [p[0] / t_lc for p in pts]
                ys = [p[1] / t_lc for p in pts]
                for n in knee_blocks(xs, ys, be_models[b], t_lc, knee_samples):
                    t_be, t_f = sample_blocks(n)
                    xs.append(t_be / t_lc)
                    ys.append(t_f / t_lc)
                samples[(key, b)][v] = list(zip(xs, ys, strict=True))
                taken[(key, b, v)] = (i, blocks, len(fit), len(held))
        if log:
            log(f"  profiled LC kernel {lc[i].name} ({key}, {t_lc:.4f} ms) with {', '.join(be_names)}")
    # a sample past what any fused launch measured (``implausible``) is a stall of the machine, not the co-run: taken again
    # now, seconds later (session 58: a stall covered every sample of one key, 22-188x the GEMM, held-out error 235%)
    retaken = 0
    for (key, b, v), (i, blocks, *_) in taken.items():
        pts = samples[(key, b)][v]
        for j, (x, y) in enumerate(pts):
            if y > implausible(x):
                y2 = med(lambda i=i, b=b, v=v, n=blocks[j]: backend.run_fused(i, b, *fresh(b, n), v)) / lc_ms[i]
                retaken += 1
                if y2 < y:
                    pts[j] = (x, y2)
    if retaken and log:
        log(f"  {retaken} fused samples past {IMPLAUSIBLE_Y0:g} + {IMPLAUSIBLE_SLOPE:g} x taken again (a stall)")
    fused_err: list[float] = []
    sample_err: list[float] = []
    for (key, b, v), (i, _, n_fit, n_held) in taken.items():
        xs, ys = (list(c) for c in zip(*samples[(key, b)][v], strict=True))
        two_stage = OnlineTwoStage.fit(xs[:n_fit], ys[:n_fit])  # reported (held-out error), not planned with
        t_lc = lc_ms[i]
        fused_err += relative_errors([two_stage.predict(t_lc, x * t_lc) for x in xs[n_fit : n_fit + n_held]],
                                     [y * t_lc for y in ys[n_fit : n_fit + n_held]])  # fmt: skip
        # planned with: the measured samples themselves; error bound from this pair's leave-one-out errors
        model = fused.setdefault((key, b), {})[v] = OnlineTwoStage.from_samples(xs, ys)
        sample_err += model.errors
    prof = Profile(lc_ms, lc, be_models, be_blocks, fused, samples=samples, min_overlap=min_overlap)
    if span_sms or fill_shares:
        profile_spans(prof, backend, be_names, span_sms, med, fresh, log, fill_shares)
    prof.heldout = {"be_linear": error_summary(lin_err), "fused_two_stage": error_summary(fused_err),
                    "fused_samples_loo": error_summary(sample_err)}  # fmt: skip
    prof.choose()
    return prof


# slices as fractions of what the BE partition does in a solo query's time at its whole-GPU rate per SM; dense near
# 0.75-1.05, where a low-HBM BE kernel's slice starts to outlast the query (session 51, mri-q on 32 SMs: +2% at 0.75,
# +24% at 1.0); the plan only takes sampled slice sizes, so 0.25 too: beside ResNet-50 B32 (session 53) the smallest
# slice sampled before, half the fill, cost the query 6-11% on 16 SMs, more than its ~10% allowance leaves a slice
SPAN_FILL = (0.25, 0.5, 0.75, 0.85, 0.95, 1.05, 1.25, 1.5)
SPAN_MAX_KERNELS = 8  # a span's slice covers at most this many instances of its BE job
# backfill sizes: BE blocks of this share of the query's time on its own N - S SMs at the BE's whole-GPU rate per SM.
# The query leaves its SMs idle between kernels (BERT-base B8 on an H100: 1.23 ms as one graph against 1.08 ms of
# kernels) and inside kernels with fewer programs than SMs; low-priority BE blocks there are the backfill
FILL_SHARES = (0.1, 0.2, 0.35)
SPAN_MARGIN = 0.02  # a span's predicted window is read 2% long: one interpolated sample (windows of one query repeat within ~1-2%)


def profile_spans(
    prof: Profile, backend: Backend, be_names: Sequence[str], span_sms: Sequence[int], med: Any, fresh: Any, log: Any = None,
    fill_shares: Sequence[float] = (),
) -> None:  # fmt: skip
    """Whole-query partition windows: the query alone (``span_solo_ms``), then per BE kernel and BE SM count the query
    with no slice and with slices around the blocks the partition would run in the query's time at the BE's
    whole-GPU rate scaled by its share of the SMs (``SPAN_FILL``). With ``fill_shares``, the same slices again with
    each backfill size (``FILL_SHARES``) on the query's own SMs (``filled_spans``), and the backfill alone beside the
    query on the whole GPU (BE SM count 0, no slice: for an LC that a partition slows)."""
    if not be_names:
        return
    prof.span_solo_ms = med(lambda: backend.run_span(be_names[0], 0, 0, 0))
    sms = getattr(backend, "sms", None) or 0

    def profile_fills(b: str, s: int, counts: list[int], lc_share: float) -> None:
        for f in fill_shares:
            m = min(SPAN_MAX_KERNELS * prof.be_blocks[b], max(1, int(prof.be[b].blocks_for(f * lc_share * prof.span_solo_ms))))

            def filled(n: int, m: int = m) -> float:
                lo, _ = fresh(b, n + m)
                return backend.run_span(b, lo, lo + n, s, m)

            prof.filled_spans[(b, s, m)] = [(n, med(lambda n=n: filled(n))) for n in counts]
            if log:
                pts = ", ".join(f"{n} blocks {t:.4f}" for n, t in prof.filled_spans[(b, s, m)])
                where = f"on {s} SMs" if s else "alone (the query on every SM)"
                log(f"  span {b} {where} with a backfill of {m} blocks ({f:.0%} of the query's SMs' time): {pts}")

    for b in be_names:
        for s in span_sms:
            share = s / sms if sms else 0.25
            fill = prof.be[b].blocks_for(share * prof.span_solo_ms)
            # past one BE kernel's blocks a slice runs into the next instances of the same job (short BE kernels)
            counts = sorted({0} | {min(SPAN_MAX_KERNELS * prof.be_blocks[b], max(1, int(f * fill))) for f in SPAN_FILL})
            prof.spans[(b, s)] = [(n, med(lambda n=n: backend.run_span(b, *fresh(b, n), s))) for n in counts]
            if log:
                pts = ", ".join(f"{n} blocks {t:.4f}" for n, t in prof.spans[(b, s)])
                log(f"  span {b} on {s} SMs (query alone {prof.span_solo_ms:.4f} ms): {pts}")
            profile_fills(b, s, counts, 1.0 - share)
        profile_fills(b, 0, [0], 1.0)


@dataclass(frozen=True)
class SpanPlan:
    be_sms: int
    blocks: int  # on the BE's partition
    clock_ms: float  # the predicted window on the policies' clock (lc_total units), pessimistic
    gain_ms: float  # BE solo time of the blocks less the query's predicted extra time
    fill: int = 0  # backfill blocks on the query's own SMs, after the slice's


def span_plan(prof: Profile, be: str, blocks_left: int, headroom: float, run_on: bool = True, fill: bool = True) -> SpanPlan | None:
    """The partition and slice for a query starting now: among the profiled slices, the one with the largest gain (the
    blocks' solo time less the extra the query takes) whose pessimistic extra fits ``headroom``; None where none
    gains. With ``run_on`` a slice longer than the ``blocks_left`` of the head BE kernel runs on into its job's next
    instances; without, slices are cut to ``blocks_left``. With ``fill``, profiled backfills (``filled_spans``) are
    candidates too: their blocks count with the slice's, and without ``run_on`` slice and backfill together fit
    ``blocks_left``."""
    if prof.span_solo_ms <= 0:
        return None
    scale = prof.lc_total / prof.span_solo_ms
    best: SpanPlan | None = None
    curves = [(s, 0, pts) for (b, s), pts in prof.spans.items() if b == be]
    curves += [(s, m, pts) for (b, s, m), pts in prof.filled_spans.items() if b == be and fill]
    for s, m, pts in curves:
        if (len(pts) < 2 and s) or (not run_on and m >= blocks_left):
            continue
        ns, ts = [p[0] for p in pts], [p[1] for p in pts]
        room = blocks_left - m  # what the slice may take without running on
        if not s:  # the backfill alone, beside the query on every SM: no slice
            cands = {0}
        else:
            cands = {n for n in ns if n > 0} if run_on else {min(n, room) for n in ns if n > 0}
            cands |= {room} if 0 < room < max(ns) else set()
        for n in sorted(cands):
            # a slice beside the query never makes it faster: a sample below the query alone is noise
            clock = max(float(np.interp(n, ns, ts)), prof.span_solo_ms) * scale * (1.0 + SPAN_MARGIN)
            extra = clock - prof.lc_total
            gain = prof.be[be].b * (n + m) - max(0.0, extra)
            if extra < headroom and gain > 0 and (best is None or gain > best.gain_ms):
                best = SpanPlan(s, n, clock, gain, m)
    return best


def partition_ceiling(rate_per_s: float, query_ms: float, be_sms: int, sms: int) -> float:
    """The most a BE partition of ``be_sms`` of ``sms`` SMs can add to time sharing's BE throughput (a fraction): BE
    work at its whole-GPU rate per SM on the partition through every query, none of it costing the query time, over
    the GPU time time sharing leaves the BE. ``rho`` = the LC's busy share: ``rho / (1 - rho) x be_sms / sms``
    (session 51, BERT-base at load 0.8 on an H100: rho 0.47, +21% at 32 of 132 SMs; measured +4..+9%)."""
    rho = rate_per_s * query_ms / 1000.0
    if not 0.0 <= rho < 1.0 or sms <= 0 or not 0 <= be_sms <= sms:
        raise ValueError(f"partition_ceiling: LC busy share {rho:.3f} must be in [0, 1) and 0 <= {be_sms} <= {sms} SMs")
    return rho / (1.0 - rho) * be_sms / sms


def aker_query_gain(prof: Profile, models: dict[tuple[str, str], dict[Any, Any]], be: str, headroom: float) -> float:
    """Aker's planned gain over time sharing for one whole query starting now: ``plan_fusion`` on every LC kernel
    with a chosen version, in order, each on a whole BE kernel, the pessimistic extra of each fusion taken from the
    headroom the next ones see. ``models``: the fused models to plan with (Aker's online copies)."""
    gain, hr = 0.0, headroom
    for j, k in enumerate(prof.lc):
        sel = prof.chosen.get((k.key, be))
        if sel is None or hr <= 0.0:
            continue
        sp = plan_fusion(prof.lc_ms[j], prof.be[be], models[(k.key, be)][sel.version], prof.be_blocks[be], hr, prof.min_overlap)
        if not sp.empty:
            gain += prof.be[be].b * sp.blocks - max(0.0, sp.extra)
            hr -= max(0.0, sp.extra)
    return gain


# ---- the run --------------------------------------------------------------------------------------


def poisson_arrivals(rate_per_s: float, n: int, seed: int = 0) -> list[float]:
    """n arrival times in ms of a Poisson process with ``rate_per_s`` queries per second."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(1000.0 / rate_per_s, n)).tolist()


@dataclass
class RunResult:
    policy: str
    latencies_ms: list[float]
    qos_ms: float
    elapsed_ms: float
    be_units: float  # BE kernels completed (fractions count: blocks / blocks per kernel)
    fused_launches: int = 0
    be_slices: int = 0
    refits: int = 0
    online_errors: list[float] = field(default_factory=list)
    fused_gain_ms: float = 0.0  # measured: sum of (solo time of the fused BE blocks - fused extra time)
    # per "LC shape|BE|version": [launches, sum of x, of predicted T_fused / T_lc, of measured T_fused / T_lc, gain ms];
    # shows whether the run's slices land where the profile put the opportune ratio
    fused_by_key: dict[str, list[float]] = field(default_factory=dict)
    # per key as fused_by_key: each co-run launch's prediction error (a mean of T_fused / T_lc above hides a stalled tail)
    online_errors_by_key: dict[str, list[float]] = field(default_factory=dict)
    # why each LC kernel of an Aker query ran unfused (not_fusible, not_chosen, no_blocks, headroom, efficiency) or fused
    decisions: dict[str, int] = field(default_factory=dict)
    delegated: bool = False  # Aker found no fusion plan_fusion could accept for any profiled pair: it ran time sharing itself
    lc_ms: float = 0.0  # measured GPU time of the LC kernel launches (unfused), and their count
    lc_launches: int = 0
    be_ms: float = 0.0  # measured GPU time of the time-shared BE launches: inside queries / in idle gaps
    be_query_launches: int = 0
    be_idle_launches: int = 0
    fused_ms: float = 0.0
    host_ms: float = 0.0  # CPU wall time of the policy between launches (the GPU idles then: each launch is synchronised)
    # with several arrival sequences (merge_runs): each sequence's p99 and BE throughput, in order
    p99_per_sequence: list[float] = field(default_factory=list)
    be_throughput_per_sequence: list[float] = field(default_factory=list)

    @property
    def p99(self) -> float:
        return float(np.percentile(self.latencies_ms, 99)) if self.latencies_ms else math.nan

    @property
    def violations(self) -> int:
        return sum(lat > self.qos_ms for lat in self.latencies_ms)

    @property
    def be_throughput(self) -> float:
        return self.be_units / (self.elapsed_ms / 1e3) if self.elapsed_ms > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        lat = self.latencies_ms
        return {
            "policy": self.policy, "queries": len(lat), "qos_ms": self.qos_ms,
            "p50_ms": float(np.percentile(lat, 50)) if lat else math.nan, "p99_ms": self.p99, "max_ms": max(lat, default=math.nan),
            "violations": self.violations, "be_throughput": self.be_throughput, "be_units": self.be_units,
            "elapsed_ms": self.elapsed_ms, "fused_launches": self.fused_launches, "be_slices": self.be_slices,
            "refits": self.refits, "online_error": error_summary(self.online_errors), "fused_gain_ms": self.fused_gain_ms,
            "online_error_by_key": {k: error_summary(v) for k, v in sorted(self.online_errors_by_key.items())},
            "decisions": dict(self.decisions), "fused_by_key": fused_key_summary(self.fused_by_key),
            "delegated": self.delegated, "lc_ms": self.lc_ms, "lc_launches": self.lc_launches,
            "lc_ms_per_query": self.lc_ms / len(lat) if lat else math.nan, "be_ms": self.be_ms,
            "be_ms_per_launch": self.be_ms / max(1, self.be_query_launches + self.be_idle_launches),
            "be_query_launches": self.be_query_launches, "be_idle_launches": self.be_idle_launches, "fused_ms": self.fused_ms,
            "host_ms": self.host_ms,
        }  # fmt: skip


def fused_key_summary(acc: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per "LC shape|BE|version" of the fused launches: count, mean load ratio x, mean predicted and measured
    T_fused / T_lc, and the summed measured gain (solo time of the fused BE blocks - fused extra time)."""
    out = {}
    for k, (n, sx, sp, sy, g) in sorted(acc.items()):
        if n > 0:
            out[k] = {"launches": int(n), "mean_x": sx / n, "mean_predicted_y": sp / n, "mean_y": sy / n, "gain_ms": g}
    return out


def merge_runs(runs: Sequence[RunResult]) -> RunResult:
    """One policy's runs on several arrival sequences as one result: latencies pooled (p99 and
    violations over every query), work and time summed, and each sequence's p99 and BE throughput
    kept (``p99_per_sequence``, ``be_throughput_per_sequence``). On the H200 the p99 of one
    sequence moved by ~1.5 ms between identical policies (session 8), so one sequence is no
    measurement of a violation or a gain."""
    if not runs:
        raise ValueError("merge_runs needs at least one run")
    if len({r.policy for r in runs}) != 1:
        raise ValueError(f"merge_runs: runs of different policies {sorted({r.policy for r in runs})}")
    first = runs[0]
    out = RunResult(first.policy, [x for r in runs for x in r.latencies_ms], first.qos_ms,
                    sum(r.elapsed_ms for r in runs), sum(r.be_units for r in runs))  # fmt: skip
    for name in ("fused_launches", "be_slices", "refits", "fused_gain_ms", "lc_ms", "lc_launches", "be_ms", "be_query_launches",
                 "be_idle_launches", "fused_ms", "host_ms"):  # fmt: skip
        setattr(out, name, sum(getattr(r, name) for r in runs))
    out.online_errors = [e for r in runs for e in r.online_errors]
    for r in runs:
        for k, errs in r.online_errors_by_key.items():
            out.online_errors_by_key.setdefault(k, []).extend(errs)
    for r in runs:
        for k, v in r.fused_by_key.items():
            acc = out.fused_by_key.setdefault(k, [0.0] * len(v))
            for j, x in enumerate(v):
                acc[j] += x
        for k, v in r.decisions.items():
            out.decisions[k] = out.decisions.get(k, 0) + v
    out.delegated = all(r.delegated for r in runs)
    out.p99_per_sequence = [p for r in runs for p in (r.p99_per_sequence or [r.p99])]
    out.be_throughput_per_sequence = [b for r in runs for b in (r.be_throughput_per_sequence or [r.be_throughput])]
    return out


def fusion_plans(prof: Profile, be: str, headroom: float) -> dict[str, dict[str, Any]]:
    """Per profiled LC shape: what ``plan_fusion`` does with the chosen version on a whole BE kernel and
    ``headroom`` (the per-query allowance): blocks, predicted BE time, pessimistic extra, time-sharing
    saving, error bound and the reason (``not_chosen`` where selection trusted no version)."""
    out: dict[str, dict[str, Any]] = {}
    for j, k in enumerate(prof.lc):
        if (k.key, be) not in prof.fused or out.get(k.key, {}).get("reason") in ("fused", "not_chosen"):
            continue  # per shape: the first kernel plan_fusion accepts, else the last one's reason
        sel = prof.chosen.get((k.key, be))
        if sel is None:
            out[k.key] = {"reason": "not_chosen"}
            continue
        om = prof.fused[(k.key, be)][sel.version]
        sp = plan_fusion(prof.lc_ms[j], prof.be[be], om, prof.be_blocks[be], headroom, prof.min_overlap)
        out[k.key] = {"reason": sp.reason, "t_lc_ms": prof.lc_ms[j], "x_star": sel.opportune_ratio, "blocks": sp.blocks or sp.tried,
                      "t_be_ms": sp.t_be, "extra_ms": sp.extra, "saving_ms": sp.saving, "error_bound": om.error_bound}  # fmt: skip
    return out


def run_policy(
    backend: Backend, prof: Profile, policy: str, arrivals: Sequence[float], be_names: Sequence[str], qos_ms: float,
    margin: float = 0.05, idle_budget: float | None = None, reserve_ms: float = 0.0, extra_per_query_ms: float = math.inf,
) -> RunResult:  # fmt: skip
    """Serve the queries arriving at ``arrivals`` (ms) under ``policy``; BE kernels of ``be_names`` queue round-robin.

    ``reserve_ms`` is kept out of every query's headroom for queries that have not arrived yet
    (``queue_reserve`` estimates it from the load); ``extra_per_query_ms`` caps the BE time any one
    query absorbs (``extra_budget``: more would push queries still to come past QoS at this load);
    ``margin`` absorbs prediction error. ``idle_budget`` is kept for callers; idle gaps run whole
    BE kernels in every policy (as time sharing does). The profile is not modified: Aker's online
    models are copies, so warm-up runs and earlier policies do not leak into this run.

    Aker where ``plan_fusion`` accepts no fusion of any profiled pair, even with a whole query's allowance
    (``fusion_plans``), *is* the time-sharing run: it calls it (``delegated``), so not one decision, launch or
    line of host code differs. Otherwise every step it does not fuse goes through the same time-sharing step.

    ``partition`` runs each query whole on the LC's SMs beside a BE slice where ``span_plan`` finds one that fits;
    ``auto`` does so only where that span plans at least the gain Aker's fusions plan for the same query
    (``aker_query_gain``), and runs the query as Aker otherwise."""
    del idle_budget
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    if policy == "aker" and be_names:
        hr0 = min(extra_per_query_ms, qos_ms)
        plans = {b: fusion_plans(prof, b, hr0) for b in be_names}
        if not any(p["reason"] == "fused" for pl in plans.values() for p in pl.values()):
            res = run_policy(backend, prof, "timeshare", arrivals, be_names, qos_ms, margin, None, reserve_ms, extra_per_query_ms)
            res.policy, res.delegated = "aker", True
            # what each fusible LC kernel would have been told, once per query (the plans are static without fusions)
            dec: dict[str, int] = {}
            for b in be_names:
                for k in prof.lc:
                    r = plans[b].get(k.key, {"reason": "not_chosen"})["reason"] if (k.key, b) in prof.fused else "not_fusible"
                    dec[r] = dec.get(r, 0) + len(res.latencies_ms)
            res.decisions = dec
            return res
    t_host0 = time.perf_counter()
    n_lc = len(prof.lc)
    suffix = np.concatenate([np.cumsum(prof.lc_ms[::-1])[::-1], [0.0]]).tolist()  # remaining solo LC time from kernel i
    safe_qos = qos_ms * (1.0 - margin) - reserve_ms
    be_queue: deque[list[Any]] = deque([b, 0, prof.be_blocks[b]] for b in be_names)
    res = RunResult(policy, [], qos_ms, 0.0, 0.0)
    queries: deque[list[Any]] = deque()  # [arrival, next kernel, BE time absorbed, auto's mode for it]
    now, ai = 0.0, 0
    online = {pair: {v: copy.deepcopy(m) for v, m in ms.items()} for pair, ms in prof.fused.items()} if policy in ("aker", "auto") else {}
    reserve_cache: dict[tuple[str, int, int], list[float]] = {}
    aker_gain_cache: dict[tuple[str, int, float], float] = {}
    in_backend = 0.0

    def timed_call(f: Any, *args: Any) -> float:
        nonlocal in_backend
        t0 = time.perf_counter()
        t = f(*args)
        in_backend += time.perf_counter() - t0
        return t

    def decide(reason: str) -> None:
        res.decisions[reason] = res.decisions.get(reason, 0) + 1

    def record_co_run(key: str, t_ref: float, t_be: float, predicted: float, t: float, gain: float, expected: float) -> None:
        """One co-run launch (a fused slice or a partitioned query) of ``t`` ms against its ``t_ref`` alone: the
        prediction error of ``expected``, where it landed against the profile (per key, ``predicted`` as planned), its
        time and its gain over time sharing."""
        err = abs(expected - t) / t
        res.online_errors.append(err)
        res.online_errors_by_key.setdefault(key, []).append(err)
        acc = res.fused_by_key.setdefault(key, [0.0] * 5)
        for j, v in enumerate((1.0, t_be / t_ref, predicted / t_ref, t / t_ref, gain)):
            acc[j] += v
        res.fused_launches += 1
        res.fused_ms += t
        res.fused_gain_ms += gain

    def reserve(b: str, i: int) -> float:
        """Pessimistic extra time of the fusions plan_fusion accepts (with a whole query's allowance) from LC kernel i
        to the end of the query: time sharing leaves it to them, since they buy more BE blocks per ms of headroom
        (recomputed after refits). A fusion plan_fusion would decline reserves nothing."""
        key = (b, res.refits, len(res.latencies_ms))  # error bounds move with every fused launch: refresh once per query
        if key not in reserve_cache:
            acc = [0.0] * (n_lc + 1)
            for j in range(n_lc - 1, -1, -1):
                sel = prof.chosen.get((prof.lc[j].key, b))
                ex = 0.0
                if sel is not None:
                    om = online[(prof.lc[j].key, b)][sel.version]
                    sp = plan_fusion(prof.lc_ms[j], prof.be[b], om, prof.be_blocks[b], min(extra_per_query_ms, qos_ms), prof.min_overlap)
                    ex = sp.extra
                acc[j] = acc[j + 1] + ex
            reserve_cache[key] = acc
        return reserve_cache[key][i]

    def be_done(item: list[Any], n: int) -> None:
        res.be_units += n / prof.be_blocks[item[0]]
        item[1] += n
        if item[1] >= item[2]:  # kernel finished: the next instance of that BE job joins the back
            be_queue.popleft()
            be_queue.append([item[0], 0, prof.be_blocks[item[0]]])
        elif be_queue[0] is not item:
            raise AssertionError("BE progress on an item that is not the queue head")

    def headroom() -> float:
        """min over waiting queries of (deadline - predicted finish if only LC ran): T_qos - T_solo - T_queue,
        and no more than what is left of the head query's BE allowance."""
        hr, t = extra_per_query_ms - queries[0][2], now
        for j, (arr, idx, *_) in enumerate(queries):
            t += suffix[int(idx)] if j == 0 else prof.lc_total
            hr = min(hr, arr + safe_qos - t)
        return hr

    def run_rest(item: list[Any], q: list[float] | None) -> None:
        """Time sharing: the rest of the head BE kernel in one launch (whole kernels amortise the launch)."""
        nonlocal now
        t = timed_call(backend.run_be, item[0], item[1], item[2])
        now += t
        res.be_ms += t
        if q is not None:
            q[2] += t
            res.be_query_launches += 1
        else:
            res.be_idle_launches += 1
        res.be_slices += 1
        be_done(item, item[2] - item[1])

    def lc_done(q: list[float]) -> None:
        q[1] += 1
        if q[1] == n_lc:
            res.latencies_ms.append(now - q[0])
            queries.popleft()

    while queries or ai < len(arrivals):
        while ai < len(arrivals) and arrivals[ai] <= now:
            queries.append([arrivals[ai], 0, 0.0, ""])
            ai += 1
        if not queries:
            if policy == "lc_alone" or not be_queue:
                now = arrivals[ai]
                continue
            run_rest(be_queue[0], None)
            continue
        q = queries[0]
        i = int(q[1])
        k = prof.lc[i]
        t_lc = prof.lc_ms[i]
        if not be_queue:
            policy = "lc_alone"
        else:
            item = be_queue[0]
            b, left = item[0], item[2] - item[1]
        if policy in ("partition", "backfill", "auto") and i == 0:
            hr = headroom()
            sp = span_plan(prof, b, left, hr, run_on=all(x[0] == b for x in be_queue), fill=policy != "partition")
            if policy != "auto":
                decide("span" if sp is not None else "no_span")
            else:  # the span only where it plans more gain than Aker's fusions over the same query would
                gkey = (b, res.refits, round(hr, 3))
                if sp is not None and gkey not in aker_gain_cache:
                    aker_gain_cache[gkey] = aker_query_gain(prof, online, b, hr)
                q[3] = "span" if sp is not None and sp.gain_ms >= aker_gain_cache[gkey] else "aker"
                decide(f"auto_{q[3]}")
            if sp is not None and q[3] != "aker":
                t = timed_call(backend.run_span, b, item[1], item[1] + sp.blocks, sp.be_sms, sp.fill)
                clock = t * prof.lc_total / prof.span_solo_ms  # the policies' clock counts kernel windows, not graph gaps
                total = sp.blocks + sp.fill
                record_co_run(f"query|{b}|span{sp.be_sms}" + (f"+fill{sp.fill}" if sp.fill else ""), prof.lc_total,
                              prof.be[b].predict(total), sp.clock_ms, clock, prof.be[b].b * total - (clock - prof.lc_total),
                              sp.clock_ms / (1.0 + SPAN_MARGIN))  # fmt: skip
                done = 0
                while done < total:  # the head kernel's rest, then the job's next instances (be_done queues them)
                    head = be_queue[0]
                    n = min(total - done, head[2] - head[1])
                    be_done(head, n)
                    done += n
                now += clock
                q[2] += max(0.0, clock - prof.lc_total)
                q[1] = n_lc - 1
                lc_done(q)
                continue
        hold = 0.0  # headroom the time-sharing step leaves to this query's later fusions (Aker only)
        if policy == "aker" or q[3] == "aker":
            hr = headroom()
            sel = prof.chosen.get((k.key, b))  # only profiled pairs are chosen: PTB GEMMs, any kernel with SM partitions
            if sel is None:
                decide("not_chosen" if (k.key, b) in prof.fused else "not_fusible")
            else:
                om = online[(k.key, b)][sel.version]
                sp = plan_fusion(t_lc, prof.be[b], om, left, hr, prof.min_overlap)
                decide(sp.reason)
                if not sp.empty:
                    t = timed_call(backend.run_fused, i, b, item[1], item[1] + sp.blocks, sel.version)
                    predicted = om.predict(t_lc, sp.t_be)
                    record_co_run(f"{k.key}|{b}|{version_name(sel.version)}", t_lc, sp.t_be, predicted, t,
                                  prof.be[b].b * sp.blocks - (t - t_lc), predicted)  # fmt: skip
                    res.refits += om.observe(t_lc, sp.t_be, t)
                    be_done(item, sp.blocks)
                    now += t
                    q[2] += max(0.0, t - t_lc)
                    lc_done(q)
                    continue
            hold = reserve(b, i + 1)
        # the time-sharing step (Aker's too): the rest of the head BE kernel if its predicted time fits the headroom
        if policy in ("timeshare", "aker", "partition", "backfill", "auto") and prof.be[b].predict(left) < headroom() - hold:
            run_rest(item, q)
            continue
        if policy == "streams":
            # the BE stream keeps the GPU shared: each LC kernel overlaps about as much BE work as its own length
            n = max(1, min(left, int(prof.be[b].blocks_for(t_lc))))
            t = timed_call(backend.run_concurrent, i, b, item[1], item[1] + n)
            now += t
            q[2] += t - t_lc
            be_done(item, n)
        else:
            t = timed_call(backend.run_lc, i)
            now += t
            res.lc_ms += t
            res.lc_launches += 1
        lc_done(q)
    res.elapsed_ms = now
    res.host_ms = (time.perf_counter() - t_host0 - in_backend) * 1e3
    return res


def max_lc_rate(prof: Profile, qos_ms: float, n_queries: int = 400, seed: int = 0) -> float:
    """The highest Poisson rate (queries/s) at which LC-alone keeps p99 within QoS, by bisection on
    the profile's solo times (LC alone is a deterministic-service queue: no GPU needed)."""
    sim = _ReplayBackend(prof)
    lo, hi = 0.0, 1000.0 / prof.lc_total
    for _ in range(24):
        mid = (lo + hi) / 2
        # all of several arrival sequences must keep p99 within QoS (one sequence is noisy at high load)
        ok = all(
            run_policy(sim, prof, "lc_alone", poisson_arrivals(mid, n_queries, seed + s), [], qos_ms, margin=0.0).p99 <= qos_ms
            for s in range(3)
        )
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo


def extra_budget(
    prof: Profile, qos_ms: float, rate_per_s: float, margin: float = 0.05, n_queries: int = 400, seed: int = 12345,
    p99_gap_ms: float = 0.0,
) -> float:  # fmt: skip
    """The BE time (ms) each query may absorb at this load: the largest stretch of every query's
    service time for which LC alone still keeps p99 within QoS (several arrival sequences, none the run's).
    ``p99_gap_ms``: how much the GPU's measured LC-alone p99 exceeds the replay of the profile's median
    kernel times on the same arrivals (``p99_gap``); the replayed p99 must then stay that much lower."""
    lo, hi = 0.0, 4.0
    target = qos_ms * (1.0 - margin) - max(0.0, p99_gap_ms)
    for _ in range(16):
        mid = (lo + hi) / 2
        stretched = Profile([t * (1 + mid) for t in prof.lc_ms], prof.lc, prof.be, prof.be_blocks, prof.fused)
        sim = _ReplayBackend(stretched)
        p99s = [run_policy(sim, stretched, "lc_alone", poisson_arrivals(rate_per_s, n_queries, seed + s), [], qos_ms, margin=0.0).p99
                for s in range(5)]  # fmt: skip
        ok = float(np.mean(p99s)) <= target
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo * prof.lc_total


def p99_gap(prof: Profile, measured: Sequence[RunResult], arrivals: Sequence[Sequence[float]], qos_ms: float) -> float:
    """Measured LC-alone p99 minus the p99 of the same arrivals replayed with the profile's median
    kernel times, averaged over the arrival sequences (``measured[i]`` served ``arrivals[i]``), >= 0:
    real launches vary, and queueing amplifies the variation into the tail. On the H200 (session 8,
    BERT-base, hotspot) the gap was 1.04 ms of a 5.85 ms QoS."""
    if len(arrivals) != len(measured):
        raise ValueError(f"p99_gap: {len(measured)} measured runs for {len(arrivals)} arrival sequences")
    replay = _ReplayBackend(prof)
    gaps = [r.p99 - run_policy(replay, prof, "lc_alone", a, [], qos_ms, margin=0.0).p99 for r, a in zip(measured, arrivals, strict=True)]
    return max(0.0, float(np.mean(gaps)))


def queue_reserve(prof: Profile, qos_ms: float, rate_per_s: float, n_queries: int = 400, seed: int = 12345) -> float:
    """Mean queueing delay of LC queries at this load with LC alone (on arrivals other than the run's):
    the part of the QoS budget that BE work leaves to queries that have not arrived yet."""
    r = run_policy(_ReplayBackend(prof), prof, "lc_alone", poisson_arrivals(rate_per_s, n_queries, seed), [], qos_ms, margin=0.0)
    return max(0.0, float(np.mean(r.latencies_ms)) - prof.lc_total)


class _ReplayBackend(Backend):
    """LC kernels take their profiled solo times (for the LC-alone load search)."""

    def __init__(self, prof: Profile) -> None:
        self.prof = prof

    def lc_kernels(self) -> list[LCKernel]:
        return self.prof.lc

    def run_lc(self, i: int) -> float:
        return self.prof.lc_ms[i]


def measured_solo_ms(backend: Backend, prof: Profile, n_queries: int = 12) -> float:
    """Median latency of a query served alone on the backend (arrivals far apart: no queueing).
    The policies' clock sums each launch's own measured window, so a query there takes this, not
    the sum of the profile's median kernel times (session 9, BERT-base: 1.32 ms against 1.12)."""
    gap = 10.0 * prof.lc_total + 1.0
    r = run_policy(backend, prof, "lc_alone", [i * gap for i in range(n_queries)], [], float("inf"), margin=0.0)
    return float(np.median(r.latencies_ms))


def measured_max_lc_rate(
    backend: Backend, prof: Profile, qos_ms: float, start: float, n_queries: int = 150, iters: int = 6, sequences: int = 3,
    bracket: float = 0.85,
) -> float:  # fmt: skip
    """The highest rate at which LC alone keeps p99 within QoS *on the backend* (real launches vary
    more than the profile's medians): bisection below ``start`` (the replay estimate). A rate passes
    when the p99 pooled over ``sequences`` arrival sequences of ``n_queries`` is within QoS: session 9
    checked one sequence of 80 queries (its p99 is nearly its maximum) and the rate it passed gave
    LC-alone p99s of 4.3, 5.1 and 6.6 ms on three sequences against a 5.6 ms QoS.

    The search first tries ``bracket x start``: the replay estimate is usually a few percent high (session 52:
    432 -> 419/s), so where that rate passes, the bisection runs between it and ``start`` with ``iters - 3`` steps
    (with the defaults to within 1.9% of ``start``, against 1.6% for 6 steps over [0, start]): 5 rate checks instead
    of 7, each serving ``sequences x n_queries`` real queries. Else it bisects [0, bracket x start] as before."""

    def ok(rate: float) -> bool:
        lat = [x for s in range(sequences) for x in run_policy(backend, prof, "lc_alone", poisson_arrivals(rate, n_queries, 7 + s), [],
                                                               qos_ms, margin=0.0).latencies_ms]  # fmt: skip
        return float(np.percentile(lat, 99)) <= qos_ms

    if ok(start):
        return start
    near = bracket * start if 0.0 < bracket < 1.0 else start
    lo, hi, steps = (near, start, max(1, iters - 3)) if near < start and ok(near) else (0.0, near, iters)
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
