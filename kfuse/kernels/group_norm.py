"""GroupNorm (+ SiLU) in two passes over a channels-last (or standard) map, for diffusion U-Nets and VAEs.

GroupNorm normalises each (image, group of C / G channels) over its channels and all pixels. Imported as
``reshape -> layer_norm -> reshape -> affine``, its first reshape of a channels-last conv output is a copy, so a
GroupNorm + SiLU cost a copy, the norm and a pointwise kernel: 3 reads and 3 writes of the map. Here it is
2 reads and 1 write:

1. ``_partial_sums``: program (image, pixel slice) sums x - k and (x - k)^2 per channel over its pixels, then per group
   (a one-hot [BLOCK_C, G] product, so a group may span channel blocks and C / G need not be a power of two),
   and writes its [G] partial sums. No atomics: the result is the same every run.
2. ``_normalize``: program (image, pixel slice) reduces the [slices, G] partial sums of its image to each
   group's mean and 1 / std, and writes ``(x - mean) * rstd * w + b``, then SiLU if asked, over its pixels.

The variance is E[(x - k)^2] - E[x - k]^2 in fp32, k the group's first value, so a mean far from zero cancels
nothing (the tests include mean 100, std 1). Pixels
are one flattened dim, so any layout whose spatial dims merge (NCHW, NHWC, [N, C, L]) runs without a copy.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.nhwc_window import measured_step, pixel_stride


@triton.jit
def _partial_sums(x_ptr, part_ptr, C, HW, G, CG, ROWS, sxn, sxc, sxp,
                  BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)  # n * sxn can pass 2^31 on a large map
    s = tl.program_id(1)
    r_lo = s * ROWS
    r_hi = tl.minimum(r_lo + ROWS, HW)
    gs = tl.arange(0, BLOCK_G)
    g_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
    g_sq = tl.zeros([BLOCK_G], dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        c_ok = cs < C
        # sums of x - k, k the group's first value: no cancellation in E[x^2] - mean^2 where |mean| >> std
        k = tl.load(x_ptr + n * sxn + (cs // CG) * CG * sxc, mask=c_ok, other=0.0).to(tl.float32)
        c_sum = tl.zeros([BLOCK_C], dtype=tl.float32)
        c_sq = tl.zeros([BLOCK_C], dtype=tl.float32)
        for r0 in range(r_lo, r_hi, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            ok = (rows < r_hi)[:, None] & c_ok[None, :]
            x = tl.load(x_ptr + n * sxn + rows[:, None] * sxp + cs[None, :] * sxc, mask=ok, other=0.0).to(tl.float32)
            d = tl.where(ok, x - k[None, :], 0.0)
            c_sum += tl.sum(d, 0)
            c_sq += tl.sum(d * d, 0)
        hot = ((cs[:, None] // CG) == gs[None, :]) & c_ok[:, None]  # channel -> its group
        g_sum += tl.sum(tl.where(hot, c_sum[:, None], 0.0), 0)
        g_sq += tl.sum(tl.where(hot, c_sq[:, None], 0.0), 0)
    base = part_ptr + (n * tl.num_programs(1) + s) * 2 * G
    tl.store(base + gs, g_sum, mask=gs < G)
    tl.store(base + G + gs, g_sq, mask=gs < G)


@triton.jit
def _normalize(x_ptr, part_ptr, w_ptr, b_ptr, y_ptr, C, HW, G, CG, ROWS, S, count, eps, sxn, sxc, sxp, syn, syc, syp,
               SILU: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
               BLOCK_S: tl.constexpr):  # fmt: skip
    n = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    gs = tl.arange(0, BLOCK_G)
    ss = tl.arange(0, BLOCK_S)
    ok = (ss < S)[:, None] & (gs < G)[None, :]
    part = part_ptr + (n * S + ss[:, None]) * 2 * G + gs[None, :]
    shifted = tl.sum(tl.load(part, mask=ok, other=0.0), 0) / count  # the mean of x - k
    var = tl.maximum(tl.sum(tl.load(part + G, mask=ok, other=0.0), 0) / count - shifted * shifted, 0.0)
    mean = tl.load(x_ptr + n * sxn + gs * CG * sxc, mask=gs < G, other=0.0).to(tl.float32) + shifted
    rstd = 1.0 / tl.sqrt(var + eps)
    r_lo = s * ROWS
    r_hi = tl.minimum(r_lo + ROWS, HW)
    for c0 in range(0, C, BLOCK_C):
        cs = c0 + tl.arange(0, BLOCK_C)
        c_ok = cs < C
        hot = (cs[:, None] // CG) == gs[None, :]
        # per channel: its group's statistics folded with the affine into one scale and shift
        scale = tl.sum(tl.where(hot, rstd[None, :], 0.0), 1) * tl.load(w_ptr + cs, mask=c_ok, other=0.0).to(tl.float32)
        shift = tl.load(b_ptr + cs, mask=c_ok, other=0.0).to(tl.float32) - tl.sum(tl.where(hot, mean[None, :], 0.0), 1) * scale
        for r0 in range(r_lo, r_hi, BLOCK_R):
            rows = r0 + tl.arange(0, BLOCK_R)
            m = (rows < r_hi)[:, None] & c_ok[None, :]
            x = tl.load(x_ptr + n * sxn + rows[:, None] * sxp + cs[None, :] * sxc, mask=m, other=0.0).to(tl.float32)
            y = x * scale[None, :] + shift[None, :]
            if SILU:
                y = y / (1.0 + tl.exp(-y))
            tl.store(y_ptr + n * syn + rows[:, None] * syp + cs[None, :] * syc, y.to(y_ptr.dtype.element_ty), mask=m)


def row_tile(pixels: int, block_c: int, programs: int = 528) -> int:
    """Pixels a tile: up to 64 (a 64 x 64 tile), fewer where the map is too small to give ``programs``
    programs of 64 (SD's U-Net at 64 x 64 latents, B2: 8,192 pixels -> 8-pixel tiles, 512 programs instead of
    128). Neither kernel pipelines its loads, so only more programs an SM hide their latency."""
    tile = max(8, min(64, 4096 // block_c))
    while tile > 8 and pixels < programs * tile:
        tile //= 2
    return tile


def launch_shape(n: int, hw: int, block_r: int, programs: int = 528) -> tuple[int, int]:
    """(slices per image, pixels per slice): about ``programs`` programs in all (4 per SM on an H200), each
    slice a whole number of ``block_r`` row tiles."""
    s = max(1, min(triton.cdiv(programs, n), triton.cdiv(hw, block_r), 256))
    rows = triton.cdiv(triton.cdiv(hw, s), block_r) * block_r
    return triton.cdiv(hw, rows), rows


def group_norm(
    x: torch.Tensor, groups: int, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, silu: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``F.group_norm(x, groups, weight, bias, eps)`` (then ``F.silu`` if ``silu``) for x of rank >= 3 in any
    memory format; the output has x's strides."""
    if x.dim() < 3 or x.shape[1] % groups:
        raise ValueError(f"group_norm: {groups} groups do not divide the channels of a {tuple(x.shape)} input")
    if weight.shape != (x.shape[1],) or bias.shape != (x.shape[1],):
        raise ValueError(f"group_norm: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} must be ({x.shape[1]},)")
    if pixel_stride(x) is None:
        x = x.contiguous()
    y = torch.empty_like(x) if out is None else out
    if y.shape != x.shape or pixel_stride(y) is None:
        raise ValueError(f"group_norm: out {tuple(y.shape)} must match x {tuple(x.shape)} with mergeable pixel dims")
    n, c = x.shape[:2]
    hw = x[0, 0].numel()
    cg = c // groups
    block_c = min(64, triton.next_power_of_2(c))
    block_r = row_tile(n * hw, block_c)
    block_g = triton.next_power_of_2(groups)
    s, rows = launch_shape(n, hw, block_r)
    part = torch.empty((n, s, 2, groups), device=x.device, dtype=torch.float32)
    sx, sy = (x.stride(0), x.stride(1), pixel_stride(x)), (y.stride(0), y.stride(1), pixel_stride(y))
    _partial_sums[(n, s)](x, part, c, hw, groups, cg, rows, *sx, BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_G=block_g)
    _normalize[(n, s)](x, part, weight, bias, y, c, hw, groups, cg, rows, s, float(cg * hw), float(eps), *sx, *sy, SILU=silu,
                       BLOCK_R=block_r, BLOCK_C=block_c, BLOCK_G=block_g, BLOCK_S=triton.next_power_of_2(s))  # fmt: skip
    return y


def lower_group_norm(node: Any, graph: Any, backend: str, options: Any = None) -> Any:
    """A Step running the two kernels; on a GPU only where they are measured faster than PyTorch's GroupNorm."""
    a = dict(node.attrs)
    silu = a.get("act") == "silu"

    def run(xs: list[torch.Tensor]) -> torch.Tensor:
        return group_norm(xs[0], a["groups"], xs[1], xs[2], a.get("eps", 1e-5), silu)

    from kfuse.passes.layout import runs_nhwc

    desc = f"{a['groups']} groups" + (" + SiLU" if silu else "")
    return measured_step(node, graph, backend, run, "group_norm", desc, channels_last=runs_nhwc(graph))
