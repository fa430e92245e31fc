"""The chain description (stages, epilogues, dtypes) and the kernel configuration."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any

import torch

from kfuse.kernels.epilogue import Epilogue

MAX_RESIDENT = 256  # widest intermediate a program keeps resident (N0 <= 256, issue 5)
# "chunked": the intermediate is produced and consumed BLOCK_H columns at a time (two-stage GEMM
# chains, ``b2b_chunked_kernel``), so it is never whole on chip and its width is not bounded
RESIDENCES = ("register", "smem", "chunked")


def pad_width(n: int) -> int:
    """The resident tile width for an intermediate of width ``n``: a power of two >= 16."""
    p = 16
    while p < n:
        p *= 2
    return p


def chunked_eligible(conv: bool, widths: list[int], k0: int, elem_bytes: int = 2) -> str | None:
    """Why ``b2b_chunked_kernel`` cannot run a chain, or None when it can: two GEMM stages, K0 and
    the last width in one tile each (<= 256, TMA's box limit), and every row of x, the weights and
    the output a multiple of 16 bytes (TMA's stride rule)."""
    if conv or len(widths) != 2:
        return "chunked residence is for two-stage GEMM chains"
    if k0 > 256 or widths[-1] > 256:
        return f"chunked residence needs K0 <= 256 and N1 <= 256 (got {k0}, {widths[-1]})"
    if any((d * elem_bytes) % 16 for d in (k0, *widths)):
        return f"chunked residence needs 16-byte rows (K0 {k0}, widths {widths})"
    return None


def chunked_parts(k0: int, n1: int, min_part: int | None = None) -> tuple[int, int, int, int]:
    """(K_STEP, K_PARTS, N_A, N_B) of ``b2b_chunked_kernel``: K0 in one power-of-two step, or in up to
    four steps of K_STEP columns when it is not a power of two (192 = 3 x 64); N1 in one power-of-two
    tile N_A, or two (N_A the largest power of two below N1, N_B the rest padded: 192 = 128 + 64), so
    a width between powers of two does not run at the next one. No step or part is narrower than
    ``min_part`` columns (``$KFUSE_B2B_MIN_PART``, default 64); TMA zero-fills what lies past K0 / N1.
    Why 64: session 36 on the H200 (Triton 3.6), a 32-column second output part (N1 = 96 as 64 + 32, ConvNeXt-T's
    and Swin-T's MLP) gave wrong results (errors 0.9-21) or an illegal address in the one-warpgroup tilings;
    32-column K steps with N1 = 128 and ViT-Ti's 3 x 64, 128 + 64 were right. At 64, 96 runs as 2 x 64 and
    64 + 64 (a third of each product zero fill): 16 of 16 runs right (``b2b_chunked_fault_probe.py``)."""
    if min_part is None:
        min_part = int(os.environ.get("KFUSE_B2B_MIN_PART", "64"))
    min_part = max(16, min_part)
    if pad_width(k0) == k0 and k0 >= min_part:
        k_step, k_parts = k0, 1
    else:
        k_step = max(min_part, pad_width(-(-k0 // 4)))
        k_parts = -(-k0 // k_step)
    n_a = max(min_part, pad_width(n1))
    if n_a != n1 and n_a // 2 >= min_part:
        n_a //= 2
    n_b = 0 if n_a >= n1 else max(min_part, pad_width(n1 - n_a))
    return k_step, k_parts, n_a, n_b


def pad_constexprs(widths: list[int]) -> dict[str, int | bool]:
    """The kernels' constexprs for the intermediates (every width but the last): ``P<s>``, the
    resident tile width, and ``PADDED<s>``, whether it exceeds the width (padded columns to zero)."""
    pads: dict[str, int | bool] = {}
    for s, w in enumerate(widths[:-1]):
        pads[f"P{s}"] = pad_width(w)
        pads[f"PADDED{s}"] = pad_width(w) != w
    return pads


@dataclass(frozen=True)
class Stage:
    """One stage of a chain: its epilogue, whether it has a separate bias vector (conv nodes
    carry their bias apart from the epilogue), and the dtype its result is rounded to."""

    epilogue: Epilogue
    out_dtype: torch.dtype
    has_bias: bool = False


@dataclass(frozen=True)
class Chain:
    stages: tuple[Stage, ...]
    conv: bool = False  # stage 0 is an implicit-GEMM convolution

    def key(self) -> str:
        parts = [f"{s.epilogue.key()}:{s.has_bias}:{s.out_dtype}" for s in self.stages]
        return ("conv" if self.conv else "gemm") + "_" + hashlib.sha1("|".join(parts).encode()).hexdigest()[:12]

    def describe(self) -> str:
        return " => ".join(("conv" if (i == 0 and self.conv) else "gemm") + f"[{s.epilogue.describe()}]" for i, s in enumerate(self.stages))


@dataclass(frozen=True)
class B2BConfig:
    block_m: int = 64
    block_k: int = 32  # stage 0's K step
    block_n: int = 64  # last stage's N step
    num_warps: int = 4
    num_stages: int = 2
    residence: str = "register"
    persistent: bool = False  # fixed grid looping over row tiles, pipelined across tiles
    # the resident stages' weights are loaded before stage 0's GEMM (when the last width fits one
    # N tile), so their latency overlaps stage 0's loads instead of following its GEMM
    preload: bool = False
    # with ``persistent``: GEMM chains whose K0 and last width fit one tile read x and write the
    # output by TMA (``b2b_tma_kernel``); the pipeliner keeps TILE_STAGES row tiles in flight
    tma: bool = False
    programs_per_sm: int = 2  # persistent grid = programs_per_sm x SMs (capped at the tile count)
    # with ``tma`` on a conv chain: the spatial tile of ``b2b_conv_tma_kernel``, tile_n images x
    # tile_h x (block_m // (tile_h * tile_n)) output pixels (powers of two); 0: not that kernel.
    # Several images per tile let small images tile without waste (28 x 28 in 8 x 4 x 4 tiles of
    # 128 pixels, where one image's 4 x 32 tile computes 14% of its pixels in vain)
    tile_h: int = 0
    tile_n: int = 1
    # (``persistent`` with a conv chain's ``tile_h``: ``b2b_conv_tma_persistent_kernel``, a fixed
    # grid of programs_per_sm x SMs looping over the spatial tiles)
    # with ``tma`` on a GEMM chain: launch with programmatic dependent launch (Hopper), so the
    # persistent grid's prologue (weights, descriptors) overlaps the previous kernel's tail
    pdl: bool = False
    # software-pipelining depth of the last stage's N loop (outputs wider than BLOCK_N); 0: the
    # kernel's num_stages. Each stage buffers a P x BLOCK_N weight tile: at 128 -> 128 -> 512 the
    # default 4 buffers (128 KB) hold a program per SM, 1-2 let two programs share an SM, but
    # measured 7-40% slower on the H200 (session 8), so the candidates keep the default; a knob
    # for experiments/b2b_sweep.py --n-stages
    n_stages: int = 0
    # with ``residence="chunked"``: the intermediate's column chunk (stage 0's N step = stage 1's
    # K step); the chunk loop is pipelined ``num_stages`` deep
    block_h: int = 64

    def describe(self) -> str:
        d = f"{self.residence} m{self.block_m} k{self.block_k} n{self.block_n} w{self.num_warps} s{self.num_stages}"
        d += (" persistent" if self.persistent else "") + (" preload" if self.preload else "")
        if self.tma and self.tile_h:
            n = f"{self.tile_n}x" if self.tile_n > 1 else ""
            d += f" tma {n}{self.tile_h}x{self.block_m // (self.tile_h * self.tile_n)}"
            d += f" x{self.programs_per_sm}" if self.persistent else ""
        elif self.tma:
            d += f" tma x{self.programs_per_sm}" + (" pdl" if self.pdl else "")
        if self.n_stages:
            d += f" ns{self.n_stages}"
        if self.residence == "chunked":
            d += f" h{self.block_h}" + (f" x{self.programs_per_sm}" if self.persistent else "") + (" pdl" if self.pdl else "")
        return d

    def as_dict(self) -> dict[str, Any]:
        keys = ("block_m", "block_k", "block_n", "num_warps", "num_stages", "residence", "persistent", "preload", "tma", "programs_per_sm",
                "tile_h", "tile_n", "pdl", "n_stages", "block_h")  # fmt: skip
        return {k: getattr(self, k) for k in keys}
