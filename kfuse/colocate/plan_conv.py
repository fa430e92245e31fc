"""The PTB form of a compiled plan's convolution step: kfuse's own implicit-GEMM conv template, sliceable by tile range.

As ``plan_gemm`` does for ``gemm_epilogue`` steps: a ``conv_epilogue`` step of the plan becomes a block kernel whose
block is one output tile of that step (``kfuse.kernels.conv``'s ``conv_tile`` / ``conv_tma_tile``, the bodies of its
two kernels), with the step's tuned tile, its real input and packed weight, its bias and generated epilogue, so Aker's
fused versions slice ResNet-50's own convolutions rather than im2col GEMM stand-ins. What the block form does not
keep is listed in ``PlanGemmInfo.changed`` (a cuDNN kernel the plan chose: the template's tile instead). Convs with
an input prologue (a squeeze-excitation scale, a norm before the conv) stay the plan's steps (``None``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kfuse.colocate.plan_gemm import PlanGemmInfo, choose_tile, colocation_tiles
from kfuse.colocate.ptb import BlockKernel
from kfuse.kernels import conv
from kfuse.kernels.codegen import cdiv
from kfuse.kernels.tma import spatial_tile


def plan_conv_kernel(
    node: Any, graph: Any, inputs: list[torch.Tensor], name: str | None = None, share_sm: int = 0,
    time_ms: Callable[[BlockKernel], float] | None = None,
) -> tuple[BlockKernel, PlanGemmInfo] | None:  # fmt: skip
    """The block kernel of the plan's ``conv_epilogue`` node on ``inputs`` (x, weight, bias if any, the epilogue's
    extras, as the plan's step receives them), or None for a conv the template does not run or one with an input
    prologue. Each block writes one output tile, epilogue applied, into a channels-last buffer of its own.
    ``share_sm`` > 0: a tile that lets that many blocks share an SM (``plan_gemm.colocation_tiles``), the fastest by
    ``time_ms(kernel)`` where given (``meta["fit_ms"]``), else the plain stage cut."""
    if node.op != "conv_epilogue":
        raise ValueError(f"plan_conv_kernel: {node.name} is a {node.op!r} node, not conv_epilogue")
    params = conv.ConvParams.of(node.attrs)
    x, weight = inputs[0], inputs[1]
    if node.attrs.get("in_scale") or conv.supported(tuple(weight.shape), params) is not None or params.pad_end != (0, 0):
        return None
    nb, c, h, w = x.shape
    oc, cg, kh, kw = weight.shape
    oh, ow = conv.out_hw(h, w, kh, kw, params)
    groups = params.groups
    cfg = node.attrs.get("config") or conv.default_config(nb * oh * ow, oc // groups, kh * kw * cg, cg, groups)
    plan_cfg = cfg.describe() if node.attrs.get("config") is not None else f"{cfg.describe()} (untuned default)"
    extras = inputs[conv.conv_operand_count(node.attrs) :]
    if len(extras) != node.attrs["epilogue"].n_inputs:
        raise ValueError(f"plan_conv_kernel: the epilogue expects {node.attrs['epilogue'].n_inputs} extra inputs, got {len(extras)}")
    wp = conv.pack_weight(weight, groups)
    probe = torch.empty((nb, oc, oh, ow), dtype=node.ttype.dtype, device=x.device, memory_format=torch.channels_last)
    descs = conv.tma_descriptors(x, probe, cfg, params) if cfg.tile_h and groups == 1 else None
    tma, store = descs is not None, descs is not None and descs[1] is not None
    changed = ["TMA cannot do this conv: the pointer kernel's tile"] if cfg.tile_h and not tma else []

    def build(t: conv.ConvConfig, tma_store: bool) -> tuple[BlockKernel, str]:
        return _tile_kernel(node, inputs, wp, params, t, tma, tma_store, name)

    if share_sm <= 0:
        kernel, form = build(cfg, store)
        return kernel, PlanGemmInfo(plan_cfg, cfg.describe(), form, tuple(changed))
    choices = colocation_tiles(cfg, share_sm, x.element_size(), store)
    kernel, form, tile, how = choose_tile(choices, build, time_ms)
    return kernel, PlanGemmInfo(plan_cfg, tile.describe(), form, tuple(changed + ([how] if how else [])))


def _tile_kernel(
    node: Any, inputs: list[torch.Tensor], wp: torch.Tensor, params: conv.ConvParams, cfg: conv.ConvConfig, tma: bool,
    tma_store: bool, name: str | None,
) -> tuple[BlockKernel, str]:  # fmt: skip
    """The block kernel of one tile choice (its own output buffer), and its form."""
    x, weight = inputs[0], inputs[1]
    has_bias = bool(node.attrs.get("has_bias"))
    bias = inputs[2] if has_bias else None
    nb, c, h, w = x.shape
    oc, cg, kh, kw = weight.shape
    oh, ow = conv.out_hw(h, w, kh, kw, params)
    groups = params.groups
    out = torch.empty((nb, oc, oh, ow), dtype=node.ttype.dtype, device=x.device, memory_format=torch.channels_last)
    extras = [torch.broadcast_to(e, out.shape) for e in inputs[conv.conv_operand_count(node.attrs) :]]
    ex_strides = [s for e in extras for s in (e.stride(0), e.stride(1), e.stride(2), e.stride(3))]
    precision = "ieee" if x.dtype == torch.float32 and not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    mod = conv._module(node.attrs["epilogue"])
    descs = conv.tma_descriptors(x, out, cfg, params) if tma else None
    if descs is not None:
        x_desc, c_desc, block_k = descs
        c_desc = c_desc if tma_store else None
        bh, bw = spatial_tile(cfg.block_m, cfg.tile_h, "conv", cfg.tile_n)
        fn, form = "conv_tma_tile", "tma"
        n_blocks = cdiv(nb, cfg.tile_n) * cdiv(oh, bh) * cdiv(ow, bw) * cdiv(oc, cfg.block_n)
        args = [x_desc, wp, bias if bias is not None else wp, out, c_desc if c_desc is not None else out, *extras,
                nb, c, h, w, oc, oh, ow, *out.stride(), *ex_strides]  # fmt: skip
        consts = {"PH": params.padding[0], "PW": params.padding[1], "DH": params.dilation[0], "DW": params.dilation[1], "KH": kh,
                  "KW": kw, "BNI": cfg.tile_n, "BH": bh, "BW": bw, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n, "BLOCK_K": block_k,
                  "HAS_BIAS": has_bias, "TMA_STORE": c_desc is not None, "INPUT_PRECISION": precision}  # fmt: skip
    else:
        fn, form = "conv_tile", "pointers"
        n_blocks = cdiv(nb * oh * ow, cfg.block_m) * cdiv(oc // groups, cfg.block_n) * groups
        args = [x, wp, bias if bias is not None else wp, out, wp, wp, *extras, nb, cg, h, w, oc // groups, oh, ow,
                *x.stride(), *out.stride(), 0, 0, 0, 0, *ex_strides]  # fmt: skip
        consts = {"SH": params.stride[0], "SW": params.stride[1], "PH": params.padding[0], "PW": params.padding[1],
                  "DH": params.dilation[0], "DW": params.dilation[1], "KH": kh, "KW": kw, "BLOCK_M": cfg.block_m,
                  "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k, "GROUP_M": cfg.group_m, "FLAT_K": cfg.flat_k,
                  "HAS_BIAS": has_bias, "IN_SCALE": False, "IN_SHIFT": False, "IN_RELU": False, "GROUPED": groups > 1,
                  "INPUT_PRECISION": precision}  # fmt: skip
    k_dim = kh * kw * cg
    elem = x.element_size()
    kernel = BlockKernel(
        name=name or node.name,
        module=mod.__name__,
        fn=fn,
        args=args,
        consts=consts,
        n_blocks=n_blocks,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
        flops_per_block=2.0 * cfg.block_m * cfg.block_n * k_dim,
        bytes_per_block=(cfg.block_m + cfg.block_n) * k_dim * elem + cfg.block_m * cfg.block_n * out.element_size(),
        meta={
            "M": nb * oh * ow,
            "N": oc // groups,
            "K": k_dim,
            "batch": groups,
            "tensor_core": precision != "ieee" or elem < 4,
            "out": out,
        },  # fmt: skip
    )
    return kernel, form
