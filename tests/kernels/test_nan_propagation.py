"""relu, clamp, maximum and minimum return NaN where an input is NaN, as PyTorch's do: the generated
code asks for PTX's ``max.NaN`` / ``min.NaN`` (Triton's default max may return the other operand on
the GPU; the interpreter propagates NaN either way, so the sm_90 PTX is what is checked here)."""

from __future__ import annotations

import pytest
import torch
from cubin_facts import run_offline_script

from kfuse.ir import ops


@pytest.mark.parametrize("op", ["relu", "hardswish", "hardsigmoid", "clamp", "maximum", "minimum"])
def test_templates_ask_for_nan_propagation(op: str) -> None:
    assert "propagate_nan=tl.PropagateNan.ALL" in ops.get(op).triton


@pytest.mark.parametrize("op", ["relu", "clamp", "maximum"])
def test_interpreted_kernels_keep_nan(op: str) -> None:
    import kfuse

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = x * 2.0
            return {"relu": torch.relu(z), "clamp": torch.clamp(z, -0.5, 0.5), "maximum": torch.maximum(z, y)}[op] + 1.0

    x, y = torch.randn(4, 33), torch.randn(4, 33)
    c = kfuse.compile(M(), (x, y))
    x[1, 3] = float("nan")
    got = c(x, y)
    assert torch.isnan(got[1, 3]) and torch.isnan(got).sum() == 1


_SCRIPT = r"""
import json
import triton  # before kfuse: kfuse turns the interpreter on when triton is not imported yet and there is no GPU
from kfuse.kernels import gemm_ws
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm_ws import WsConfig
from kfuse.kernels.pointwise import Arg, PointwiseProgram, PStep, Variant, _kernel
from triton.backends.compiler import GPUTarget

out = {}
# the Gluon GEMM's epilogue (Gluon has no PropagateNan of its own)
add = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
epi = Epilogue((add, EpilogueStep("relu", (Operand("reg", 1),))), 1)
ck = gemm_ws.compile_offline(epi, 4096, 3072, 768, WsConfig("pingpong", 128, 128, 64, 4, 8), row_broadcast=(True,))
out["gemm_ws"] = "max.NaN.f32" in ck.asm["ptx"]
# a generated pointwise kernel
prog = PointwiseProgram((False,), (PStep("relu", (Arg("in", 0),)),), (0,))
var = Variant("ew", 1, (True, True), False)
fn = _kernel(prog, var)
consts = {"BLOCK": 1024, "PDL": False}
sig = {}
for n in fn.arg_names:
    if n in consts or n.startswith("cs") or (n.startswith("st") and n.endswith("_1")):
        sig[n] = "constexpr"
        consts.setdefault(n, 1)
    elif n.startswith(("in", "out")):
        sig[n] = "*fp16"
    else:
        sig[n] = "i32"
k = triton.compile(triton.compiler.ASTSource(fn, sig, constexprs=consts), target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
out["pointwise"] = "max.NaN" in k.asm["ptx"]
print(json.dumps(out))
"""


def test_sm90_code_uses_nan_propagating_max() -> None:
    got = run_offline_script(_SCRIPT, None, timeout=600)
    assert got == {"gemm_ws": True, "pointwise": True}, got
