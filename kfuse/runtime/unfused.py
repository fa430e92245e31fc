"""A fused node's measured decision: the original kernels it replaced (``attrs["unfused"]``, with
``attrs["input_names"]``) run one after the other, random inputs of the node's types, and the
CUDA-graph timer both sides are timed with, and the check that a fused candidate computes what the
unfused kernels do before it is timed. Used by the b2b chains and the gated-MLP GEMM."""

from __future__ import annotations

from typing import Any

import torch

from kfuse.runtime.executor import LOWERINGS, _takes_options, _torch_step


def random_like(t: Any, device: torch.device) -> torch.Tensor:
    """A random tensor of value type ``t`` (ones for integer types), in ``t``'s memory layout."""
    if t.dtype.is_floating_point:
        x = torch.randn(t.shape, dtype=t.dtype, device=device)
    else:
        x = torch.ones(t.shape, dtype=t.dtype, device=device)
    if getattr(t, "layout", "") == "channels_last" and x.dim() == 4:  # time with the strides the model will use
        x = x.to(memory_format=torch.channels_last)
    return x


def decision_inputs(node: Any, graph: Any, device: torch.device) -> list[torch.Tensor]:
    """The node's inputs to time with: its constants (weights, and transposed views of them) as they are, random
    runtime inputs."""
    from kfuse.runtime.choice import constant_view

    xs = []
    for name in node.inputs:
        c = constant_view(graph, name, device)
        xs.append(c if c is not None else random_like(graph.type_of(name), device))
    return xs


# a fused candidate whose output differs from the unfused kernels' by more than this (relative to the
# output's largest magnitude) is wrong, not rounded differently: both sides round the intermediates
# to the same dtypes, and the miscompiles found so far (Triton 3.6, sm_90, session 28) were off by 0.9-1.8
WRONG_RESULT = 5e-2


def wrong_result(out: Any, ref: torch.Tensor) -> str | None:
    """Why a fused candidate's ``out`` is not the unfused kernels' result ``ref``, or None when it is."""
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return f"wrong result: shape {tuple(out.shape) if isinstance(out, torch.Tensor) else None}, expected {tuple(ref.shape)}"
    got, want = out.float(), ref.float()
    if not torch.isfinite(got).all() and torch.isfinite(want).all():
        return "wrong result: non-finite values"
    rel = float((got - want).abs().nan_to_num(float("inf")).max()) / max(float(want.abs().max()), 1e-6)
    return f"wrong result (relative error {rel:.3g})" if rel > WRONG_RESULT else None


class AgreeingOutputs:
    """Candidates grouped by what they compute, for an autotuner with no cheaper reference than its own
    candidates (the attention tiles): each output joins the first group whose first output it matches
    (``wrong_result``), else starts a group. The largest group is what the kernel computes; a tile the
    compiler gets wrong stands apart and is not timed."""

    def __init__(self) -> None:
        self.groups: list[tuple[torch.Tensor, list[Any]]] = []

    def add(self, key: Any, out: torch.Tensor) -> None:
        for first, members in self.groups:
            if wrong_result(out, first) is None:
                members.append(key)
                return
        self.groups.append((out.detach().clone(), [key]))

    def agreeing(self, prefer: Any = None) -> tuple[list[Any], list[Any]]:
        """(the largest group, ties to the one holding ``prefer``; every other candidate)."""
        if not self.groups:
            return [], []
        best = max(self.groups, key=lambda g: (len(g[1]), prefer in g[1]))[1]
        return list(best), [k for _, ms in self.groups if ms is not best for k in ms]


def graph_time_ms(fn: Any, reps: int = 15) -> float:
    """GPU time of ``fn()`` per call (wall clock without a GPU)."""
    # GPU time from CUDA-graph replays: the plan runs in a CUDA graph, so the unfused side's
    # extra launches cost GPU time only, not Python launch overhead. Ten calls per graph: one
    # replay's fixed ~5 us would otherwise be a third of a small chain's time and hide a 10% gap
    from kfuse.bench.harness import gpu_time_ms, graph_ms_per_call

    if not torch.cuda.is_available():
        return gpu_time_ms(fn, warmup=1, rep=2)
    fn()  # compile outside the capture
    try:
        return graph_ms_per_call(fn, (), calls=10, warmup=2, rep=reps)[0]
    except Exception:  # capture failed: plain timing
        torch.cuda.synchronize()
        return gpu_time_ms(fn, warmup=3, rep=reps)


def unfused_run(node: Any, graph: Any, backend: str, options: Any) -> Any:
    """The node as its original kernels, one after the other (each with its own lowering)."""
    steps = []
    # the stage lowerings look up their operand types, intermediates included
    ctx = graph.replace(nodes=tuple(graph.nodes) + tuple(node.attrs["unfused"]))
    for n in node.attrs["unfused"]:
        fn = LOWERINGS.get(n.op)
        st = None
        if fn is not None:
            st = fn(n, ctx, backend, options=options) if _takes_options(fn) else fn(n, ctx, backend)
        steps.append(st or _torch_step(n))

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        env = dict(zip(node.attrs["input_names"], xs, strict=True))
        out = None
        for st in steps:
            out = st.fn([env[i] for i in st.inputs])
            env[st.output] = out
        return out

    # what each stage runs, for the report (template or library, and the config)
    run.kernels = [f"{st.info.template} {st.info.config}".strip() for st in steps]  # type: ignore[attr-defined]
    return run
