"""Lowering a graph to a kernel plan, and executing the plan.

Each node becomes a ``Step``: a kfuse kernel (fused GEMM + epilogue, ...) where a template
covers it and a backend can run it, else the op's PyTorch implementation (or the original
op, for fallback nodes). Intermediate values are released after their last use.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kfuse.ir import ops
from kfuse.ir.graph import Graph, Node, TensorType


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


@dataclass
class Plan:
    graph: Graph
    steps: list[Step]
    backend: str  # "triton" (GPU), "triton-interpreter" (CPU) or "torch"
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    release_after: list[list[str]] = field(default_factory=list)

    @property
    def kernels(self) -> list[KernelInfo]:
        return [s.info for s in self.steps]


def choose_backend(device: torch.device) -> str:
    if device.type == "cuda":
        return "triton"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "triton-interpreter"
    return "torch"


Lowering = Callable[[Node, Graph, str], Step | None]
LOWERINGS: dict[str, Lowering] = {}


def lowering(op: str) -> Callable[[Lowering], Lowering]:
    def deco(fn: Lowering) -> Lowering:
        LOWERINGS[op] = fn
        return fn

    return deco


@lowering("gemm_epilogue")
def _lower_gemm(node: Node, graph: Graph, backend: str) -> Step | None:
    if backend == "torch":
        return None
    from kfuse.kernels.gemm import default_config, gemm_epilogue

    epi = node.attrs["epilogue"]
    out_t = node.ttype
    a_t, b_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    assert isinstance(a_t, TensorType) and isinstance(b_t, TensorType)
    m = a_t.numel // a_t.shape[-1]
    cfg = node.attrs.get("config") or default_config(m, b_t.shape[1], b_t.shape[0])

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        return gemm_epilogue(xs[0], xs[1], xs[2:], epi, out_t.dtype, cfg)

    info = KernelInfo(node.name, "gemm_epilogue", node.attrs["fused_ops"], cfg.describe(), epi.describe())
    return Step(node.name, node.inputs, run, info)


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


def lower(graph: Graph, device: torch.device, backend: str | None = None) -> Plan:
    """Turn an optimised graph into a plan of steps for ``device``."""
    backend = backend or choose_backend(device)
    steps: list[Step] = []
    for node in graph.nodes:
        step = None
        if node.op in LOWERINGS:
            step = LOWERINGS[node.op](node, graph, backend)
        steps.append(step or _torch_step(node))
    constants = {k: v.to(device) for k, v in graph.constants.items()}
    plan = Plan(graph, steps, backend, constants)
    plan.release_after = _liveness(graph, steps)
    return plan


def _liveness(graph: Graph, steps: list[Step]) -> list[list[str]]:
    """For each step, the values whose last reader it is (never inputs, constants or outputs)."""
    keep = set(graph.outputs) | set(graph.input_names) | set(graph.constants)
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        for v in s.inputs:
            last[v] = i
    out: list[list[str]] = [[] for _ in steps]
    for v, i in last.items():
        if v not in keep:
            out[i].append(v)
    return out


def execute(plan: Plan, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``plan`` on ``inputs`` (in graph input order); returns the graph outputs."""
    env: dict[str, Any] = dict(plan.constants)
    for (name, _), x in zip(plan.graph.inputs, inputs, strict=True):
        env[name] = x
    for step, dead in zip(plan.steps, plan.release_after, strict=True):
        env[step.output] = step.fn([env[i] for i in step.inputs])
        for v in dead:
            del env[v]
    return [env[o] for o in plan.graph.outputs]
