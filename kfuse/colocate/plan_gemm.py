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

from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from kfuse.colocate.ptb import BlockKernel, launch_ptb
from kfuse.kernels import gemm
from kfuse.kernels.codegen import cdiv, interpreting
from kfuse.tune.hardware import programs_per_sm as hardware_programs_per_sm

TileT = TypeVar("TileT")  # a template config with block_m / block_n / block_k / num_stages (GemmConfig, ConvConfig)
MAX_PROGRAMS_PER_SM = 2  # the LC's persistent grid takes at most this many programs an SM (the PTB stand-in's)
SM_SHARED_BYTES = 233472  # sm_90 (H100/H200): shared memory an SM
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


def plan_gemm_kernel(
    node: Any, graph: Any, inputs: list[torch.Tensor], name: str | None = None, share_sm: int = 0
) -> tuple[BlockKernel, PlanGemmInfo]:  # fmt: skip
    """The block kernel of the plan's ``gemm_epilogue`` node on ``inputs`` (A, B, then the epilogue's extras, as the
    plan's step receives them): each block writes one output tile, epilogue applied, into a buffer of its own (the
    step's output shape and dtype). ``share_sm`` > 0: the tile's stages cut so that many blocks share an SM
    (``fit_stages``)."""
    if node.op != "gemm_epilogue":
        raise ValueError(f"plan_gemm_kernel: {node.name} is a {node.op!r} node, not gemm_epilogue")
    epi = node.attrs["epilogue"]
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
    mod = gemm._module(epi)
    precision = "ieee" if g.a.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    ex_strides = [s for e in g.extras for s in (e.stride(0), e.stride(1), e.stride(2))]
    xb = {f"XB{j}": e.stride(1) == 0 for j, e in enumerate(g.extras)}
    tiles = cdiv(m, tile.block_m) * cdiv(n, tile.block_n) * nb
    blocks = {"BLOCK_M": tile.block_m, "BLOCK_N": tile.block_n, "BLOCK_K": tile.block_k, "GROUP_M": tile.group_m}
    tma = gemm.tma_operands(g.a, g.b, tile) if tile.tma else None  # the descriptors depend on the block shape only
    c = g.c
    store = gemm.tma_output(c, tile)[1] if tma is not None else {"TMA_STORE": False}
    if share_sm > 0:
        fitted = fit_stages(tile, share_sm, g.a.element_size(), bool(store["TMA_STORE"]))
        if fitted != tile:
            changed.append(f"stages {tile.num_stages} -> {fitted.num_stages} ({share_sm} blocks an SM)")
            tile = fitted
    if tma is not None:
        a_desc, b_desc, layout = tma
        c_desc, store = gemm.tma_output(c, tile)
        fn, form = "gemm_tma_tile", "tma"
        args = [a_desc, b_desc, c, c_desc, *g.extras, m, n, k, c.stride(0), c.stride(1), c.stride(2), *ex_strides]
        consts = {**xb, **blocks, **layout, "INPUT_PRECISION": precision, **store}
    else:
        if tile.tma:
            changed.append("TMA cannot describe the operands: pointer loads")
        fn, form = "gemm_tile", "pointers"
        ab = (
            g.a.stride(0),
            g.a.stride(1),
            g.a.stride(2),
            g.b.stride(0),
            g.b.stride(1),
            g.b.stride(2),
            c.stride(0),
            c.stride(1),
            c.stride(2),
        )
        args = [g.a, g.b, c, *g.extras, m, n, k, *ab, *ex_strides]
        consts = {**xb, **blocks, "EVEN_K": k % tile.block_k == 0, "INPUT_PRECISION": precision}
    elem = g.a.element_size()
    kernel = BlockKernel(
        name=name or node.name,
        module=mod.__name__,
        fn=fn,
        args=args,
        consts=consts,
        n_blocks=tiles,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        flops_per_block=2.0 * tile.block_m * tile.block_n * k,
        bytes_per_block=(tile.block_m + tile.block_n) * k * elem + tile.block_m * tile.block_n * c.element_size(),
        meta={"M": m, "N": n, "K": k, "batch": nb, "tensor_core": precision != "ieee" or g.a.dtype != torch.float32, "out": c},
    )
    return kernel, PlanGemmInfo(plan_cfg, tile.describe(), form, tuple(changed))


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
