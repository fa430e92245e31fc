"""The Hopper conv template (``conv_tma_kernel``): the input is read as TMA boxes of BH x BW pixels
shifted by each filter tap (the out-of-bounds part zero-filled: the padding), the output stored as
TMA boxes where the output allows it. In the interpreter on the CPU, or compiled on a Hopper GPU,
against ``conv.reference`` (fp32, on the CPU) on images that are not multiples of the pixel tile;
ineligible convs fall back to ``conv_kernel`` with the same results; and compiled offline for sm_90
(4-D TMA loads, wgmma, no spills)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cubin_facts import sass_facts

from kfuse.ir import ops  # noqa: F401
from kfuse.kernels import conv
from kfuse.kernels.conv import ConvConfig, ConvParams, conv_epilogue, reference
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)
ADD_RELU = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    """Record every launch's kernel name and constexprs (and still launch it)."""
    calls: list[tuple[str, dict[str, Any]]] = []
    real = conv._go

    def go(kernel: Any, grid: tuple[int, ...], warmup: bool, *args: Any, **kw: Any) -> None:
        calls.append((getattr(kernel, "fn", kernel).__name__, kw))
        real(kernel, grid, warmup, *args, **kw)

    monkeypatch.setattr(conv, "_go", go)
    return calls


def _run(
    c: int, oc: int, hw: tuple[int, int], k: int, pad: int, dil: int, stride: int, dtype: torch.dtype, epi: Epilogue,
    cfg: ConvConfig, device: str, x_cl: bool = True, out_cl: bool = True, nb: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """conv + bias + epilogue (batch ``nb``; residual NCHW so its strides differ from the output's)
    into a NaN-poisoned output; returns (kernel output, reference). The reference is computed on CPU
    copies: on a GPU, cuDNN would compute the fp32 convolution in TF32."""
    torch.manual_seed(3)
    p = ConvParams((stride, stride), (pad, pad), (dil, dil))
    x = torch.randn(nb, c, *hw, device=device).to(dtype)
    x = x.contiguous(memory_format=torch.channels_last) if x_cl else x.contiguous()
    wt = (torch.randn(oc, c, k, k, device=device) / (c * k * k) ** 0.5).to(dtype)
    b = torch.randn(oc, device=device).to(dtype)
    oh, ow = conv.out_hw(hw[0], hw[1], k, k, p)
    ex = [torch.randn(nb, oc, oh, ow, device=device).to(dtype)] if epi.n_inputs else []
    # the launcher allocates the output: poison the allocation so unwritten pixels show as NaN
    real_empty = torch.empty

    def poisoned(*a: Any, **kw: Any) -> torch.Tensor:
        return real_empty(*a, **kw).fill_(float("nan"))

    torch.empty = poisoned  # type: ignore[assignment]
    try:
        got = conv_epilogue(x, wt, b, ex, epi, p, dtype, cfg, channels_last=out_cl)
    finally:
        torch.empty = real_empty  # type: ignore[assignment]
    return got, reference(x.cpu(), wt.cpu(), b.cpu(), [e.cpu() for e in ex], epi, p, dtype)


def _check(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    got = got.cpu()
    assert not torch.isnan(got).any(), "pixels or channels left unwritten"
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def _cfg(bm: int, bn: int, bk: int, tile_h: int, tile_n: int = 1) -> ConvConfig:
    return ConvConfig(bm, bn, bk, 1, 4, 1, tile_h=tile_h, tile_n=tile_n)


CASES = [
    # C, OC, (H, W), kernel, pad, dilation, dtype, epilogue, config. Images are not multiples of the tile
    (8, 16, (7, 9), 1, 0, 1, torch.float32, RELU, _cfg(32, 16, 16, 4)),  # 1x1
    (24, 40, (7, 9), 3, 1, 1, torch.float16, ADD_RELU, _cfg(32, 32, 16, 4)),  # C % BLOCK_K != 0, OC % BLOCK_N != 0
    (32, 16, (5, 6), 3, 0, 1, torch.float32, ADD_RELU, _cfg(16, 16, 64, 2)),  # no padding; BLOCK_K 64 narrowed to 32
    (8, 40, (7, 9), 5, 2, 1, torch.float16, RELU, _cfg(32, 16, 16, 8)),  # 5x5, 8x4 tiles
    (24, 16, (6, 7), 3, 2, 2, torch.float32, ADD_RELU, _cfg(16, 16, 16, 4)),  # dilation 2
    (32, 40, (5, 6), 3, 1, 1, torch.float16, ADD_RELU, _cfg(64, 32, 32, 8)),  # an 8x8 tile larger than the image
    (8, 16, (7, 9), 3, 1, 1, torch.float16, RELU, _cfg(32, 16, 16, 2)),  # 2x16 tiles
]
# no bf16 case: the Triton 3.6 interpreter's bf16 tl.dot returns garbage (conv_kernel's too)


@pytest.mark.parametrize("c,oc,hw,k,pad,dil,dtype,epi,cfg", CASES)
def test_conv_tma_equals_reference(
    monkeypatch: pytest.MonkeyPatch, c: int, oc: int, hw: tuple[int, int], k: int, pad: int, dil: int, dtype: torch.dtype,
    epi: Epilogue, cfg: ConvConfig, device: str,
) -> None:  # fmt: skip
    calls = _spy(monkeypatch)
    got, ref = _run(c, oc, hw, k, pad, dil, 1, dtype, epi, cfg, device)
    assert [name for name, _ in calls] == ["conv_tma_kernel"]
    kw = calls[0][1]
    assert kw["TMA_STORE"] and (kw["BNI"], kw["BH"], kw["BW"]) == (1, cfg.tile_h, cfg.block_m // cfg.tile_h)
    assert kw["BLOCK_K"] == min(cfg.block_k, max(16, 1 << (c - 1).bit_length()))
    assert got.is_contiguous(memory_format=torch.channels_last)
    _check(got, ref, dtype)


@pytest.mark.parametrize(
    "hw,cfg,nb",
    [
        ((4, 4), _cfg(32, 16, 16, 4, tile_n=2), 3),  # 2 images of 4x4 per tile; the last tile has one
        ((5, 6), _cfg(32, 32, 16, 2, tile_n=4), 3),  # 4 images of 2x4: ragged edges and a missing image
        ((3, 3), _cfg(16, 16, 16, 1, tile_n=8), 5),  # 8 images x 1 x 2 pixels
    ],
)
def test_several_images_per_tile(monkeypatch: pytest.MonkeyPatch, hw: tuple[int, int], cfg: ConvConfig, nb: int, device: str) -> None:
    """``tile_n`` images per program: boxes [tile_n, BH, BW, C]; rows past the batch are computed
    and never stored; the residual is addressed per row's image."""
    calls = _spy(monkeypatch)
    got, ref = _run(24, 40, hw, 3, 1, 1, 1, torch.float32, ADD_RELU, cfg, device, nb=nb)
    assert [name for name, _ in calls] == ["conv_tma_kernel"]
    kw = calls[0][1]
    assert (kw["BNI"], kw["BH"], kw["BW"]) == (cfg.tile_n, cfg.tile_h, cfg.block_m // (cfg.tile_h * cfg.tile_n)) and kw["TMA_STORE"]
    assert f"tma {cfg.tile_n}x" in cfg.describe()
    _check(got, ref, torch.float32)


@pytest.mark.parametrize("oc,out_cl", [(20, True), (16, False)], ids=["OC*2 bytes not a multiple of 16", "NCHW output"])
def test_pointer_store_when_the_output_is_not_a_tma_tensor(monkeypatch: pytest.MonkeyPatch, oc: int, out_cl: bool, device: str) -> None:
    calls = _spy(monkeypatch)
    got, ref = _run(16, oc, (7, 9), 3, 1, 1, 1, torch.float16, ADD_RELU, _cfg(32, 16, 16, 4), device, out_cl=out_cl)
    assert [name for name, _ in calls] == ["conv_tma_kernel"] and not calls[0][1]["TMA_STORE"]
    assert got.is_contiguous(memory_format=torch.channels_last if out_cl else torch.contiguous_format)
    _check(got, ref, torch.float16)


@pytest.mark.parametrize(
    "why,kw",
    [
        ("stride 2", dict(stride=2)),
        ("NCHW input", dict(x_cl=False)),
        ("C * 2 bytes not a multiple of 16", dict(c=12)),
    ],
)
def test_ineligible_convs_fall_back_to_conv_kernel(monkeypatch: pytest.MonkeyPatch, why: str, kw: dict, device: str) -> None:
    """Same results as the config without tile_h (conv_kernel with the same tiles), bit for bit."""
    calls = _spy(monkeypatch)
    args: dict[str, Any] = dict(c=16, oc=24, hw=(7, 9), k=3, pad=1, dil=1, stride=1, dtype=torch.float16, epi=ADD_RELU, device=device)
    args.update(kw)
    got, ref = _run(**args, cfg=_cfg(32, 16, 16, 4))
    plain, _ = _run(**args, cfg=_cfg(32, 16, 16, 0))
    assert [name for name, _ in calls] == ["conv_kernel", "conv_kernel"], why
    assert torch.equal(got, plain), why
    _check(got, ref, torch.float16)


def test_config_tile_h_and_the_tuner_space(device: str) -> None:
    """``tile_h`` is not an axis: the tuner's space for a stride-1 conv on Hopper holds each g1
    pointer config once more as the TMA kernel on the problem's least-waste tile; stride 2 and
    pre-Hopper GPUs get none, and a hand-made TMA config there is rejected with the reason."""
    from kfuse.tune.hardware import TABLE
    from kfuse.tune.space import CONV_AXES, ConvProblem, all_configs, hard_reject, valid_configs

    cfg = ConvConfig(128, 64, 64, 1, 4, 3, tile_h=8)
    assert cfg.describe().endswith(" tma 8x16") and cfg.as_dict()["tile_h"] == 8
    assert "tma" not in ConvConfig().describe() and ConvConfig().tile_h == 0
    assert conv.default_config(1 << 20, 64, 576, 64).tile_h == 0
    assert "tile_h" not in CONV_AXES and not any(c.tile_h for c in all_configs("conv"))
    h200, a100 = TABLE["H200"], TABLE["A100"]
    p28 = ConvProblem(64, 128, 28, 28, 128, 3, 3, (1, 1), (1, 1))
    tma = [c for c in valid_configs(p28, h200) if c.tile_h]
    assert tma and all((c.tile_n, c.tile_h) == ((8, 4) if c.block_m == 128 else (c.tile_n, c.tile_h)) for c in tma)
    assert any(c.describe().endswith("tma 8x4x4") for c in tma) and all(c.group_m == 1 and not c.flat_k for c in tma)
    assert not any(c.tile_h for c in valid_configs(p28, a100))
    p_s2 = ConvProblem(64, 128, 56, 56, 128, 3, 3, (2, 2), (1, 1))
    assert not any(c.tile_h for c in valid_configs(p_s2, h200))
    assert "stride 1 only" in (hard_reject(cfg, p_s2, h200) or "")
    assert "Hopper" in (hard_reject(cfg, p28, a100) or "")
    assert "BLOCK_N >= 64" in (hard_reject(ConvConfig(128, 32, 64, 1, 4, 3, tile_h=8), p28, h200) or "")
    x = torch.randn(1, 16, 5, 5, device=device).contiguous(memory_format=torch.channels_last)
    wt = torch.randn(16, 16, 3, 3, device=device)
    with pytest.raises(ValueError, match="tile_h"):
        conv_epilogue(x, wt, None, [], RELU, ConvParams(padding=(1, 1)), torch.float32, _cfg(32, 16, 16, 3))


# ---- compiled for sm_90 --------------------------------------------------------------------------
_COMPILE = """
import json, pickle, sys
import triton
from triton.backends.compiler import GPUTarget
from kfuse.ir import ops
from kfuse.kernels import conv
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

a = json.loads(sys.stdin.read())
epi = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)
jf = conv._module(epi).conv_tma_kernel
names = list(jf.arg_names)
sig, const, div = {}, dict(a["const"], PDL=False), []
for name in names:
    if name in a["descs"]:
        sig[name] = a["descs"][name]
    elif name.endswith("_ptr"):
        sig[name] = "*fp16"
        div.append(name)
    elif name in const:
        sig[name] = "constexpr"
    elif a["ints"][name] == 1:  # what the JIT does with integer arguments: 1 is a constant,
        sig[name], const[name] = "constexpr", 1  # multiples of 16 are marked divisible
    else:
        sig[name] = "i32"
        div += [name] if a["ints"][name] % 16 == 0 else []
attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
src = triton.compiler.ASTSource(jf, sig, constexprs=const, attrs=attrs)
ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": a["warps"], "num_stages": a["stages"]})
sys.stdout.buffer.write(pickle.dumps({k: v for k, v in ck.asm.items() if isinstance(v, (str, bytes))}))
"""


def _compile_sm90(cfg: ConvConfig, nb: int, c: int, oc: int, hw: int, k: int) -> dict[str, Any]:
    """``conv_tma_kernel`` for an fp16 NHWC ``nb x c x hw x hw`` input, k x k 'same' conv to
    ``oc`` channels, bias + ReLU, as the JIT specialises it; compiled in a child process without
    the interpreter (which replaces ``@triton.jit`` functions)."""
    bh, bw = cfg.tile_h, cfg.block_m // (cfg.tile_h * cfg.tile_n)
    bk, tn = max(16, min(cfg.block_k, 1 << (c - 1).bit_length())), cfg.tile_n
    ints = dict(NB=nb, C=c, H=hw, W=hw, OC=oc, OH=hw, OW=hw, stride_cn=hw * hw * oc, stride_cc=1, stride_ch=hw * oc, stride_cw=oc)
    const = dict(PH=k // 2, PW=k // 2, DH=1, DW=1, KH=k, KW=k, BNI=tn, BH=bh, BW=bw, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=bk)
    const.update(HAS_BIAS=True, TMA_STORE=True, INPUT_PRECISION="tf32")
    descs = {"x_desc": f"tensordesc<fp16[{tn}, {bh}, {bw}, {bk}]>", "c_desc": f"tensordesc<fp16[{tn}, {bh}, {bw}, {cfg.block_n}]>"}
    job = dict(ints=ints, const=const, descs=descs, warps=cfg.num_warps, stages=cfg.num_stages)
    root = str(Path(conv.__file__).resolve().parents[2])
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _COMPILE], input=json.dumps(job).encode(), capture_output=True, env=env, cwd=root)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return pickle.loads(proc.stdout)


SM90_CONFIGS = [
    ConvConfig(128, 64, 64, 1, 4, 3, tile_h=8),
    ConvConfig(64, 64, 64, 1, 4, 3, tile_h=8),
    ConvConfig(128, 64, 64, 1, 4, 3, tile_h=8, tile_n=2),  # 2 images x 8 x 8: 56 x 56 without waste
]


@pytest.mark.parametrize("cfg", SM90_CONFIGS, ids=lambda c: c.describe())
def test_sm90_conv_tma_kernel_moves_boxes_by_tma(cfg: ConvConfig) -> None:
    """64 -> 64 3x3 pad 1 on a 64 x 56x56 NHWC batch: the input boxes are 4-D TMA loads,
    multi-buffered (two in flight in the prologue besides the loop's own), read by wgmma straight
    from shared memory (the box reshape is a view of the TMA buffer; the weight tile, cp.async'ed
    to shared memory, is the other operand: no wgmma reads registers, no ldmatrix); the output is
    one bulk tensor store and there is no st.global; no spills (no stack)."""
    from kfuse.kernels.b2b import ptx_summary

    asm = _compile_sm90(cfg, 64, 64, 64, 56, 3)
    ptx, ttgir = asm["ptx"], asm["ttgir"]
    assert ptx.count("cp.async.bulk.tensor.4d.shared::cluster.global") >= 3
    assert ptx.count("cp.async.bulk.tensor.4d.global.shared") == 1
    assert "ttg.memdesc_reshape" in ttgir and "ttng.async_tma_copy_global_to_local" in ttgir
    s = ptx_summary(ptx)
    assert s["st.global"] == 0 and s["wgmma"] > 0 and s["wgmma_a_regs"] == 0 and s["cp.async"] > 0, s
    sass = sass_facts(asm["cubin"])
    assert sass["STACK"] == 0 and sass["LOCAL"] == 0 and sass["STL"] == sass["LDL"] == 0, sass
    assert sass["UTMALDG.4D"] >= 3 and sass["UTMASTG.4D"] == 1 and sass["HGMMA"] > 0 and sass["LDSM"] == 0, sass
    # 90 / 58 with Triton 3.6: accumulator (64 / 32 fp32 a thread) plus addressing, far below 255
    assert sass["REG"] <= (128 if cfg.block_m == 128 else 96), sass
