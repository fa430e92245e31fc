"""The real GPU backend: every launch is timed with CUDA events and synchronised, and that time
advances the scheduler's clock."""

from __future__ import annotations

import gc
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kfuse.colocate.be_forms import grid as be_grid
from kfuse.colocate.fuser import GREEN_MODES, STREAM_MODES, WS_MODE, FusedVersion, launch_fused
from kfuse.colocate.gate import StreamGate
from kfuse.colocate.green import SmPartition, partition, run_partitioned
from kfuse.colocate.lc import LC_PROGRAMS_PER_SM, LCItem
from kfuse.colocate.prio import PrioStreams, run_beside, run_prio
from kfuse.colocate.ptb import launch_ptb, num_sms
from kfuse.colocate.scheduler import Backend, LCKernel
from kfuse.colocate.workloads import Workload
from kfuse.kernels.codegen import sm_count

# see ``timed``
PREROLL: dict[str, float] = {"cycles": 0, "ms": 0.1, "max_enqueue_ms": 0.0, "uncovered": 0, "retimed": 0, "cycles_per_ms": 0.0,
                             "shrinks": 0, "gated": 0, "gate_timeouts": 0}  # fmt: skip
# the stream gate (``kfuse.colocate.gate``) replaces the spin where the driver has it; KFUSE_COLOCATE_GATE=0 keeps the spin
_GATE: list[StreamGate | None] = []
MIN_PREROLL_MS = 0.1
MAX_PREROLL_MS = 0.5
# the spin shrinks back to 1.5x the longest of the last ENQUEUE_WINDOW enqueue times that a spin may cover (at least
# MIN_PREROLL_MS), checked once per ENQUEUE_WINDOW windows: one slow enqueue (a hiccup, a first launch) used to lengthen
# every later window's spin to MAX_PREROLL_MS for the rest of the run (session 52: 0.5 ms before each of ~86 launches a
# query, 4x the host time of the LC-alone rate search, which took most of each 200 s BERT-base run)
ENQUEUE_WINDOW = 256
_enqueues: deque[float] = deque(maxlen=ENQUEUE_WINDOW)
_since_resize = 0


def _calibrate_preroll() -> None:
    """Cycles of ``torch.cuda._sleep`` per ms on this GPU (once)."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm
    s.record()
    torch.cuda._sleep(10_000_000)
    e.record()
    e.synchronize()
    PREROLL["cycles_per_ms"] = 10_000_000 / max(s.elapsed_time(e), 1e-3)
    PREROLL["cycles"] = int(PREROLL["ms"] * PREROLL["cycles_per_ms"])


def _gate() -> StreamGate | None:
    """This process's stream gate, made on first use (None: the spin times every window)."""
    if not _GATE:
        _GATE.append(StreamGate.create() if os.environ.get("KFUSE_COLOCATE_GATE", "1") != "0" else None)
    return _GATE[0]


def _window(fn: Callable[[], Any], cycles: int | None = None, gate: StreamGate | None = None) -> tuple[float, float]:
    """(GPU ms between the events around ``fn``, host ms spent enqueueing ``fn``). With a ``gate`` the stream is held
    until both events and ``fn``'s work are enqueued: no host time inside the window, whatever the enqueue took.
    Without one the window sits behind the pre-roll spin (``cycles``, default ``PREROLL["cycles"]``). Python's garbage
    collector waits until the window is enqueued: a collection inside it is host time a spin may not cover."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if gate is not None:
        gate.hold()
    else:
        torch.cuda._sleep(int(PREROLL["cycles"] if cycles is None else cycles))
    collecting = gc.isenabled()
    gc.disable()
    try:
        s.record()
        t0 = time.perf_counter()
        fn()
        enq = (time.perf_counter() - t0) * 1e3
        e.record()
    finally:
        if collecting:
            gc.enable()
        if gate is not None:
            gate.release()
    e.synchronize()
    return s.elapsed_time(e), enq


def timed(fn: Callable[[], Any], retime: bool = True) -> float:
    """Milliseconds of the GPU work ``fn`` launches (CPU wall clock without a GPU).

    The start event sits behind a short GPU spin (``torch.cuda._sleep``, ``PREROLL["ms"]``), so ``fn``'s kernels are
    already enqueued when it fires: the window holds GPU time only. Sessions 3-4 recorded the start event on an idle
    GPU, so every duration on the scheduler's clock also held the host's launch path (Triton's Python launcher,
    tens of us per launch for 44 LC kernels of 50-260 us), which varies with what the host did in between
    (Aker plans between launches; time sharing does not). If enqueueing took longer than the spin, the GPU may have
    idled inside the window (session 8: 2,638-7,437 such windows a run, one of 852 ms): the spin grows (and shrinks
    back to what the recent enqueues need, ``_note_enqueue``), and with
    ``retime`` the work runs once more and that window is the one returned (the scheduler counts its blocks once;
    callers pass ``retime=False`` for work that is not idempotent: a histogram's atomics would count twice, which
    session 28's first whole-suite GPU run caught in ``tests/colocate/test_prio_version.py``).

    Where the driver has stream memory operations, a gate the host opens after enqueueing (``kfuse.colocate.gate``)
    replaces the spin: no window can be uncovered, so none is timed twice (session 65: the suspected cause of the
    runs where Aker's measured fused launches ran 1.3-3x their profile and its gain collapsed)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    gate = _gate()
    if gate is not None:
        ms, enq = _window(fn, gate=gate)
        PREROLL["gated"] += 1
        PREROLL["gate_timeouts"] = gate.timeouts
        PREROLL["max_enqueue_ms"] = max(PREROLL["max_enqueue_ms"], enq)
        return ms
    if not PREROLL["cycles"]:
        _calibrate_preroll()
    # a window that cannot run twice gets the longest spin: host time it leaves uncovered would stay in its measurement
    spin_ms = PREROLL["ms"] if retime else MAX_PREROLL_MS
    ms, enq = _window(fn, None if retime else int(spin_ms * PREROLL["cycles_per_ms"]))
    PREROLL["max_enqueue_ms"] = max(PREROLL["max_enqueue_ms"], enq)
    _note_enqueue(enq)
    if enq > 0.8 * spin_ms:  # the GPU may have idled inside the window
        PREROLL["uncovered"] += 1
        if enq <= MAX_PREROLL_MS:  # a longer spin from now on (not for a JIT compile: first calls are untimed anyway)
            _set_spin(min(MAX_PREROLL_MS, 1.5 * enq))
        if retime:
            PREROLL["retimed"] += 1
            ms2, enq2 = _window(fn)
            if enq2 <= 0.8 * PREROLL["ms"] or ms2 < ms:  # covered this time, or at least less idle inside
                ms = ms2
    return ms


def _set_spin(ms: float) -> None:
    PREROLL["ms"] = ms
    PREROLL["cycles"] = int(ms * PREROLL["cycles_per_ms"])


def _note_enqueue(enq_ms: float) -> None:
    """Keep the last ``ENQUEUE_WINDOW`` enqueue times; once per window, shrink a spin that a rare slow enqueue grew to
    1.5x the longest of them up to ``MAX_PREROLL_MS`` (longer ones are stalls no spin covers; never below
    ``MIN_PREROLL_MS``): a spin longer than the enqueues it covers only adds host time. The longest, not a
    percentile, so a rare kind of launch that enqueues slowly (a span's two partitions, a BE kernel that must not be
    re-timed) stays covered while it recurs within the window."""
    global _since_resize
    _enqueues.append(enq_ms)
    _since_resize += 1
    if _since_resize < ENQUEUE_WINDOW:  # a whole window of enqueues since the last check (so the deque is full)
        return
    _since_resize = 0
    longest = max((e for e in _enqueues if e <= MAX_PREROLL_MS), default=0.0)
    target = min(MAX_PREROLL_MS, max(MIN_PREROLL_MS, 1.5 * longest))
    if target < PREROLL["ms"]:
        _set_spin(target)
        PREROLL["shrinks"] += 1


def graphed(run: Callable[[], Any]) -> Callable[[], Any]:
    """``run`` (a segment of several LC steps on fixed, cached inputs) captured in one CUDA graph: one
    launch to enqueue instead of one Python launch per step, so its timing window is covered by the
    pre-roll (a deployed kfuse model runs in a CUDA graph too). ``run`` itself if capture fails."""
    if not torch.cuda.is_available():
        return run
    from kfuse.bench.harness import cuda_graph_callable

    try:
        return cuda_graph_callable(run, ())
    except Exception:  # noqa: BLE001 - a step that cannot be captured runs eagerly
        torch.cuda.synchronize()
        return run


class CudaBackend(Backend):
    def __init__(
        self, items: Sequence[LCItem], be: dict[str, Workload], lc_programs_per_sm: int = LC_PROGRAMS_PER_SM, be_programs_per_sm: int = 4,
        graph_segments: bool = True,
    ) -> None:  # fmt: skip
        self.items = list(items)
        # segments (several non-GEMM steps) replay from CUDA graphs: see ``graphed``
        self.segments = {i: graphed(it.run) if graph_segments else it.run for i, it in enumerate(self.items) if it.run is not None}
        self.graphed_segments = sum(1 for i, it in enumerate(self.items) if it.run is not None and self.segments[i] is not it.run)
        self.be = be
        self.sms = num_sms()
        self.lc_grid = lc_programs_per_sm * self.sms
        self.be_grid = be_programs_per_sm * self.sms
        self.launches = 0
        self._queries: dict[int, Callable[[], Any]] = {}  # BE SM count -> the whole query as one graph (run_span)
        self._sized: dict[tuple[int, int], Callable[[], Any]] = {}  # (segment, SMs) -> its graph sized for a partition
        self.prio: PrioStreams | None = None
        if torch.cuda.is_available():
            self.s1, self.s2 = torch.cuda.Stream(), torch.cuda.Stream()
            self.prio = PrioStreams()
        # each worker-partition host's tile and warps per BE kernel, timed now: a choice made on the first fused launch
        # would put every candidate's timing launches into that launch's measured time (a profile sample)
        for it in self.items:
            if it.host is not None:
                for w in be.values():
                    it.host.choose(w)

    def lc_kernels(self) -> list[LCKernel]:
        return [LCKernel(it.name, it.fusible, it.key, it.host is not None) for it in self.items]

    def be_blocks(self, be: str) -> int:
        return self.be[be].kernel.n_blocks

    def lc_grid_of(self, k: Any, sms: int | None = None) -> int:
        """An LC block kernel's persistent grid on ``sms`` SMs (default: all): its own programs an SM where it says
        (``meta["programs_per_sm"]``: a plan tile may fit one an SM, ``lc_items(gemms="plan-ptb")``), else the LC's."""
        return int(k.meta.get("programs_per_sm", self.lc_grid // self.sms)) * (sms or self.sms)

    def _lc(self, i: int) -> Callable[[], None]:
        it = self.items[i]
        if it.kernel is not None:
            k, grid = it.kernel, self.lc_grid_of(it.kernel)
            return lambda: launch_ptb(k, 0, k.n_blocks, grid)
        return self.segments[i]

    def run_lc(self, i: int) -> float:
        self.launches += 1
        return timed(self._lc(i))

    def run_be(self, be: str, start: int, end: int) -> float:
        self.launches += 1
        k, grid = self.be[be].kernel, self._be_grid(be, end - start)  # outside the timing window
        return timed(lambda: launch_ptb(k, start, end, grid), retime=self.be[be].idempotent)

    def _be_grid(self, be: str, blocks: int, sms: int | None = None) -> int:
        """The BE kernel's grid for a launch of ``blocks`` blocks on ``sms`` SMs (None: all), in its own form
        (``be_forms.apply``: persistent programs an SM or one program a block), else the backend's programs an SM."""
        return be_grid(self.be[be], blocks, sms or self.sms, self.be_grid // self.sms)

    def _partition(self, be_sms: int) -> SmPartition | None:
        """The green-context SM partition with ``be_sms`` SMs for the BE (None without a GPU: both run in order)."""
        return partition(be_sms) if torch.cuda.is_available() else None

    def _lc_on(self, i: int, sms: int) -> Callable[[], None]:
        """LC kernel i for a partition of ``sms`` SMs: a PTB GEMM's persistent grid sized to them (a grid for the
        whole GPU would queue its surplus programs behind the first wave); a segment's own persistent kernels (kfuse's
        GEMMs with ``--lc-gemms plan``, norms) too, their launches sized under ``codegen.sm_count`` and captured so."""
        it = self.items[i]
        if it.kernel is not None:
            k, grid = it.kernel, max(1, self.lc_grid_of(it.kernel, sms))
            return lambda: launch_ptb(k, 0, k.n_blocks, grid)
        if sms >= self.sms:
            return self.segments[i]
        if (i, sms) not in self._sized:
            self._sized[(i, sms)] = graphed(self._sized_for(it.run, sms))
        return self._sized[(i, sms)]

    def _sized_for(self, run: Callable[[], Any], sms: int) -> Callable[[], Any]:
        """``run`` with its launches sized for ``sms`` SMs (``codegen.sm_count``) where that is fewer than the GPU's,
        so a graph captured from it keeps the partition's grids."""
        if sms >= self.sms:
            return run

        def sized() -> None:
            with sm_count(sms):
                run()

        return sized

    def _query_on(self, be_sms: int) -> Callable[[], None]:
        """The whole query's LC kernels back to back for the SMs a ``be_sms`` partition leaves (0: the whole GPU), as
        one CUDA graph, so its window holds GPU time and one launch to enqueue (86 Python launches would outlast the
        pre-roll); segments captured from their steps, not nested graphs."""
        if be_sms not in self._queries:
            part = self._partition(be_sms) if be_sms else None
            sms = part.lc_sms if part is not None else self.sms
            fns = [self._lc_on(i, sms) if it.kernel is not None else it.run for i, it in enumerate(self.items)]
            # on a partition, the segments' launches sized for the LC's SMs as they are captured
            self._queries[be_sms] = graphed(self._sized_for(lambda: [f() for f in fns], sms))
        return self._queries[be_sms]

    def run_span(self, be: str, start: int, end: int, be_sms: int, fill: int = 0) -> float:
        self.launches += 1
        query = self._query_on(be_sms)
        if not be_sms and not fill:
            return timed(query)
        bk = self.be[be].kernel

        def pieces(lo: int, left: int) -> list[tuple[int, int]]:
            """Block ranges of ``left`` blocks from ``lo``: past the kernel's last block, into the job's next instances."""
            out = []
            lo %= bk.n_blocks
            while left > 0:
                hi = min(bk.n_blocks, lo + left)
                out.append((lo, hi))
                left -= hi - lo
                lo = 0
            return out

        def backfill() -> None:  # one program per block: each slot the query leaves free takes a fresh block
            for lo, hi in pieces(end, fill):
                launch_ptb(bk, lo, hi, hi - lo)

        if not be_sms:  # the backfill alone: the query on every SM, the blocks behind it at a lower priority
            return timed(lambda: run_prio(self.prio, query, backfill), retime=self.be[be].idempotent)
        part = self._partition(be_sms)
        be_sms = part.be_sms if part is not None else None
        # persistent on its SMs (or one program a block, the BE's form); grids sized outside the timing window
        launches = [(lo, hi, self._be_grid(be, hi - lo, be_sms)) for lo, hi in pieces(start, end - start)]

        def slice_() -> None:
            for lo, hi, grid in launches:
                launch_ptb(bk, lo, hi, grid)

        return timed(lambda: run_partitioned(part, query, slice_, backfill if fill else None), retime=self.be[be].idempotent)

    def run_fused(self, i: int, be: str, start: int, end: int, version: Any) -> float:
        it = self.items[i]
        v = version if isinstance(version, FusedVersion) else FusedVersion(*version)
        bk = self.be[be].kernel
        if v.mode in GREEN_MODES:  # any LC kernel: the LC on its SMs, the slice on the disjoint rest
            self.launches += 1
            part = self._partition(v.r2)
            lc = self._lc_on(i, part.lc_sms if part is not None else self.sms)
            n = max(1, end - start)  # one program per block, as prio: each freed BE slot takes a fresh block
            return timed(lambda: run_partitioned(part, lc, lambda: launch_ptb(bk, start, end, n)), retime=self.be[be].idempotent)
        if v.mode == WS_MODE:  # the plan's GEMM step on a ping-pong tile, the slice in its worker partition
            if it.host is None:
                raise ValueError(f"LC kernel {it.name} hosts no worker partition: the ws version needs --lc-gemms plan-ws")
            self.launches += 1
            w = self.be[be]
            return timed(lambda: it.host.fused(w, start, end), retime=w.idempotent)
        if it.kernel is None:
            raise ValueError(f"LC kernel {it.name} is not a PTB GEMM: it cannot be fused with version {v.describe()}")
        self.launches += 1
        lk = it.kernel
        if v.mode in STREAM_MODES:  # two kernels: the LC's solo launch first, on the urgent stream
            lc = self._lc(i)
            # the slice one program per block: the block scheduler hands each free slot beside or
            # after the LC's programs a fresh block (a persistent grid would leave the programs that
            # do not fit beside the LC queued with their whole share of blocks)
            n = max(1, end - start)
            return timed(lambda: run_prio(self.prio, lc, lambda: launch_ptb(bk, start, end, n)), retime=self.be[be].idempotent)
        return timed(lambda: launch_fused(lk, bk, v, (0, lk.n_blocks), (start, end), self.sms), retime=self.be[be].idempotent)

    def run_concurrent(self, i: int, be: str, start: int, end: int) -> float:
        self.launches += 1
        lc = self._lc(i)
        k, grid = self.be[be].kernel, self._be_grid(be, end - start)
        if not torch.cuda.is_available():
            return timed(lambda: (lc(), launch_ptb(k, start, end, grid)), retime=self.be[be].idempotent)

        # the whole BE kernel's blocks first (plain streams: no priority), then the LC kernel
        return timed(lambda: run_beside(self.s2, lambda: launch_ptb(k, start, end, grid), self.s1, lc), retime=self.be[be].idempotent)
