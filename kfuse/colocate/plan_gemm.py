"""The PTB form of a compiled plan's GEMM step: kfuse's own template, tile and epilogue, sliceable by tile range.

Aker fuses an LC kernel with a BE kernel inside one launch, so the LC kernel must exist as a *block function*
(``ptb.BlockKernel``: one output tile per block id). The PTB stand-in (``ptb.gemm_block``) is a bare GEMM on
stand-in operands; session 54 measured that a co-location result on it overstates what the compiled model leaves
(its 48-tile GEMMs left SMs idle that kfuse's tuned kernels fill). This module builds the block kernel of a plan's
``gemm_epilogue`` step from the template the plan runs (``kfuse.kernels.gemm``'s ``gemm_tile`` / ``gemm_tma_tile``,
the tile bodies of its persistent kernels), with the step's tuned tile, its real operands and its generated epilogue,
so one block computes exactly one tile of the step's output.

What the PTB form cannot keep, it says (``PlanGemmInfo.changed``): split-K (a block is one whole output tile), the
Gluon warp-specialised kernels (no block-function form: their tile runs on the TMA tile, rounded to Triton's powers
of two as ``gemm.launch`` does where they cannot run), the resident-B kernel, and a library GEMM the plan chose
(cuBLASLt: the template's tuned tile instead). The run compares each step's PTB time with the plan's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from kfuse.colocate.ptb import BlockKernel, launch_ptb
from kfuse.kernels import gemm
from kfuse.kernels.codegen import cdiv, interpreting
from kfuse.tune.hardware import programs_per_sm as hardware_programs_per_sm

TileT = TypeVar("TileT")  # a template config with block_m / block_n / block_k / num_stages (GemmConfig, ConvConfig)
MAX_PROGRAMS_PER_SM = 2  # the LC's persistent grid takes at most this many programs an SM (the PTB stand-in's)
SM_SHARED_BYTES = gemm.SMEM_PER_SM  # sm_90 (H100/H200): shared memory an SM
BLOCK_RESERVED_BYTES = 1024  # what the hardware keeps of it for each resident block
MIN_STAGES = 2  # below two buffers the main loop has no load in flight while it multiplies


def tile_shared_bytes(tile: Any, elem: int, tma_store: bool) -> int:
    """Shared memory of one block of ``tile``: ``num_stages`` A and B tiles (the pipeline's ring) and, when the output
    is stored by TMA, the staged C tile (offline sm_90 compiles ask for this plus 32 bytes of barriers)."""
    ring = tile.num_stages * (tile.block_m * tile.block_k + tile.block_k * tile.block_n) * elem
    return ring + (tile.block_m * tile.block_n * elem if tma_store else 0)


def fit_stages(tile: TileT, per_sm: int, elem: int, tma_store: bool) -> TileT:
    """``tile`` (a GEMM or conv config) with its pipeline stages cut (to ``MIN_STAGES`` at least) until ``per_sm``
    blocks' shared memory fits an SM. The plan's tuned tiles take 160-213 KB (BERT-base on the H100: 4 stages of 128 x 128 x 64 or
    64 x 128 x 128), one block an SM: a fused kernel's blocks all take the larger branch's shared memory, so no BE
    block could sit beside an LC block (Aker's partitioned versions) without this."""
    budget = SM_SHARED_BYTES // per_sm - BLOCK_RESERVED_BYTES - 64
    while tile.num_stages > MIN_STAGES and tile_shared_bytes(tile, elem, tma_store) > budget:  # type: ignore[attr-defined]
        tile = replace(tile, num_stages=tile.num_stages - 1)  # type: ignore[attr-defined, type-var]
    return tile


@dataclass(frozen=True)
class PlanGemmInfo:
    """How the PTB form relates to the plan's kernel for one step."""

    plan_config: str  # the tuned config the plan's step was lowered with
    tile: str  # the tile the block function runs
    form: str  # "tma" (gemm_tma_tile) or "pointers" (gemm_tile)
    changed: tuple[str, ...]  # what the PTB form does differently from the plan, in words

    def describe(self) -> str:
        note = f" ({'; '.join(self.changed)})" if self.changed else ""
        return f"{self.tile} {self.form}{note}"


def ptb_tile(cfg: gemm.GemmConfig) -> tuple[gemm.GemmConfig, tuple[str, ...]]:
    """The tile a block function runs for the plan's ``cfg``, and what had to change: one whole output tile a block
    (no split-K), the Gluon kernels' tile on Triton's TMA tile (powers of two), no resident B."""
    changed = []
    tile = cfg
    if cfg.split_k > 1:
        changed.append(f"split-K {cfg.split_k} -> 1")
        tile = replace(tile, split_k=1)
    if cfg.ws:
        bm, bn = 1 << (cfg.block_m.bit_length() - 1), 1 << (cfg.block_n.bit_length() - 1)
        changed.append(f"Gluon {cfg.ws} kernel -> Triton TMA tile {bm}x{bn}")
        tile = replace(tile, ws="", shared_c=False, block_m=bm, block_n=bn, tma=True)
    if cfg.resident_b:
        changed.append("resident B -> streamed")
        tile = replace(tile, resident_b=False)
    # the persistent kernels' compile hints have no meaning for one tile
    tile = replace(tile, persistent=False, flatten=False, warp_specialize=False, epilogue_subtile=False)
    return tile, tuple(changed)


def colocation_tiles(tile: TileT, per_sm: int, elem: int, tma_store: bool) -> list[tuple[TileT, bool, str]]:
    """Ways for ``tile`` to fit ``per_sm`` blocks an SM, as (tile, C stored by TMA, what changed), the plain stage cut
    first: the stages cut (``fit_stages``); the C tile stored by pointers, which frees the 32 KB staging buffer for a
    stage (with a TMA store); half the K step at up to twice the stages, the same bytes in flight in a deeper pipeline
    (session 55: two stages of 64 x 128 x 128 ran FFN2's K = 3072 loop at 1.84x the plan's four). Duplicates dropped."""
    out: list[tuple[TileT, bool, str]] = []

    def add(t: TileT, store: bool, how: str) -> None:
        fitted = fit_stages(t, per_sm, elem, store)
        notes = [how] if how else []
        if fitted.num_stages != tile.num_stages:  # type: ignore[attr-defined]
            notes.append(f"stages {tile.num_stages} -> {fitted.num_stages} ({per_sm} blocks an SM)")
        if all((fitted, store) != (o[0], o[1]) for o in out):
            out.append((fitted, store, "; ".join(notes)))

    add(tile, tma_store, "")
    if tma_store:
        add(tile, False, "C stored by pointers")
    if tile.block_k >= 64:  # type: ignore[attr-defined]
        half = replace(tile, block_k=tile.block_k // 2, num_stages=2 * tile.num_stages)  # type: ignore[attr-defined, type-var]
        add(half, tma_store, f"K step {tile.block_k} -> {half.block_k}")  # type: ignore[attr-defined]
        if tma_store:
            add(half, False, f"K step {tile.block_k} -> {half.block_k}; C stored by pointers")  # type: ignore[attr-defined]
    return out


def plan_gemm_kernel(
    node: Any, graph: Any, inputs: list[torch.Tensor], name: str | None = None, share_sm: int = 0,
    time_ms: Callable[[BlockKernel], float] | None = None,
) -> tuple[BlockKernel, PlanGemmInfo]:  # fmt: skip
    """The block kernel of the plan's ``gemm_epilogue`` node on ``inputs`` (A, B, then the epilogue's extras, as the
    plan's step receives them): each block writes one output tile, epilogue applied, into a buffer of its own (the
    step's output shape and dtype). ``share_sm`` > 0: a tile that lets that many blocks share an SM
    (``colocation_tiles``): the fastest by ``time_ms(kernel)`` where given (a GPU; every candidate's time goes into
    ``meta["fit_ms"]``), else the plain stage cut."""
    if node.op != "gemm_epilogue":
        raise ValueError(f"plan_gemm_kernel: {node.name} is a {node.op!r} node, not gemm_epilogue")
    a, b, extras = inputs[0], inputs[1], list(inputs[2:])
    eps = node.attrs.get("row_rms")
    changed: list[str] = []
    if eps is not None:  # a folded RMSNorm: the step scales A's rows first; here A is scaled once, ahead of the runs
        from kfuse.kernels.norm import norm

        a = norm(a, rms=True, eps=eps)
        changed.append("folded norm's row scale applied ahead")
    g = gemm.prepare(a, b, extras, node.ttype.dtype)
    nb, m, k = g.a.shape
    n = g.b.shape[2]
    cfg = node.attrs.get("config") or gemm.default_config(m, n, k)
    plan_cfg = cfg.describe() if node.attrs.get("config") is not None else f"{cfg.describe()} (untuned default)"
    tile, more = ptb_tile(cfg)
    changed += more
    tma_ok = tile.tma and gemm.tma_operands(g.a, g.b, tile) is not None
    if tile.tma and not tma_ok:
        changed.append("TMA cannot describe the operands: pointer loads")
    store_ok = tma_ok and bool(gemm.tma_output(g.c, tile)[1]["TMA_STORE"])
    if share_sm <= 0:
        kernel, form = _tile_kernel(node, g, tile, tma_ok, store_ok, name)
        return kernel, PlanGemmInfo(plan_cfg, tile.describe(), form, tuple(changed))
    choices = colocation_tiles(tile, share_sm, g.a.element_size(), store_ok)
    kernel, form, tile, how = choose_tile(choices, lambda t, st: _tile_kernel(node, g, t, tma_ok, st, name), time_ms)
    return kernel, PlanGemmInfo(plan_cfg, tile.describe(), form, tuple(changed + ([how] if how else [])))


def choose_tile(
    choices: list[tuple[TileT, bool, str]], build: Callable[[TileT, bool], tuple[BlockKernel, str]],
    time_ms: Callable[[BlockKernel], float] | None,
) -> tuple[BlockKernel, str, TileT, str]:  # fmt: skip
    """Of ``colocation_tiles``' choices, the kernel (its form, tile and what changed) that ``time_ms`` finds fastest,
    every candidate's time in its ``meta["fit_ms"]``; the first choice (the plain stage cut) without a timer."""
    built = [(*build(t, store), t, how) for t, store, how in choices]
    best = 0
    if time_ms is not None and len(built) > 1:
        times = [float(time_ms(kern)) for kern, *_ in built]
        best = min(range(len(times)), key=times.__getitem__)
        built[best][0].meta["fit_ms"] = {f"{t.describe()}{' (' + how + ')' if how else ''}": ms  # type: ignore[attr-defined]
                                         for (_, _, t, how), ms in zip(built, times, strict=True)}  # fmt: skip
    return built[best]


def _tile_kernel(
    node: Any, g: gemm.GemmCall, tile: gemm.GemmConfig, tma: bool, tma_store: bool, name: str | None
) -> tuple[BlockKernel, str]:
    """The block kernel of one tile choice on the prepared call ``g`` (its own output buffer), and its form."""
    epi = node.attrs["epilogue"]
    nb, m, k = g.a.shape
    n = g.b.shape[2]
    c = torch.empty_like(g.c)
    mod = gemm._module(epi)
    precision = "ieee" if g.a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    ex_strides = [s for e in g.extras for s in (e.stride(0), e.stride(1), e.stride(2))]
    xb = {f"XB{j}": e.stride(1) == 0 for j, e in enumerate(g.extras)}
    blocks = {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "BLOCK_K": tile.block_k, "GROUP_M": tile.group_m}
    if tma:
        ops = gemm.tma_operands(g.a, g.b, tile)
        assert ops is not None  # checked by the caller for this block shape
        a_desc, b_desc, layout = ops
        c_desc, store = gemm.tma_output(c, tile) if tma_store else (c, {"TMA_STORE": False, "C_BATCHED": False})
        fn, form = "gemm_tma_tile", "tma"
        args = [a_desc, b_desc, c, c_desc, *g.extras, m, n, k, c.stride(0), c.stride(1), c.stride(2), *ex_strides]
        consts = {**xb, **blocks, **layout, "INPUT_PRECISION": precision, **store}
    else:
        fn, form = "gemm_tile", "pointers"
        ab = (*g.a.stride(), *g.b.stride(), *c.stride())
        args = [g.a, g.b, c, *g.extras, m, n, k, *ab, *ex_strides]
        consts = {**xb, **blocks, "EVEN_K": k % tile.block_k == 0, "INPUT_PRECISION": precision}
    elem = g.a.element_size()
    kernel = BlockKernel(
        name=name or node.name,
        module=mod.__name__,
        fn=fn,
        args=args,
        consts=consts,
        n_blocks=cdiv(m, tile.block_m) * cdiv(n, tile.block_n) * nb,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        flops_per_block=2.0 * tile.block_m * tile.block_n * k,
        bytes_per_block=(tile.block_m + tile.block_n) * k * elem + tile.block_m * tile.block_n * c.element_size(),
        meta={"M": m, "N": n, "K": k, "batch": nb, "tensor_core": precision != "ieee" or g.a.dtype != torch.float32, "out": c},
    )
    return kernel, form


def output(kernel: BlockKernel) -> torch.Tensor:
    """The buffer ``kernel``'s blocks write (the step's output shape as 3-D (batch, M, N))."""
    return kernel.meta["out"]


def fit_programs_per_sm(kernel: BlockKernel, most: int = MAX_PROGRAMS_PER_SM) -> int:
    """How many of ``kernel``'s PTB programs an SM holds, at most ``most``: from the compiled kernel's registers and
    shared memory on a GPU (a tuned tile may take a whole SM: a grid of two an SM would queue its second half behind
    the first), ``most`` in the interpreter. Compiles (and runs one block of) the kernel."""
    ck = launch_ptb(kernel, 0, min(1, kernel.n_blocks), 1)
    if interpreting() or ck is None or not hasattr(ck, "n_regs"):
        return most
    fit = hardware_programs_per_sm(int(ck.n_regs), int(ck.metadata.shared), kernel.num_warps)
    return max(1, min(most, fit))
