"""Forward writes into its inputs or buffers: a static KV cache, a step counter.

The functionalised graph computes each written tensor's new value as an output
(``Imported.input_writes``: output position -> input position). After a run the plan writes that
value back into the input, so the caller's tensor (or the module's buffer) changes as it does in
eager PyTorch. Only the caller's other outputs are returned.

A write-back is a copy of the whole tensor, and the functional form of a cache update
(``index_copy(cache, 2, pos, k)``) is a second one: for a decoder's KV cache, two copies of every
layer's cache per generated token. ``write_in_place`` removes both where it is exact: a fallback
step that computes the new value as ``index_copy`` / ``index_put`` / ``copy`` of the old one, where
nothing else reads the old one, runs as ``index_copy_`` / ``index_put_`` / ``copy_`` on the input
itself, and its value *is* the input. The write-back then finds the value already in place.

Whoever runs a plan that writes its inputs for its own purposes (timing, capture warm-up, the
compile's check) runs it on clones of the written inputs (``protect``): a compile never changes
state; the call after it does, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kfuse.runtime.executor import KernelInfo, Plan, Step

# functional op -> the in-place overload that writes its first argument with the same result
IN_PLACE = {
    "aten.index_copy.default": torch.ops.aten.index_copy_.default,
    "aten.index_put.default": torch.ops.aten.index_put_.default,
    "aten.copy.default": torch.ops.aten.copy_.default,
}


def written_positions(plan: Plan) -> list[int]:
    """The graph input positions that a run writes."""
    return sorted({i for _, i in plan.input_writes})


def protect(xs: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    """``xs`` with the written inputs replaced by clones, for runs that must not change the caller's state."""
    out = list(xs)
    for i in positions:
        out[i] = out[i].clone()
    return out


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def write_back(plan: Plan, env: dict[str, Any], inputs: Sequence[torch.Tensor]) -> None:
    """Copy each written value into its input, unless a step already wrote it there (``write_in_place``)."""
    for o, i in plan.input_writes:
        value, dst = env[plan.graph.outputs[o]], inputs[i]
        if not _same_tensor(value, dst):
            dst.copy_(value)


def user_outputs(plan: Plan, outs: list[Any]) -> list[Any]:
    """The outputs the caller sees: all but the written values' positions."""
    if not plan.input_writes:
        return outs
    skip = {o for o, _ in plan.input_writes}
    return [x for k, x in enumerate(outs) if k not in skip]


def _in_place_step(step: Step, call: Any, inplace: Any) -> Step:
    """``step`` run as the in-place overload on its first operand (the written input), which is its value."""

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        return call.call_as(inplace, xs)

    written = step.inputs[call.first_operand()]
    info = KernelInfo(step.info.name, "in_place", step.info.ops, config=f"writes input {written}")
    return Step(step.output, step.inputs, run, info, step.host_sync)


def write_in_place(plan: Plan) -> list[dict[str, Any]]:
    """Turn each write whose value is an in-place-able update of its input into that in-place update
    (see the module doc); returns, per write, what runs: ``in place`` or ``copied back`` and why."""
    graph = plan.graph
    nodes = graph.node_map()
    readers: dict[str, int] = {}
    for s in plan.steps:
        for v in s.inputs:
            readers[v] = readers.get(v, 0) + 1
    targets = [i for _, i in plan.input_writes]
    result = []
    for o, i in plan.input_writes:
        name = graph.inputs[i][0]
        value = graph.outputs[o]
        at = next((k for k, s in enumerate(plan.steps) if s.output == value), None)
        why = ""
        node = nodes.get(value)
        call = node.attrs.get("fn") if node is not None and node.op == "fallback" else None
        inplace = IN_PLACE.get(node.attrs.get("target", "")) if call is not None else None
        if at is None or call is None or not hasattr(call, "call_as"):
            why = "the new value is not a fallback step's (a kfuse kernel computes it into its own buffer)"
        elif inplace is None:
            why = f"{node.attrs['target']} has no in-place form here"
        elif call.first_operand() is None or plan.steps[at].inputs[call.first_operand()] != name:
            why = "the update does not start from the input's old value"
        elif readers.get(name, 0) != 1 or plan.steps[at].inputs.count(name) != 1:
            why = "other steps read the input's old value"
        elif targets.count(i) != 1 or name in graph.outputs:
            why = "the input is written twice or returned"
        elif node.type != graph.inputs[i][1]:
            why = "the new value's type differs from the input's"
        if why:
            result.append({"input": name, "value": value, "how": "copied back", "why": why})
            continue
        plan.steps[at] = _in_place_step(plan.steps[at], call, inplace)
        result.append({"input": name, "value": value, "how": "in place", "op": node.attrs["target"]})
    return result
