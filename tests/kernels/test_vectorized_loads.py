"""Regression guard, read from sm_90 PTX compiled on the CPU: the GEMM and conv templates load
their tiles as 16-byte cp.async, never as 2-byte scalars. Clamping edge indices with tl.where
instead of masking made both templates load scalars once (10x slower GEMM on the H200)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_SCRIPT = r'''
import os, re, sys
os.environ["TRITON_INTERPRET"] = "0"
from kfuse.sass.examples import compile_sm90
from kfuse.kernels.epilogue import Epilogue
which = sys.argv[1]
if which == "conv":
    from kfuse.kernels import conv as K
    fn = K._module(Epilogue()).conv_kernel
    const = dict(stride_xc=1, stride_cc=1, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1, KH=3, KW=3, BLOCK_M=128, BLOCK_N=128,
                 BLOCK_K=64, GROUP_M=8, FLAT_K=False, HAS_BIAS=True, INPUT_PRECISION="tf32")
else:
    from kfuse.kernels import gemm as K
    fn = K._module(Epilogue()).gemm_kernel
    const = dict(stride_ak=1, stride_bn=1, stride_cn=1, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, SPLIT_K=1,
                 EVEN_K=True, INPUT_PRECISION="tf32")
sig = {}
for n in fn.arg_names:
    if n in const:
        continue
    sig[n] = "*fp16" if n.endswith("_ptr") else "i32"
div = tuple(k for k in sig if not k.endswith("_ptr"))
ck = compile_sm90(fn, sig, const, num_warps=8, num_stages=3, divisible=div)
ptx = ck.asm["ptx"]
print(len(re.findall(r"cp\.async\.c[ag]\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)),
      len(re.findall(r"ld\.global(\.\w+)*\.b16", ptx)), ptx.count("wgmma.mma_async"))
'''


@pytest.mark.parametrize("template", ["gemm", "conv"])
def test_tiles_load_as_16_byte_vectors(template: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, template], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    vec16, scalar16, wgmma = (int(x) for x in r.stdout.split()[-3:])
    assert vec16 >= 8, f"{template}: only {vec16} 16-byte cp.async"
    assert scalar16 == 0, f"{template}: {scalar16} scalar 2-byte global loads"
    assert wgmma > 0, f"{template}: no wgmma"
