"""Lowering a graph to a kernel plan, and executing the plan.

Each node becomes a ``Step``: a kfuse kernel (fused GEMM + epilogue, ...) where a template
covers it and a backend can run it, else the op's PyTorch implementation (or the original
op, for fallback nodes). Intermediate values are released after their last use.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, Node
from kfuse.kernels import pdl
from kfuse.runtime import parallel_compile
from kfuse.runtime.device import first_device


@dataclass(frozen=True)
class KernelInfo:
    """What the report says about one launch: which ops it covers and how it runs."""

    name: str
    template: str  # "gemm_epilogue", "torch", "fallback", ...
    ops: tuple[str, ...]
    config: str = ""
    epilogue: str = ""

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "template": self.template, "ops": list(self.ops)}
        if self.config:
            d["config"] = self.config
        if self.epilogue:
            d["epilogue"] = self.epilogue
        return d


@dataclass
class Step:
    output: str
    inputs: tuple[str, ...]
    fn: Callable[[list[torch.Tensor]], Any]
    info: KernelInfo
    host_sync: bool = False  # reads a device value on the host (no CUDA-graph capture around it)


@dataclass
class Plan:
    graph: Graph
    steps: list[Step]
    backend: str  # "triton" (GPU), "triton-interpreter" (CPU) or "torch"
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    release_after: list[list[str]] = field(default_factory=list)
    # static memory plan (kfuse.passes.memory_plan): built on the first execute when enabled
    use_memory_plan: bool = True
    memory: Any = None  # MemoryPlan
    arena: torch.Tensor | None = None  # the device bytes planned buffers live in
    out_buffers: dict[str, torch.Tensor] = field(default_factory=dict)  # value -> its planned tensor
    pdl: bool = False  # kernels launched with programmatic dependent launch (Options.pdl, kfuse.kernels.pdl)
    concat_groups: list[Any] = field(default_factory=list)  # cats served as views of one buffer (kfuse.runtime.concat_in_place)
    # (graph output position, graph input position): a run writes that output's value into that input and returns
    # the other outputs (kfuse.runtime.state_writes)
    input_writes: tuple[tuple[int, int], ...] = ()

    @property
    def kernels(self) -> list[KernelInfo]:
        return [s.info for s in self.steps]


def choose_backend(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton-interpreter"
    return "torch"


Lowering = Callable[..., Step | None]  # (node, graph, backend[, options=])
LOWERINGS: dict[str, Lowering] = {}


def lowering(op: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        LOWERINGS[op] = fn
        return fn

    return deco


@lowering("gemm_epilogue")
def _lower_gemm(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    # the template's own lowering (tuned config, batched/transposed operands, split-K)
    from kfuse.kernels.gemm import lower_gemm_epilogue

    return lower_gemm_epilogue(node, graph, backend, options)


@lowering("max_pool2d")
def _lower_max_pool(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.pool import lower_max_pool2d

    return lower_max_pool2d(node, graph, backend, options)


@lowering("avg_pool2d")
def _lower_avg_pool(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.pool import lower_avg_pool2d

    return lower_avg_pool2d(node, graph, backend, options)


@lowering("group_norm")
def _lower_group_norm(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.group_norm import lower_group_norm

    return lower_group_norm(node, graph, backend, options)


@lowering("adaptive_avg_pool2d")
def _lower_global_pool(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.global_pool import lower_global_avg_pool

    return lower_global_avg_pool(node, graph, backend, options)


@lowering("upsample2d")
def _lower_upsample(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.resize import lower_upsample2d

    return lower_upsample2d(node, graph, backend, options)


@lowering("gather_rows")
def _lower_gather_rows(node: Node, graph: Graph, backend: str, options: Any = None) -> Step | None:
    from kfuse.kernels.gather_rows import lower_gather_rows

    return lower_gather_rows(node, graph, backend, options)


def _torch_step(node: Node) -> Step:
    d = ops.get(node.op)
    attrs = node.attrs
    if node.op == "fallback":
        info = KernelInfo(node.name, "fallback", (attrs["target"],))
    elif d.kind == ops.FUSED:
        info = KernelInfo(node.name, "torch", tuple(attrs.get("fused_ops", (node.op,))))
    else:
        info = KernelInfo(node.name, "torch", (node.op,))
    ref = d.reference
    return Step(node.name, node.inputs, lambda xs: ref(xs, attrs), info)


def _takes_options(fn: Lowering) -> bool:
    try:
        return "options" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def lower(graph: Graph, device: torch.device, backend: str | None = None, options: Any = None) -> Plan:
    """Turn an optimised graph into a plan of steps for ``device``. ``options`` (the compile
    ``Options``) is passed to the lowerings that take an ``options`` parameter."""
    backend = backend or choose_backend(device)
    steps: list[Step] = []
    for node in graph.nodes:
        step = None
        if node.op in LOWERINGS:
            fn = LOWERINGS[node.op]
            step = fn(node, graph, backend, options=options) if _takes_options(fn) else fn(node, graph, backend)
        steps.append(step or _torch_step(node))
    groups: list[Any] = []
    if getattr(options, "concat_in_place", True):
        from kfuse.runtime.concat_in_place import place_concats

        groups = place_concats(graph, steps)
    constants = {k: v.to(device) for k, v in graph.constants.items()}
    plan = Plan(graph, steps, backend, constants, pdl=pdl_wanted(getattr(options, "pdl", False)) and backend == "triton")
    plan.concat_groups = groups
    plan.release_after = _liveness(graph, steps)
    return plan


def _liveness(graph: Graph, steps: list[Step]) -> list[list[str]]:
    """For each step, the values whose last reader it is (never inputs, constants or outputs);
    a value nobody reads is released right after the step that makes it."""
    keep = set(graph.outputs) | set(graph.input_names) | set(graph.constants)
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        last.setdefault(s.output, i)
        for v in s.inputs:
            last[v] = i
    out: list[list[str]] = [[] for _ in steps]
    for v, i in last.items():
        if v not in keep:
            out[i].append(v)
    return out


def _prepare_memory(plan: Plan, device: torch.device) -> dict[str, torch.Tensor]:
    """The planned output tensors (arena views) for ``device``; built once per plan."""
    if not plan.use_memory_plan:
        return {}
    if plan.arena is not None and plan.arena.device == device:
        return plan.out_buffers
    from kfuse.passes.memory_plan import arena_view, plan_memory

    if plan.memory is None:
        plan.memory = plan_memory(plan)
    mp = plan.memory
    plan.arena = torch.empty(max(mp.arena_bytes, 1), dtype=torch.uint8, device=device)
    types = {n.name: n.type for n in plan.graph.nodes}
    plan.out_buffers = {v: arena_view(plan.arena, mp.buffers[b], types[v]) for v, b in mp.value_buffer.items()}
    return plan.out_buffers


def execute(plan: Plan, inputs: Sequence[torch.Tensor], *, poison_dead: bool = False) -> list[torch.Tensor]:
    """Run ``plan`` on ``inputs`` (in graph input order); returns the graph outputs.

    Steps with a planned buffer write into the arena (``fn(xs, out)``); the others allocate.
    ``poison_dead`` fills each planned buffer with NaN bytes when its lifetime ends, so a plan
    that shared storage between live values would show in the numerics (tests use it)."""
    env = initial_env(plan, inputs)
    run_steps(plan, env, 0, len(plan.steps), poison_dead=poison_dead)
    outputs = list(plan.graph.outputs)
    if plan.input_writes:  # forward writes its inputs: the new values go there, the caller gets the rest
        from kfuse.runtime.state_writes import user_outputs, write_back

        write_back(plan, env, inputs)
        outputs = user_outputs(plan, outputs)
    # constants that are outputs themselves (folding leaves views of constants as new constants)
    consts = [plan.constants[o] for o in outputs if o in plan.constants]
    return own_outputs([env[o] for o in outputs], [*inputs, *consts])


def own_outputs(outs: list[Any], held: Sequence[Any]) -> list[Any]:
    """The outputs as tensors the caller owns: an output that shares storage with an input or a
    constant (``clone`` imports as identity, folding makes constants outputs), or that is another
    output again, is copied. Otherwise a caller writing into one result would change its input, the
    model's constants (every later call) or another result."""
    seen = {t.untyped_storage().data_ptr() for t in held if isinstance(t, torch.Tensor) and t.numel()}
    owned = []
    for t in outs:
        if isinstance(t, torch.Tensor) and t.numel():
            ptr = t.untyped_storage().data_ptr()
            if ptr in seen:
                t = t.clone()
                ptr = t.untyped_storage().data_ptr()
            seen.add(ptr)
        owned.append(t)
    return owned


def initial_env(plan: Plan, inputs: Sequence[torch.Tensor]) -> dict[str, Any]:
    """Constants and graph inputs by name: the values a plan starts from."""
    env: dict[str, Any] = dict(plan.constants)
    for (name, _), x in zip(plan.graph.inputs, inputs, strict=True):
        env[name] = x
    return env


def plan_values(plan: Plan, inputs: Sequence[Any]) -> dict[str, Any]:
    """Every value of one run of ``plan`` on ``inputs``, by name (no memory plan, nothing released):
    what a tool needs to run any single step again on its real inputs."""
    env: dict[str, Any] = dict(plan.constants)
    for (name, _), x in zip(plan.graph.inputs, inputs, strict=True):
        env[name] = x
    with torch.no_grad():
        for step in plan.steps:
            env[step.output] = step.fn([env[v] for v in step.inputs])
    return env


def pdl_wanted(setting: bool | str) -> bool:
    """``Options.pdl``: True, False or "auto" (on, then timed off by ``kfuse.runtime.pdl_choice``)."""
    if setting not in (True, False, "auto"):
        raise ValueError(f"Options.pdl must be True, False or 'auto', got {setting!r}")
    return setting is not False


def precompile_plan(plan: Plan, inputs: Sequence[torch.Tensor]) -> parallel_compile.PrecompileReport:
    """Compile the kernels of ``plan``'s first run on worker processes (``parallel_compile``):
    its steps run once with every Triton compile recorded and skipped, up to the first step that
    reads a device value on the host (after it, skipped kernels' outputs would steer the host).
    Returns the ``PrecompileReport``."""
    env = initial_env(plan, inputs)

    def run(i: int) -> None:
        step = plan.steps[i]
        env[step.output] = step.fn([env[v] for v in step.inputs])

    def release(i: int) -> None:
        for v in plan.release_after[i]:
            env.pop(v, None)

    def calls() -> Any:
        for i, step in enumerate(plan.steps):
            if step.host_sync:
                return
            yield functools.partial(run, i)
            release(i)

    with pdl.scope(plan.pdl), torch.no_grad():
        return parallel_compile.precompile(calls())


def run_steps(plan: Plan, env: dict[str, Any], lo: int, hi: int, *, poison_dead: bool = False) -> None:
    """Run steps ``[lo, hi)`` of ``plan`` on ``env`` in place (values are released after their
    last use). Split out so a runner can capture a run of steps as one CUDA graph."""
    tensors = [env.get(n) for n, _ in plan.graph.inputs] + list(plan.constants.values())
    device = first_device(tensors)
    outs = _prepare_memory(plan, device)
    dead_buffers = plan.memory.dead_after if (poison_dead and outs) else None
    with pdl.scope(plan.pdl):
        for i in range(lo, hi):
            step, dead = plan.steps[i], plan.release_after[i]
            xs = [env[v] for v in step.inputs]
            buf = outs.get(step.output)
            env[step.output] = step.fn(xs) if buf is None else step.fn(xs, buf)
            for v in dead:
                del env[v]
            if dead_buffers is not None and plan.arena is not None:
                for k in dead_buffers[i]:
                    b = plan.memory.buffers[k]
                    plan.arena[b.offset : b.offset + b.nbytes].fill_(255)
