"""Lowering of ``b2b_chain`` nodes, with the fused-vs-unfused decision measured on the GPU."""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from kfuse.kernels.b2b.chain import B2BConfig, Chain
from kfuse.kernels.b2b.configs import candidate_configs, default_config
from kfuse.kernels.b2b.launcher import ConvGeom, b2b_chain, capped_note, pack_first, pack_next
from kfuse.kernels.codegen import as_pair
from kfuse.kernels.tma import tma_device
from kfuse.runtime import cuda_fault, parallel_compile
from kfuse.runtime.device import on_device
from kfuse.runtime.executor import KernelInfo, Step, lowering
from kfuse.runtime.unfused import decision_inputs, graph_time_ms, unfused_run, wrong_result


@lowering("b2b_chain")
def lower_b2b_chain(node: Any, graph: Any, backend: str, options: Any = None) -> Step | None:
    """The fused chain as one kernel; on a GPU, fused and unfused are measured on random inputs
    of the right shapes and the faster is kept (``step.b2b`` records the decision)."""
    if backend == "torch":
        return None
    a = node.attrs
    chain: Chain = a["chain"]
    stages = a["unfused"]
    # operand positions of each stage inside the fused node's inputs
    pos, slices = 0, []
    for s, n in enumerate(stages):
        take = len(n.inputs) - (0 if s == 0 else 1)
        slices.append((pos, pos + take))
        pos += take
    packed_cache: dict[torch.device, list[torch.Tensor]] = {}
    geom = ConvGeom(as_pair(a.get("stride"), 1), as_pair(a.get("padding"), 0), as_pair(a.get("dilation"), 1))
    channels_last = a["out_type"].layout == "channels_last"

    def split(xs: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor], list[Any], list[list[torch.Tensor]]]:
        ws, bs, es = [], [], []
        for s, (lo, hi) in enumerate(slices):
            part = xs[lo:hi] if s == 0 else [None, *xs[lo:hi]]
            nconv = 3 if chain.stages[s].has_bias else 2
            ws.append(part[1])
            bs.append(part[2] if chain.stages[s].has_bias else None)
            es.append(list(part[nconv:]))
        return xs[0], ws, bs, es

    def fused_with(cfg: B2BConfig) -> Any:
        def run(xs: list[torch.Tensor]) -> torch.Tensor:
            x, ws, bs, es = split(xs)
            pk = packed_cache.get(x.device)
            if pk is None:
                pk = packed_cache[x.device] = [pack_first(ws[0], chain.conv)] + [pack_next(w) for w in ws[1:]]
            return b2b_chain(chain, x, ws, bs, es, cfg, pk, geom, channels_last)

        return run

    m = _rows(graph, node, chain)
    widths = list(a["widths"])
    elem = node.attrs["out_type"].dtype.itemsize  # the chunked kernel's buffers are sized by it
    cfg = a.get("config") or default_config(m, widths, elem=elem)
    decision: dict[str, Any] = {"residence": cfg.residence, "config": cfg.describe(), "decided_by": "rule"}
    run = fused_with(cfg)
    template = "b2b_chain"
    measure = backend == "triton" and os.environ.get("KFUSE_B2B_DECIDE", "measure") == "measure"
    if cfg.residence == "chunked" and backend == "triton" and not _tma_gpu():
        # past 256 columns only the chunked kernel fuses, and it needs TMA: before Hopper, the pair
        run, template = unfused_run(node, graph, backend, options), "b2b_chain(unfused)"
        decision = {"residence": "none", "config": "unfused (chunked residence needs TMA: Hopper or later)", "decided_by": "rule"}
        measure = False
    sides: dict[str, Any] | None = None
    if measure:
        try:
            run, template, decision = _decide(node, graph, backend, options, fused_with, m, widths)
            sides = decision.pop("_sides", None)
        except Exception as e:  # a measurement that fails keeps the rule's choice, and says why (a GPU fault stops the compile)
            cuda_fault.check(e, f"the b2b decision of {node.name}")
            decision["decided_by"] = f"rule (measurement failed: {type(e).__name__}: {str(e)[:120]})"
    epis = " => ".join(n.attrs["epilogue"].describe() for n in stages)
    info = KernelInfo(node.name, template, a["fused_ops"], decision.get("config", ""), epis)
    step = Step(node.name, node.inputs, run, info)
    step.b2b = decision  # type: ignore[attr-defined]  # read by kfuse.passes.fuse_b2b.b2b_report
    if sides is not None:
        # both sides of a measured decision, for the plan-level re-check (kfuse.runtime.b2b_recheck):
        # (run, kernel info, the decision fields that describe it)
        best: B2BConfig = sides["best_config"]
        step.b2b_sides = {  # type: ignore[attr-defined]
            "fused": (fused_with(best), KernelInfo(node.name, "b2b_chain", a["fused_ops"], best.describe() + capped_note(best), epis),
                      {"residence": best.residence, "config": best.describe() + capped_note(best), "fused": True}),
            "unfused": (sides["unfused"], KernelInfo(node.name, "b2b_chain(unfused)", a["fused_ops"], "unfused (measured faster)", epis),
                        {"residence": "none", "config": "unfused (measured faster)", "fused": False}),
        }  # fmt: skip
        step.b2b_key = _decision_key(node, graph, options)  # type: ignore[attr-defined]  # the re-check's cache key
    return step


def _conv_tma_runs(node: Any, graph: Any) -> bool:
    """Whether a conv chain's TMA tilings run ``b2b_conv_tma_kernel`` (``launcher._conv_tma_descriptors``):
    stride 1, NHWC input and output with 16-byte aligned channel rows, a GPU with TMA."""
    a = node.attrs
    if not a["chain"].conv or as_pair(a.get("stride"), 1) != (1, 1) or a["out_type"].layout != "channels_last" or not _tma_gpu():
        return False
    x_t, out_t = graph.type_of(node.inputs[0]), a["out_type"]
    if getattr(x_t, "layout", "") != "channels_last" or x_t.dtype != out_t.dtype:
        return False
    return all(t.shape[1] * t.dtype.itemsize % 16 == 0 for t in (x_t, out_t))


def _tma_gpu() -> bool:
    """Whether the current GPU has TMA (sm_90 or later); without a GPU, True (the interpreter emulates it)."""
    return tma_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def _rows(graph: Any, node: Any, chain: Chain) -> int:
    t = node.attrs["out_type"]
    if chain.conv:
        return t.shape[0] * t.shape[2] * t.shape[3]
    return t.numel // max(1, t.shape[-1])


# decisions already measured in this process, by chain and operand types: a model repeats its
# blocks (ResNet-50 has 16 bottlenecks of 8 distinct shapes), and each decision measures 10-20
# candidates. The chosen config (None: unfused) and the measured decision.
_DECIDED: dict[tuple, tuple[B2BConfig | None, dict[str, Any], B2BConfig | None]] = {}


def _decision_key(node: Any, graph: Any, options: Any) -> tuple:
    a = node.attrs
    types = tuple((tuple(t.shape), str(t.dtype), getattr(t, "layout", "")) for t in map(graph.type_of, node.inputs))
    geom = tuple(as_pair(a.get(k), d) for k, d in (("stride", 1), ("padding", 0), ("dilation", 1)))
    # every option, not only the b2b ones: the unfused side's lowering (library or template,
    # tuning mode) is part of what was measured
    return (a["chain"].key(), types, geom, a["out_type"].layout, repr(options))


# a candidate whose kernel takes longer than this to compile (on a worker process) is dropped: long
# register-resident chains can spend minutes in ptxas, more than any fused kernel saves at run time
CANDIDATE_COMPILE_S = 60.0


def _first_calls(runs: list[Any], xs: list[torch.Tensor], ref: torch.Tensor | None = None) -> list[str | None]:
    """Each candidate's first call, in parallel threads: that call compiles its kernel (Triton's
    frontend and ptxas, seconds each), and compiles of different configs are independent.
    Returns the error of each candidate that does not compile or run (registers, smem), or whose
    output is not ``ref`` (the unfused chain's, when given), else None: a tiling the compiler gets
    wrong is never timed, let alone chosen."""

    dev = xs[0].device if xs else None

    def first(run: Any) -> tuple[str | None, torch.Tensor | None]:
        try:
            with on_device(dev):  # a worker thread's current device is its own (device 0), not the caller's
                return None, run(xs)
        except Exception as e:  # noqa: BLE001 - recorded per candidate
            if cuda_fault.is_fault(e):
                return f"fault: {type(e).__name__}: {cuda_fault.first_line(e, 120)}", None
            return f"failed: {type(e).__name__}", None

    workers = max(1, min(8, len(runs), (os.cpu_count() or 2) - 1))
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(first, runs))
    if torch.cuda.is_available() and not any(err and err.startswith("fault:") for err, _ in results):
        torch.cuda.synchronize()
    return [err if err is not None or ref is None else wrong_result(out, ref) for err, out in results]


def _compile_candidates(runs: list[Any], xs: list[torch.Tensor], ref: torch.Tensor, on_gpu: bool) -> tuple[list[str | None], str]:
    """``_first_calls`` of the candidates (on a GPU; elsewhere nothing to compile), their kernels
    compiled first on worker processes into Triton's cache. A candidate with a kernel past
    ``CANDIDATE_COMPILE_S`` is dropped, not compiled again here. Returns each candidate's error
    (None: it runs and agrees) and a note of how long that took."""
    if not on_gpu:
        return [None] * len(runs), "not compiled (no GPU)"
    t0 = time.perf_counter()
    pre = parallel_compile.precompile([functools.partial(run, xs) for run in runs], kernel_timeout_s=CANDIDATE_COMPILE_S)
    slow = set(pre.slow_calls)
    kept = iter(_first_calls([r for i, r in enumerate(runs) if i not in slow], xs, ref))
    errs = [f"failed: compile took over {CANDIDATE_COMPILE_S:g} s" if i in slow else next(kept) for i in range(len(runs))]
    return errs, f"{time.perf_counter() - t0:.1f} s" + (f" ({pre.summary()})" if pre.requests else "")


def _decide(
    node: Any, graph: Any, backend: str, options: Any, fused_with: Any, m: int, widths: list[int]
) -> tuple[Any, str, dict[str, Any]]:
    key = _decision_key(node, graph, options)
    unfused = unfused_run(node, graph, backend, options)
    if key in _DECIDED:
        cfg, d, best_cfg = _DECIDED[key]
        d = {**d, "decided_by": "measured (an identical chain earlier in this process)"}
        if best_cfg is not None:
            d["_sides"] = {"best_config": best_cfg, "unfused": unfused}
        return (fused_with(cfg), "b2b_chain", d) if cfg is not None else (unfused, "b2b_chain(unfused)", d)
    xs = decision_inputs(node, graph, torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    t_unfused = graph_time_ms(lambda: unfused(xs))
    ref = unfused(xs).clone()  # what every candidate must produce (see _first_calls)
    best: tuple[float, B2BConfig | None] = (float("inf"), None)
    tried = {}
    x_t = graph.type_of(node.inputs[0])
    k0 = None if node.attrs["chain"].conv or x_t.rank < 2 else int(x_t.shape[-1])
    out_shape = node.attrs["out_type"].shape
    image = (int(out_shape[0]), int(out_shape[2]), int(out_shape[3])) if node.attrs["chain"].conv and len(out_shape) == 4 else None
    sms = torch.cuda.get_device_properties(xs[0].device).multi_processor_count if xs and xs[0].is_cuda else 132
    cands = candidate_configs(m, widths, k0, image, elem=node.attrs["out_type"].dtype.itemsize, sms=sms)
    if not getattr(options, "b2b_conv_tma", True):  # Options.b2b_conv_tma=False: without the TMA conv kernel
        cands = [c for c in cands if not (node.attrs["chain"].conv and c.tile_h > 0)]
    elif _conv_tma_runs(node, graph):
        # where the TMA conv kernel runs, the pointer-based conv tilings are not measured: in all ten
        # recorded H200 decisions (resnet50.json B1 / B64, b2b_conv.json) they lost to the best TMA tiling
        # by 9-62% wherever a fused kernel won, and where they were faster the unfused pair won; they were
        # 6-7 of each decision's 24 compiles (7-12 s of ptxas each, session 33)
        cands = [c for c in cands if c.tile_h > 0] or cands
    if not getattr(options, "b2b_pdl", False):  # Options.b2b_pdl: programmatic dependent launch, opt-in
        cands = [c for c in cands if not c.pdl]
    runs = [fused_with(cfg) for cfg in cands]
    errs, compile_note = _compile_candidates(runs, xs, ref, torch.cuda.is_available())
    faulted = [f"{cfg.describe()} ({err})" for cfg, err in zip(cands, errs, strict=True) if err and err.startswith("fault:")]
    if faulted:  # the context is lost: nothing more can run in this process (first calls run in parallel threads)
        raise cuda_fault.CudaFault(
            f"kfuse: the GPU faulted in the first calls of {node.name}'s b2b candidates: {'; '.join(faulted)}. "
            "The CUDA context is lost: restart the process (fuse_b2b=False avoids these kernels)."
        )
    for cfg, run, err in zip(cands, runs, errs, strict=True):
        if err is not None:
            tried[cfg.describe()] = err
            continue
        try:
            t = graph_time_ms(lambda run=run: run(xs))
        except Exception as e:  # a config that does not compile (registers, smem) is skipped
            cuda_fault.check(e, f"b2b candidate {cfg.describe()} of {node.name}")
            tried[cfg.describe()] = f"failed: {type(e).__name__}"
            continue
        tried[cfg.describe() + capped_note(cfg)] = round(t, 4)
        if t < best[0]:
            best = (t, cfg)
    t_fused, cfg = best
    d: dict[str, Any] = {"unfused_ms": round(t_unfused, 4), "fused_ms": round(t_fused, 4), "tried": tried, "decided_by": "measured",
                         "unfused_kernels": getattr(unfused, "kernels", []), "candidates_compiled_in": compile_note}  # fmt: skip
    # the returned copy also carries both sides (popped by lower_b2b_chain; never in the report)
    sides = {"_sides": {"best_config": cfg, "unfused": unfused}} if cfg is not None else {}
    if cfg is not None and t_fused < t_unfused:
        d.update(residence=cfg.residence, config=cfg.describe() + capped_note(cfg), fused=True)
        _DECIDED[key] = (cfg, d, cfg)
        return fused_with(cfg), "b2b_chain", {**d, **sides}
    d.update(residence="none", config="unfused (measured faster)", fused=False)
    _DECIDED[key] = (None, d, cfg)
    return unfused, "b2b_chain(unfused)", {**d, **sides}
