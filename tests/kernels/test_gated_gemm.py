"""Gated-MLP GEMM vs the float32 reference: every activation, odd shapes (not tile multiples),
a transposed weight view, poisoned outputs; and the fused-vs-unfused decision's two sides."""

import pytest
import torch

from kfuse.kernels import gated_gemm as G


@pytest.mark.parametrize("act", sorted(G.ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_reference_on_odd_shapes(act, dtype, device):
    gen = torch.Generator().manual_seed(len(act) * 7 + (dtype == torch.float16))
    m, k, half = 37, 40, 24  # 37 rows, K and I not multiples of the 32-wide interpreter tile
    a = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(k, 2 * half, generator=gen) / k**0.5).to(device, dtype)
    out = torch.full((m, half), float("nan"), dtype=dtype, device=device)
    G.gated_gemm(a, w, act, out=out)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    torch.testing.assert_close(out.float(), G.reference(a, w, act), atol=tol, rtol=tol)


def test_gate_in_the_second_half(device):
    gen = torch.Generator().manual_seed(4)
    a = torch.randn(19, 24, generator=gen).to(device)
    w = torch.randn(24, 2 * 40, generator=gen).to(device) / 5
    out = torch.full((19, 40), float("nan"), device=device)
    assert G.gated_gemm(a, w, "silu", gate_first=False, out=out) is out
    ref = G.reference(a, w, "silu", gate_first=False)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert (ref - G.reference(a, w, "silu")).abs().max() > 0.1  # the halves differ: the test can fail


def test_batched_rows_and_a_transposed_weight(device):
    # the weight as nn.Linear keeps it: [2I, K], used transposed (a strided view, no copy)
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(2, 9, 48, generator=gen).to(device)
    lin = torch.randn(2 * 20, 48, generator=gen).to(device) / 7
    out = torch.full((2, 9, 20), float("nan"), device=device)
    assert G.gated_gemm(a, lin.t(), "silu", out=out) is out
    torch.testing.assert_close(out, G.reference(a, lin.t(), "silu"), atol=1e-4, rtol=1e-4)


def test_every_config_of_the_space_is_right(device):
    """The GPU decision may pick any tile of the space: each must be right (one shape, fp16)."""
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(70, 96, generator=gen).to(device, torch.float16)
    w = (torch.randn(96, 2 * 136, generator=gen) / 10).to(device, torch.float16)
    ref = G.reference(a, w, "silu")
    for cfg in G.config_space():
        out = torch.full((70, 136), float("nan"), dtype=torch.float16, device=device)  # fresh poison per config
        assert G.gated_gemm(a, w, "silu", config=cfg, out=out) is out
        torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2, msg=cfg.describe())


def test_clear_errors(device):
    a = torch.randn(4, 8, device=device)
    with pytest.raises(ValueError, match="activation"):
        G.gated_gemm(a, torch.randn(8, 6, device=device), "tanh")
    with pytest.raises(ValueError, match=r"w \[K, 2I\]"):
        G.gated_gemm(a, torch.randn(8, 5, device=device))
    with pytest.raises(ValueError, match=r"w \[K, 2I\]"):
        G.gated_gemm(a, torch.randn(9, 6, device=device))


_SM90 = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from cubin_facts import sass_facts
from kfuse.kernels import gated_gemm as G

out = []
for c in G.config_space():
    names = list(G._gated_gemm_fwd.arg_names)
    sig = {n: "*fp16" for n in ("A", "B", "C")}
    const = dict(PDL=True, ACT=0, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m, PRECISION="tf32",
                 PREFETCH=True, PF_K=2048, SK=1, PF_N=max(1, c.block_n // 64), SN=64)  # a decode step's weight streamed early
    for n in names:
        if n in const:
            sig[n] = "constexpr"
        elif n not in sig:
            sig[n] = "i32"
    # M=512, N=5632, K=2048 as the JIT specialises them (strides 1 are constants, others divisible by 16)
    const.update(stride_ak=1, stride_bn=1, stride_cn=1)
    for n in ("stride_ak", "stride_bn", "stride_cn"):
        sig[n] = "constexpr"
    div = [n for n in names if n in ("A", "B", "C", "M", "N", "K", "up_offset", "stride_am", "stride_bk", "stride_cm")]
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in div}
    src = triton.compiler.ASTSource(G._gated_gemm_fwd, sig, constexprs=const, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": c.num_warps, "num_stages": c.num_stages})
    f = sass_facts(ck.asm["cubin"])
    f["shared"] = ck.metadata.shared
    ptx = ck.asm["ptx"]
    f["prefetch_before_wait"] = -1 < ptx.find("prefetch.global.L2") < ptx.find("griddepcontrol.wait")
    f["config"] = c.describe()
    out.append(f)
print(json.dumps(out))
"""


def test_sm90_tiles_use_wgmma_without_spills_and_fit_shared_memory():
    """Offline sm_90 compiles of every tile the GPU decision measures: tensor-core MMAs (HGMMA), no
    local-memory spills, shared memory within a block's 227 KB; under PDL the weight's prefetch before the wait."""
    from cubin_facts import run_offline_script

    facts = run_offline_script(_SM90, {}, timeout=600)
    assert len(facts) == len(G.config_space())
    for f in facts:
        assert f["HGMMA"] > 0, f
        assert f["LOCAL"] == 0 and f["STL"] == 0, f
        assert f["shared"] <= G.SMEM_LIMIT, f
        assert f["prefetch_before_wait"], f
