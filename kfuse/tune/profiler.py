"""The hardware-native profiler: measure candidate configs of one problem on the GPU.

For each candidate: compile (in parallel, threads: Triton's ptxas step runs outside the
GIL), run once and compare with the reference (a wrong result is recorded as ``wrong`` and
never chosen), run once more timed by the wall clock (a config slower than ``timeout_ms`` is
``timeout``), then CUDA-event timing after warm-up. By default (``cuda_graphs``) the median of
``rep`` replays of one CUDA graph of ``GRAPH_LAUNCHES`` launches alternating between two input
sets, each replay on a flushed L2: the first two launches find nothing cached, the last two may
find the first two's operands in L2 when both sets fit it (~50 MB on an H100/H200: most BERT
GEMMs), as a GEMM's activations from the step before often are in a model. Without graphs: the
median of ``rep`` launches, each on a flushed L2 and on a rotating set of inputs.

A config that raises on the GPU is recorded ``failed`` and the next one measured, unless the
error is sticky (an illegal address, a trap: the CUDA context is lost and every later launch
fails too): then ``torch.cuda.synchronize()`` fails as well, the tuning stops with
``CudaContextLost`` (the config that raised is recorded, so a new process skips it) and none of
the configs after it is measured or recorded as failed.

Tests inject ``measure`` (a function ``(config, problem) -> ms``) so search, database and
cost-model logic run without a GPU; with a ``runner`` too, each config is still executed
(in the Triton interpreter) and checked for correctness.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from kfuse.bench.harness import interleaved_medians
from kfuse.kernels.conv import ConvConfig, ConvParams, conv_epilogue, pack_weight
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand, apply_reference
from kfuse.kernels.gemm import GemmConfig, launch, prepare
from kfuse.runtime import cuda_fault, parallel_compile
from kfuse.tune.space import Config, ConvProblem, GemmProblem, Problem

Measure = Callable[[Config, Problem], float]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class CudaContextLost(RuntimeError):
    """The CUDA context is unusable after a config failed (a sticky error): nothing more can be
    measured in this process. ``measurement`` is the failure of the config that raised it."""

    def __init__(self, measurement: Measurement, why: str, record: bool = True) -> None:
        then = "; that config is recorded as failed, so the next run skips it" if record else ""
        super().__init__(
            f"kfuse tune: the CUDA context was lost while measuring {measurement.config.describe()} ({measurement.error}; then"
            f" torch.cuda.synchronize: {why}). Tuning stopped: restart the process{then}"
        )
        self.measurement = measurement
        self.record = record  # whether ``measurement`` is to be stored (its config caused the loss)


def _cuda_lost(runner: Any) -> str | None:
    """After an exception: the error of ``torch.cuda.synchronize()`` if the runner's device is a
    GPU whose context no longer works (a sticky error), else None."""
    dev = getattr(runner, "device", None) if runner is not None else None
    if dev is None or torch.device(dev).type != "cuda":
        return None
    return cuda_fault.context_lost(dev)


@dataclass(frozen=True)
class Measurement:
    config: Config
    time_ms: float | None
    status: str  # ok | failed | wrong | timeout
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.time_ms is not None


class Runner(Protocol):
    """Runs one problem with a given config (what the profiler measures)."""

    n_sets: int

    def compile(self, cfg: Config) -> None: ...
    def poison(self, i: int) -> None: ...
    def run(self, cfg: Config, i: int) -> torch.Tensor: ...
    def check(self, out: torch.Tensor, i: int) -> str | None: ...


def _bias_gelu(n_extras: int) -> Epilogue:
    """A representative epilogue when the caller has none: bias add (+ residuals) then GELU."""
    steps = [EpilogueStep("add", (Operand("reg", j), Operand("in", j))) for j in range(n_extras)]
    steps.append(EpilogueStep("gelu", (Operand("reg", len(steps)),)))
    return Epilogue(tuple(steps), n_extras)


def _tol(dtype: torch.dtype, k: int) -> float:
    base = {torch.float16: 2e-2, torch.bfloat16: 6e-2}.get(dtype, 2e-3)
    return base * max(1.0, (k / 1024) ** 0.5)


class GemmRunner:
    def __init__(self, problem: GemmProblem, device: torch.device | str, epi: Epilogue | None = None, n_sets: int = 2) -> None:
        self.problem, self.device = problem, torch.device(device)
        self.epi = epi or _bias_gelu(problem.n_extras)
        self.dtype = DTYPES[problem.dtype]
        self.n_sets = n_sets
        p = problem
        self.calls, self.refs = [], []
        for _ in range(n_sets):
            a = torch.randn((p.batch, p.k, p.m) if p.a_t else (p.batch, p.m, p.k), device=self.device).to(self.dtype)
            b = torch.randn((p.batch, p.n, p.k) if p.b_t else (p.batch, p.k, p.n), device=self.device).to(self.dtype) / p.k**0.5
            a = a.transpose(1, 2) if p.a_t else a
            b = b.transpose(1, 2) if p.b_t else b
            ex = [torch.randn(p.n, device=self.device).to(self.dtype) for _ in range(self.epi.n_inputs)]
            self.calls.append(prepare(a, b, ex, self.dtype))
            self.refs.append((a, b, ex))
        self._ref_out: dict[int, torch.Tensor] = {}

    def compile(self, cfg: Config) -> None:
        assert isinstance(cfg, GemmConfig)
        launch(self.calls[0], self.epi, cfg, warmup=True)

    def poison(self, i: int) -> None:
        """NaN into input set ``i``'s output buffer: the buffer is reused across configs, so without
        this a config that writes nothing would be checked against the previous config's result."""
        self.calls[i % self.n_sets].c.fill_(float("nan"))

    def run(self, cfg: Config, i: int) -> torch.Tensor:
        assert isinstance(cfg, GemmConfig)
        g = self.calls[i % self.n_sets]
        launch(g, self.epi, cfg)
        return g.c

    def check(self, out: torch.Tensor, i: int) -> str | None:
        if i not in self._ref_out:
            a, b, ex = self.refs[i]
            acc = torch.matmul(a.float(), b.float())
            self._ref_out[i] = apply_reference(acc, [e.float() for e in ex], self.epi)
        return _compare(out, self._ref_out[i], _tol(self.dtype, self.problem.k))


class ConvRunner:
    def __init__(self, problem: ConvProblem, device: torch.device | str, epi: Epilogue | None = None, n_sets: int = 2) -> None:
        self.problem, self.device = problem, torch.device(device)
        self.epi = epi or _bias_gelu(0)
        self.dtype = DTYPES[problem.dtype]
        self.n_sets = n_sets
        p = problem
        self.params = ConvParams(p.stride, p.padding, p.dilation, 1)
        self.sets = []
        for _ in range(n_sets):
            x = torch.randn(p.n, p.c, p.h, p.w, device=self.device).to(self.dtype).contiguous(memory_format=torch.channels_last)
            w = (torch.randn(p.oc, p.c, p.kh, p.kw, device=self.device) / (p.c * p.kh * p.kw) ** 0.5).to(self.dtype)
            bias = torch.randn(p.oc, device=self.device).to(self.dtype)
            oh, ow = p.out_hw()
            ex = [torch.randn(p.n, p.oc, oh, ow, device=self.device).to(self.dtype).contiguous(memory_format=torch.channels_last)
                  for _ in range(self.epi.n_inputs)]  # fmt: skip
            self.sets.append((x, w, pack_weight(w), bias, ex))
        oh, ow = p.out_hw()
        # one output buffer per input set, reused by every config (as GemmRunner's); see ``poison``
        self.outs = [torch.empty(p.n, p.oc, oh, ow, dtype=self.dtype, device=self.device, memory_format=torch.channels_last)
                     for _ in range(n_sets)]  # fmt: skip
        self._ref_out: dict[int, torch.Tensor] = {}

    def compile(self, cfg: Config) -> None:
        assert isinstance(cfg, ConvConfig)
        x, w, wp, bias, ex = self.sets[0]
        conv_epilogue(x, w, bias, ex, self.epi, self.params, self.dtype, cfg, wp, warmup=True)

    def poison(self, i: int) -> None:
        """NaN into input set ``i``'s output buffer (see ``GemmRunner.poison``)."""
        self.outs[i % self.n_sets].fill_(float("nan"))

    def run(self, cfg: Config, i: int) -> torch.Tensor:
        assert isinstance(cfg, ConvConfig)
        x, w, wp, bias, ex = self.sets[i % self.n_sets]
        return conv_epilogue(x, w, bias, ex, self.epi, self.params, self.dtype, cfg, wp, out=self.outs[i % self.n_sets])

    def check(self, out: torch.Tensor, i: int) -> str | None:
        if i not in self._ref_out:
            x, w, _, bias, ex = self.sets[i]
            pr = self.params
            acc = torch.nn.functional.conv2d(x.float(), w.float(), bias.float(), pr.stride, pr.padding, pr.dilation)
            self._ref_out[i] = apply_reference(acc, [e.float() for e in ex], self.epi)
        return _compare(out, self._ref_out[i], _tol(self.dtype, self.problem.kh * self.problem.kw * self.problem.c))


def _compare(out: torch.Tensor, ref: torch.Tensor, tol: float) -> str | None:
    o = out.float()
    if torch.isnan(o).any() and not torch.isnan(ref).any():
        return "NaN in output"
    err = ((o - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
    return None if err <= tol else f"max relative error {err:.3g} > {tol:.3g}"


def make_runner(problem: Problem, device: torch.device | str, epi: Epilogue | None = None) -> Runner:
    if isinstance(problem, GemmProblem):
        return GemmRunner(problem, device, epi)
    return ConvRunner(problem, device, epi)


_L2: dict[str, torch.Tensor] = {}


def _flush_l2(device: torch.device) -> None:
    key = str(device)
    if key not in _L2:
        _L2[key] = torch.empty(128 * 1024 * 1024 // 4, dtype=torch.int32, device=device)  # 128 MB > any L2
    _L2[key].zero_()


class Profiler:
    """Measures configs of one problem; never raises for a bad config (it is recorded)."""

    def __init__(
        self,
        measure: Measure | None = None,
        warmup: int = 3,
        rep: int = 10,
        flush_l2: bool = True,
        timeout_ms: float = 50.0,
        compile_timeout_s: float = 120.0,
        workers: int = 8,
        check: bool = True,
        cuda_graphs: bool = True,
    ) -> None:
        self.measure = measure
        self.cuda_graphs = cuda_graphs
        self.warmup, self.rep, self.flush = warmup, rep, flush_l2
        self.timeout_ms, self.compile_timeout_s = timeout_ms, compile_timeout_s
        self.workers, self.do_check = workers, check
        self.compile_s = 0.0
        self.precompile: parallel_compile.PrecompileReport | None = None  # the last batch's worker compiles

    def profile(self, problem: Problem, configs: Sequence[Config], runner: Runner | None = None,
                on_result: Callable[[Measurement], None] | None = None) -> list[Measurement]:  # fmt: skip
        """Measure ``configs``; ``on_result`` is called as each one finishes (the database
        commits it there, so an interrupted run keeps what it measured). Raises
        ``CudaContextLost`` (after ``on_result`` of the config that caused it) when a failure left
        the GPU unusable: the configs after it would all fail and must not be recorded."""
        results: list[Measurement] = []
        failed = self._compile_all(configs, runner) if runner is not None and self.measure is None else {}
        if failed and (why := _cuda_lost(runner)) is not None:  # a compile's warm-up launch broke the context
            raise CudaContextLost(next(iter(failed.values())), why, record=False)
        for cfg in configs:
            try:
                m = failed.get(cfg) or self._one(problem, cfg, runner)
            except CudaContextLost as e:
                if on_result is not None and e.record:
                    on_result(e.measurement)
                raise
            results.append(m)
            if on_result is not None:
                on_result(m)
        return results

    def recheck(self, configs: Sequence[Config], runner: Runner, rounds: int = 5) -> dict[Config, float]:
        """Median time of each config over ``rounds`` rounds that time all of them in an order
        rotated every round (``interleaved_medians``). A batch is timed one config after the other;
        a GPU that clocks down as it heats (an H200 at its power limit under back-to-back GEMMs,
        session 19) then favours the configs timed first, by more than the finalists differ.
        Configs that fail here are dropped."""

        def time_one(cfg: Config) -> float | None:
            try:
                m = self._time(cfg, runner)
            except Exception as e:  # noqa: BLE001 - it ran before; a failure now only removes it
                if (why := _cuda_lost(runner)) is not None:
                    m = Measurement(cfg, None, "failed", f"{type(e).__name__}: {_first_line(e)}")
                    raise CudaContextLost(m, why, record=False) from e
                return None
            return m.time_ms if m.ok else None

        return interleaved_medians(configs, time_one, rounds)

    def _compile_all(self, configs: Sequence[Config], runner: Runner) -> dict[Config, Measurement]:
        """Compile every candidate before timing any: worker processes compile them into Triton's
        cache (``parallel_compile``; unlike threads, a process past the time-out can be stopped), then Triton's
        async-compile mode loads each on a thread pool (the launcher's argument handling stays on
        this thread), compiling here whatever the workers could not."""
        t0 = time.perf_counter()
        failed: dict[Config, Measurement] = {}
        if torch.device(getattr(runner, "device", "cuda")).type == "cuda":
            calls = [functools.partial(runner.compile, cfg) for cfg in configs]
            # the workers only once they are up: the pool thread below compiles about as fast meanwhile (session 32)
            self.precompile = parallel_compile.precompile(calls, kernel_timeout_s=self.compile_timeout_s, wait=False)
            for i in self.precompile.slow_calls:  # never compiled again here: as slow, and the tuner must not stall
                cfg = configs[i]
                failed[cfg] = Measurement(cfg, None, "timeout", f"compile took over {self.compile_timeout_s:.0f} s")
            configs = [c for c in configs if c not in failed]
        try:
            from triton.runtime._async_compile import AsyncCompileMode
        except ImportError:  # an older Triton: compile one after the other
            AsyncCompileMode = None  # noqa: N806
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            ctx = AsyncCompileMode(pool, ignore_errors=True) if AsyncCompileMode is not None else contextlib.nullcontext()
            with ctx:
                for cfg in configs:
                    try:
                        runner.compile(cfg)
                    except Exception as e:  # noqa: BLE001 - any compile error marks the config failed
                        failed[cfg] = Measurement(cfg, None, "failed", f"compile: {type(e).__name__}: {_first_line(e)}")
        # a compile that failed in the pool fails again, synchronously, at the first run: recorded there
        self.compile_s += time.perf_counter() - t0
        return failed

    def _one(self, problem: Problem, cfg: Config, runner: Runner | None) -> Measurement:
        try:
            if runner is not None and self.do_check:
                runner.poison(0)  # the output buffer holds the previous config's result otherwise
                out = runner.run(cfg, 0)
                why = runner.check(out, 0)
                if why is not None:
                    return Measurement(cfg, None, "wrong", why)
            if self.measure is not None:
                t = float(self.measure(cfg, problem))
                if not t == t or t <= 0 or t == float("inf"):
                    return Measurement(cfg, None, "failed", f"measure returned {t}")
                return Measurement(cfg, t, "ok")
            if runner is None:
                return Measurement(cfg, None, "failed", "no runner and no measure function")
            return self._time(cfg, runner)
        except Exception as e:  # noqa: BLE001 - a config that crashes is recorded, never chosen
            m = Measurement(cfg, None, "failed", f"{type(e).__name__}: {_first_line(e)}")
            if (why := _cuda_lost(runner)) is not None:
                raise CudaContextLost(m, why) from e
            return m

    def _time(self, cfg: Config, runner: Runner) -> Measurement:
        dev = getattr(runner, "device", torch.device("cuda"))
        on_gpu = torch.device(dev).type == "cuda"
        sync = torch.cuda.synchronize if on_gpu else (lambda: None)
        sync()
        t0 = time.perf_counter()
        runner.run(cfg, 1 % runner.n_sets)
        sync()
        first = (time.perf_counter() - t0) * 1e3
        if first > self.timeout_ms:
            return Measurement(cfg, None, "timeout", f"one launch took {first:.1f} ms > {self.timeout_ms} ms")
        for i in range(self.warmup):
            runner.run(cfg, i)
        if not on_gpu:
            times = []
            for i in range(self.rep):
                t0 = time.perf_counter()
                runner.run(cfg, i)
                times.append((time.perf_counter() - t0) * 1e3)
            return Measurement(cfg, statistics.median(times), "ok")
        if self.cuda_graphs:
            ms = self._graph_time(cfg, runner, torch.device(dev))
            if ms is not None:
                return Measurement(cfg, ms, "ok")
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.rep)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.rep)]
        for i in range(self.rep):
            if self.flush:
                _flush_l2(torch.device(dev))
            starts[i].record()
            runner.run(cfg, i)
            ends[i].record()
        torch.cuda.synchronize()
        return Measurement(cfg, statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)), "ok")

    GRAPH_LAUNCHES = 4

    def _graph_time(self, cfg: Config, runner: Runner, dev: torch.device) -> float | None:
        """Kernel time per launch from CUDA-graph replays (None if capture fails).

        Compiled models run their kernels inside one CUDA graph, so the tuner ranks configs by
        GPU time alone: timing Python launches would add 30-200 us of launch overhead that
        swamps the differences between configs of a small GEMM."""
        if not torch.cuda.is_available():
            return None
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=torch.cuda.Stream(dev)):  # dev's stream: the process-wide default may be another GPU's
                for i in range(self.GRAPH_LAUNCHES):
                    runner.run(cfg, i)
            g.replay()
            torch.cuda.synchronize()
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.rep)]
            ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.rep)]
            for i in range(self.rep):
                if self.flush:
                    _flush_l2(dev)
                starts[i].record()
                g.replay()
                ends[i].record()
            torch.cuda.synchronize()
            return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)) / self.GRAPH_LAUNCHES
        except Exception:  # capture is an optimisation of the measurement: fall back to events
            torch.cuda.synchronize()
            return None


def _first_line(e: BaseException) -> str:
    return cuda_fault.first_line(e, 300)


def describe(m: Measurement) -> dict[str, Any]:
    return {"config": m.config.describe(), "time_ms": m.time_ms, "status": m.status, "error": m.error}
