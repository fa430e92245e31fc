"""SASS schedule tuning of a compiled plan's hottest Triton kernels: ``kfuse.compile(..., sass=True)``.

The plan is profiled (each step replayed alone from a CUDA graph). Then, hottest first, every step
is run once with Triton's launcher wrapped, which gives its kernel's ``CompiledKernel``, the full
argument list and the grid. Steps that launch exactly one Triton kernel go to
``kfuse.sass.optimize_compiled_kernel``. It searches schedules in a separate process, verifies the
best one on ``samples`` random input sets, and only then loads it into the ``CompiledKernel``.

Skipped, each with its reason in the report:
- library steps (cuBLAS, cuDNN, SDPA: no Triton launch);
- steps of several launches;
- kernels taking TMA descriptors (host objects that point at this process's memory, which the
  verifier's worker process cannot rebuild).

The tuned cubin lives in Triton's in-process cache entry for that specialisation. Every later
launch of the same kernel with the same specialisation runs it, including the plan's CUDA graph,
which is captured after this step. Accepted schedules are also cached on disk by cubin hash
(``kfuse.sass.cache``), so a recompile reuses them without a search.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Launch:
    """One Triton launch as ``kfuse.sass`` needs it."""

    fn: Any  # the JITFunction
    kernel: Any  # the CompiledKernel it ran
    args: list[Any]  # every parameter in the kernel's order, constexprs included
    grid: tuple[int, int, int]

    @property
    def name(self) -> str:
        return str(getattr(self.kernel, "name", getattr(self.fn, "__name__", "?")))


def bind_launch(fn: Any, args: Sequence[Any], kwargs: dict[str, Any], grid: Any) -> tuple[list[Any], tuple[int, int, int]]:
    """Every parameter of ``fn`` (a JITFunction) in order, from a ``fn[grid](*args, **kwargs)`` call (launch
    options such as ``num_warps`` dropped, defaults applied), and the grid as three ints."""
    params = list(fn.arg_names)
    sig = inspect.signature(fn.fn)
    bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in params})
    bound.apply_defaults()
    named = dict(bound.arguments)
    missing = [p for p in params if p not in named]
    if missing:
        raise TypeError(f"{fn.__name__}: no value for {', '.join(missing)}")
    g = grid(named) if callable(grid) else grid
    g = tuple(int(x) for x in g) + (1,) * (3 - len(g))
    return [named[p] for p in params], (g[0], g[1], g[2])


@contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every Triton launch made inside the block (JITFunction.run wrapped, then restored)."""
    from triton.runtime.jit import JITFunction

    launches: list[Launch] = []
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        kernel = original(self, *args, grid=grid, warmup=warmup, **kwargs)
        if not warmup and kernel is not None:
            full, g = bind_launch(self, args, kwargs, grid)
            launches.append(Launch(self, kernel, full, g))
        return kernel

    JITFunction.run = run  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        JITFunction.run = original  # type: ignore[method-assign]


def unsupported_reason(launches: Sequence[Launch]) -> str | None:
    """Why a step's launches cannot be tuned, or None."""
    if not launches:
        return "no Triton launch (library or PyTorch step)"
    if len(launches) > 1:
        return f"{len(launches)} Triton launches in one step (tuning takes one kernel at a time)"
    for a in launches[0].args:
        if type(a).__name__ == "TensorDescriptor" or hasattr(a, "block_shape"):
            return "TMA descriptor arguments (the verifier's worker process cannot rebuild them)"
    return None


def tune_plan(
    plan: Any, xs: Sequence[torch.Tensor], kernels: int = 2, samples: int = 10_000, iterations: int = 1000,
    max_seconds: float | None = None, log: Callable[[str], None] | None = None,
    profile: Callable[[Any, Sequence[torch.Tensor]], list[dict[str, Any]]] | None = None,
    optimize: Callable[..., Any] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Tune the SASS schedules of the ``kernels`` hottest tunable Triton kernels of ``plan``; a report.

    ``profile`` / ``optimize`` default to ``kfuse.runtime.profile.profile_plan`` and
    ``kfuse.sass.optimize_compiled_kernel`` (replaceable for tests)."""
    from kfuse.runtime.executor import plan_values

    say = log or (lambda m: None)
    if profile is None:
        from kfuse.runtime.profile import profile_plan as profile
    if optimize is None:
        from kfuse.sass import optimize_compiled_kernel as optimize
    from kfuse.sass.search import SimulatedAnnealing

    t0 = time.perf_counter()
    rows = profile(plan, xs)
    env = plan_values(plan, xs)
    inputs = [[env[v] for v in step.inputs] for step in plan.steps]
    # profile_plan's rows carry "time_ms"; session 10 on the H200 found this read "ms" (absent: every step 0 ms, so
    # the "hottest" steps were taken in plan order). A missing key now fails instead of ranking by zero
    step_times = [float(r["time_ms"]) for r in rows]
    order = sorted(range(len(plan.steps)), key=lambda i: -step_times[i])
    report: dict[str, Any] = {"applied": False, "kernels": [], "skipped": []}
    for i in order:
        if len(report["kernels"]) >= kernels:
            break
        step = plan.steps[i]
        with capture_launches() as launches:
            step.fn(inputs[i])
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        why = unsupported_reason(launches)
        step_ms = step_times[i]
        if why is not None:
            report["skipped"].append({"step": step.output, "ms": step_ms, "reason": why})
            continue
        ln = launches[0]
        say(f"sass: tuning {ln.name} (step {step.output}, {step_ms:.4f} ms)")
        try:
            res = optimize(ln.kernel, ln.args, ln.grid, samples=samples, progress=log is not None,
                           strategy=SimulatedAnnealing(iterations=iterations, max_seconds=max_seconds))  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a kernel the tuner cannot handle is reported, the compile goes on
            report["skipped"].append({"step": step.output, "ms": step_ms, "reason": f"tuner failed: {type(e).__name__}: {str(e)[:160]}"})
            continue
        report["kernels"].append({
            "step": step.output, "kernel": ln.name, "step_ms": step_ms, "accepted": bool(res.accepted), "reason": res.reason,
            "triton_ms": res.triton_ms, "kfuse_ms": res.kfuse_ms, "verified_samples": res.verified_samples,
            "moves_applied": res.moves_applied, "search_s": round(res.search_s, 1), "from_cache": res.from_cache,
        })  # fmt: skip
    report["applied"] = any(k["accepted"] for k in report["kernels"])
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report
