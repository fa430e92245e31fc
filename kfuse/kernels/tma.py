"""Host-side TMA (Hopper's bulk tensor copies) shared by the templates: whether a tensor's device
can use TMA, the spatial pixel tile of the conv kernels, and the 4-D descriptor that moves an NHWC
activation as [1, BH, BW, C-block] boxes (out-of-bounds boxes, negative coordinates included, are
zero-filled on loads and clipped on stores: a stride-1 convolution's padding and ragged edges)."""

from __future__ import annotations

from typing import Any

import torch

TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def tma_device(t: torch.Tensor) -> bool:
    """False only for a CUDA tensor on a GPU before Hopper (sm_90); the interpreter emulates TMA."""
    return not t.is_cuda or torch.cuda.get_device_capability(t.device)[0] >= 9


def spatial_tile(block_m: int, tile_h: int, who: str) -> tuple[int, int]:
    """(BH, BW) of a ``block_m``-pixel tile ``tile_h`` rows high; both powers of two."""
    if block_m <= 0 or block_m & (block_m - 1) or tile_h <= 0 or tile_h & (tile_h - 1) or block_m % tile_h:
        raise ValueError(f"{who}: tile_h {tile_h} must be a power of two dividing block_m {block_m} (a power of two)")
    return tile_h, block_m // tile_h


def nhwc_box_descriptor(t: torch.Tensor, bh: int, bw: int, box_c: int) -> Any | None:
    """The descriptor of ``t`` (N, C, H, W) with channels-last strides, viewed as (N, H, W, C),
    moving [1, bh, bw, box_c] boxes; None when TMA cannot: another dtype, channels not the
    unit-stride dim, a base or pixel stride not 16-byte aligned, an inner box under 16 bytes, a
    box dim over 256."""
    e = t.element_size()
    if t.dtype not in TMA_DTYPES or t.stride(1) != 1 or t.data_ptr() % 16:
        return None
    if any(t.stride(d) * e % 16 for d in (0, 2, 3)) or box_c * e % 16 or max(bh, bw, box_c) > 256:
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    n, c, h, w = t.shape
    return TensorDescriptor(t, [n, h, w, c], [t.stride(0), t.stride(2), t.stride(3), 1], [1, bh, bw, box_c])
