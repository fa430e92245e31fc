"""Regression guard, read from sm_90 PTX compiled on the CPU: the GEMM and conv templates load
their tiles as 16-byte cp.async, never as 2-byte scalars. Clamping edge indices with tl.where
instead of masking made both templates load scalars once (10x slower GEMM on the H200). The TMA
variant of the GEMM template must load its tiles with cp.async.bulk.tensor into wgmma."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = r"""
import os, re, sys
os.environ["TRITON_INTERPRET"] = "0"
from kfuse.sass.examples import compile_sm90
from kfuse.kernels.epilogue import Epilogue
which = sys.argv[1]
sig = {}
if which.startswith("conv"):  # conv, conv_grouped (one GEMM a group), conv_scaled (an SE scale on the input loads),
    # conv_prologue (a batch norm + ReLU on the input loads: scale and shift tables)
    from kfuse.kernels import conv as K
    fn = K._module(Epilogue()).conv_kernel
    const = dict(stride_xc=1, stride_cc=1, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1, KH=3, KW=3, BLOCK_M=128, BLOCK_N=128,
                 BLOCK_K=64, GROUP_M=8, FLAT_K=False, HAS_BIAS=True, INPUT_PRECISION="tf32", PDL=False,
                 GROUPED=which == "conv_grouped", IN_SCALE=which in ("conv_scaled", "conv_prologue"), stride_sc=1,
                 IN_SHIFT=which == "conv_prologue", IN_RELU=which == "conv_prologue", stride_tc=1)
elif which == "gemm":
    from kfuse.kernels import gemm as K
    fn = K._module(Epilogue()).gemm_kernel
    const = dict(stride_ak=1, stride_bn=1, stride_cn=1, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT_K=1,
                 EVEN_K=True, INPUT_PRECISION="tf32")
else:  # gemm_tma:<batched>:<kmajor>: A and B by TMA descriptors (3-D for batched operands, B^T for column-major B)
    from kfuse.kernels import gemm as K
    _, batched, kmajor = which.split(":")
    batched, kmajor = batched == "1", kmajor == "1"
    fn = K._module(Epilogue()).gemm_tma_kernel
    const = dict(PDL=False, stride_cn=1, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, A_BATCHED=batched, B_BATCHED=batched,
                 B_KMAJOR=kmajor, INPUT_PRECISION="tf32", TMA_STORE=False, C_BATCHED=False)
    one = "1, " if batched else ""
    sig = {"a_desc": f"tensordesc<fp16[{one}128, 64]>", "b_desc": f"tensordesc<fp16[{one}{'256, 64' if kmajor else '64, 256'}]>"}
for n in fn.arg_names:
    if n in const or n in sig:
        continue
    sig[n] = "*fp16" if n.endswith("_ptr") else "i32"
div = tuple(k for k in sig if not k.endswith("_ptr") and not k.endswith("_desc"))
ck = compile_sm90(fn, sig, const, num_warps=8, num_stages=3, divisible=div)
ptx = ck.asm["ptx"]
print(len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
      len(re.findall(r"ld\.global(\.\w+)*\.b16", ptx)), ptx.count("wgmma.mma_async"), ptx.count("cp.async.bulk.tensor"))
"""


@pytest.mark.parametrize("template", ["gemm", "conv", "conv_grouped", "conv_scaled", "conv_prologue"])
def test_tiles_load_as_16_byte_vectors(template: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, template], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    vec16, scalar16, wgmma, _ = (int(x) for x in r.stdout.split()[-4:])
    assert vec16 >= 8, f"{template}: only {vec16} 16-byte cp.async"
    assert scalar16 == 0, f"{template}: {scalar16} scalar 2-byte global loads"
    assert wgmma > 0, f"{template}: no wgmma"


@pytest.mark.parametrize("batched,kmajor", [(False, False), (True, True)])
def test_tma_kernel_compiles_to_tma_and_wgmma(batched: bool, kmajor: bool) -> None:
    """gemm_tma_kernel: tiles by cp.async.bulk.tensor into wgmma, no pointer loads of A or B
    (the 3-D descriptor's reshape of batched operands and the .T of a column-major B included)."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    which = f"gemm_tma:{int(batched)}:{int(kmajor)}"
    r = subprocess.run([sys.executable, "-c", _SCRIPT, which], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    vec16, scalar16, wgmma, bulk = (int(x) for x in r.stdout.split()[-4:])
    assert bulk >= 2, f"{which}: no cp.async.bulk.tensor (TMA) loads"
    assert wgmma > 0, f"{which}: no wgmma"
    assert vec16 == 0 and scalar16 == 0, f"{which}: pointer loads of the tiles ({vec16} cp.async, {scalar16} scalar)"
