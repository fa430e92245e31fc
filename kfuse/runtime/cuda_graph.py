"""Whole-plan CUDA graphs: capture the plan once per input-shape signature, replay on call.

Inputs are copied into static buffers before replay; outputs are the graph's static output
tensors, cloned so a later call cannot overwrite what the caller holds. If capture fails
(an op that synchronises, a CPU tensor, ...) the runner says why and runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kfuse.runtime.executor import Plan, execute


class CudaGraphRunner:
    def __init__(self, plan: Plan, example_inputs: Sequence[torch.Tensor], warmup: int = 2) -> None:
        self.plan = plan
        self.static_inputs = [x.clone() for x in example_inputs]
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_outputs: list[torch.Tensor] = []
        self.reason = ""
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(warmup):  # compiles Triton kernels before capture
                    execute(plan, self.static_inputs)
            torch.cuda.current_stream().wait_stream(stream)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.static_outputs = execute(plan, self.static_inputs)
            self.graph = g
        except Exception as e:  # capture is an optimisation: report and run eagerly
            self.graph = None
            self.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            torch.cuda.synchronize()

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, inputs: Sequence[torch.Tensor], clone_outputs: bool = True) -> list[torch.Tensor]:
        if self.graph is None:
            return execute(self.plan, inputs)
        for dst, src in zip(self.static_inputs, inputs, strict=True):
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)
        self.graph.replay()
        return [o.clone() for o in self.static_outputs] if clone_outputs else list(self.static_outputs)
