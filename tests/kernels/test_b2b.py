"""Back-to-back GEMM / conv chain template against the stage-by-stage reference, in the
interpreter on the CPU or compiled on a GPU (the reference always in fp32 on the CPU); and, from
the compiled sm_90 code, that the intermediate never goes to global memory."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from cubin_facts import sass_facts

from kfuse.kernels import b2b
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

R = Operand("reg", 0)


def _epi(kind: str) -> Epilogue:
    """The epilogues under test: none, bias+relu, bias+gelu, residual+sigmoid, scale+clamp."""
    if kind == "none":
        return Epilogue()
    if kind == "bias_relu":
        return Epilogue((EpilogueStep("add", (R, Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)
    if kind == "bias_gelu":
        return Epilogue((EpilogueStep("add", (R, Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
    if kind == "residual_sigmoid":
        return Epilogue((EpilogueStep("sigmoid", (R,)), EpilogueStep("add", (Operand("reg", 1), Operand("in", 0)))), 1)
    if kind == "scale_clamp":
        clamp = EpilogueStep("clamp", (Operand("reg", 1),), (("lo", -1.0), ("hi", 1.0)))
        steps = (EpilogueStep("mul", (R, Operand("lit", value=0.5))), clamp)
        return Epilogue(steps, 0)
    raise KeyError(kind)


def _extras(kind: str, lead: tuple[int, ...], n: int, dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    if kind in ("bias_relu", "bias_gelu"):
        return [torch.randn(n, dtype=dtype, device=device)]
    if kind == "residual_sigmoid":
        return [torch.randn(*lead, n, dtype=dtype, device=device)]
    return []


def _cpu(v: Any) -> Any:
    """Tensors (in lists, at any depth) moved to the CPU; anything else as it is."""
    if isinstance(v, torch.Tensor):
        return v.cpu()
    if isinstance(v, list):
        return [_cpu(e) for e in v]
    return v


def _ref(chain: b2b.Chain, x: torch.Tensor, ws: list, bs: list, ex: list, geom: b2b.ConvGeom | None = None) -> torch.Tensor:
    """``b2b.reference`` on CPU copies of the operands: the same fp32 oracle on either device (on a
    GPU, cuDNN would compute the fp32 convolutions in TF32)."""
    return b2b.reference(chain, _cpu(x), _cpu(ws), _cpu(bs), _cpu(ex), geom)


TOL = {torch.float32: 2e-3, torch.float16: 2e-2}


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    out, ref = out.cpu(), ref.cpu()
    assert not torch.isnan(out).any(), "output has NaN: some element was not written"
    err = (out.double() - ref.double()).abs().max().item() / max(ref.double().abs().max().item(), 1e-6)
    assert err < TOL[dtype], f"max rel err {err}"


@pytest.fixture
def two_sms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Persistent grids sized for 2 SMs on either device (the interpreter's count), so that each
    program's tile loop runs over several tiles on a GPU too, not one tile per program."""
    monkeypatch.setattr(b2b.launcher, "_num_sms", lambda device: 2)


GEMM_CASES = [
    # m, k0, widths, residence, epilogue per stage, dtype
    (37, 24, [16, 48], "register", ["bias_relu", "none"], torch.float32),
    (19, 64, [256, 16], "smem", ["bias_gelu", "residual_sigmoid"], torch.float32),
    (33, 40, [128, 100], "register", ["residual_sigmoid", "bias_relu"], torch.float16),
    (5, 16, [64, 256], "smem", ["scale_clamp", "bias_gelu"], torch.float16),
    (23, 63, [32, 32, 32], "register", ["bias_relu", "bias_relu", "none"], torch.float16),
    (17, 20, [48, 96, 24], "smem", ["bias_relu", "scale_clamp", "residual_sigmoid"], torch.float32),
]


@pytest.mark.parametrize("m,k0,widths,residence,epis,dtype", GEMM_CASES)
def test_gemm_chain(m: int, k0: int, widths: list[int], residence: str, epis: list[str], dtype: torch.dtype, device: str) -> None:
    chain = b2b.Chain(tuple(b2b.Stage(_epi(e), dtype) for e in epis))
    x = torch.randn(m, k0, dtype=dtype, device=device)
    ks = [k0] + widths[:-1]
    ws = [(torch.randn(k, n, device=device) / k**0.5).to(dtype) for k, n in zip(ks, widths, strict=True)]
    ex = [_extras(e, (m,), n, dtype, device) for e, n in zip(epis, widths, strict=True)]
    out = torch.full((m, widths[-1]), float("nan"), dtype=dtype, device=device)
    cfg = b2b.default_config(m, widths, residence)
    assert cfg.residence == residence
    got = b2b.b2b_chain(chain, x, ws, [None] * len(ws), ex, cfg, out=out)
    assert got.data_ptr() == out.data_ptr()
    _check(got, _ref(chain, x, ws, [None] * len(ws), ex), dtype)


@pytest.mark.parametrize("residence", ["register", "smem"])
@pytest.mark.parametrize("widths,block_n", [([40, 24, 20], 32), ([32, 48], 16)])
def test_preload_matches_reference(residence: str, widths: list[int], block_n: int, device: str) -> None:
    """Preloaded weights on a 3-stage chain (one N tile: preloaded) and on a chain whose last
    width needs an N loop (preload falls back to the loads in the loop); odd M and K."""
    dtype = torch.float32
    m, k0 = 37, 23
    epis = ["bias_relu"] * (len(widths) - 1) + ["residual_sigmoid"]
    chain = b2b.Chain(tuple(b2b.Stage(_epi(e), dtype) for e in epis))
    x = torch.randn(m, k0, dtype=dtype, device=device)
    ws = [(torch.randn(k, n, device=device) / k**0.5).to(dtype) for k, n in zip([k0] + widths[:-1], widths, strict=True)]
    ex = [_extras(e, (m,), n, dtype, device) for e, n in zip(epis, widths, strict=True)]
    cfg = b2b.B2BConfig(16, 32, block_n, 4, 1, residence, preload=True)
    out = torch.full((m, widths[-1]), float("nan"), dtype=dtype, device=device)
    got = b2b.b2b_chain(chain, x, ws, [None] * len(ws), ex, cfg, out=out)
    _check(got, _ref(chain, x, ws, [None] * len(ws), ex), dtype)


@pytest.mark.parametrize("lead", [(3, 7), (2, 3, 5), (2, 1, 3, 2)])
def test_gemm_chain_batched_rows_and_transposed_weight(lead: tuple[int, ...], device: str) -> None:
    """Leading dims of any number fold into M; a transposed (Linear-style) weight view works. A 4-D
    output (ConvNeXt's (B, H, W, C) MLP, lead (2, 3, 5)) was once taken for an NCHW image: its rows
    were written at the batch stride, out of bounds (a segfault in the interpreter, session 35)."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float32), b2b.Stage(_epi("none"), torch.float32)))
    x = torch.randn(*lead, 24, device=device)
    w0 = torch.randn(40, 24, device=device).t() / 5
    w1 = torch.randn(16, 40, device=device).t() / 6
    ex = [[torch.randn(40, device=device)], []]
    out = torch.full((*lead, 16), float("nan"), device=device)
    got = b2b.b2b_chain(chain, x, [w0, w1], [None, None], ex, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (*lead, 16)
    _check(out, _ref(chain, x, [w0, w1], [None, None], ex), torch.float32)


CONV_CASES = [
    # n, c, h, w, kernel, stride, pad, widths, residence, channels_last, dtype
    (2, 8, 7, 5, 3, 1, 1, [16, 24], "register", True, torch.float32),
    (1, 16, 9, 9, 3, 2, 1, [64, 16], "smem", False, torch.float32),
    (3, 12, 5, 6, 1, 1, 0, [32, 48], "register", True, torch.float16),
    (2, 8, 6, 7, 3, 1, 1, [256, 16], "smem", True, torch.float16),
]


@pytest.mark.parametrize("n,c,h,w,k,stride,pad,widths,residence,cl,dtype", CONV_CASES)
def test_conv_chain(
    n: int, c: int, h: int, w: int, k: int, stride: int, pad: int, widths: list[int], residence: str, cl: bool, dtype: torch.dtype,
    device: str,
) -> None:  # fmt: skip
    chain = b2b.Chain((b2b.Stage(_epi("scale_clamp"), dtype, True), b2b.Stage(_epi("residual_sigmoid"), dtype, True)), conv=True)
    x = torch.randn(n, c, h, w, dtype=dtype, device=device)
    if cl:
        x = x.to(memory_format=torch.channels_last)
    w0 = (torch.randn(widths[0], c, k, k, device=device) / (c * k * k) ** 0.5).to(dtype)
    w1 = (torch.randn(widths[1], widths[0], 1, 1, device=device) / widths[0] ** 0.5).to(dtype)
    bs = [torch.randn(widths[0], dtype=dtype, device=device), torch.randn(widths[1], dtype=dtype, device=device)]
    geom = b2b.ConvGeom((stride, stride), (pad, pad))
    oh = (h + 2 * pad - k) // stride + 1
    ow = (w + 2 * pad - k) // stride + 1
    ex = [[], [torch.randn(n, widths[1], oh, ow, dtype=dtype, device=device)]]
    cfg = b2b.default_config(n * oh * ow, widths, residence)
    fmt = torch.channels_last if cl else torch.contiguous_format
    out = torch.full((n, widths[1], oh, ow), float("nan"), dtype=dtype, device=device).contiguous(memory_format=fmt)
    got = b2b.b2b_chain(chain, x, [w0, w1], bs, ex, cfg, geom=geom, channels_last=cl, out=out)
    assert got.data_ptr() == out.data_ptr() and got.shape == (n, widths[1], oh, ow)
    assert got.is_contiguous(memory_format=fmt)
    _check(out, _ref(chain, x, [w0, w1], bs, ex, geom), dtype)


def test_clear_errors(device: str) -> None:
    chain = b2b.Chain((b2b.Stage(_epi("none"), torch.float32), b2b.Stage(_epi("none"), torch.float32)))
    x = torch.randn(4, 8, device=device)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device)

    with pytest.raises(ValueError, match="resident limit"):  # 512 wide in a three-stage chain: not chunked
        three = b2b.Chain(chain.stages + chain.stages[:1])
        b2b.b2b_chain(three, x, [rand(8, 512), rand(512, 8), rand(8, 8)], [None] * 3, [[], [], []])
    with pytest.raises(ValueError, match="stage 1 takes K=16"):
        b2b.b2b_chain(chain, x, [rand(8, 32), rand(16, 8)], [None, None], [[], []])
    with pytest.raises(ValueError, match="expects 1 extra"):
        bad = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float32), b2b.Stage(_epi("none"), torch.float32)))
        b2b.b2b_chain(bad, x, [rand(8, 32), rand(32, 8)], [None, None], [[], []])
    with pytest.raises(ValueError, match="residence"):
        b2b.b2b_chain(chain, x, [rand(8, 32), rand(32, 8)], [None, None], [[], []], b2b.B2BConfig(residence="l2"))


# ---- the generated code: the intermediate never touches global memory --------------------------
PTX_CASES = [
    # chain kind, widths, config, expect the second MMA to read A from registers
    ("gemm", [64, 64], b2b.B2BConfig(64, 64, 64, 4, 2, "register"), True),
    ("gemm", [256, 64], b2b.B2BConfig(64, 32, 64, 8, 2, "smem"), False),
    ("conv", [128, 64], b2b.B2BConfig(64, 64, 64, 4, 2, "register"), True),
    # 3 stages: the interpreter does not check loop-carried types, the sm_90 compile does
    ("gemm", [64, 32, 48], b2b.B2BConfig(64, 64, 64, 4, 2, "register"), True),
    # preloaded weights (every resident stage's weight loaded before stage 0's GEMM)
    ("gemm", [128, 128], b2b.B2BConfig(64, 128, 128, 4, 2, "register", preload=True), True),
    ("gemm", [64, 32, 48], b2b.B2BConfig(64, 64, 64, 4, 2, "smem", preload=True), False),
]


@pytest.mark.parametrize("kind,widths,cfg,a_in_regs", PTX_CASES)
def test_sm90_code_stores_only_the_output(kind: str, widths: list[int], cfg: b2b.B2BConfig, a_in_regs: bool) -> None:
    conv = kind == "conv"
    stages = tuple(b2b.Stage(_epi("bias_relu"), torch.float16, conv) for _ in widths[:-1])
    stages += (b2b.Stage(_epi("residual_sigmoid"), torch.float16, conv),)
    chain = b2b.Chain(stages, conv=conv)
    asm = b2b.compile_asm(chain, widths, cfg, torch.float16, 90, (3, 3) if conv else (1, 1))
    # one store op in the kernel IR: the last stage's tile
    assert asm["ttgir"].count("tt.store") == 1
    ptx = asm["ptx"]
    bases = b2b.ptx_global_store_bases(ptx)
    assert bases, "no global store found"
    pointers = _pointer_params(ptx)
    out_param = {p for p in pointers if p.endswith(f"_param_{_out_index(chain)}")}
    assert len(out_param) == 1
    # every st.global instruction writes through the output pointer, and through no other pointer
    assert all(b & pointers == out_param for b in bases), bases
    s = b2b.ptx_summary(ptx)
    assert s["wgmma"] > 0
    if a_in_regs:
        assert s["wgmma_a_regs"] > 0  # GEMM1 takes the intermediate straight from registers
    else:
        assert s["wgmma_a_regs"] == 0 and s["st.shared"] > 0  # staged through shared memory


def _pointer_params(ptx: str) -> set[str]:
    import re

    return set(re.findall(r"\.param\s+\.u64\s+\.ptr[^\n]*?(\w+_param_\d+)", ptx))


def _out_index(chain: b2b.Chain) -> int:
    # x, w0..w{L-1}, out
    return 1 + len(chain.stages)


def test_store_base_analysis_sees_other_buffers() -> None:
    """The taint analysis tells stores through different pointers apart (a negative control)."""
    ptx = """
    .param .u64 .ptr .global .align 1 k_param_0,
    .param .u64 .ptr .global .align 1 k_param_1,
    ld.param.u64 %rd1, [k_param_0];
    ld.param.u64 %rd2, [k_param_1];
    $L__loop:
    add.s64 %rd3, %rd5, 4;
    st.global.b16 [ %rd3 + 0 ], { %rs1 };
    mov.b64 %rd5, %rd1;
    @%p1 st.global.b32 [ %rd2 + 0 ], { %r1 };
    """
    assert b2b.ptx_global_store_bases(ptx) == [{"k_param_0"}, {"k_param_1"}]


# ---- the persistent variant: a fixed grid looping over row tiles ------------------------------
PERSISTENT_CASES = [
    # m, k0, widths, config (block_k >= k0: one K step; else the K loop inside the tile loop)
    (203, 32, [48, 40], b2b.B2BConfig(16, 32, 64, 4, 3, "register", True)),
    (77, 24, [64, 100], b2b.B2BConfig(16, 32, 32, 4, 2, "smem", True)),  # last width in N tiles
    (130, 40, [32, 16, 24], b2b.B2BConfig(32, 16, 32, 4, 3, "register", True)),  # K loop
]


@pytest.mark.parametrize("m,k0,widths,cfg", PERSISTENT_CASES)
@pytest.mark.usefixtures("two_sms")
def test_persistent_equals_reference(m: int, k0: int, widths: list[int], cfg: b2b.B2BConfig, device: str) -> None:
    torch.manual_seed(3)
    kinds = ["bias_relu"] * (len(widths) - 1) + ["residual_sigmoid"]
    chain = b2b.Chain(tuple(b2b.Stage(_epi(k), torch.float32) for k in kinds))
    x = torch.randn(m, k0, device=device)
    dims = [k0, *widths]
    ws = [torch.randn(dims[i], dims[i + 1], device=device) / dims[i] ** 0.5 for i in range(len(widths))]
    extras = [_extras(k, (m,), widths[i], torch.float32, device) for i, k in enumerate(kinds)]
    out = torch.full((m, widths[-1]), float("nan"), device=device)
    got = b2b.b2b_chain(chain, x, ws, [None] * len(widths), extras, cfg, out=out)
    _check(got, _ref(chain, x, ws, [None] * len(widths), extras), torch.float32)


def test_candidates_include_persistent_for_small_k0_gemm_chains() -> None:
    cands = b2b.candidate_configs(262144, [128, 64], k0=64)
    assert any(c.persistent for c in cands) and all(c.block_k >= 64 for c in cands if c.persistent)
    assert not any(c.persistent for c in b2b.candidate_configs(262144, [128, 64]))  # conv / unknown K0
    assert not any(c.persistent for c in b2b.candidate_configs(262144, [128, 512], k0=64))  # last width in N tiles


def test_sm90_persistent_kernel_pipelines_across_tiles() -> None:
    """Compiled as the JIT specialises a GEMM chain (unit strides, 1x1 "images"), the persistent
    kernel's tile loop is software-pipelined: the row tiles arrive by cp.async into multi-buffered
    shared memory, and the output is still the only global store."""
    import re

    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    asm = b2b.compile_asm(chain, [64, 64], b2b.B2BConfig(128, 64, 64, 4, 3, "register", True), torch.float16, 90, (1, 1), 64, True)
    assert asm["ttgir"].count("tt.store") == 1
    ptx = asm["ptx"]
    assert b2b.ptx_summary(ptx)["cp.async"] >= 8 and ptx.count("cp.async.commit_group") >= 2, re.findall(r"cp\.async\S*", ptx)[:5]


def test_compile_asm_specialises_integer_arguments_like_the_jit() -> None:
    """A conv chain compiled with its NHWC sizes (unit channel strides, multiples of 16) gets the
    pipelined cp.async loads the JIT gives it; without them the offline code would mislead."""
    stages = (b2b.Stage(_epi("bias_relu"), torch.float16, True), b2b.Stage(_epi("none"), torch.float16, True))
    chain = b2b.Chain(stages, conv=True)
    cfg = b2b.B2BConfig(64, 64, 64, 4, 3, "register")
    h, c, n = 56, 64, 64
    ints = dict(NB=64, C=c, H=h, W=h, OH=h, OW=h, N0=n, N1=n)
    ints.update(sxn=h * h * c, sxc=1, sxh=h * c, sxw=c, son=h * h * n, soc=1, soh=h * n, sow=n)
    ptx = b2b.compile_asm(chain, [n, n], cfg, torch.float16, 90, (3, 3), c, False, ints)["ptx"]
    assert "cp.async" in ptx
    with pytest.raises((ValueError, RuntimeError), match="not an integer argument"):  # RuntimeError: from the compile process
        b2b.compile_asm(chain, [n, n], cfg, torch.float16, 90, (3, 3), c, False, {"BLOCK_M": 64})


# ---- the TMA persistent variant: x tiles in and output tiles out by tensor descriptors ---------
TMA_CASES = [
    # m, k0, widths, config, dtype (K0 and the last width in one tile each; 16-byte aligned rows)
    (203, 32, [48, 40], b2b.B2BConfig(16, 32, 64, 4, 3, "register", True, tma=True), torch.float32),
    (77, 24, [64, 104], b2b.B2BConfig(32, 32, 128, 4, 2, "smem", True, preload=True, tma=True), torch.float16),
    (130, 40, [32, 16, 24], b2b.B2BConfig(32, 64, 32, 4, 3, "register", True, tma=True, programs_per_sm=3), torch.float16),
    (9, 16, [16, 16], b2b.B2BConfig(16, 16, 16, 4, 2, "register", True, preload=True, tma=True), torch.float16),  # M < one tile
    # programmatic dependent launch: a no-op in the interpreter (no grid dependencies there)
    (203, 32, [48, 40], b2b.B2BConfig(16, 32, 64, 4, 3, "register", True, tma=True, pdl=True), torch.float32),
]


@pytest.mark.parametrize("m,k0,widths,cfg,dtype", TMA_CASES)
@pytest.mark.usefixtures("two_sms")
def test_tma_persistent_equals_reference(
    monkeypatch, m: int, k0: int, widths: list[int], cfg: b2b.B2BConfig, dtype: torch.dtype, device: str
) -> None:
    used = []
    real = b2b.launcher._tma_descriptors
    monkeypatch.setattr(b2b.launcher, "_tma_descriptors", lambda *a: used.append(real(*a)) or used[-1])
    torch.manual_seed(5)
    kinds = ["bias_relu"] * (len(widths) - 1) + ["residual_sigmoid"]
    chain = b2b.Chain(tuple(b2b.Stage(_epi(k), dtype) for k in kinds))
    x = torch.randn(m, k0, device=device).to(dtype)
    dims = [k0, *widths]
    ws = [(torch.randn(dims[i], dims[i + 1], device=device) / dims[i] ** 0.5).to(dtype) for i in range(len(widths))]
    extras = [_extras(k, (m,), widths[i], dtype, device) for i, k in enumerate(kinds)]
    out = torch.full((m, widths[-1]), float("nan"), dtype=dtype, device=device)
    got = b2b.b2b_chain(chain, x, ws, [None] * len(widths), extras, cfg, out=out)
    assert len(used) == 1 and used[0] is not None, "the TMA kernel was not used"
    _check(got, _ref(chain, x, ws, [None] * len(widths), extras), dtype)


@pytest.mark.usefixtures("two_sms")
def test_tma_persistent_falls_back_when_rows_are_misaligned(monkeypatch, device: str) -> None:
    """K0 = 20 fp16 columns (40-byte rows) cannot be a TMA operand: the pointer kernel runs."""
    used = []
    real = b2b.launcher._tma_descriptors
    monkeypatch.setattr(b2b.launcher, "_tma_descriptors", lambda *a: used.append(real(*a)) or used[-1])
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    x = torch.randn(45, 20, device=device).half()
    ws = [torch.randn(20, 32, device=device).half() / 5, torch.randn(32, 16, device=device).half() / 6]
    ex = [_extras("bias_relu", (45,), 32, torch.float16, device), []]
    cfg = b2b.B2BConfig(16, 32, 16, 4, 2, "register", True, tma=True)
    got = b2b.b2b_chain(chain, x, ws, [None, None], ex, cfg, out=torch.full((45, 16), float("nan"), device=device).half())
    assert used == [None]
    _check(got, _ref(chain, x, ws, [None, None], ex), torch.float16)


def test_candidates_include_tma_persistent_for_narrow_gemm_chains() -> None:
    cands = b2b.candidate_configs(1 << 20, [64, 64], k0=64)
    assert sum(c.tma and c.persistent for c in cands) >= 2
    assert not any(c.tma for c in b2b.candidate_configs(1 << 20, [256, 256], k0=256))


def test_sm90_tma_kernel_moves_rows_by_tma_only() -> None:
    """Compiled for sm_90: the row tiles come in and go out as bulk tensor copies (TMA), the
    tile loop is pipelined (several TMA loads in flight), there is no st.global at all, and the
    second GEMM takes the intermediate from registers."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    cfg = b2b.B2BConfig(128, 64, 64, 4, 3, "register", True, tma=True)
    ptx = b2b.compile_asm(chain, [128, 64], cfg, torch.float16, 90, (1, 1), 64, True)["ptx"]
    summary = b2b.ptx_summary(ptx)
    assert summary["st.global"] == 0 and summary["wgmma_a_regs"] > 0, summary
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx  # the output store
    assert ptx.count("cp.async.bulk.tensor.2d.shared") >= 2  # row-tile loads, multi-buffered


def test_sm90_intermediate_is_masked_only_when_its_width_is_padded() -> None:
    """The intermediate's padded columns are zeroed (a select per value, ~150 of the tile loop's
    ~460 sm_90 instructions on the 128->64 chain) only when its width is below its power-of-two
    pad: 128 is exact, 120 is padded to 128."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    cfg = b2b.B2BConfig(128, 64, 64, 4, 2, "register", True, preload=True, tma=True)
    selects = {}
    for width in (128, 120):
        ptx = b2b.compile_asm(chain, [width, 64], cfg, torch.float16, 90, (1, 1), 64, True, None, True)["ptx"]
        selects[width] = ptx.count("selp")
    assert selects[128] < 10 and selects[120] > 100, selects


def test_sm90_tma_kernel_with_pdl_waits_before_touching_activations() -> None:
    """With ``pdl`` the preloaded weights (constants) are loaded, then ``griddepcontrol.wait``
    (the previous kernel has finished and its writes are visible), then the dependents may launch;
    every TMA load of x and every store comes after the wait. Without ``pdl`` neither appears."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    cfg = b2b.B2BConfig(128, 64, 64, 4, 2, "register", True, preload=True, tma=True, pdl=True)
    assert cfg.describe().endswith(" tma x2 pdl") and cfg.as_dict()["pdl"]
    ptx = b2b.compile_asm(chain, [128, 64], cfg, torch.float16, 90, (1, 1), 64, True, None, True)["ptx"]  # a bias vector
    wait, launch = ptx.find("griddepcontrol.wait"), ptx.find("griddepcontrol.launch_dependents")
    assert 0 < wait < launch, "no grid dependency control, or in the wrong order"
    first_x = ptx.find("cp.async.bulk.tensor.2d.shared")
    first_store = ptx.find("cp.async.bulk.tensor.2d.global.shared")
    assert wait < first_x and wait < first_store, "an activation is touched before the wait"
    assert ptx.find("ld.global") < wait  # the preloaded weights come first
    # and the bias vectors with them: none is reloaded per tile inside the tile loop
    assert ptx.rfind("ld.global") < wait, "a global load (a bias vector) after the wait, i.e. in the tile loop"
    plain = b2b.compile_asm(chain, [128, 64], dataclasses.replace(cfg, pdl=False), torch.float16, 90, (1, 1), 64, True)["ptx"]
    assert "griddepcontrol" not in plain


def _chunk(bm: int, bk: int, bn: int, stages: int, bh: int, persistent: bool = False) -> b2b.B2BConfig:
    return b2b.B2BConfig(bm, bk, bn, 4, stages, "chunked", persistent=persistent, block_h=bh)


CHUNKED_CASES = [
    # m, k0, widths, epilogues, config, dtype. N0 past 256 (no other residence could run it), N0 not
    # a multiple of the chunk (the last chunk's columns masked), stage 0 with a full residual tile
    # (not a row vector), a persistent grid whose programs loop over several row tiles, M < a tile
    (77, 32, [96, 48], ["bias_relu", "none"], _chunk(16, 32, 64, 2, 32), torch.float16),
    (130, 64, [80, 40], ["residual_sigmoid", "bias_gelu"], _chunk(32, 32, 64, 2, 32, True), torch.float16),
    (45, 24, [520, 16], ["bias_gelu", "residual_sigmoid"], _chunk(16, 32, 16, 2, 64), torch.float32),
    (9, 16, [64, 24], ["scale_clamp", "bias_relu"], _chunk(16, 16, 32, 1, 16, True), torch.float16),
    # ViT-Ti-like widths: K0 = 192 in three 64-column steps, N1 = 192 as 128 + 64 (both parts' epilogues)
    (37, 192, [160, 192], ["bias_gelu", "residual_sigmoid"], _chunk(16, 64, 256, 1, 32), torch.float16),
    # ConvNeXt-T / Swin-T widths: K0 = 96 in three 32-column steps, N1 = 96 as 64 + 32 (session 35)
    (50, 96, [384, 96], ["bias_gelu", "bias_relu"], _chunk(16, 32, 128, 1, 32), torch.float16),
]  # fmt: skip


@pytest.mark.parametrize("m,k0,widths,epis,cfg,dtype", CHUNKED_CASES)
@pytest.mark.usefixtures("two_sms")
def test_chunked_equals_reference(
    m: int, k0: int, widths: list[int], epis: list[str], cfg: b2b.B2BConfig, dtype: torch.dtype, device: str
) -> None:
    """b2b_chunked_kernel: the intermediate made and consumed BLOCK_H columns at a time equals the
    stage-by-stage reference, on a NaN-poisoned output."""
    torch.manual_seed(11)
    chain = b2b.Chain(tuple(b2b.Stage(_epi(e), dtype) for e in epis))
    x = torch.randn(m, k0, device=device).to(dtype)
    dims = [k0, *widths]
    ws = [(torch.randn(dims[i], dims[i + 1], device=device) / dims[i] ** 0.5).to(dtype) for i in range(2)]
    ex = [_extras(e, (m,), n, dtype, device) for e, n in zip(epis, widths, strict=True)]
    out = torch.full((m, widths[-1]), float("nan"), dtype=dtype, device=device)
    got = b2b.b2b_chain(chain, x, ws, [None, None], ex, cfg, out=out)
    _check(got, _ref(chain, x, ws, [None, None], ex), dtype)


def test_chunked_is_the_default_past_the_resident_width_and_refuses_what_it_cannot_run(device: str) -> None:
    assert b2b.default_config(1000, [512, 64]).residence == "chunked"
    assert all(c.residence == "chunked" for c in b2b.candidate_configs(1 << 18, [1024, 64], k0=64))
    assert any(c.residence == "chunked" for c in b2b.candidate_configs(1 << 18, [256, 256], k0=256))
    assert not any(c.residence == "chunked" for c in b2b.candidate_configs(1 << 18, [128, 128], k0=128))
    assert b2b.chunked_eligible(False, [512, 64], 64) is None
    assert "two-stage" in b2b.chunked_eligible(False, [64, 64, 64], 64)
    assert "two-stage" in b2b.chunked_eligible(True, [64, 64], 64)
    assert "K0 <= 256" in b2b.chunked_eligible(False, [512, 64], 512)
    assert "16-byte" in b2b.chunked_eligible(False, [500, 64], 64)
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    x = torch.randn(8, 16, device=device).half()
    ws = [torch.randn(16, 300, device=device).half(), torch.randn(300, 16, device=device).half()]
    with pytest.raises(ValueError, match="16-byte rows"):
        b2b.b2b_chain(chain, x, ws, [None, None], [[torch.randn(300, device=device).half()], []])
    with pytest.raises(ValueError, match="exceeds the resident limit"):
        ws = [torch.randn(16, 512, device=device).half(), torch.randn(512, 16, device=device).half()]
        bias = torch.randn(512, device=device).half()
        b2b.b2b_chain(chain, x, ws, [None, None], [[bias], []], b2b.default_config(8, [512, 16], "register"))


def test_sm90_chunked_kernel() -> None:
    """Compiled for sm_90 at 256 -> 256 -> 256 with the default tiling: both products on wgmma
    (the second from the intermediate chunk in registers), every operand moved by TMA (x, both
    weights' chunks multi-buffered, the output), no st.global, no spills, and the shared memory
    the sweep's estimate says (x tile + 2 buffers of both weight chunks)."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("bias_relu"), torch.float16)))
    cfg = dataclasses.replace(b2b.chunked_config([256, 256]), block_m=128, num_warps=8, num_stages=2, block_h=64)
    asm = b2b.compile_asm(chain, [256, 256], cfg, torch.float16, 90, (1, 1), 256, True, None, True)
    summary = b2b.ptx_summary(asm["ptx"])
    assert summary["st.global"] == 0 and summary["wgmma_a_regs"] > 0, summary
    assert asm["ptx"].count("cp.async.bulk.tensor.2d.shared") >= 3  # x and the two weight chunks
    assert "cp.async.bulk.tensor.2d.global.shared" in asm["ptx"]
    facts = sass_facts(asm["cubin"])
    assert facts["STL"] == 0 and facts["LOCAL"] == 0 and facts["HGMMA"] > 0, facts
    assert 2 * (128 * 256 + 2 * 64 * 512) <= asm["shared"] <= 227 * 1024


def test_chunked_parts_split_widths_between_powers_of_two() -> None:
    assert b2b.chunked_parts(256, 256) == (256, 1, 256, 0)  # powers of two: one step, one tile
    assert b2b.chunked_parts(192, 192) == (64, 3, 128, 64)  # ViT-Ti: 3 x 64, 128 + 64
    assert b2b.chunked_parts(96, 40, min_part=16) == (32, 3, 32, 16)
    assert b2b.chunked_parts(200, 16, min_part=16) == (64, 4, 16, 0)
    # no box narrower than 64 columns by default (session 36: ConvNeXt's 96-wide chain faulted with 32-wide ones)
    assert b2b.chunked_parts(96, 96) == (64, 2, 64, 64)
    assert b2b.chunked_parts(96, 40) == (64, 2, 64, 0)
    assert b2b.chunked_parts(200, 16) == (64, 4, 64, 0)
    assert b2b.chunked_parts(32, 256) == (64, 1, 256, 0)


def test_sm90_chunked_kernel_at_vit_ti_widths() -> None:
    """192 -> 768 -> 192 (ViT-Ti's FFN) compiled for sm_90 with the default tiling: K0 in three
    64-column steps, the output in 128 + 64 columns (two TMA stores), wgmma with the intermediate
    in registers, no spills."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_gelu"), torch.float16), b2b.Stage(_epi("residual_sigmoid"), torch.float16)))
    cfg = dataclasses.replace(b2b.chunked_config([768, 192], 192), block_m=64, num_warps=4, num_stages=1, block_h=128)
    asm = b2b.compile_asm(chain, [768, 192], cfg, torch.float16, 90, (1, 1), 192, True, None, True)
    summary = b2b.ptx_summary(asm["ptx"])
    assert summary["st.global"] == 0 and summary["wgmma_a_regs"] > 0, summary
    assert asm["ptx"].count("cp.async.bulk.tensor.2d.global.shared") == 2  # the two output parts
    facts = sass_facts(asm["cubin"])
    assert facts["STL"] == 0 and facts["LOCAL"] == 0 and facts["HGMMA"] > 0, facts


def test_sm90_chunked_kernel_at_convnext_widths_has_no_narrow_boxes() -> None:
    """96 -> 384 -> 96 (ConvNeXt-T's / Swin-T's first-stage MLP) compiled for sm_90 with the decision's
    first tiling: K0 in two 64-column TMA boxes (8 KB each for a 64-row tile), W1 and the output in 64-column
    parts, so no 32-column box and no n32 wgmma remain (session 36: those tilings faulted on the H200)."""
    import re

    chain = b2b.Chain((b2b.Stage(_epi("bias_gelu"), torch.float16), b2b.Stage(_epi("bias_relu"), torch.float16)))
    cfg = dataclasses.replace(b2b.chunked_config([384, 96], 96), block_m=64, num_warps=4, num_stages=1, block_h=128)
    asm = b2b.compile_asm(chain, [384, 96], cfg, torch.float16, 90, (1, 1), 96, True, None, True)
    tx = [int(v) for v in re.findall(r"expect_tx\.shared\.b64 _, \[%r\d+\], (\d+);", asm["ptx"])]
    assert tx and min(tx) >= 64 * 64 * 2, tx  # every box at least 64 x 64 fp16
    assert "n32k16" not in asm["ptx"] and "m64n64k16" in asm["ptx"]
    assert asm["ptx"].count("cp.async.bulk.tensor.2d.global.shared") == 2  # the two 64-column output parts
    facts = sass_facts(asm["cubin"])
    assert facts["STL"] == 0 and facts["HGMMA"] > 0, facts


def test_one_program_per_tile_always_preloads_the_later_weights() -> None:
    """Session 28, on the H200: ``b2b_kernel`` loading the last stage's weight tile after the
    resident stages' products gave wrong results or illegal addresses (Triton 3.6, sm_90; 21 of 69
    runs at 64 -> 128 -> 32 and 64 -> 128 -> 128 -> 32), the preloading form none of 80. So the
    candidates say ``preload`` for every one-program-per-tile tiling whose last width is one tile,
    do not list a tiling twice, and the persistent, TMA and N-loop tilings are left as they were."""
    cands = b2b.candidate_configs(130, [128, 128, 32], k0=64, sms=1)  # sms=1: the persistent tilings too
    per_tile = [c for c in cands if not (c.persistent or c.tma or c.residence == "chunked")]
    assert per_tile and all(c.preload for c in per_tile)
    assert len(set(cands)) == len(cands)
    assert any(c.persistent and not c.preload for c in cands)
    assert b2b.default_config(130, [128, 128, 32]).preload
    assert not b2b.default_config(130, [128, 512]).preload  # the last width in N tiles: nothing to preload


def test_sm90_one_program_per_tile_loads_every_weight_before_the_first_product() -> None:
    """The offline sm_90 code of the tiling that failed on the H200 (64 -> 128 -> 32, 64-row tiles,
    4 warps, asked for without preload): every global load comes before the first wgmma."""
    chain = b2b.Chain((b2b.Stage(_epi("bias_relu"), torch.float16), b2b.Stage(_epi("none"), torch.float16)))
    ptx = b2b.compile_asm(chain, [128, 32], b2b.B2BConfig(64, 64, 32, 4, 2, "register"), torch.float16, 90, (1, 1), 64, True)["ptx"]
    first_mma = ptx.index("wgmma.mma_async")
    assert "ld.global" in ptx[:first_mma] and "ld.global" not in ptx[first_mma:]


def test_persistent_candidates_only_where_a_program_gets_a_second_row_tile() -> None:
    """A persistent kernel pipelines the next row tile's loads behind this one's GEMMs; with fewer row
    tiles than SMs there is no next tile, and these kernels are the slowest to compile (session 33:
    ViT-tiny's fp32 34-row chain waited 60 s for two ``b2b_tma_kernel`` compiles that were dropped)."""
    small = b2b.candidate_configs(34, [256, 64], k0=64, elem=4)
    assert small and not any(c.persistent for c in small)
    assert any(c.persistent for c in b2b.candidate_configs(1 << 18, [256, 64], k0=64, elem=4))
    # the boundary: 132 tiles of a config's rows keep it, one row fewer drops it
    for c in (c for c in b2b.candidate_configs(1 << 18, [128, 64], k0=64) if c.persistent):
        at = b2b.candidate_configs(132 * c.block_m, [128, 64], k0=64)
        under = b2b.candidate_configs(131 * c.block_m, [128, 64], k0=64)
        assert any(d.describe() == c.describe() for d in at), c.describe()
        assert not any(d.describe() == c.describe() for d in under), c.describe()
    chunked_only = b2b.candidate_configs(34, [1024, 64], k0=64)  # past the resident widths: chunked, one per tile
    assert chunked_only and all(c.residence == "chunked" and not c.persistent for c in chunked_only)


def test_gemm_chains_wider_than_128_measure_no_register_resident_tiling() -> None:
    """A GEMM chain whose intermediate is wider than 128 columns holds it in shared memory or in chunks:
    the register-resident tilings lost every recorded H200 decision there (22-61%) and are the slowest
    fp32 compiles. Chains up to 128 wide and conv chains keep them."""
    for widths, k0, elem in (([256, 64], 64, 4), ([256, 256], 256, 2), ([512, 64], 64, 2)):
        cands = b2b.candidate_configs(1 << 18, widths, k0=k0, elem=elem)
        assert cands and all(c.residence != "register" for c in cands), widths
    assert any(c.residence == "register" for c in b2b.candidate_configs(1 << 18, [128, 64], k0=64))
    assert any(c.residence == "register" for c in b2b.candidate_configs(64 * 14 * 14, [256, 1024], None, (64, 14, 14)))
