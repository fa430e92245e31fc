"""Forward writes into its inputs or buffers: a static KV cache, a step counter.

The functionalised graph computes each written tensor's new value as an output
(``Imported.input_writes``: output position -> input position). After a run the plan writes that
value back into the input, so the caller's tensor (or the module's buffer) changes as it does in
eager PyTorch. Only the caller's other outputs are returned.

A write-back is a copy of the whole tensor, and the functional form of a cache update
(``index_copy(cache, 2, pos, k)``) is a second one: for a decoder's KV cache, two copies of every
layer's cache per generated token. ``write_in_place`` removes both where it is exact, that is where no
step at or after the write reads the old value (or a view of it):

- a fallback step that computes the new value as ``index_copy`` / ``index_put`` / ``copy`` of the old
  one runs as ``index_copy_`` / ``index_put_`` / ``copy_`` on the input itself;
- an elementwise kfuse kernel writes into the operand, and PyTorch's ``add`` / ``sub`` / ... take
  ``out=`` it (a cache's int64 length counter).

The step's value *is* then the input, and the write-back finds it already in place.

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


# elementwise ops that PyTorch runs for a plan (integer counters: kfuse's kernels compute in floating point) and
# that take ``out=``, which may be one of their operands
TORCH_OUT = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum}


# in-place updates of many tensors by one scalar, one launch for all (``batch_scalar_updates``)
FOREACH = {"add": torch._foreach_add_, "sub": torch._foreach_sub_, "mul": torch._foreach_mul_}


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


def _rerun(step: Step, run: Any, template: str, config: str) -> Step:
    """``step`` with another function (its in-place form) and what the report says of it."""
    return Step(
        step.output, step.inputs, run, KernelInfo(step.info.name, template, step.info.ops, config, step.info.epilogue), step.host_sync
    )


def _how(plan: Plan, at: int | None, node: Any, name: str) -> tuple[Step | None, str]:
    """The step that makes the new value in place, or why there is none (the value is then copied back)."""
    if at is None or node is None:
        return None, "the new value is not computed by a step of its own"
    step = plan.steps[at]
    call = node.attrs.get("fn") if node.op == "fallback" else None
    if call is not None and hasattr(call, "call_as"):
        inplace = IN_PLACE.get(node.attrs.get("target", ""))
        if inplace is None:
            return None, f"{node.attrs['target']} has no in-place form here"
        if call.first_operand() is None or step.inputs[call.first_operand()] != name:
            return None, "the update does not start from the input's old value"
        return _rerun(step, lambda xs: call.call_as(inplace, xs), "in_place", f"writes input {name}"), ""
    in_place = getattr(step.fn, "in_place", None)  # a step with an in-place form on its first input (cache_write)
    if in_place is not None and step.inputs and step.inputs[0] == name:
        return _rerun(step, in_place, step.info.template, f"{step.info.config}; in place into input {name}"), ""
    # an elementwise kernel reads each element before it writes it: it may write into the operand
    slots = [j for j in getattr(step.fn, "inplace_inputs", ()) if step.inputs[j] == name]
    if slots:
        fn, j = step.fn, slots[0]
        return _rerun(step, lambda xs: fn(xs, xs[j]), step.info.template, f"{step.info.config}; into input {name}"), ""
    if step.info.template == "torch" and node.op in TORCH_OUT and len(step.inputs) == 2:  # a cache's int64 length counter
        fn, j = TORCH_OUT[node.op], step.inputs.index(name)

        def run(xs: list[torch.Tensor]) -> torch.Tensor:
            return fn(xs[0], xs[1], out=xs[j])

        other = plan.constants.get(step.inputs[1 - j])
        if other is not None and other.dim() == 0 and node.op in FOREACH and (node.op != "sub" or j == 0):
            run.scalar_update = (node.op, j, other.item())  # type: ignore[attr-defined]  # batch_scalar_updates
        return _rerun(step, run, "torch", f"into input {name}"), ""
    return None, f"a {step.info.template} step computes it into its own buffer"


def _read_after(plan: Plan, name: str, at: int) -> bool:
    """Whether a step other than ``at`` reads ``name`` (or a view of it) at or after ``at``: then writing the new
    value into ``name``'s storage at ``at`` would change what it reads. Readers before ``at`` have read it
    (one stream: a step starts after the ones before it end; PDL kernels wait for them first)."""
    return any(k > at for k in _readers_of_old_value(plan, name, skip=at))


def _readers_of_old_value(plan: Plan, name: str, skip: int | None = None) -> list[int]:
    """Positions of the steps (but ``skip``) that read ``name`` or a view of it: a view of the old value, read
    later, would see a new value written into its storage."""
    from kfuse.passes.memory_plan import may_alias

    aliases, found = {name}, []
    for k, s in enumerate(plan.steps):
        if k != skip and aliases.intersection(s.inputs):
            found.append(k)
            if may_alias(plan.graph, s.output):
                aliases.add(s.output)
    return found


def sink_unread_updates(plan: Plan) -> list[str]:
    """Move each step that computes a written input's new value that no step reads to just after the last step
    that reads the input's old value (or a view of it), so that its in-place form is exact there
    (``_read_after``). transformers' static cache bumps a layer's length counter before that layer's cache write
    reads the length (``kfuse.passes.fuse_cache_write`` folds the positions' add into the write). Exact: the
    moved value is read by no step (it is only written back), the input is written by this step alone, and its
    other operands are no written input, so no step between changes them (a run writes nothing else). Returns
    the moved values."""
    graph = plan.graph
    written = [graph.inputs[i][0] for _, i in plan.input_writes]
    readers = {v for s in plan.steps for v in s.inputs}
    moved = []
    for o, i in plan.input_writes:
        name, value = graph.inputs[i][0], graph.outputs[o]
        at = next((k for k, s in enumerate(plan.steps) if s.output == value), None)
        if at is None or value in readers or written.count(name) != 1:
            continue
        step = plan.steps[at]
        if name not in step.inputs or any(v in written and v != name for v in step.inputs):
            continue
        later = [k for k in _readers_of_old_value(plan, name, skip=at) if k > at]
        if not later:
            continue
        plan.steps.insert(later[-1], plan.steps.pop(at))  # after the pop, index later[-1] is just past that reader
        moved.append(value)
    if moved:
        from kfuse.runtime.executor import _liveness

        plan.release_after = _liveness(graph, plan.steps)
    return moved


def write_in_place(plan: Plan, pair: bool = True) -> list[dict[str, Any]]:
    """Make each written value in its input where that is exact (see the module doc); returns, per write,
    what runs: ``in place`` (and the op), or ``copied back`` and why. ``pair``: cache writes at the same
    positions share a launch (``pair_cache_writes``)."""
    sink_unread_updates(plan)
    graph = plan.graph
    nodes = graph.node_map()
    targets = [i for _, i in plan.input_writes]
    position = {s.output: k for k, s in enumerate(plan.steps)}
    result = []
    for o, i in plan.input_writes:
        name = graph.inputs[i][0]
        value = graph.outputs[o]
        at = position.get(value)
        node = nodes.get(value)
        step, why = None, ""
        if at is None or plan.steps[at].inputs.count(name) != 1 or _read_after(plan, name, at):
            why = "a later step reads the input's old value"
        elif targets.count(i) != 1 or name in graph.outputs:
            why = "the input is written twice or returned"
        elif node is not None and node.type != graph.inputs[i][1]:
            why = "the new value's type differs from the input's"
        else:
            step, why = _how(plan, at, node, name)
        if step is None:
            result.append({"input": name, "value": value, "how": "copied back", "why": why})
            continue
        plan.steps[at] = step  # type: ignore[index]
        op = node.attrs.get("target") if node.op == "fallback" else node.op  # type: ignore[union-attr]
        result.append({"input": name, "value": value, "how": "in place", "op": op})
    batched = batch_scalar_updates(plan)
    paired = pair_cache_writes(plan) if pair else {}
    for r in result:
        if r["value"] in batched:
            r["batched"] = batched[r["value"]]
        if r["value"] in paired:
            r["paired"] = paired[r["value"]]
    return result


def pair_cache_writes(plan: Plan) -> dict[str, str]:
    """A layer's two in-place cache writes at the same positions (its keys, rotated or not, and its values) in one
    launch (``rotary.write_rows_pair``): the later write moves into the earlier one's step, and its own step only
    names the cache it has written (a view). Only where the later write's operands are all made before the
    earlier step, no step between them reads the later write's cache (it would see the new rows early) or writes
    one of its operands, at most one of the two rotates, and both have one index, offset and shapes. Returns, per
    moved value, the step that writes it."""
    from kfuse.kernels.rotary import write_rows_pair

    steps, graph = plan.steps, plan.graph
    made_at = {s.output: k for k, s in enumerate(steps)}
    written_at = {graph.inputs[i][0]: made_at[graph.outputs[o]] for o, i in plan.input_writes if graph.outputs[o] in made_at}
    paired: dict[str, str] = {}
    used: set[int] = set()
    for i, first in enumerate(steps):
        a = getattr(first.fn, "rows_write", None)
        if a is None or i in used:
            continue
        for j in range(i + 1, len(steps)):
            b = getattr(steps[j].fn, "rows_write", None)
            if b is None or j in used or not _pairable(plan, i, j, a, b, made_at, written_at):
                continue
            second = steps[j]
            rot, plain = (first, second) if not b["rotate"] else (second, first)
            spec = a if rot is first else b
            n_rot = len(rot.inputs)

            def run(xs: list[torch.Tensor], n_rot: int = n_rot, spec: dict = spec, first_is_rot: bool = rot is first) -> torch.Tensor:
                r, p = xs[:n_rot], xs[n_rot:]
                cos, sin = (r[3], r[4]) if spec["rotate"] else (None, None)
                write_rows_pair(r[2], r[0], p[2], p[0], r[1], cos, sin, rotary_dims=spec["rotary_dims"],
                                interleaved=spec["interleaved"], index_offset=r[-1] if spec["offset"] else None)  # fmt: skip
                return r[0] if first_is_rot else p[0]

            info = KernelInfo(first.info.name, first.info.template, (*first.info.ops, *second.info.ops),
                              f"{first.info.config} + {second.output}'s rows in the same launch")  # fmt: skip
            steps[i] = Step(first.output, (*rot.inputs, *plain.inputs), run, info, first.host_sync)
            view = KernelInfo(second.info.name, "view", second.info.ops, f"written with {first.output}")
            steps[j] = Step(second.output, (second.inputs[0],), lambda xs: xs[0], view, second.host_sync)
            paired[second.output] = first.output
            used |= {i, j}
            break
    if paired:
        from kfuse.runtime.executor import _liveness

        plan.release_after = _liveness(graph, plan.steps)
    return paired


def _pairable(plan: Plan, i: int, j: int, a: dict, b: dict, made_at: dict[str, int], written_at: dict[str, int]) -> bool:
    """Whether cache write ``j`` may run inside step ``i`` (see ``pair_cache_writes``)."""
    first, second = plan.steps[i], plan.steps[j]
    if (a["rotate"] and b["rotate"]) or a["offset"] != b["offset"] or first.inputs[1] != second.inputs[1]:
        return False
    if a["offset"] and first.inputs[-1] != second.inputs[-1]:
        return False
    graph = plan.graph
    if graph.type_of(first.inputs[0]) != graph.type_of(second.inputs[0]):
        return False
    tx, ty = graph.type_of(first.inputs[2]), graph.type_of(second.inputs[2])
    if getattr(tx, "shape", None) != getattr(ty, "shape", None) or getattr(tx, "dtype", None) != getattr(ty, "dtype", None):
        return False
    if any(made_at.get(v, -1) >= i for v in second.inputs):  # an operand made after the first write
        return False
    if any(i < written_at.get(v, -1) < j for v in second.inputs):  # an operand written in place in between
        return False
    return not any(i < k < j for k in _readers_of_old_value(plan, second.inputs[0], skip=j))


def batch_scalar_updates(plan: Plan) -> dict[str, str]:
    """Counters a plan bumps in place by the same scalar (transformers' static cache keeps a length per layer: 22
    one-element int64 adds a decode step, each a launch), bumped together by one ``torch._foreach_add_`` at the
    last of them. Only updates whose new value no step reads: the old value's readers all come before its own
    update (``_read_after``), so before the last one too. Returns, per deferred value, the step that runs it."""
    readers = {v for s in plan.steps for v in s.inputs}
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, s in enumerate(plan.steps):
        spec = getattr(s.fn, "scalar_update", None)
        if spec is not None and s.output not in readers:
            groups.setdefault((spec[0], spec[2], plan.graph.type_of(s.inputs[spec[1]])), []).append(k)
    batched: dict[str, str] = {}
    for (op, scalar, _), ks in groups.items():
        if len(ks) < 2:
            continue
        targets = tuple(plan.steps[k].inputs[plan.steps[k].fn.scalar_update[1]] for k in ks)  # type: ignore[attr-defined]
        last = plan.steps[ks[-1]]
        for k, t in zip(ks[:-1], targets[:-1], strict=True):  # no launch here: the value is the input, bumped later
            s = plan.steps[k]
            plan.steps[k] = Step(
                s.output, (t,), lambda xs: xs[0], KernelInfo(s.info.name, "view", s.info.ops, f"{op} deferred to {last.output}")
            )
            batched[s.output] = last.output

        def run(xs: list[torch.Tensor], op: str = op, scalar: Any = scalar) -> torch.Tensor:
            FOREACH[op](xs, scalar)
            return xs[-1]

        info = KernelInfo(last.info.name, "torch", last.info.ops, f"_foreach_{op}_ of {len(ks)} inputs: {', '.join(targets)}")
        plan.steps[ks[-1]] = Step(last.output, targets, run, info, last.host_sync)
        batched[last.output] = last.output
    return batched
