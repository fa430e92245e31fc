"""Gated MLP in one GEMM: ``act(x @ W[:, :I]) * (x @ W[:, I:])`` (SwiGLU, GeGLU).

Llama-style MLPs project ``x`` to a gate and an up half (kfuse merges the two GEMMs into one over
``W = [W_gate | W_up]``), then multiply ``silu(gate)`` by ``up``. Unfused, the GEMM writes both halves
(``M x 2I``) and a pointwise kernel reads them back to write ``M x I``. Here each program keeps two
accumulators for the same output tile, one per half: it loads its A tile once for both products,
and the epilogue writes only ``act(gate) * up``. At M = 512, I = 5632 in fp16 that is 17 MB of
traffic and one launch less per layer (the SiLU-gated MLP of a 1.1B Llama).

The decision is measured, as for back-to-back chains: on the GPU the lowering times a few tiles of
this kernel and the unfused pair (the tuned GEMM then the pointwise kernel) on random inputs, in CUDA
graphs, and keeps the faster. Two accumulators double the registers of a tile, so the fused kernel
runs smaller tiles than the GEMM alone; where that costs more than the traffic saved, the pair stays.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.ir import ops
from kfuse.ir.graph import TensorType, ValueType
from kfuse.kernels import pdl, skinny_gemm
from kfuse.kernels.codegen import interpreting
from kfuse.kernels.norm import norm
from kfuse.kernels.pdl import pdl_start
from kfuse.kernels.prefetch import prefetch_slab, prefetch_wanted, slab_plan
from kfuse.runtime import cuda_fault
from kfuse.runtime.choice import compile_together
from kfuse.runtime.executor import KernelInfo, Step, lowering
from kfuse.runtime.plan_alternatives import offer, runners_up
from kfuse.runtime.unfused import decision_inputs, graph_time_ms, unfused_run, wrong_result

ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


@triton.jit
def gate_activation(g, ACT: tl.constexpr):
    """The gate's activation (``ACTIVATIONS``' codes) on an fp32 tile; shared with the skinny GEMM's gated form."""
    if ACT == 0:  # silu
        g = g * tl.sigmoid(g)
    elif ACT == 1:  # gelu (erf)
        g = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    elif ACT == 2:  # gelu (tanh form): 0.5 (1 + tanh(z)) = sigmoid(2 z)
        g = g * tl.sigmoid(1.5957691216057308 * (g + 0.044715 * g * g * g))
    else:  # relu
        g = tl.maximum(g, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as torch.relu
    return g


@triton.jit
def _gated_gemm_fwd(
    A, B, C, M, N, K, gate_offset, up_offset,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr,
    PREFETCH: tl.constexpr, PF_K: tl.constexpr, PF_N: tl.constexpr, SK: tl.constexpr, SN: tl.constexpr,
):  # fmt: skip
    if PDL and PREFETCH:  # one row block (a decode step): this program's columns of both halves into L2 before the wait
        n0 = (tl.program_id(0) % tl.cdiv(N, BLOCK_N)) * BLOCK_N
        prefetch_slab(B + gate_offset, n0, N, 0, K, stride_bk, stride_bn, PF_K, PF_N, SK, SN)
        prefetch_slab(B + up_offset, n0, N, 0, K, stride_bk, stride_bn, PF_K, PF_N, SK, SN)
    pdl_start(PDL)
    # grouped tile order: GROUP_M row tiles share each column block of W while it is in L2
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = (pid // (GROUP_M * n_n)) * GROUP_M
    group_rows = min(n_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * n_n)) % group_rows
    pid_n = (pid % (GROUP_M * n_n)) // group_rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = A + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = B + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn  # + gate_offset / up_offset: the halves
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k
        a = tl.load(a_ptrs, mask=(offs_m < M)[:, None] & k_ok[None, :], other=0.0)
        b_mask = k_ok[:, None] & (offs_n < N)[None, :]
        b_gate = tl.load(b_ptrs + gate_offset, mask=b_mask, other=0.0)
        b_up = tl.load(b_ptrs + up_offset, mask=b_mask, other=0.0)
        acc_gate = tl.dot(a, b_gate, acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, b_up, acc_up, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    out = gate_activation(acc_gate, ACT) * acc_up
    c_ptrs = C + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, out.to(C.dtype.element_ty), mask=(offs_m < M)[:, None] & (offs_n < N)[None, :])


@dataclass(frozen=True)
class GatedConfig:
    block_m: int = 64
    block_n: int = 64
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def describe(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} w{self.num_warps} s{self.num_stages}"


SMEM_LIMIT = 227 * 1024  # sm_90's shared memory per block


def config_space(elem: int = 2) -> list[GatedConfig]:
    """The tiles the GPU decision measures: two accumulators a tile, so at most 128 x 128, and
    ``num_stages`` copies of one A and two B tiles within the shared memory of a block."""
    space = [
        GatedConfig(64, 64, 64, 8, 4, 4),
        GatedConfig(64, 128, 64, 8, 8, 3),
        GatedConfig(128, 64, 64, 8, 4, 3),
        GatedConfig(128, 64, 64, 8, 8, 4),
        GatedConfig(128, 128, 64, 8, 8, 3),
        GatedConfig(64, 64, 128, 8, 4, 3),
    ]
    return [c for c in space if c.num_stages * (c.block_m * c.block_k + 2 * c.block_k * c.block_n) * elem <= SMEM_LIMIT]


def default_config() -> GatedConfig:
    return GatedConfig(32, 32, 32, 4, 4, 1) if interpreting() else GatedConfig(128, 64, 64, 8, 8, 4)


def gated_gemm(
    a: torch.Tensor, w: torch.Tensor, act: str = "silu", out: torch.Tensor | None = None, config: GatedConfig | None = None,
    out_dtype: torch.dtype | None = None, gate_first: bool = True, prefetch: bool = True,
) -> torch.Tensor:  # fmt: skip
    """``act(a @ w[:, :I]) * (a @ w[:, I:])`` with ``w`` ``[K, 2I]`` (any strides) and ``a``
    ``[..., K]`` (leading dims merged into rows); with ``gate_first=False`` the gate is the second
    half. Returns ``[..., I]`` (or writes ``out``). ``prefetch``: where the rows are one row block, a launch under
    PDL streams its weight columns into L2 before it waits (``kfuse.kernels.prefetch``)."""
    if act not in ACTIVATIONS:
        raise ValueError(f"gated_gemm: activation {act!r} is not one of {sorted(ACTIVATIONS)}")
    if w.dim() != 2 or w.shape[1] % 2 or a.shape[-1] != w.shape[0]:
        raise ValueError(f"gated_gemm: a {tuple(a.shape)} and w {tuple(w.shape)}: need w [K, 2I] with K = a.shape[-1]")
    if a.dtype != w.dtype:
        raise TypeError(f"gated_gemm: a and w must have one dtype, got {a.dtype} and {w.dtype}")
    k, half = w.shape[0], w.shape[1] // 2
    a2 = a.reshape(-1, k)
    m = a2.shape[0]
    out_shape = (*a.shape[:-1], half)
    if out is not None and (tuple(out.shape) != out_shape or out.device != a.device):
        raise ValueError(f"gated_gemm: out is {tuple(out.shape)} on {out.device}, expected {out_shape} on {a.device}")
    o = out if out is not None else torch.empty(out_shape, dtype=out_dtype or a.dtype, device=a.device)
    try:
        o2 = o.view(m, half)
    except RuntimeError:
        raise ValueError(f"gated_gemm: out's strides {tuple(o.stride())} do not fold to (rows, I) = {(m, half)}") from None
    if m == 0 or half == 0:
        return o
    cfg = config or default_config()
    precision = "ieee" if a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(half, cfg.block_n),)
    _gated_gemm_fwd[grid](
        a2, w, o2, m, half, k, (0 if gate_first else half) * w.stride(1), (half if gate_first else 0) * w.stride(1),
        a2.stride(0), a2.stride(1), w.stride(0), w.stride(1), o2.stride(0), o2.stride(1),
        ACT=ACTIVATIONS[act], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        PRECISION=precision, **slab_plan(w, cfg.block_n, k, prefetch and m <= cfg.block_m),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl.launch_kwargs(),
    )  # fmt: skip
    return o


def reference(a: torch.Tensor, w: torch.Tensor, act: str = "silu", gate_first: bool = True) -> torch.Tensor:
    """The oracle, in float32: the activation of the gate half times the up half."""
    return _gate(a.float() @ w.float(), act, gate_first)


def _gate(y: torch.Tensor, act: str, gate_first: bool) -> torch.Tensor:
    """``act(gate) * up`` of the merged projection ``y`` (``[..., 2I]``)."""
    half = y.shape[-1] // 2
    gate, up = (y[..., :half], y[..., half:]) if gate_first else (y[..., half:], y[..., :half])
    return _ACT_TORCH[act](gate) * up


_ACT_TORCH = {
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "relu": torch.relu,
}


# ---------------------------------------------------------------------------------------
# the ``gated_gemm`` op: inputs (a, w); attrs act, gate_first, out_type, unfused (the GEMM, the two slices and
# the pointwise node it replaces), input_names (a's and w's value names, for the unfused run)
# ---------------------------------------------------------------------------------------
def _out_type(types: list[ValueType], attrs: Mapping[str, Any]) -> ValueType:
    t = attrs["out_type"]
    assert isinstance(t, TensorType)
    return t


@ops.register("gated_gemm", ops.FUSED, infer=_out_type)
def _gated_ref(xs: list[torch.Tensor], attrs: Mapping[str, Any]) -> torch.Tensor:
    # as the unfused graph computes it: the GEMM's result in its dtype, then the gate
    a, w = xs
    if attrs.get("row_rms") is not None:  # a folded RMSNorm (passes/fold_row_norm): ``a`` is the norm's input
        from kfuse.passes.fuse_epilogue import row_rms_scaled

        a = row_rms_scaled(a, attrs["row_rms"])
    return _gate(a @ w, attrs["act"], attrs["gate_first"]).to(attrs["out_type"].dtype)


_DECIDED: dict[tuple, tuple[GatedConfig | None, str]] = {}
_TIMES: dict[Any, dict[str, float]] = {}  # every candidate's time per decision key (the plan's re-check reads them)


@lowering("gated_gemm")
def lower_gated_gemm(node: Any, graph: Any, backend: str, options: Any = None) -> Step | None:
    """The fused kernel; on a GPU, its tiles and the unfused pair are timed and the faster kept."""
    if backend == "torch":
        return None
    a = node.attrs
    act, out_dtype, gate_first = a["act"], a["out_type"].dtype, a["gate_first"]
    eps = a.get("row_rms")  # a folded RMSNorm (passes/fold_row_norm): the input is the norm's, scaled here first
    prefetch = prefetch_wanted(options)

    def fused_with(cfg: GatedConfig) -> Any:
        def run(xs: list[torch.Tensor]) -> torch.Tensor:
            x = xs[0] if eps is None else norm(xs[0], rms=True, eps=eps)
            return gated_gemm(x, xs[1], act, config=cfg, out_dtype=out_dtype, gate_first=gate_first, prefetch=prefetch)

        return run

    a_t, w_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    m = a_t.numel // max(1, a_t.shape[-1])
    skinny = skinny_gemm.candidates(node, graph, backend, options, m, w_t, out_dtype, gated=act, gate_first=gate_first)
    ops_ = tuple(a["fused_ops"])
    if skinny and skinny_gemm.mode(options) == "always":
        run, info = next(iter(skinny.values()))
        return Step(node.name, node.inputs, run, info)
    cfg: GatedConfig | str | None = default_config()
    note = f"{cfg.describe()} (rule)"
    measure = backend == "triton" and torch.cuda.is_available() and os.environ.get("KFUSE_GATED_DECIDE", "measure") == "measure"
    if measure:
        try:
            cfg, note = _decide(node, graph, backend, options, fused_with, skinny)
        except Exception as e:  # noqa: BLE001 - a measurement that fails keeps the rule's choice, and says why
            cuda_fault.check(e, f"the gated-GEMM decision of {node.name}")
            cfg = default_config()
            note = f"{cfg.describe()} (rule; measurement failed: {type(e).__name__}: {str(e)[:120]})"
    if cfg is None:
        info = KernelInfo(node.name, "gated_gemm(unfused)", ops_, note)
        return Step(node.name, node.inputs, unfused_run(node, graph, backend, options), info)
    if isinstance(cfg, str):  # one of the skinny kernel's configs
        run, info = skinny[cfg]
        return Step(node.name, node.inputs, run, KernelInfo(info.name, info.template, info.ops, f"{info.config}: {note}", info.epilogue))
    folded = " after the folded norm's row scale" if eps is not None else ""
    step = Step(node.name, node.inputs, fused_with(cfg), KernelInfo(node.name, "gated_gemm", ops_, note + folded, f"{act}(gate) * up"))
    if measure and cfg is not None and skinny:  # a close skinny runner-up is timed again in the plan (runtime/plan_alternatives)
        key = _decision_key(node, graph, options)
        times = {("tile" if n == cfg.describe() else n): t for n, t in _TIMES.get(key, {}).items()}
        close = runners_up(times, "tile", lambda n: n in skinny)
        step = offer(step, ("gated", key), "tile", {n: skinny[n] for n in close})
    return step


def _decide(
    node: Any, graph: Any, backend: str, options: Any, fused_with: Any, skinny: dict | None = None
) -> tuple[GatedConfig | str | None, str]:
    """(the fastest fused config, the name of a ``skinny`` candidate, or None for the unfused pair; what was measured)."""
    key = _decision_key(node, graph, options)
    if key in _DECIDED:
        return _DECIDED[key]
    xs = decision_inputs(node, graph, torch.device("cuda" if torch.cuda.is_available() else "cpu"))  # the CPU only in tests
    unfused = unfused_run(node, graph, backend, options)  # lowered once, outside any timing or capture
    times = {"unfused": graph_time_ms(lambda: unfused(xs))}
    ref = unfused(xs).clone()  # what every tile must compute before it is timed
    best: tuple[float, GatedConfig | str | None] = (times["unfused"], None)
    wrong: list[str] = []
    tiles = [(c.describe(), c) for c in config_space(xs[0].element_size())] + [(name, name) for name in skinny or {}]
    runs = {name: fused_with(c) if isinstance(c, GatedConfig) else skinny[c][0] for name, c in tiles}
    compile_together(list(runs.values()), xs, wait=True)  # on every core, before the first is timed
    for name, c in tiles:
        run = runs[name]
        try:
            why = wrong_result(run(xs), ref)
            if why is not None:  # a tile the compiler gets wrong is never timed, let alone chosen
                wrong.append(f"{name}: {why}")
                continue
            t = graph_time_ms(lambda run=run: run(xs))
        except Exception as e:  # noqa: BLE001 - a tile the compiler rejects (registers, shared memory) is skipped
            cuda_fault.check(e, f"gated-GEMM tile {name} of {node.name}")
            continue
        times[name] = t
        if t < best[0]:
            best = (t, c)
    fused_best = min((t for n, t in times.items() if n != "unfused"), default=float("inf"))
    chosen = "unfused" if best[1] is None else best[1] if isinstance(best[1], str) else best[1].describe()
    note = f"{chosen}: fused {fused_best * 1e3:.1f} us vs unfused {times['unfused'] * 1e3:.1f} us"
    others = sorted((t, n) for n, t in times.items() if n not in ("unfused", chosen))[:4]
    note += f" (then {', '.join(f'{n} {t * 1e3:.1f}' for t, n in others)})" if others else ""
    missing = [name for name, _ in tiles if name not in times and not any(w.startswith(f"{name}:") for w in wrong)]
    note += f"; failed to run: {', '.join(missing)}" if missing else ""
    note += f"; skipped {'; '.join(wrong)}" if wrong else ""
    _DECIDED[key] = (best[1], note)
    _TIMES[key] = times
    return _DECIDED[key]


def _decision_key(node: Any, graph: Any, options: Any) -> tuple:
    types = tuple((tuple(t.shape), str(t.dtype)) for t in map(graph.type_of, node.inputs))
    return (types, node.attrs["act"], node.attrs["gate_first"], node.attrs.get("row_rms"), repr(options))
