"""The skinny (few-row) GEMM against the fp32 reference: odd shapes (not tile multiples), one to several K
slices reduced in-kernel by the last program, row- and column-major weights, a generated epilogue with a bias
and a residual, the folded RMSNorm's row scale, the gated MLP; outputs poisoned before every launch."""

import pytest
import torch

from kfuse.kernels import skinny_gemm as S
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

ADD_BIAS_RESIDUAL = Epilogue(
    (
        EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),
        EpilogueStep("add", (Operand("reg", 1), Operand("in", 1))),
    ),
    n_inputs=2,
)


def _poisoned(shape, dtype, device):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _tol(dtype):
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.float16 else {"atol": 1e-4, "rtol": 1e-4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("m", "k", "n", "splits"), [(1, 100, 70, 1), (1, 100, 70, 3), (5, 64, 33, 2), (16, 130, 40, 4)])
def test_plain_product_on_odd_shapes(m, k, n, splits, dtype, device):
    gen = torch.Generator().manual_seed(m * 1000 + k + n + splits)
    a = torch.randn(m, k, generator=gen).to(device, dtype)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(device, dtype)  # nn.Linear's layout, used transposed
    out = _poisoned((m, n), dtype, device)
    got = S.skinny_gemm(a, w.t(), [], Epilogue(), dtype, S.SkinnyConfig(32, 32, splits, 4, 1), out=out)
    assert got is out
    torch.testing.assert_close(out.float(), S.reference(a, w.t(), [], Epilogue(), torch.float32), **_tol(dtype))


def test_row_major_weight_and_leading_dims(device):
    gen = torch.Generator().manual_seed(7)
    a = torch.randn(2, 3, 48, generator=gen).to(device)  # 6 rows in two leading dims
    w = torch.randn(48, 50, generator=gen).to(device) / 7  # (K, N) row-major
    out = _poisoned((2, 3, 50), torch.float32, device)
    S.skinny_gemm(a, w, [], Epilogue(), torch.float32, S.SkinnyConfig(32, 32, 2, 4, 1), out=out)
    torch.testing.assert_close(out, a @ w, atol=1e-4, rtol=1e-4)


def test_epilogue_with_a_bias_row_and_a_residual(device):
    gen = torch.Generator().manual_seed(11)
    m, k, n = 3, 96, 45
    a = torch.randn(m, k, generator=gen).to(device)
    w = torch.randn(k, n, generator=gen).to(device) / 10
    bias = torch.randn(n, generator=gen).to(device)  # broadcast over rows: loaded as one row
    residual = torch.randn(m, n, generator=gen).to(device)
    out = _poisoned((m, n), torch.float32, device)
    S.skinny_gemm(a, w, [bias, residual], ADD_BIAS_RESIDUAL, torch.float32, S.SkinnyConfig(32, 32, 3, 4, 1), out=out)
    torch.testing.assert_close(out, a @ w + bias + residual, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("rms_slice", [False, True])
@pytest.mark.parametrize("splits", [1, 2])
def test_row_rms_is_the_folded_rms_norm(splits, rms_slice, device):
    """``rms_norm(x, w) @ W == rstd(x) * (x @ diag(w) W)``: the fold the pass makes, rows of very different scales."""
    gen = torch.Generator().manual_seed(5)
    m, k, n, eps = 4, 72, 38, 1e-6
    x = torch.randn(m, k, generator=gen) * torch.tensor([[0.01], [1.0], [30.0], [3.0]])
    norm_w = torch.rand(k, generator=gen) + 0.5
    big_w = torch.randn(k, n, generator=gen) / 8
    want = torch.nn.functional.rms_norm(x, (k,), norm_w, eps) @ big_w
    out = _poisoned((m, n), torch.float32, device)
    cfg = S.SkinnyConfig(32, 32, splits, 4, 1, rms_slice=rms_slice)  # the squares from the loop's tiles or the slice
    S.skinny_gemm(x.to(device), (norm_w[:, None] * big_w).to(device), [], Epilogue(), torch.float32, cfg, row_rms=eps, out=out)
    torch.testing.assert_close(out.cpu(), want, atol=1e-4, rtol=1e-4)
    assert (want - x @ (norm_w[:, None] * big_w)).abs().max() > 1.0  # without the row scale it would be far off


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("gate_first", [True, False])
def test_gated_mlp(act, gate_first, device):
    gen = torch.Generator().manual_seed(len(act) + gate_first)
    m, k, half = 2, 80, 36
    a = torch.randn(m, k, generator=gen).to(device)
    w = (torch.randn(2 * half, k, generator=gen) / k**0.5).to(device)
    out = _poisoned((m, half), torch.float32, device)
    cfg = S.SkinnyConfig(32, 32, 2, 4, 1)
    S.skinny_gemm(a, w.t(), [], Epilogue(), torch.float32, cfg, gated=act, gate_first=gate_first, out=out)
    ref = S.reference(a, w.t(), [], Epilogue(), torch.float32, gated=act, gate_first=gate_first)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    other = S.reference(a, w.t(), [], Epilogue(), torch.float32, gated=act, gate_first=not gate_first)
    assert (ref - other).abs().max() > 0.05  # the halves differ: the test can fail


@pytest.mark.parametrize("rms_slice", [False, True])
def test_gated_with_row_rms_in_fp16(rms_slice, device):
    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(1, 64, generator=gen) * 20).to(device, torch.float16)
    w = (torch.randn(64, 2 * 40, generator=gen) / 8).to(device, torch.float16)
    out = _poisoned((1, 40), torch.float16, device)
    cfg = S.SkinnyConfig(32, 32, 2, 4, 1, rms_slice=rms_slice)
    S.skinny_gemm(x, w, [], Epilogue(), torch.float16, cfg, row_rms=1e-5, gated="silu", out=out)
    ref = S.reference(x, w, [], Epilogue(), torch.float32, row_rms=1e-5, gated="silu")
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


def test_counters_are_left_at_zero_and_a_second_call_agrees(device):
    gen = torch.Generator().manual_seed(13)
    a = torch.randn(1, 128, generator=gen).to(device)
    w = torch.randn(128, 64, generator=gen).to(device)
    cfg = S.SkinnyConfig(32, 32, 4, 4, 1)
    first = S.skinny_gemm(a, w, [], Epilogue(), torch.float32, cfg, owner=12345)
    second = S.skinny_gemm(a, w, [], Epilogue(), torch.float32, cfg, owner=12345)
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    _, count = S._buffers(torch.device(device), 1, 4, 1, 64, 2, 12345)
    assert count.tolist() == [0, 0]


def test_split_counts_keep_the_gpu_busy():
    # a 1.1B Llama's q/k/v projection (K 2048, N 2560) on 132 SMs: 40 column blocks of 64, 8 K slices of 256
    assert S.splits_for(2560, 2048, 64, 128, 132) == 8
    assert S.splits_for(2560, 2048, 64, 128, 132) * 40 >= 2 * 132
    assert S.splits_for(128, 64, 32, 32, 132) == 1  # K of two steps: one slice
    assert S.splits_for(32000, 2048, 64, 128, 132) == 1  # a vocabulary's 500 column blocks need no split


def test_clear_errors():
    a = torch.randn(17, 8)
    with pytest.raises(ValueError, match="at most 16"):
        S.skinny_gemm(a, torch.randn(8, 8), [], Epilogue(), torch.float32)
    with pytest.raises(ValueError, match="2-D weight"):
        S.skinny_gemm(torch.randn(2, 8), torch.randn(8, 8).half(), [], Epilogue(), torch.float32)
    with pytest.raises(ValueError, match="even width"):
        S.skinny_gemm(torch.randn(2, 8), torch.randn(8, 7), [], Epilogue(), torch.float32, gated="silu")
    with pytest.raises(ValueError, match="last dim"):
        S.skinny_gemm(torch.randn(2, 9), torch.randn(8, 7), [], Epilogue(), torch.float32)
    assert S.eligible(1, (64, 64), torch.float16) and not S.eligible(32, (64, 64), torch.float16)
    assert not S.eligible(1, (2, 64, 64), torch.float16)


_SM90_SCRIPT = r"""
import json
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from cubin_facts import sass_facts
from kfuse.kernels import skinny_gemm as S
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),), n_inputs=1)
out = {}
for name, (block_n, block_k, splits, rms, gated, warps, epi_) in json.loads(sys.argv[1]).items():
    e = epi if epi_ else Epilogue()
    kern = S._module(e).skinny_kernel
    names = kern.arg_names
    rms_slice = rms == "slice"
    const = dict(BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, SPLITS=splits, ROW_RMS=bool(rms), SQUARES=rms == "loop",
                 RMS_SLICE=rms_slice, BLOCK_SLICE=256 if rms_slice else 16, GATED=gated, ACT=0, PRECISION="tf32",
                 PDL=True, **({"XB0": False} if epi_ else {}))
    rows = triton.next_power_of_2(2048 // splits)  # the weight read through nn.Linear's view (K contiguous), K = 2048
    const |= dict(PREFETCH=True, PF_K=max(1, rows // 64), SK=64, PF_N=block_n, SN=1)
    sig = {n: "i32" for n in names}
    sig.update({"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "ws_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"})
    sig["x0_ptr"] = "*fp16"
    const |= {"stride_ak": 1, "stride_bk": 1, "stride_cn": 1}  # as the JIT specialises unit strides (nn.Linear's weight)
    s = {n: ("constexpr" if n in const else sig[n]) for n in names}
    aligned = ("a_ptr", "b_ptr", "c_ptr", "ws_ptr", "count_ptr", "x0_ptr", "stride_am", "stride_bn", "stride_cm", "stride_x0m", "N", "K",
               "k_per_split", "gate_off", "up_off")  # and arguments divisible by 16
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in aligned if n in names}
    src = ASTSource(kern, s, {(names.index(k),): v for k, v in const.items()}, attrs)
    stages = S.stages_for(block_n, block_k, 2 if gated else 1, 2)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    facts = sass_facts(ck.asm["cubin"])
    ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
    facts["atom_acq_rel"] = ptx.count("acq_rel.add")
    facts["prefetch_l2"] = ptx.count("prefetch.global.L2")
    facts["prefetch_before_wait"] = -1 < ptx.find("prefetch.global.L2") < ptx.find("griddepcontrol.wait")
    facts["ld_cg"] = ptx.count("ld.global.cg")
    facts["mma"] = ptx.count("mma.sync") + ptx.count("wgmma")
    facts["async_copies"] = ttgir.count("ttg.async_copy_global_to_local")
    facts["shared"] = ck.metadata.shared
    out[name] = facts
print(json.dumps(out))
"""


def test_sm90_compiles_with_the_in_kernel_reduction_and_no_spills() -> None:
    """The kernel compiles for sm_90 (offline, the triton wheel's ptxas) in the forms a decode step uses: the split
    reduction's acquire-release count and L2 reads of the partials are in the PTX, the product is on the tensor
    cores, the A and B tiles are pipelined (cp.async) within the shared memory, and nothing spills, at the widest
    gated tile too."""
    from cubin_facts import run_offline_script

    cases = {
        "split": (64, 128, 8, "", False, 4, True),
        "rms_gated": (64, 128, 4, "loop", True, 4, False),
        "wide": (128, 128, 2, "loop", False, 8, False),
        "rms_slice": (64, 128, 8, "slice", False, 4, True),
        "one_slice": (64, 128, 1, "", False, 4, True),
    }
    got = run_offline_script(_SM90_SCRIPT, cases, timeout=600)
    for name, facts in got.items():
        assert facts["STL"] == 0 and facts["LDL"] == 0 and facts["LOCAL"] == 0, (name, facts)
        assert facts["mma"] > 0, (name, facts)
        assert facts["async_copies"] >= 2 * (2 if name == "rms_gated" else 1), (name, facts)  # A's and each B's tiles pipelined
        assert facts["shared"] <= 227 * 1024, (name, facts)
    for name in ("split", "rms_gated", "wide", "rms_slice"):
        assert got[name]["atom_acq_rel"] >= 1 and got[name]["ld_cg"] >= 1, (name, got[name])
    for name, facts in got.items():  # under PDL the weight slab's lines go to L2 before the wait for the previous kernel
        assert facts["prefetch_l2"] >= 1 and facts["prefetch_before_wait"], (name, facts)
    # a line per lane's prefetch: split's slab 256 K x 64 N = 4 x 64 lines on 128 threads, two each; the gated form's
    # 512 K (4 slices) twice over (the gate's and the up's slab), eight
    assert got["split"]["prefetch_l2"] == 2 and got["rms_gated"]["prefetch_l2"] == 8, (got["split"], got["rms_gated"])
    assert got["one_slice"]["atom_acq_rel"] == 0


def test_a_slice_too_long_to_load_at_once_takes_the_loop(device):
    """``rms_slice`` loads a program's whole K slice at once, up to ``MAX_SLICE`` values; a longer slice (one program
    over K = 1100) takes the squares from the main loop's tiles instead, with the same result."""
    gen = torch.Generator().manual_seed(17)
    k = S.MAX_SLICE + 76
    x = (torch.randn(2, k, generator=gen) * torch.tensor([[0.05], [20.0]])).to(device)
    w = (torch.randn(k, 20, generator=gen) / 30).to(device)
    out = _poisoned((2, 20), torch.float32, device)
    S.skinny_gemm(x, w, [], Epilogue(), torch.float32, S.SkinnyConfig(32, 32, 1, 4, 1, rms_slice=True), row_rms=1e-6, out=out)
    torch.testing.assert_close(out, S.reference(x, w, [], Epilogue(), torch.float32, row_rms=1e-6), atol=1e-4, rtol=1e-4)


def test_the_prefetch_plan_puts_one_point_on_each_line_of_the_slab(monkeypatch) -> None:
    """``prefetch_slab``'s sampling: along N for a row-major [K, N] weight (a merged QKV), along K for nn.Linear's
    transposed view; a 128-byte line is 64 fp16 or 32 fp32 values; none where ``Options.skinny_prefetch`` is off."""
    from kfuse.kernels import prefetch as P

    monkeypatch.setattr(P, "interpreting", lambda: False)
    row_major = torch.empty(2048, 2560, dtype=torch.float16)
    k_major = torch.empty(2560, 2048, dtype=torch.float16).t()
    assert P.slab_plan(row_major, 64, 256) == {"PREFETCH": True, "PF_K": 256, "SK": 1, "PF_N": 1, "SN": 64}
    assert P.slab_plan(k_major, 64, 256) == {"PREFETCH": True, "PF_K": 4, "SK": 64, "PF_N": 64, "SN": 1}
    assert P.slab_plan(k_major.float(), 32, 200) == {"PREFETCH": True, "PF_K": 8, "SK": 32, "PF_N": 32, "SN": 1}
    assert P.slab_plan(row_major, 64, 256, enabled=False)["PREFETCH"] is False
