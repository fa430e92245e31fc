"""Side-by-side timing against PyTorch, in one process, with correctness checked in the same run.

Baselines (DESIGN.md §5): eager, eager captured in a CUDA graph, ``torch.compile`` default and
``mode="max-autotune"``. Times are medians of CUDA-event timings after warm-up.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kfuse.bench.hf_masks import hf_masks_skipped_when_absent
from kfuse.runtime.cuda_graph import own_cublas_workspace

PEAK_FLOPS = 790e12  # fp16/bf16 dense, measured on the H200
PEAK_BYTES = 4.3e12  # device-to-device copy bandwidth, measured on the H200
BASELINES = ("eager", "eager_cudagraph", "compile", "max_autotune")
# torch.compile's mode per baseline; ``compile_cudagraphs`` (on request, not in BASELINES): inductor's
# kernels replayed from CUDA graphs, the mode meant for inference at small batch
_COMPILE_MODES = {"compile": None, "compile_cudagraphs": "reduce-overhead", "max_autotune": "max-autotune"}


def floor_ms(flops: float, bytes_moved: float) -> float:
    """The roofline floor: max(FLOPs / 790 TFLOP/s, bytes / 4.3 TB/s), in ms."""
    return max(flops / PEAK_FLOPS, bytes_moved / PEAK_BYTES) * 1e3


_L2_FLUSH: torch.Tensor | None = None


def _flush_l2() -> None:
    global _L2_FLUSH
    if _L2_FLUSH is None:
        _L2_FLUSH = torch.empty(64 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")  # > 60 MB L2
    _L2_FLUSH.zero_()


def time_ms(
    fn: Callable[[], Any], warmup: int = 10, rep: int = 50, flush_l2: bool = False, device: torch.device | str | None = None
) -> float:
    """Median time of ``fn()`` in milliseconds (CUDA events on a GPU, wall clock otherwise). ``device``: where
    ``fn`` runs (None: the GPU when there is one); work on the CPU is timed by the wall clock on a GPU machine too."""
    for _ in range(warmup):
        fn()
    if not (torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"):
        times = []
        for _ in range(rep):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    torch.cuda.synchronize()
    times = []
    for _ in range(rep):
        if flush_l2:
            _flush_l2()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def max_rel_err(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| over the tensor leaves, the scale taken over the reference's finite
    values. Infinite when a NaN or an infinity of either side is not matched at the same position
    (an infinity by one of the same sign), when shapes or leaf counts differ, and when a non-floating
    leaf (integers, bools) is not exactly equal."""
    worst = 0.0
    outs = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    refs = [t for t in pytree.tree_leaves(ref) if isinstance(t, torch.Tensor)]
    if len(outs) != len(refs):
        return float("inf")
    for o, r in zip(outs, refs, strict=True):
        if o.shape != r.shape:
            return float("inf")
        if r.numel() == 0:
            continue
        r = r.to(o.device)
        if r.is_complex() or o.is_complex():
            o, r = torch.view_as_real(o.to(torch.complex128)), torch.view_as_real(r.to(torch.complex128))
        if not r.is_floating_point():
            if not bool((o == r).all()):  # integers and bools must match exactly
                return float("inf")
            continue
        o64, r64 = o.double(), r.double()
        r_nan, r_inf = torch.isnan(r64), torch.isinf(r64)
        if not torch.equal(torch.isnan(o64), r_nan) or not torch.equal(torch.isinf(o64), r_inf):
            return float("inf")
        if r_inf.any() and not torch.equal(o64[r_inf], r64[r_inf]):  # an infinity of the other sign
            return float("inf")
        finite = ~(r_nan | r_inf)
        if not finite.any():
            continue
        of, rf = o64[finite], r64[finite]
        d = (of - rf).abs().max().item()
        worst = max(worst, d / max(rf.abs().max().item(), 1e-12))
    return worst


def cuda_graph_callable(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None = None, calls: int = 1
) -> Callable[[], Any]:
    """Capture ``fn(*args, **kwargs)`` in a CUDA graph; return a replay function. With ``calls``
    > 1 the graph holds that many back-to-back calls (``graph_ms_per_call`` divides by it)."""
    kwargs = kwargs or {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    own_cublas_workspace(torch.cuda)  # see there: a later reduce-overhead compile must not free its workspace
    with torch.cuda.graph(g, stream=s):  # this device's stream (the process-wide default may be another GPU's)
        for _ in range(calls):
            out = fn(*args, **kwargs)

    def replay() -> Any:
        g.replay()
        return out

    return replay


def graph_ms_per_call(fn: Callable[..., Any], args: Sequence[Any], calls: int = 20, warmup: int = 3, rep: int = 20) -> tuple[float, Any]:
    """Steady-state GPU time of one call: ``calls`` back-to-back calls captured in one CUDA graph,
    the median replay time divided by ``calls`` (as Triton's ``do_bench_cudagraph``). The fixed
    cost of launching a graph (~4-8 us with the events on the H200) is then spread over the calls
    instead of being charged to each, which is what a call inside a larger captured model pays.
    Returns (ms per call, output); without a GPU, plain wall-clock timing of single calls."""
    if not torch.cuda.is_available():
        return time_ms(lambda: fn(*args), 1, max(1, rep // 10)), fn(*args)
    replay = cuda_graph_callable(fn, args, calls=calls)
    out = replay()
    return time_ms(replay, warmup, rep) / calls, out


def interleaved_rounds(sides: Sequence[Any], time_one: Callable[[Any], float | None], rounds: int) -> dict[Any, list[float | None]]:
    """``time_one(side)`` for each side in each of ``rounds`` rounds (entry r: round r; None where a
    timing failed), every side timed once a round in an order rotated every round: a GPU that clocks
    down under sustained load (an H200 at its power limit, seen in session 19: cuBLAS's steady-state
    time 20% above its one-call time when measured after kfuse's) then slows every side alike, instead
    of whichever is timed last. Two sides' times of one round were taken close together, so their
    ratio round by round (``paired_ratio_band``) says how far apart they are beyond the drift."""
    order = list(sides)
    times: dict[Any, list[float | None]] = {s: [] for s in order}
    for r in range(rounds):
        for s in order[r % len(order) :] + order[: r % len(order)]:
            times[s].append(time_one(s))
    return times


def interleaved_medians(sides: Sequence[Any], time_one: Callable[[Any], float | None], rounds: int) -> dict[Any, float]:
    """Median of ``time_one(side)`` for each side over ``interleaved_rounds``; a side whose every timing
    is None is left out."""
    return round_medians(interleaved_rounds(sides, time_one, rounds))


def round_medians(per_round: dict[Any, list[float | None]]) -> dict[Any, float]:
    """Each side's median over its rounds (``interleaved_rounds``), failed timings left out; a side
    whose every timing failed is left out."""
    return {s: statistics.median(ts) for s, t in per_round.items() if (ts := [x for x in t if x is not None])}


def paired_ratio_band(a: Sequence[float | None], b: Sequence[float | None]) -> dict[str, float] | None:
    """The round-by-round ratio a / b of two sides of ``interleaved_rounds``: its median and quartiles
    (``q1``, ``q3``), with ``verdict`` -1 where even the upper quartile is under 1 (a faster in most
    rounds), +1 where even the lower quartile is over 1, 0 where the band holds 1 (a tie within the
    rounds' spread). None without two paired rounds."""
    ratios = sorted(x / y for x, y in zip(a, b, strict=True) if x is not None and y is not None and y > 0)
    if len(ratios) < 2:
        return None
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    verdict = -1 if q3 < 1.0 else (1 if q1 > 1.0 else 0)
    return {"median": med, "q1": q1, "q3": q3, "rounds": len(ratios), "verdict": verdict}


def interleaved_ms_rounds(
    fns: dict[str, Callable[[], Any]], rounds: int = 7, calls: int = 1, rep: int = 10
) -> dict[str, list[float | None]]:
    """``interleaved_ms`` before the medians: each function's time (ms per call) in every round."""
    if torch.cuda.is_available():
        replays = {n: cuda_graph_callable(fn, (), calls=calls) for n, fn in fns.items()}
    else:
        calls, replays = 1, dict(fns)
    return interleaved_rounds(list(fns), lambda n: time_ms(replays[n], warmup=2, rep=rep) / calls, rounds)


def interleaved_ms(fns: dict[str, Callable[[], Any]], rounds: int = 7, calls: int = 1, rep: int = 10) -> dict[str, float]:
    """Median time (ms per call) of each function, timed in rotated rounds (``interleaved_rounds``).
    ``calls`` = 1: one call a graph replay (the graph's launch included); > 1: that many calls a
    graph, the replay's time divided by it. Without a GPU, plain wall-clock timing."""
    return round_medians(interleaved_ms_rounds(fns, rounds, calls, rep))


def ab_ms(fns: dict[str, Callable[[], Any]], rounds: int = 7, warmup: int = 3, rep: int = 30) -> dict[str, float]:
    """Median time (ms) of each whole call (a compiled model replaying its own CUDA graph), timed in
    rotated rounds (``interleaved_medians``): an A/B of two compiles of one model in one process."""
    return interleaved_medians(list(fns), lambda n: time_ms(fns[n], warmup, rep), rounds)


def sweep_configs(
    cfgs: Sequence[Any], compile_one: Callable[[Any], Any] | None, time_one: Callable[[Any], dict[str, Any]], deadline: float,
    workers: int = 8,
) -> dict[str, Any]:  # fmt: skip
    """The experiments' config sweep, keyed by ``cfg.describe()``: every config compiled first in
    parallel threads (``compile_one``; None where nothing compiles, as in the interpreter), then
    timed one by one with ``time_one`` (its record). Configs past ``deadline`` are recorded as
    skipped, and one that fails to compile or run as the error text."""

    def compile_err(cfg: Any) -> str | None:
        if compile_one is None or time.perf_counter() > deadline:
            return None
        try:
            compile_one(cfg)
            return None
        except Exception as e:  # noqa: BLE001 - reported per config
            return f"{type(e).__name__}: {str(e)[:80]}"

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        errs = list(pool.map(compile_err, cfgs))
    res: dict[str, Any] = {}
    for cfg, err in zip(cfgs, errs, strict=True):
        if time.perf_counter() > deadline:
            res[cfg.describe()] = "skipped: time budget"
        elif err:
            res[cfg.describe()] = f"failed to compile: {err}"
        else:
            try:
                res[cfg.describe()] = time_one(cfg)
            except Exception as e:  # noqa: BLE001 - reported per config
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                res[cfg.describe()] = f"failed: {type(e).__name__}: {str(e)[:80]}"
    return res


def graph_or_plain(fn: Callable[[], Any]) -> Callable[[], Any]:
    """A CUDA-graph replay of ``fn`` on the GPU (kernel time without launch overhead, as inside a
    compiled model); ``fn`` itself without a GPU."""
    if not torch.cuda.is_available():
        return fn
    return cuda_graph_callable(lambda: fn(), ())


def gpu_time_ms(fn: Callable[[], Any], warmup: int = 2, rep: int = 10) -> float:
    """Median GPU time of ``fn()`` replayed from a CUDA graph (launch overhead excluded, as in a
    compiled model's plan); plain CUDA-event timing where capture fails or there is no GPU.
    Used by compile-time decisions (template vs cuDNN, fused vs unfused)."""
    if torch.cuda.is_available():
        try:
            fn()  # compile / warm up outside the capture
            call = cuda_graph_callable(fn, ())
            return time_ms(call, warmup, rep)
        except Exception:
            torch.cuda.synchronize()
    return time_ms(fn, warmup, rep)


def pytorch_baselines(
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    which: Sequence[str] = BASELINES,
    warmup: int = 10,
    rep: int = 50,
    log: Callable[[str], None] = print,
    hf_mask_skip: bool = True,
) -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """Time ``fn`` under each baseline. Returns (ms per baseline, output per baseline,
    compile seconds per baseline). A baseline that fails is reported and left out. With
    ``hf_mask_skip`` a Hugging Face model given no padding mask builds none under capture and
    compile either (``hf_masks``: otherwise its attention runs in FP32 math there). cuDNN times
    its algorithms (``cudnn_autotuned``) for every baseline."""
    with hf_masks_skipped_when_absent() if hf_mask_skip else contextlib.nullcontext([]) as patched, cudnn_autotuned():
        if hf_mask_skip and not patched and type(fn).__module__.startswith("transformers."):
            log("  warning: this transformers version has none of the mask functions hf_masks patches; the graph and "
                "compile baselines may run attention in SDPA's FP32 math backend (check a profile)")  # fmt: skip
        return _time_baselines(fn, args, kwargs or {}, which, warmup, rep, log)


@contextlib.contextmanager
def cudnn_autotuned() -> Iterator[None]:
    """cuDNN picks each convolution's algorithm by timing them (``torch.backends.cudnn.benchmark``),
    as a PyTorch user serving fixed shapes would set it; the baselines ran on cuDNN's heuristic until
    session 25. Restored on exit."""
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def _time_baselines(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], which: Sequence[str], warmup: int, rep: int,
    log: Callable[[str], None],
) -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:  # fmt: skip
    times: dict[str, float] = {}
    outs: dict[str, Any] = {}
    compile_s: dict[str, float] = {}
    for name in which:
        try:
            t0 = time.perf_counter()
            if name == "eager":
                call = lambda: fn(*args, **kwargs)  # noqa: E731
            elif name == "eager_cudagraph":
                call = cuda_graph_callable(fn, args, kwargs)
            elif name in _COMPILE_MODES:
                torch._dynamo.reset()
                compiled = torch.compile(fn, mode=_COMPILE_MODES[name])
                call = lambda c=compiled: c(*args, **kwargs)  # noqa: E731
                call()
            else:
                raise ValueError(f"unknown baseline {name}")
            with torch.no_grad():
                # a copy: a CUDA-graph replay (eager_cudagraph, compile_cudagraphs) reuses its output memory
                outs[name] = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, call())
                compile_s[name] = time.perf_counter() - t0
                times[name] = time_ms(call, warmup, rep)
            log(f"  {name:16s} {times[name]:9.4f} ms")
        except Exception as e:  # a baseline that cannot run is reported, not fatal
            log(f"  {name:16s} failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
    return times, outs, compile_s


def kernel_lines(report: dict[str, Any]) -> list[str]:
    """What each launch of a compiled plan runs (template or library, config), from its report:
    "name: template config"."""
    return [f"{k['name']}: {k['template']} {k.get('config', '')}".strip() for k in report.get("kernels", [])]


def gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def make_record(
    benchmark: str,
    case: str,
    kfuse_ms: float | None,
    baselines_ms: dict[str, float],
    floor: float | None,
    err: float | None,
    command: str,
    dtype: str = "fp16",
    **extra: Any,
) -> dict[str, Any]:
    from kfuse import __version__

    rec: dict[str, Any] = {
        "benchmark": benchmark,
        "case": case,
        "gpu": gpu_name(),
        "dtype": dtype,
        "kfuse_ms": kfuse_ms,
        "baselines_ms": baselines_ms,
        "floor_ms": floor,
        "max_rel_err": err,
        "command": command,
        "date": datetime.date.today().isoformat(),
        "kfuse_version": __version__,
        "torch_version": torch.__version__,
    }
    if kfuse_ms and baselines_ms:
        rec["speedup_vs_best"] = min(baselines_ms.values()) / kfuse_ms
    rec.update(extra)
    return rec


def write_experiment(name: str, out_dir: str | Path, **fields: Any) -> Path:
    """An experiment's raw result, ``<out_dir>/<name>.json``: the GPU, torch and the command that
    ran (this process's argv), then ``fields`` (usually ``records``), in that order."""
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": gpu_name(), "torch": torch.__version__, "command": "PYTHONPATH=. python " + " ".join(sys.argv)}
    path.write_text(json.dumps({**meta, **fields}, indent=1))
    return path


def write_results(name: str, records: list[dict[str, Any]], out_dir: str | Path) -> Path:
    """Write ``records`` as ``<out_dir>/<name>.json`` (a list, the latest run of that benchmark)."""
    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=2, default=str))
    return path
