"""Each step's own numerical error, to tell a wrong kernel from error that a deep network amplifies.

The end-to-end check compares the model's output only. In a deep random-weight CNN a 1e-6 rounding difference
per kernel can grow to 1e-4 at the output (torchvision's RegNet-Y-1.6GF, fp32 in the interpreter: every step
within 1.1e-6 of PyTorch, the output 1.2e-4 off), which looks the same as a kernel that is slightly wrong. Here
every step runs on the *reference's* values of its inputs and is compared with the reference's value of its
output: the same optimized graph lowered with ``backend="torch"`` (PyTorch's ops for every node). A wrong kernel
then stands out as itself, and amplification shows as small step errors under a large output error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from kfuse.bench.harness import max_rel_err
from kfuse.runtime.executor import Plan, lower, plan_values


@dataclass(frozen=True)
class StepError:
    index: int  # the step's position in the plan
    output: str  # the value it writes
    template: str  # the kernel that wrote it
    shape: tuple[int, ...]
    rel_err: float  # max |kfuse - reference| / max |reference| over the step's output

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def step_errors(plan: Plan, inputs: Sequence[Any], reference: Plan | None = None) -> tuple[list[StepError], float]:
    """Every floating-point step's own error, in plan order, and the output's error when the whole plan runs
    on ``inputs`` (the first graph output). ``reference``: the plan to compare with (default: ``plan``'s graph
    lowered for PyTorch on the inputs' device)."""
    if reference is None:
        device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
        reference = lower(plan.graph, device, "torch")
    with torch.no_grad():
        ref = plan_values(reference, inputs)
        rows = []
        for i, step in enumerate(plan.steps):
            want = ref.get(step.output)
            if not (isinstance(want, torch.Tensor) and want.is_floating_point()):
                continue
            got = step.fn([ref[v] for v in step.inputs])
            if isinstance(got, torch.Tensor):
                rows.append(StepError(i, step.output, step.info.template, tuple(want.shape), max_rel_err(got.float(), want.float())))
        whole = plan_values(plan, inputs)
    out = plan.graph.outputs[0]
    return rows, max_rel_err(whole[out].float(), ref[out].float())


def worst(rows: Sequence[StepError], top: int = 10) -> list[StepError]:
    """The ``top`` steps with the largest error, largest first."""
    return sorted(rows, key=lambda r: r.rel_err, reverse=True)[:top]
