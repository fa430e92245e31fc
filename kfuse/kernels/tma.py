"""Host-side TMA (Hopper's bulk tensor copies) shared by the templates: whether a tensor's device
can use TMA, the spatial pixel tile of the conv kernels, and the 4-D descriptor that moves an NHWC
activation as [1, BH, BW, C-block] boxes (out-of-bounds boxes, negative coordinates included, are
zero-filled on loads and clipped on stores: a stride-1 convolution's padding and ragged edges)."""

from __future__ import annotations

from typing import Any

import torch

TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def tma_device(t: torch.Tensor | torch.device) -> bool:
    """False only for a CUDA tensor (or device) on a GPU before Hopper (sm_90); the interpreter emulates TMA."""
    device = t if isinstance(t, torch.device) else t.device
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def spatial_tile(block_m: int, tile_h: int, who: str, tile_n: int = 1) -> tuple[int, int]:
    """(BH, BW) of a ``block_m``-pixel tile of ``tile_n`` images, ``tile_h`` rows high; all powers of two."""
    pow2 = lambda v: v > 0 and v & (v - 1) == 0  # noqa: E731
    if not (pow2(block_m) and pow2(tile_h) and pow2(tile_n)) or block_m % (tile_h * tile_n):
        raise ValueError(
            f"{who}: tile_h {tile_h} x tile_n {tile_n} must be powers of two whose product divides block_m {block_m} (a power of two)"
        )
    return tile_h, block_m // (tile_h * tile_n)


def tile_waste(block_m: int, tile_n: int, tile_h: int, nb: int, oh: int, ow: int) -> float:
    """Pixels a tile of tile_n images x tile_h rows x the rest columns computes over an (nb, oh,
    ow) output, divided by the pixels needed (1.0: no waste)."""

    def cover(n: int, t: int) -> int:
        return -(-n // t) * t

    bw = block_m // (tile_n * tile_h)
    return cover(nb, tile_n) * cover(oh, tile_h) * cover(ow, bw) / (nb * oh * ow)


def least_waste_tile(block_m: int, nb: int, oh: int, ow: int) -> tuple[int, int, float]:
    """(tile_n, tile_h, waste) of the ``block_m``-pixel tile of tile_n images x tile_h rows x the
    rest columns that covers an (nb, oh, ow) output with the fewest pixels computed in vain
    (``tile_waste``). Ties go to fewer images per tile, then wider rows (longer contiguous TMA
    rows). 28 x 28 at batch 64: 8 x 4 x 4 (waste 1.0; one image's 4 x 32 or 32 x 4 tile computes
    1.14x, 8 x 16 1.31x)."""
    best: tuple[tuple[float, int, int, int], float] | None = None
    tn = 1
    while tn <= block_m:
        th = 1
        while tn * th <= block_m:
            bw = block_m // (tn * th)
            if max(tn, th, bw) <= 256:
                waste = tile_waste(block_m, tn, th, nb, oh, ow)
                key = (round(waste, 9), tn, -bw, th)  # rounded: equal wastes tie exactly
                if best is None or key < best[0]:
                    best = (key, waste)
            th *= 2
        tn *= 2
    assert best is not None
    (_, tn, _, th), waste = best
    return tn, th, waste


def nhwc_box_descriptor(t: torch.Tensor, bh: int, bw: int, box_c: int, bn: int = 1) -> Any | None:
    """The descriptor of ``t`` (N, C, H, W) with channels-last strides, viewed as (N, H, W, C),
    moving [bn, bh, bw, box_c] boxes (``bn`` images: small images tile without waste); None when TMA cannot: another dtype, channels not the
    unit-stride dim, a base or pixel stride not 16-byte aligned, an inner box under 16 bytes, a
    box dim over 256."""
    e = t.element_size()
    if t.dtype not in TMA_DTYPES or t.stride(1) != 1 or t.data_ptr() % 16:
        return None
    if any(t.stride(d) * e % 16 for d in (0, 2, 3)) or box_c * e % 16 or max(bn, bh, bw, box_c) > 256:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, c, h, w = t.shape
    return TensorDescriptor(t, [n, h, w, c], [t.stride(0), t.stride(2), t.stride(3), 1], [bn, bh, bw, box_c])
