"""What the sliding-window kernels over channels-last tiles share (``pool``, ``depthwise``): the output
length, the output tensor in the input's memory format and, inside the kernel, a tile's decode into image,
row and column. ``tiling`` is the max pool's tile rule (the depthwise kernel has its own measured one,
``depthwise.launch_config``).

One program owns BLOCK_P output pixels x BLOCK_C channels; the channel dimension is contiguous in NHWC, so
each window tap is a 16-byte-vector load and overlapping taps hit L2.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.codegen import cdiv, interpreting


def out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool = False) -> int:
    """PyTorch's output length (with its ceil_mode rule: the last window starts inside the input)."""
    span = size + 2 * p - d * (k - 1) - 1
    o = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (o - 1) * s >= size + p:
        o -= 1
    return o


def output_like(x: torch.Tensor, shape: tuple[int, int, int, int], out: torch.Tensor | None, who: str) -> torch.Tensor:
    """``out`` checked against ``shape`` and ``x``'s device, or a new tensor in ``x``'s memory format
    (channels-last in, channels-last out)."""
    if out is None:
        nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        fmt = torch.channels_last if nhwc else torch.contiguous_format
        return torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=fmt)
    if tuple(out.shape) != shape or out.device != x.device:
        raise ValueError(f"{who}: out is {tuple(out.shape)} on {out.device}, expected {shape} on {x.device}")
    return out


def tiling(pixels: int, channels: int) -> tuple[int, int, tuple[int, int]]:
    """(BLOCK_P, BLOCK_C, grid) for ``pixels`` output pixels of ``channels`` channels."""
    block_p, block_c = (16, 16) if interpreting() else (32, min(128, triton.next_power_of_2(channels)))
    return block_p, block_c, (cdiv(pixels, block_p), cdiv(channels, block_c))


@triton.jit
def tile(N, C, OH, OW, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's channels and masks, and each pixel's image (int64), row and column."""
    offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)  # flat output pixel n*OH*OW + oh*OW + ow
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_p = offs_p < N * OH * OW
    mask_c = offs_c < C
    n = (offs_p // (OH * OW)).to(tl.int64)
    rem = offs_p % (OH * OW)
    return offs_c, mask_p, mask_c, n, rem // OW, rem % OW


def pixel_stride(t: torch.Tensor) -> int | None:
    """The stride of the flattened pixel dim (dims 2..), or None where those dims do not merge into one."""
    shape, strides = t.shape[2:], t.stride()[2:]
    step = strides[-1] if shape else 1
    expect = step
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expect:
            return None
        expect = expect * size
    return step


def measured_step(
    node: Any, graph: Any, backend: str, run: Callable[[list[torch.Tensor]], torch.Tensor], template: str, desc: str,
    channels_last: bool = False,
) -> Any:  # fmt: skip
    """The Step running ``run`` for ``node``; on a GPU only where it is measured faster than the op's PyTorch
    reference (None: the executor runs PyTorch's). The pool, resize and GroupNorm kernels' lowering.
    ``channels_last``: time on a channels-last first input, the layout it has at run time, where the graph's
    type does not say so (an NHWC graph's activations after ops other than convs)."""
    if backend == "torch":
        return None
    from kfuse.ir import ops
    from kfuse.runtime.executor import KernelInfo, Step

    if backend == "triton" and torch.cuda.is_available():
        from kfuse.runtime.choice import choose, example_inputs, problem_key

        ref, a = ops.get(node.op).reference, dict(node.attrs)

        def channels_last_inputs() -> list[torch.Tensor]:
            xs = example_inputs(node, graph)
            if xs[0].dim() == 4:
                xs[0] = xs[0].contiguous(memory_format=torch.channels_last)
            return xs

        key = problem_key(node, graph, "channels_last") if channels_last else problem_key(node, graph)
        # the inputs are made on a cache miss only (choose calls the function then)
        inputs = channels_last_inputs if channels_last else None
        choice, times = choose(node, graph, {"kernel": run, "torch": lambda xs: ref(xs, a)}, key, inputs=inputs)
        if choice != "kernel":
            return None
        desc += f"; {times['kernel'] * 1e3:.1f} us vs PyTorch {times['torch'] * 1e3:.1f} us"
    return Step(node.name, node.inputs, run, KernelInfo(node.name, template, (node.op,), desc))
