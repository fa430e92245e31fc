"""Piecewise CUDA graphs: capture the runs of steps between host-synchronising steps.

A plan with a step that reads a device value on the host (``Step.host_sync``: the padding-free
region needs the valid-token count to size its tensors) cannot be captured whole. Launched
eagerly instead, every step pays its Python launch cost, and for BERT at B=32, S=128 that was
as much time as the GPU work. This runner captures each maximal run of ordinary steps as its
own CUDA graph and runs only the host-sync steps eagerly between replays:

    [graph 0] -> sync step (eager; its outputs copied into static buffers) -> [graph 1] -> ...

Values that cross a boundary live in static tensors held by the runner, so each graph reads and
writes fixed addresses. Each segment is replayed right after its capture, so the host-sync step
that follows sees real data during set-up. As with ``CudaGraphRunner``, capture is an
optimisation: any failure leaves ``reason`` set and the caller runs the plan eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.runtime.cuda_graph import Signature, own_cublas_workspace, recover_after_failed_capture, save_rng, signature, why
from kfuse.runtime.executor import Plan, execute, initial_env, run_steps
from kfuse.runtime.output_copy import fresh_copies


@dataclass
class Segment:
    """Steps ``[lo, hi)``; ``sync`` segments hold one host-sync step and are never captured."""

    lo: int
    hi: int
    sync: bool
    graph: Any = None
    sync_inputs: list[Any] = field(default_factory=list)  # static tensors the sync step reads
    sync_output: Any = None  # static copy of the sync step's output (tensor or tuple)


def segments(plan: Plan) -> list[Segment]:
    """Split the plan's steps at host-sync steps (pure: depends only on the step flags)."""
    out: list[Segment] = []
    lo = 0
    for i, step in enumerate(plan.steps):
        if step.host_sync:
            if i > lo:
                out.append(Segment(lo, i, False))
            out.append(Segment(i, i + 1, True))
            lo = i + 1
    if lo < len(plan.steps):
        out.append(Segment(lo, len(plan.steps), False))
    return out


def _static_copy(y: Any) -> Any:
    if isinstance(y, torch.Tensor):
        return y.clone()
    if isinstance(y, (tuple, list)):
        return type(y)(_static_copy(v) for v in y)
    raise TypeError(f"host-sync step output of type {type(y).__name__} cannot be kept in a static buffer")


def _copy_into(dst: Any, src: Any) -> None:
    if isinstance(dst, torch.Tensor):
        if dst.shape != src.shape:
            raise RuntimeError(f"host-sync step output changed shape: {tuple(src.shape)} vs captured {tuple(dst.shape)}")
        dst.copy_(src)
        return
    for d, s in zip(dst, src, strict=True):
        _copy_into(d, s)


class PiecewiseGraphRunner:
    """Runs ``plan`` as CUDA graphs around its host-sync steps (see the module docstring)."""

    def __init__(self, plan: Plan, example_inputs: Sequence[torch.Tensor], warmup: int = 2, cuda: Any = None) -> None:
        self.plan = plan
        self.cuda = cuda if cuda is not None else torch.cuda
        self.signature: Signature = signature(example_inputs)
        self.segments = segments(plan)
        self.static_inputs: list[torch.Tensor] = []
        self.static_outputs: list[torch.Tensor] = []
        self.reason = ""
        self.replays = 0
        self.eager_calls = 0
        self._captured = False
        if not any(s.sync for s in self.segments):
            self.reason = "no host-sync step: use the whole-plan CUDA graph"
            return
        rng = save_rng(self.cuda)
        try:
            self._capture(example_inputs, warmup)
            self._captured = True
        except Exception as e:  # capture is an optimisation: report and run eagerly
            for s in self.segments:
                s.graph = None
            self.reason = why(e) + recover_after_failed_capture(self.cuda, rng)

    @property
    def captured(self) -> bool:
        return self._captured

    @property
    def graphs(self) -> int:
        return sum(1 for s in self.segments if s.graph is not None)

    def _capture(self, example_inputs: Sequence[torch.Tensor], warmup: int) -> None:
        cuda, plan = self.cuda, self.plan
        self.static_inputs = [x.clone() for x in example_inputs]
        stream = cuda.Stream()
        stream.wait_stream(cuda.current_stream())
        with cuda.stream(stream):  # compiles kernels, builds the arena and the sync steps' own graphs
            for _ in range(max(1, warmup)):
                execute(plan, self.static_inputs)
        cuda.current_stream().wait_stream(stream)
        cuda.synchronize()
        env = initial_env(plan, self.static_inputs)
        for seg in self.segments:
            if seg.sync:
                step = plan.steps[seg.lo]
                seg.sync_inputs = [env[v] for v in step.inputs]
                run_steps(plan, env, seg.lo, seg.hi)
                y = env[step.output]
                # an output in the planned arena already has a fixed address; others get one
                seg.sync_output = env[step.output] = y if y is plan.out_buffers.get(step.output) else _static_copy(y)
                continue
            g = cuda.CUDAGraph()
            own_cublas_workspace(cuda)
            with cuda.graph(g, stream=stream):  # the warm-up stream, on this device (CudaGraphRunner._capture says why)
                run_steps(plan, env, seg.lo, seg.hi)
            g.replay()  # real values for the host-sync step that follows
            seg.graph = g
        self.static_outputs = [env[o] for o in plan.graph.outputs]

    def __call__(self, inputs: Sequence[torch.Tensor], clone_outputs: bool | Sequence[bool] = True) -> list[torch.Tensor]:
        if not self._captured or signature(inputs) != self.signature:
            self.eager_calls += 1
            return execute(self.plan, inputs)
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        for seg in self.segments:
            if seg.graph is not None:
                seg.graph.replay()
            else:
                step = self.plan.steps[seg.lo]
                buf = self.plan.out_buffers.get(step.output)
                y = step.fn(list(seg.sync_inputs)) if buf is None else step.fn(list(seg.sync_inputs), buf)
                if y is not seg.sync_output:
                    _copy_into(seg.sync_output, y)
        self.replays += 1
        return fresh_copies(self.static_outputs, clone_outputs)  # the next replay overwrites them

    def stats(self) -> dict[str, Any]:
        return {
            "captured": self.captured,
            "piecewise": True,
            "graphs": self.graphs,
            "host_sync_steps": sum(1 for s in self.segments if s.sync),
            "reason": self.reason,
            "replays": self.replays,
            "eager_calls": self.eager_calls,
        }
