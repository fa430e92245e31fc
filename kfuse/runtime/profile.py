"""Operator-level profile of a plan: per step GPU time (each step replayed alone from a CUDA graph), share of the total,
achieved TFLOP/s or GB/s, and the roofline floor of that step (DESIGN.md §5), plus a PNG chart.

FLOPs are counted for GEMMs, convolutions and attention (from the node's operand types);
every other step is memory-bound and is judged by bytes moved (operands read once, output
written once; broadcast operands count their real size).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kfuse.bench.harness import PEAK_BYTES, PEAK_FLOPS, floor_ms, gpu_time_ms, graph_ms_per_call
from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.runtime.device import first_device
from kfuse.runtime.executor import Plan, _prepare_memory


def _ops_of(node: Node) -> tuple[str, ...]:
    return tuple(node.attrs.get("fused_ops", (node.op,))) if node.op != "fallback" else (str(node.attrs.get("target")),)


def node_flops(node: Node, graph: Graph) -> float:
    """Multiply-add FLOPs (x2) of GEMM, convolution and attention nodes; 0 for the rest."""
    if "flops" in node.attrs:
        return float(node.attrs["flops"])
    ops_ = _ops_of(node)
    out = node.type if isinstance(node.type, TensorType) else None
    types = [graph.type_of(i) for i in node.inputs]
    tts = [t for t in types if isinstance(t, TensorType)]
    if out is None or not tts:
        return 0.0
    if "matmul" in ops_ and len(tts) >= 2:
        return 2.0 * out.numel * tts[0].shape[-1]
    if any(o.startswith("conv") for o in ops_):
        w = next((t for t in tts[1:] if t.rank == 4), None)
        if w is not None:
            return 2.0 * out.numel * math.prod(w.shape[1:])
    if any(o in ("sdpa", "attention") or o.startswith("attention") for o in ops_) and len(tts) >= 3:
        q, k = tts[0], tts[1]
        if q.rank >= 2 and k.rank >= 2:
            batch = q.numel // (q.shape[-2] * q.shape[-1])
            return 4.0 * batch * q.shape[-2] * k.shape[-2] * q.shape[-1]
    return 0.0


def _real_bytes(x: Any) -> int:
    """Bytes a kernel reads for ``x``: broadcast (stride-0) dims count once."""
    if isinstance(x, torch.Tensor):
        n = 1
        for s, st in zip(x.shape, x.stride(), strict=True):
            if st != 0:
                n *= s
        return n * x.element_size() if x.numel() else 0
    if isinstance(x, list | tuple):
        return sum(_real_bytes(v) for v in x)
    return 0


# each step is timed as this many back-to-back calls in one CUDA graph: the fixed cost of
# launching a graph (~5-8 us with the events on the H200) is spread over the calls, as the
# model's single graph spreads it over all steps
PROFILE_CALLS = 10


def _graph_launch_overhead_ms(rep: int) -> float:
    """The fixed GPU-side cost of launching one graph: a one-kernel graph's time minus that kernel's
    steady-state time per call."""
    marker = torch.zeros(1, device="cuda")
    try:
        one = gpu_time_ms(lambda: marker.add_(0), warmup=1, rep=max(5, rep))
        per_call, _ = graph_ms_per_call(lambda: marker.add_(0), (), calls=PROFILE_CALLS, warmup=1, rep=max(5, rep))
        return max(0.0, one - per_call)
    except Exception:  # noqa: BLE001 - no overhead estimate: subtract nothing
        return 0.0


def _step_ms(call: Any, rep: int, overhead: float) -> float:
    """GPU time of one step: PROFILE_CALLS calls replayed from one graph, per call, less the
    graph launch's share (a step that launches nothing, a view, reads ~0). Session 7: timing each
    step as a one-call graph less a one-kernel graph's time read 0.045 ms summed for ResNet-50 B1,
    whose kernels take ~0.37 ms per call in a CUPTI trace (experiments/graph_timeline.py)."""
    try:
        per_call, _ = graph_ms_per_call(call, (), calls=PROFILE_CALLS, warmup=1, rep=max(3, rep))
        return max(0.0, per_call - overhead / PROFILE_CALLS)
    except Exception:  # noqa: BLE001 - capture failed: one call, events around it
        return gpu_time_ms(call, warmup=1, rep=max(3, rep))


def profile_plan(plan: Plan, inputs: Sequence[torch.Tensor], warmup: int = 3, rep: int = 10) -> list[dict[str, Any]]:
    """Time each step of ``plan`` on ``inputs``; one row per step (in plan order)."""
    graph = plan.graph
    nodes = graph.node_map()
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    device = first_device(inputs)
    outs = _prepare_memory(plan, device)
    times: list[list[float]] = [[] for _ in plan.steps]
    moved = [0] * len(plan.steps)
    overhead = _graph_launch_overhead_ms(rep) if on_gpu else 0.0
    for it in range(warmup + rep):
        env: dict[str, Any] = dict(plan.constants)
        for (name, _), x in zip(graph.inputs, inputs, strict=True):
            env[name] = x
        for i, (step, dead) in enumerate(zip(plan.steps, plan.release_after, strict=True)):
            xs = [env[v] for v in step.inputs]
            buf = outs.get(step.output)
            if on_gpu:
                # each step alone, replayed from a CUDA graph: its GPU time without the Python launch
                # (events around eager launches overstate every kernel shorter than its launch)
                env[step.output] = step.fn(xs) if buf is None else step.fn(xs, buf)
                if it == 0:
                    call = (lambda s=step, a=xs: s.fn(a)) if buf is None else (lambda s=step, a=xs, b=buf: s.fn(a, b))
                    times[i] = [_step_ms(call, rep, overhead)]
            else:
                t0 = time.perf_counter()
                env[step.output] = step.fn(xs) if buf is None else step.fn(xs, buf)
                if it >= warmup:
                    times[i].append((time.perf_counter() - t0) * 1e3)
            if it == 0:
                moved[i] = _real_bytes(xs) + _real_bytes(env[step.output])
            for v in dead:
                del env[v]
        if on_gpu:
            torch.cuda.synchronize()
            break  # timed in the first pass
    total = sum(statistics.median(t) for t in times) or 1e-12
    rows = []
    for i, step in enumerate(plan.steps):
        node = nodes.get(step.output)
        ms = statistics.median(times[i])
        flops = node_flops(node, graph) if node is not None else 0.0
        nbytes = moved[i]
        fl = floor_ms(flops, nbytes)
        compute_bound = flops / PEAK_FLOPS > nbytes / PEAK_BYTES
        rows.append(
            {
                "index": i,
                "kernel": step.info.name,
                "template": step.info.template,
                "ops": list(step.info.ops),
                "time_ms": ms,
                "share": ms / total,
                "flops": flops,
                "bytes": nbytes,
                "tflops": flops / (ms * 1e-3) / 1e12 if ms > 0 else 0.0,
                "gbps": nbytes / (ms * 1e-3) / 1e9 if ms > 0 else 0.0,
                "floor_ms": fl,
                "bound": "compute" if compute_bound else "memory",
                "of_floor": fl / ms if ms > 0 else 0.0,  # 1.0 = at the roofline
            }
        )
    return rows


def profile_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(r["time_ms"] for r in rows)
    by_template: dict[str, float] = {}
    for r in rows:
        by_template[r["template"]] = by_template.get(r["template"], 0.0) + r["time_ms"]
    return {
        "total_ms": total,
        "floor_ms": sum(r["floor_ms"] for r in rows),
        "launches": len(rows),
        "by_template_ms": dict(sorted(by_template.items(), key=lambda kv: -kv[1])),
    }


def print_profile(rows: list[dict[str, Any]], top: int = 25, console: Any = None) -> None:
    """A table of the ``top`` slowest steps, then the totals."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"operator profile (top {min(top, len(rows))} of {len(rows)} launches)")
    for col in ("#", "kernel", "template", "ops", "ms", "share", "achieved", "floor ms", "of floor"):
        t.add_column(col, justify="right" if col in ("#", "ms", "share", "achieved", "floor ms", "of floor") else "left")
    for r in sorted(rows, key=lambda r: -r["time_ms"])[:top]:
        ach = f"{r['tflops']:.1f} TFLOP/s" if r["bound"] == "compute" else f"{r['gbps']:.0f} GB/s"
        ops_ = ", ".join(r["ops"])
        t.add_row(
            str(r["index"]), r["kernel"], r["template"], ops_ if len(ops_) < 40 else ops_[:37] + "...",
            f"{r['time_ms']:.4f}", f"{100 * r['share']:.1f}%", ach, f"{r['floor_ms']:.4f}", f"{100 * r['of_floor']:.0f}%",
        )  # fmt: skip
    console.print(t)
    s = profile_summary(rows)
    console.print(
        f"total {s['total_ms']:.4f} ms over {s['launches']} launches, floor {s['floor_ms']:.4f} ms; by template: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in s["by_template_ms"].items()),
        markup=False,
    )


def plot_profile(rows: list[dict[str, Any]], path: str | Path, top: int = 30, title: str = "kfuse operator profile") -> Path:
    """Horizontal bars of the ``top`` slowest steps (colour = template), floor as a black tick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    sel = sorted(rows, key=lambda r: -r["time_ms"])[:top][::-1]
    templates = sorted({r["template"] for r in sel})
    cmap = plt.get_cmap("tab10")
    colour = {t: cmap(i % 10) for i, t in enumerate(templates)}
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.3 * len(sel) + 1.2)))
    y = list(range(len(sel)))
    ax.barh(y, [r["time_ms"] for r in sel], color=[colour[r["template"]] for r in sel])
    ax.scatter([r["floor_ms"] for r in sel], y, marker="|", s=200, color="black", label="floor", zorder=3)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r['kernel']} ({r['template']})" for r in sel], fontsize=7)
    ax.set_xlabel("time per launch (ms)")
    total = sum(r["time_ms"] for r in rows)
    ax.set_title(f"{title}: {total:.3f} ms in {len(rows)} launches")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colour[t]) for t in templates]
    ax.legend(handles + [ax.collections[0]], templates + ["floor"], fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
