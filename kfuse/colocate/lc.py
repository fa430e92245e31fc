"""LC kernels from a kfuse-compiled model.

The compiled plan's steps are the LC kernel sequence of one query. GEMM-like steps (fused GEMMs,
linear layers, convolutions as implicit GEMMs) become PTB GEMM kernels with the step's problem
shape, so they can be fused with BE kernels; the other steps run as they are, grouped into
segments of consecutive steps (one timed launch group each). Every step reads inputs cached from
one real run of the plan, so any step can run on its own, in any order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from kfuse.colocate.ptb import BlockKernel, PtbGemmConfig, conv_gemm_shape, gemm_kernel, launch_ptb, num_sms, pick_ptb_config
from kfuse.ir.graph import Graph, Node, TensorType
from kfuse.runtime.executor import plan_values

GEMM_OPS = ("gemm_epilogue", "linear", "matmul", "mm", "addmm")


def gemm_shape(node: Node, graph: Graph) -> tuple[int, int, int] | None:
    """(M, N, K) of a GEMM-like node (convolutions as implicit GEMMs, groups folded into M), else None."""
    try:
        ts = [graph.type_of(i) for i in node.inputs]
        if not ts or not all(isinstance(t, TensorType) for t in ts[:2]):
            return None
        if "conv" in node.op and "stride" in node.attrs and len(ts[1].shape) == 4:
            g = int(node.attrs.get("groups", 1))
            m, n, k = conv_gemm_shape(ts[0].shape, ts[1].shape, node.attrs["stride"], node.attrs["padding"],
                                      node.attrs.get("dilation", (1, 1)), g)  # fmt: skip
            return m * g, n, k
        if node.op in GEMM_OPS and len(ts[1].shape) == 2:
            a = ts[0]
            k = a.shape[-1]
            w = ts[1].shape
            n = w[1] if w[0] == k else w[0]  # (K, N) or a linear layer's (N, K)
            return a.numel // k, n, k
    except Exception:  # an op kfuse does not know the shape rule of: not fusible
        return None
    return None


def segment_key(ops: tuple[str, ...], inputs: list[Any]) -> str:
    """A segment's key: its ops and its inputs' shapes, so a model's repeated layers share one (SM-partition versions
    are profiled per key), and segments that differ in either do not."""
    shapes = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else None for x in inputs)
    digest = hashlib.sha1(repr((ops, shapes)).encode()).hexdigest()[:8]
    return f"seg:{'+'.join(dict.fromkeys(ops))[:48]}:{digest}"


@dataclass
class LCItem:
    name: str
    kernel: BlockKernel | None  # the PTB GEMM, or None for a segment
    run: Callable[[], Any] | None  # a segment: runs its steps
    key: str
    ops: tuple[str, ...]
    host: Any = None  # "plan-ws": the plan GEMM step that can carry a BE slice in a worker partition (ws_partition.WsHost)

    @property
    def fusible(self) -> bool:
        return self.kernel is not None or self.host is not None


LC_GEMMS = ("ptb", "ptb-tuned", "plan", "plan-ptb", "plan-ptb2", "plan-ws")
LC_PROGRAMS_PER_SM = 2  # the PTB LC's persistent grid (``CudaBackend``'s default; the default tile fits two an SM)


def lc_items(
    compiled: Any, args: tuple[Any, ...], kwargs: dict[str, Any], min_gemm_flops: float = 0.0, gemms: str = "ptb",
    ws_warps: tuple[int, ...] = (4, 8),  # ws_partition.HOST_WARPS (imported where a host is made: it loads Gluon)
    ws_unrolls: tuple[int, ...] = (1,),
    ws_feeds: tuple[str, ...] = ("ldg",),
) -> list[LCItem]:  # fmt: skip
    """The LC kernel sequence of ``compiled`` (a kfuse CompiledModel) for these inputs.
    ``gemms``: "ptb", each GEMM step as a PTB GEMM of its shape (one tile for all, stand-in operands), which Aker's
    fused versions can slice; "ptb-tuned", the same with the fastest of a few tiles for each shape
    (``ptb.pick_ptb_config`` on the LC's grid: session 54 measured the one-tile stand-in's partition gains as SMs its
    48-tile GEMMs left idle, which the compiled model does not leave); "plan", each GEMM step as the plan runs it
    (kfuse's tuned kernel or the library call it chose), a segment of its own, so the LC is the compiled model itself
    and only the SM-partition versions and spans co-run with it (session 53: the PTB stand-in's kernels took 1.08 ms
    of BERT-base B8 S128's query where the compiled model runs in 0.74 ms on the H100); "plan-ptb", each
    ``gemm_epilogue`` and ``conv_epilogue`` step as the PTB form of kfuse's own template (``plan_gemm``,
    ``plan_conv``: the step's tuned tile, real operands and generated epilogue), which Aker's fused versions can
    slice, the other GEMM-like steps as "plan";
    "plan-ptb2", the same with each tile's pipeline stages cut so two blocks share an SM (``plan_gemm.fit_stages``:
    the plan's tuned tiles take one an SM, so no BE block could sit beside an LC block in a fused launch);
    "plan-ws", as "plan", and each ``gemm_epilogue`` step the ping-pong kernel can run also hosts a BE slice in a
    worker partition (``LCItem.host``, ``ws_partition.WsHost``; the ``ws`` version): the LC alone runs the plan's own
    kernel, a fused launch the step's GEMM on a ping-pong tile beside the slice (``ws_warps``: the BE warp counts a
    host tries, ``ws_partition.parse_warps``; ``ws_unrolls``: stencil7's blocks an iteration, ``parse_unrolls``;
    ``ws_feeds``: how stencil7's partition reads its input, ``parse_feeds``).
    On a GPU each such kernel's programs an SM are read from its compile and its time is set beside the plan step's
    (``meta["programs_per_sm"]``, ``meta["ptb_ms"]``, ``meta["plan_ms"]``)."""
    if gemms not in LC_GEMMS:
        raise ValueError(f"lc_items: gemms must be one of {LC_GEMMS}, got {gemms!r}")
    variant = next(iter(compiled.variants.values()))
    plan = variant.plan
    flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
    xs = variant.imported.graph_inputs(flat)
    env = plan_values(plan, xs)  # one real run: every step's inputs are kept
    nodes = {n.name: n for n in plan.graph.nodes}
    device = xs[0].device if xs else torch.device("cpu")
    dtype = next((x.dtype for x in env.values() if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dim() > 1), torch.float32)
    buffers: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    tiles: dict[tuple[int, int, int], tuple[PtbGemmConfig, dict[str, float]]] = {}  # ptb-tuned: per shape, its choice and times
    items: list[LCItem] = []
    pending: list[Any] = []
    fit_times: dict[Any, float] = {}  # plan-ptb2 on a GPU: each candidate tile's time, shared by repeated layers
    host_choices: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # plan-ws: per key, the hosts' tile choices

    def flush() -> None:
        if not pending:
            return
        steps = list(pending)

        def run(steps: list[Any] = steps) -> None:
            for s in steps:
                s.fn([env[i] for i in s.inputs])

        ops = tuple(o for s in steps for o in s.info.ops)
        items.append(LCItem(f"seg{len(items)}", None, run, segment_key(ops, [env.get(i) for s in steps for i in s.inputs]), ops))
        pending.clear()

    for step in plan.steps:
        node = nodes.get(step.output)
        shape = gemm_shape(node, plan.graph) if node is not None else None
        if shape is None or 2.0 * shape[0] * shape[1] * shape[2] < min_gemm_flops:
            pending.append(step)
            continue
        flush()
        if gemms.startswith("plan-ptb") and node is not None and node.op in ("gemm_epilogue", "conv_epilogue"):
            item = _plan_ptb_item(step, node, plan.graph, env, share_sm=2 if gemms == "plan-ptb2" else 0, timed=fit_times)
            if item is not None:
                items.append(item)
                continue
        if gemms.startswith("plan"):  # the plan's own kernel for this GEMM, alone in its segment (the LC's kernel boundaries kept)
            pending.append(step)
            flush()
            if gemms == "plan-ws" and node is not None:
                items[-1].host = host = _ws_host(step, node, env, ws_warps, ws_unrolls, ws_feeds)
                if host is not None:  # repeated layers (one key) share one tile choice per BE kernel, timed once
                    host.chosen, host.times = host_choices.setdefault(items[-1].key, ({}, {}))
            continue
        if shape not in buffers:
            m, n, k = shape
            buffers[shape] = (torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype),
                              torch.empty(m, n, device=device, dtype=dtype))  # fmt: skip
        a, b, c = buffers[shape]
        key = "x".join(map(str, shape))
        cfg = None
        if gemms == "ptb-tuned":
            if shape not in tiles:
                best, times = pick_ptb_config(a, b, c, LC_PROGRAMS_PER_SM * num_sms(a.device))
                tiles[shape] = best, {t.describe(): ms for t, ms in times.items()}
            cfg = tiles[shape][0]
        kernel = gemm_kernel(a, b, c, cfg, name=step.output)
        if cfg is not None:  # what the choice measured, for the run's log and records
            kernel.meta["tile_ms"] = tiles[shape][1]
        items.append(LCItem(step.output, kernel, None, key, tuple(step.info.ops)))
    flush()
    return items


def _plan_ptb_item(
    step: Any, node: Node, graph: Graph, env: dict[str, Any], share_sm: int = 0, timed: dict[Any, float] | None = None
) -> LCItem | None:  # fmt: skip
    """A plan's ``gemm_epilogue`` or ``conv_epilogue`` step as an LC block kernel (``plan_gemm``, ``plan_conv``), its
    programs an SM and, on a GPU, its time beside the plan step's; None for a conv the block form does not run."""
    from kfuse.colocate.plan_conv import plan_conv_kernel
    from kfuse.colocate.plan_gemm import fit_programs_per_sm, plan_gemm_kernel

    xs = [env[i] for i in step.inputs]
    on_gpu = _on_gpu(xs)
    # on a GPU the fastest of the tiles that let ``share_sm`` blocks share an SM, each timed on its grid
    grid = max(1, share_sm) * num_sms(xs[0].device) if on_gpu else 0
    cache = timed if timed is not None else {}

    def timer(k: BlockKernel) -> float:  # repeated layers' candidates are timed once (same tile, shape, epilogue)
        key = (k.module, k.fn, tuple(k.consts.items()), k.meta["M"], k.meta["N"], k.meta["K"], k.meta["batch"])
        if key not in cache:
            cache[key] = gpu_time_ms(lambda: launch_ptb(k, 0, k.n_blocks, grid))
        return cache[key]

    build = plan_gemm_kernel if node.op == "gemm_epilogue" else plan_conv_kernel
    made = build(node, graph, xs, name=step.output, share_sm=share_sm, time_ms=timer if on_gpu and share_sm else None)
    if made is None:
        return None
    kernel, info = made
    kernel.meta["programs_per_sm"] = fit_programs_per_sm(kernel)
    kernel.meta["plan_gemm"] = info
    kernel.meta["plan_kernel"] = f"{step.info.config} {step.info.epilogue}".strip()
    if kernel.meta["out"].is_cuda:
        grid = kernel.meta["programs_per_sm"] * num_sms(kernel.meta["out"].device)
        kernel.meta["ptb_ms"] = gpu_time_ms(lambda: launch_ptb(kernel, 0, kernel.n_blocks, grid))
        kernel.meta["plan_ms"] = gpu_time_ms(lambda: step.fn(xs))
    m, n, k = kernel.meta["M"], kernel.meta["N"], kernel.meta["K"]
    # repeated layers share a key; steps of one GEMM shape but another conv geometry (stride, taps) do not
    geometry = hashlib.sha1(repr((kernel.fn, sorted(kernel.consts.items()))).encode()).hexdigest()[:6]
    key = f"{kernel.meta['batch']}x{m}x{n}x{k}:{node.attrs['epilogue'].key()}:{info.tile}:{geometry}"
    return LCItem(step.output, kernel, None, key, tuple(step.info.ops))


def _on_gpu(xs: list[Any]) -> bool:
    return bool(xs) and isinstance(xs[0], torch.Tensor) and xs[0].is_cuda


def _ws_host(step: Any, node: Node, env: dict[str, Any], warps: tuple[int, ...], unrolls: tuple[int, ...] = (1,),
             feeds: tuple[str, ...] = ("ldg",)) -> Any:  # fmt: skip
    """The plan step's ``ws_partition.WsHost`` (None where the ping-pong kernel cannot run it), its tile timed on a
    GPU per BE kernel."""
    from kfuse.colocate.ws_partition import host_for

    xs = [env[i] for i in step.inputs]
    on_gpu = _on_gpu(xs)
    sms = num_sms(xs[0].device) if on_gpu else 132
    host, _why = host_for(node, xs, step.output, sms, time_ms=gpu_time_ms if on_gpu else None, warps=warps,
                          unrolls=unrolls, feeds=feeds)  # fmt: skip
    if host is not None:
        host.plan_kernel = f"{step.info.config} {step.info.epilogue}".strip()
    return host


def ws_host_summary(items: list[LCItem]) -> dict[str, dict[str, Any]]:
    """Per key, the "plan-ws" LC's hosts (for a run's log and records): how many steps, the plan's kernel, and per BE
    kernel the ping-pong tile chosen, every candidate's time (ms, per BE blocks a program) and the candidates whose
    fused launch computed a wrong result (never chosen), with why."""
    out: dict[str, dict[str, Any]] = {}
    for it in items:
        if it.host is None:
            continue
        h = out.setdefault(it.key, {"count": 0, "plan_kernel": it.host.plan_kernel, "chosen": {}, "times": {}, "rejected": {}})
        h["count"] += 1
        h["chosen"].update({be: t[0] for be, t in it.host.chosen.items()})
        h["times"].update(it.host.times)
        h["rejected"].update({be: why for be, why in it.host.rejected.items() if why})
    return out


def gpu_time_ms(fn: Callable[[], Any], launches: int = 10) -> float:
    """GPU milliseconds of one ``fn()``: ``launches`` calls captured in one CUDA graph, its replay timed (session 55's
    first run timed single Python launches: 50-90 us each for 10-20 us kernels, the host's launch path, not the GPU);
    plain CUDA-event timing where the capture fails."""
    from kfuse.bench.harness import cuda_graph_callable, time_ms

    fn()  # the compile, outside the capture
    torch.cuda.synchronize()
    try:
        replay = cuda_graph_callable(lambda: [fn() for _ in range(launches)], ())
    except Exception:  # noqa: BLE001 - a step that cannot be captured is timed eagerly
        torch.cuda.synchronize()
        return float(time_ms(fn, warmup=3, rep=20))
    return float(time_ms(replay, warmup=3, rep=20)) / launches


def plan_gemm_summary(items: list[LCItem]) -> dict[str, dict[str, Any]]:
    """Per key, what the "plan-ptb" LC's block kernels run against the plan (for a run's log and records): how many
    steps, the tile and its form, programs an SM, what changed, the plan's kernel and, on a GPU, the mean times."""
    out: dict[str, dict[str, Any]] = {}
    for it in items:
        info = it.kernel.meta.get("plan_gemm") if it.kernel is not None else None
        if info is None:
            continue
        g = out.setdefault(it.key, {"count": 0, "plan_config": info.plan_config, "tile": info.tile, "form": info.form,
                                    "changed": list(info.changed), "programs_per_sm": it.kernel.meta["programs_per_sm"],
                                    "plan_kernel": it.kernel.meta.get("plan_kernel", ""), "ptb": [], "plan": [],
                                    "fit_ms": dict(it.kernel.meta.get("fit_ms", {}))})  # fmt: skip
        g["count"] += 1
        for w in ("ptb", "plan"):
            if f"{w}_ms" in it.kernel.meta:
                g[w].append(it.kernel.meta[f"{w}_ms"])
    for g in out.values():
        for w in ("ptb", "plan"):
            times = g.pop(w)
            if times:
                g[f"{w}_ms"] = sum(times) / len(times)
    return out


SAFE_OPTIONS = {"fuse_b2b": False, "fuse_attention": False, "fuse_pointwise": False, "varlen": False, "layout": "nchw",
                "memory_plan": False}  # fmt: skip


def compile_lc(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], log: Callable[[str], None] = print, **opts: Any) -> Any:
    """``kfuse.compile`` the LC model; if the full pipeline fails, retry with only the core stages."""
    import kfuse

    try:
        return kfuse.compile(model, args, kwargs, **opts)
    except Exception as e:
        log(f"kfuse.compile failed ({type(e).__name__}: {str(e)[:200]}); retrying with {SAFE_OPTIONS}")
        return kfuse.compile(model, args, kwargs, **{**opts, **SAFE_OPTIONS})
