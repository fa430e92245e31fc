"""GEMM template: odd shapes, transposed and batched operands, split-K, persistent, TMA (and its
fallback for operands TMA cannot describe), the persistent TMA kernel with its compile hints, the
TMA store of C (and its pointer fallback), NaN-poisoned outputs: in the Triton interpreter on the
CPU, compiled on a GPU (the ``device`` fixture); the sm_90 SASS checks compile real cubins offline."""

import os
import subprocess
import sys

import pytest
import torch
from cubin_facts import run_offline_script

from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue references
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import GemmConfig, gemm_epilogue, reference

BIAS_GELU = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
TOL = {torch.float16: 2e-2, torch.float32: 1e-4}


def _check(a, b, extras, epi, dtype, cfg, out_shape):
    out = torch.full(out_shape, float("nan"), dtype=dtype, device=a.device)  # poisoned: every element must be written
    got = gemm_epilogue(a, b, extras, epi, dtype, cfg, out=out)
    ref = reference(a, b, extras, epi, dtype)
    assert got.shape == ref.shape
    assert not torch.isnan(got).any()
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)).item()
    assert err < TOL[dtype], err


@pytest.mark.parametrize("m,n,k", [(37, 45, 70), (1, 33, 64), (50, 17, 9), (64, 64, 48)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_odd_shapes_bias_gelu(m, n, k, dtype, device):
    a, b = torch.randn(m, k, device=device).to(dtype), torch.randn(k, n, device=device).to(dtype)
    _check(a, b, [torch.randn(n, device=device).to(dtype)], BIAS_GELU, dtype, GemmConfig(32, 32, 16, 2, 4, 1), (m, n))


@pytest.mark.parametrize("a_t,b_t", [(True, False), (False, True), (True, True)])
def test_transposed_operands(a_t, b_t, device):
    m, n, k = 29, 40, 52
    a = torch.randn(k, m, device=device).t() if a_t else torch.randn(m, k, device=device)
    b = torch.randn(n, k, device=device).t() if b_t else torch.randn(k, n, device=device)
    _check(a.half(), b.half(), [torch.randn(n, device=device).half()], BIAS_GELU, torch.float16, GemmConfig(16, 32, 32, 1, 4, 1), (m, n))


def test_batched_b_and_broadcast_batch(device):
    a, b = torch.randn(3, 21, 24, device=device), torch.randn(3, 24, 19, device=device)
    _check(a, b, [torch.randn(19, device=device)], BIAS_GELU, torch.float32, GemmConfig(16, 32, 16, 1, 4, 1), (3, 21, 19))
    a2 = torch.randn(21, 24, device=device)  # broadcast against b's batch
    _check(a2, b, [torch.randn(3, 21, 19, device=device)], BIAS_GELU, torch.float32, GemmConfig(16, 32, 16, 1, 4, 1), (3, 21, 19))


def test_leading_dims_fold_into_m(device):
    a, b = torch.randn(2, 5, 7, 24, device=device), torch.randn(24, 33, device=device)
    _check(a, b, [torch.randn(33, device=device)], BIAS_GELU, torch.float32, GemmConfig(32, 32, 16, 4, 4, 1), (2, 5, 7, 33))


@pytest.mark.parametrize("split", [2, 3, 8])
def test_split_k(split, device):
    m, n, k = 9, 40, 200
    a, b = torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()
    _check(a, b, [torch.randn(n, device=device).half()], BIAS_GELU, torch.float16, GemmConfig(16, 32, 16, 1, 4, 1, split_k=split), (m, n))


def test_split_k_batched_residual(device):
    a, b = torch.randn(2, 7, 96, device=device), torch.randn(2, 96, 20, device=device)
    res = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)
    _check(a, b, [torch.randn(2, 7, 20, device=device)], res, torch.float32, GemmConfig(16, 32, 16, 1, 4, 1, split_k=4), (2, 7, 20))


@pytest.fixture
def four_sms(monkeypatch):
    """The persistent kernels launch one program per SM (at most one per tile). The interpreter's
    'GPU' has 4 SMs, so there the programs loop over several tiles; an H200 has 132, one tile each
    on these small problems: pin 4 on both so the loop is tested on the GPU too."""
    import kfuse.kernels.gemm as G

    monkeypatch.setattr(G, "_num_sms", lambda device: 4)


def test_persistent(four_sms, device):
    a, b = torch.randn(70, 40, device=device).half(), torch.randn(40, 50, device=device).half()
    _check(
        a, b, [torch.randn(50, device=device).half()], BIAS_GELU, torch.float16, GemmConfig(16, 32, 16, 2, 4, 1, persistent=True), (70, 50)
    )


@pytest.fixture
def launched(monkeypatch):
    """The names of the kernels ``launch`` runs."""
    import kfuse.kernels.gemm as G

    names, go = [], G._go

    def spy(kernel, *args, **kwargs):
        names.append(getattr(kernel, "fn", kernel).__name__)
        return go(kernel, *args, **kwargs)

    monkeypatch.setattr(G, "_go", spy)
    return names


TMA = GemmConfig(32, 32, 32, 2, 4, 1, tma=True)


@pytest.mark.parametrize(
    "shape_a,shape_b,b_t,dtype",
    [
        ((100, 96), (96, 72), False, torch.float16),  # ragged M and N
        ((100, 80), (80, 72), False, torch.float16),  # K tail: 80 is not a multiple of BLOCK_K
        ((100, 80), (80, 72), True, torch.float16),  # column-major B: a B^T descriptor
        ((3, 40, 56), (3, 56, 40), False, torch.float16),  # batched: 3-D descriptors, ragged M and K per batch
        ((3, 40, 56), (3, 56, 40), True, torch.float32),
        ((40, 56), (3, 56, 40), False, torch.float32),  # A broadcast over B's batch: a 2-D A descriptor
    ],
)  # fmt: skip
def test_tma_matches_reference(launched, shape_a, shape_b, b_t, dtype, device):
    a = torch.randn(shape_a, device=device).to(dtype)
    b = _operand_b(shape_b, b_t, dtype, device)
    out_shape = tuple(torch.broadcast_shapes(shape_a[:-2], shape_b[:-2])) + (shape_a[-2], shape_b[-1])
    _check(a, b, [torch.randn(shape_b[-1], device=device).to(dtype)], BIAS_GELU, dtype, TMA, out_shape)
    assert launched == ["gemm_tma_kernel"]


def _misaligned(m, k, device):
    return torch.randn(m * k + 1, device=device).half()[1:].view(m, k)  # base 2 bytes past a 16-byte boundary


@pytest.mark.parametrize(
    "make_a,make_b",
    [
        (lambda d: torch.randn(96, 100, device=d).half().t(), lambda d: torch.randn(96, 72, device=d).half()),  # A K-strided (col-major)
        (lambda d: _misaligned(100, 96, d), lambda d: torch.randn(96, 72, device=d).half()),  # A's base misaligned
        (lambda d: torch.randn(100, 52, device=d).half(), lambda d: torch.randn(52, 72, device=d).half()),  # A's row stride 104 B
        (lambda d: torch.randn(100, 96, device=d).half(), lambda d: torch.randn(96, 144, device=d).half()[:, ::2]),  # B strided both ways
        (lambda d: torch.randn(100, 96, device=d).half(), lambda d: torch.randn(96, 36, device=d).half()),  # B's row stride 72 B
    ],
)  # fmt: skip
def test_tma_ineligible_operands_fall_back(launched, make_a, make_b, device):
    a, b = make_a(device), make_b(device)
    _check(a, b, [torch.randn(b.shape[-1], device=device).half()], BIAS_GELU, torch.float16, TMA, (a.shape[0], b.shape[-1]))
    assert launched == ["gemm_kernel"]


def test_tma_not_with_split_k(launched, device):
    a, b = torch.randn(16, 256, device=device).half(), torch.randn(256, 32, device=device).half()
    for persistent in (False, True):
        launched.clear()
        cfg = GemmConfig(16, 32, 32, 1, 4, 1, split_k=2, persistent=persistent, tma=True)
        _check(a, b, [torch.randn(32, device=device).half()], BIAS_GELU, torch.float16, cfg, (16, 32))
        assert launched == ["gemm_kernel", "splitk_reduce_kernel"]


# ---- the persistent TMA kernel (persistent + tma) ------------------------------------------
BIAS_GELU_RES = Epilogue(
    (
        EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))),
        EpilogueStep("gelu", (Operand("reg", 1),)),
        EpilogueStep("add", (Operand("reg", 2), Operand("in", 1))),
    ),
    2,
)  # fmt: skip
HINTS = {
    "plain": {},
    "flatten": {"flatten": True},
    "ws": {"warp_specialize": True},
    "flatten+subtile": {"flatten": True, "epilogue_subtile": True},
    "subtile": {"epilogue_subtile": True},
}


@pytest.fixture
def launches(monkeypatch):
    """(kernel name, grid, constexprs) of every kernel ``launch`` runs."""
    import kfuse.kernels.gemm as G

    seen, go = [], G._go

    def spy(kernel, grid, warmup, *args, **kwargs):
        seen.append((getattr(kernel, "fn", kernel).__name__, grid, kwargs))
        return go(kernel, grid, warmup, *args, **kwargs)

    monkeypatch.setattr(G, "_go", spy)
    return seen


def _operand_b(shape_b, b_t, dtype, device):
    if b_t:  # column-major B, as a transposed nn.Linear weight
        return torch.randn(*shape_b[:-2], shape_b[-1], shape_b[-2], device=device).transpose(-1, -2).to(dtype)
    return torch.randn(shape_b, device=device).to(dtype)


@pytest.mark.parametrize("hints", list(HINTS.values()), ids=list(HINTS))
@pytest.mark.parametrize(
    "shape_a,shape_b,b_t,dtype",
    [
        ((101, 72), (72, 88), False, torch.float16),  # ragged M, N and K (72 = 2 x 32 + 8)
        ((101, 72), (72, 45), True, torch.float16),  # column-major B (a B^T descriptor), odd N
        ((77, 36), (36, 72), False, torch.float32),
        ((77, 36), (36, 75), True, torch.float32),
        ((3, 40, 56), (3, 56, 40), False, torch.float16),  # batched: the tile loop walks the batches
        ((40, 56), (3, 56, 40), True, torch.float16),  # A broadcast over B's batch
    ],
)  # fmt: skip
def test_tma_persistent_matches_reference(launches, four_sms, shape_a, shape_b, b_t, dtype, hints, device):
    """bias + GELU + residual, NaN-poisoned output; more tiles than programs, so every program
    runs the tile loop more than once (4 SMs: the interpreter's 'GPU', pinned on a real one)."""
    a, b = torch.randn(shape_a, device=device).to(dtype), _operand_b(shape_b, b_t, dtype, device)
    out_shape = tuple(torch.broadcast_shapes(shape_a[:-2], shape_b[:-2])) + (shape_a[-2], shape_b[-1])
    extras = [torch.randn(shape_b[-1], device=device).to(dtype), torch.randn(out_shape, device=device).to(dtype)]
    cfg = GemmConfig(32, 32, 32, 2, 4, 1, persistent=True, tma=True, **hints)
    _check(a, b, extras, BIAS_GELU_RES, dtype, cfg, out_shape)
    [(name, grid, kw)] = launches
    tiles = -(-out_shape[-2] // 32) * -(-out_shape[-1] // 32) * (out_shape[0] if len(out_shape) == 3 else 1)
    assert name == "gemm_tma_persistent_kernel" and grid == (kw["NUM_PROGRAMS"],) and 2 * grid[0] <= tiles
    assert kw["B_KMAJOR"] == b_t and kw["FLATTEN"] == cfg.flatten and kw["WARP_SPECIALIZE"] == cfg.warp_specialize
    assert kw["EPILOGUE_SUBTILE"] == cfg.epilogue_subtile


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_tma_persistent_bias_gelu_and_big_tile(launches, four_sms, dtype, device):
    a, b = torch.randn(150, 64, device=device).to(dtype), torch.randn(72, 64, device=device).t().to(dtype)
    for cfg in (GemmConfig(64, 64, 32, 8, 4, 1, persistent=True, tma=True, warp_specialize=True),
                GemmConfig(64, 128, 64, 8, 4, 1, persistent=True, tma=True, flatten=True, epilogue_subtile=True)):  # fmt: skip
        _check(a, b, [torch.randn(72, device=device).to(dtype)], BIAS_GELU, dtype, cfg, (150, 72))
    assert [x[0] for x in launches] == ["gemm_tma_persistent_kernel"] * 2


def test_tma_persistent_falls_back_to_pointer_persistent(launched, four_sms, device):
    """Operands TMA cannot describe (A column-major): the pointer persistent kernel, hints ignored."""
    a, b = torch.randn(96, 100, device=device).half().t(), torch.randn(96, 72, device=device).half()
    cfg = GemmConfig(32, 32, 32, 2, 4, 1, persistent=True, tma=True, warp_specialize=True)
    _check(a, b, [torch.randn(72, device=device).half()], BIAS_GELU, torch.float16, cfg, (100, 72))
    assert launched == ["gemm_persistent_kernel"]


# ---- the output tile stored by TMA (both TMA kernels, C describable) -----------------------
STORE_CFGS = {
    "tma": GemmConfig(64, 32, 32, 2, 4, 1, tma=True),
    "persistent": GemmConfig(64, 32, 32, 2, 4, 1, persistent=True, tma=True),
    "persistent+flatten": GemmConfig(64, 32, 32, 2, 4, 1, persistent=True, tma=True, flatten=True),
    "persistent+subtile": GemmConfig(64, 32, 32, 2, 4, 1, persistent=True, tma=True, epilogue_subtile=True),
}


def _padded_out(out_shape, dtype, device, pad=(3, 8)):
    """A NaN-filled buffer with ``pad`` extra rows / columns and the output as its top-left view
    (row stride N + 8: still 16-byte aligned, so TMA describes the view). Whatever lands in the
    padding was written past M or N."""
    *batch, m, n = out_shape
    buf = torch.full((*batch, m + pad[0], n + pad[1]), float("nan"), dtype=dtype, device=device)
    return buf, buf[..., :m, :n]


@pytest.mark.parametrize("name", list(STORE_CFGS))
@pytest.mark.parametrize(
    "shape_a,shape_b,b_t,dtype",
    [
        ((77, 48), (48, 40), False, torch.float16),  # M, N not tile multiples (64 x 32), K tail
        ((77, 48), (48, 40), True, torch.float32),  # column-major B
        ((3, 45, 40), (3, 40, 24), True, torch.float16),  # batched C: a 3-D descriptor, ragged M per batch
    ],
)  # fmt: skip
def test_tma_store_matches_reference(launches, name, shape_a, shape_b, b_t, dtype, device):
    """C by c_desc.store: bias + GELU + residual (a full-tile extra input, loaded by pointers),
    into a view of a NaN-poisoned buffer: every output element written, nothing past M or N
    (TMA clips the ragged tiles; batched, nothing into the next batch's rows)."""
    cfg = STORE_CFGS[name]
    a, b = torch.randn(shape_a, device=device).to(dtype), _operand_b(shape_b, b_t, dtype, device)
    out_shape = tuple(torch.broadcast_shapes(shape_a[:-2], shape_b[:-2])) + (shape_a[-2], shape_b[-1])
    extras = [torch.randn(shape_b[-1], device=device).to(dtype), torch.randn(out_shape, device=device).to(dtype)]
    buf, out = _padded_out(out_shape, dtype, device)
    got = gemm_epilogue(a, b, extras, BIAS_GELU_RES, dtype, cfg, out=out)
    ref = reference(a, b, extras, BIAS_GELU_RES, dtype)
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(got).any()
    err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    assert err < TOL[dtype], err
    pad = torch.ones_like(buf, dtype=torch.bool)
    pad[..., : out_shape[-2], : out_shape[-1]] = False
    assert torch.isnan(buf[pad]).all(), "written past M or N"
    [(kernel, _, kw)] = launches
    assert kernel == ("gemm_tma_persistent_kernel" if cfg.persistent else "gemm_tma_kernel")
    assert kw["TMA_STORE"] and kw["C_BATCHED"] == (len(out_shape) == 3)


def _view_at(flat, offset, shape):
    return flat[offset : offset + shape[0] * shape[1]].view(shape)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize(
    "n,make_out",
    [
        (36, lambda m, n, d: None),  # N x 2 B = 72 B: C's row stride is not 16-byte aligned
        (40, lambda m, n, d: _view_at(torch.full((m * n + 8,), float("nan"), device=d).half(), 1, (m, n))),  # C's base 2 B off
        (40, lambda m, n, d: torch.full((n, m), float("nan"), device=d).half().t()),  # C column-major
    ],
    ids=["row_stride", "base", "column_major"],
)  # fmt: skip
def test_tma_store_falls_back_to_pointer_store(launches, persistent, n, make_out, device):
    """C that TMA cannot describe: the same TMA kernel (A and B still by TMA; column-major B, so
    an odd N leaves the operands describable) stores by pointers, and is still right."""
    m, k = 77, 48
    a, b = torch.randn(m, k, device=device).half(), torch.randn(n, k, device=device).half().t()
    extras = [torch.randn(n, device=device).half(), torch.randn(m, n, device=device).half()]
    out = make_out(m, n, device)
    out = torch.full((m, n), float("nan"), device=device).half() if out is None else out
    cfg = GemmConfig(64, 32, 32, 2, 4, 1, persistent=persistent, tma=True, epilogue_subtile=persistent)
    got = gemm_epilogue(a, b, extras, BIAS_GELU_RES, torch.float16, cfg, out=out)
    ref = reference(a, b, extras, BIAS_GELU_RES, torch.float16)
    assert not torch.isnan(got).any() and torch.equal(got, out)
    assert ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item() < TOL[torch.float16]
    [(kernel, _, kw)] = launches
    assert kernel == ("gemm_tma_persistent_kernel" if persistent else "gemm_tma_kernel") and not kw["TMA_STORE"]


def test_tma_store_shared_memory_rule():
    """The persistent TMA kernel keeps the staged output tile next to its live pipeline buffers:
    128x256x64 s4 no longer fits the H200 when C is stored by TMA (sm_90 compile: 263200 B), and
    is still valid where launch stores by pointers (C's row stride not 16-byte aligned) or for
    gemm_tma_kernel (its staging reuses the dead pipeline buffers)."""
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.space import GemmProblem, hard_reject, smem_bytes, tma_store_bytes

    cfg = GemmConfig(128, 256, 64, 8, 8, 4, persistent=True, tma=True, flatten=True)
    aligned, odd = GemmProblem(4096, 3072, 768, b_t=True), GemmProblem(4096, 3070, 768, b_t=True)
    assert tma_store_bytes(cfg, aligned) == 128 * 256 * 2 and smem_bytes(cfg, aligned) == 4 * 24576 * 2 + 65536
    why = hard_reject(cfg, aligned, DEFAULT)
    assert why is not None and "shared memory 262144 B" in why and "TMA store" in why
    assert tma_store_bytes(cfg, odd) == 0 and hard_reject(cfg, odd, DEFAULT) is None
    assert hard_reject(GemmConfig(128, 256, 64, 8, 8, 4, tma=True), aligned, DEFAULT) is None
    assert hard_reject(GemmConfig(128, 256, 64, 8, 8, 3, persistent=True, tma=True, flatten=True), aligned, DEFAULT) is None
    # the subtiled epilogue stages a half tile, within the split's bound the rule already counted
    sub = GemmConfig(128, 256, 64, 8, 8, 3, persistent=True, tma=True, flatten=True, epilogue_subtile=True)
    assert tma_store_bytes(sub, aligned) == 128 * 128 * 2 and smem_bytes(sub, aligned) == smem_bytes(sub, odd)


def test_config_describe_and_dict():
    cfg = GemmConfig(128, 256, 64, 8, 8, 3, tma=True)
    assert cfg.describe() == "128x256x64 g8 w8 s3 tma" and cfg.as_dict()["tma"] is True
    assert "tma" not in GemmConfig().describe()
    ws = GemmConfig(128, 128, 64, 8, 4, 3, persistent=True, tma=True, warp_specialize=True)
    assert ws.describe() == "128x128x64 g8 w4 s3 persistent tma ws" and ws.as_dict()["warp_specialize"] is True
    flat = GemmConfig(128, 256, 64, 8, 8, 4, persistent=True, tma=True, flatten=True, epilogue_subtile=True)
    assert flat.describe() == "128x256x64 g8 w8 s4 persistent tma flat sub"


def test_no_epilogue_and_k_zero(device):
    a, b = torch.randn(5, 0, device=device), torch.randn(0, 6, device=device)
    bias = torch.randn(6, device=device)
    want = torch.nn.functional.gelu(bias).expand(5, 6)
    got = gemm_epilogue(a, b, [bias], BIAS_GELU, torch.float32)
    torch.testing.assert_close(got, want)
    out = torch.full((5, 6), float("nan"), device=device)  # K == 0 must still write the caller's buffer
    got = gemm_epilogue(a, b, [bias], BIAS_GELU, torch.float32, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, want)
    half = torch.full((5, 6), float("nan"), dtype=torch.float16, device=device)  # and cast to its dtype
    gemm_epilogue(a.half(), b.half(), [bias.half()], BIAS_GELU, torch.float16, out=half)
    torch.testing.assert_close(half.float(), want, atol=2e-3, rtol=2e-3)
    a, b = torch.randn(5, 8, device=device), torch.randn(8, 6, device=device)
    _check(a, b, [], Epilogue(), torch.float32, GemmConfig(16, 32, 16, 1, 4, 1), (5, 6))


def test_bad_shapes_are_reported(device):
    with pytest.raises(ValueError, match="do not multiply"):
        gemm_epilogue(torch.randn(3, 4, device=device), torch.randn(5, 6, device=device), [], Epilogue(), torch.float32)


_SASS_SCRIPT = r"""
import os, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from kfuse.ir import ops
from kfuse.kernels.gemm import _module
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
fn = _module(epi).gemm_kernel
sig = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "ws_ptr": "*fp32", "x0_ptr": "*fp16"}
for name in fn.arg_names:
    if name not in sig and name not in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "EVEN_K", "INPUT_PRECISION", "XB0", "PDL"):
        sig[name] = "i32"
consts = {"PDL": False, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "SPLIT_K": 1, "EVEN_K": True,
          "INPUT_PRECISION": "tf32", "XB0": True}
for k in consts:
    sig[k] = "constexpr"
src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
print("HGMMA" if "HGMMA" in sass else "NO-HGMMA")
"""


def test_sass_uses_hgmma_on_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-c", _SASS_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    if r.returncode != 0 and "cuobjdump" in r.stderr and "No such file" in r.stderr:
        pytest.skip("the triton wheel has no cuobjdump")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("HGMMA"), r.stdout


_SASS_PERSISTENT_SCRIPT = r"""
import json, os, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from kfuse.ir import ops
from kfuse.kernels.gemm import GemmConfig, _module
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.tune.space import GemmProblem, smem_bytes
bm, bn, warps, stages, ws, flat, tma_store = json.loads(sys.argv[1])
epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
fn = _module(epi).gemm_tma_persistent_kernel
# column-major B (a transposed nn.Linear weight): host descriptors of A (M, K) and B^T (N, K), and
# of C (M, N) with TMA_STORE (otherwise c_desc is an unused pointer placeholder)
sig = {"a_desc": f"tensordesc<fp16[{bm}, 64]>", "b_desc": f"tensordesc<fp16[{bn}, 64]>", "c_ptr": "*fp16",
       "c_desc": f"tensordesc<fp16[{bm}, {bn}]>" if tma_store else "*fp16", "x0_ptr": "*fp16"}
consts = {"PDL": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 64, "GROUP_M": 8, "NUM_PROGRAMS": 132, "A_BATCHED": False,
          "B_BATCHED": False, "B_KMAJOR": True, "INPUT_PRECISION": "tf32", "FLATTEN": flat, "WARP_SPECIALIZE": ws,
          "EPILOGUE_SUBTILE": False, "TMA_STORE": tma_store, "C_BATCHED": False, "XB0": True}
for name in fn.arg_names:
    sig.setdefault(name, "constexpr" if name in consts else "i32")
src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
cfg = GemmConfig(bm, bn, 64, 8, warps, stages, persistent=True, tma=True, warp_specialize=ws, flatten=flat)
print(json.dumps({"HGMMA": sass.count("HGMMA"), "UTMALDG": sass.count("UTMALDG"), "USETMAXREG": sass.count("USETMAXREG"),
                  "UTMASTG": sass.count("UTMASTG"), "STG": sass.count(" STG"), "num_warps": k.metadata.num_warps,
                  "shared": k.metadata.shared, "estimate": smem_bytes(cfg, GemmProblem(4096, 3072, 768, b_t=True))}))
"""


def _run_sass_script(script, args):
    return run_offline_script(script, args)


def _sass_persistent(bm, bn, warps, stages, ws, flat, tma_store):
    return _run_sass_script(_SASS_PERSISTENT_SCRIPT, [bm, bn, warps, stages, ws, flat, tma_store])


@pytest.mark.parametrize("tma_store", [False, True], ids=["pointer_store", "tma_store"])
def test_sass_warp_specialized_persistent_tma_on_sm90(tma_store):
    """Triton 3.6 warp-specialises the persistent TMA kernel for sm_90 with num_warps=4: 12 warps
    (a producer group issuing the TMA loads, two consumer groups running wgmma), register
    budgets moved between them by setmaxnreg. 64x128 is a tile the space allows (64-row tiles
    only: with BLOCK_M > 64 the specialised kernel deadlocks on the H200). With the TMA store
    the output leaves by bulk tensor stores, no STG."""
    got = _sass_persistent(64, 128, 4, 3, True, False, tma_store)
    assert got["HGMMA"] > 0 and got["UTMALDG"] > 0 and got["USETMAXREG"] > 0 and got["num_warps"] == 12, got
    assert (got["UTMASTG"] > 0 and got["STG"] == 0) if tma_store else got["UTMASTG"] == 0, got


def test_sass_tma_store_flattened_persistent_on_sm90():
    """The flattened persistent loop (the tuner's usual pick) stores C by TMA: bulk tensor stores,
    no STG, and the shared memory it asks for is the tuner's estimate (pipeline + the staged
    128x256 output tile, 212992 B) plus at most 2 KB of barriers."""
    got = _sass_persistent(128, 256, 8, 3, False, True, True)
    assert got["HGMMA"] > 0 and got["UTMASTG"] > 0 and got["STG"] == 0, got
    assert got["estimate"] == 3 * (128 * 64 + 64 * 256) * 2 + 128 * 256 * 2
    assert got["estimate"] <= got["shared"] <= got["estimate"] + 2048, got


def test_open_ended_clamp_in_epilogue(device: str) -> None:
    """clamp(x, min=None) must not clamp at zero (a None bound is unbounded)."""
    import torch

    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import gemm_epilogue, reference

    for lo, hi in ((None, 0.5), (-0.25, None)):
        epi = Epilogue((EpilogueStep("clamp", (Operand("reg", 0),), (("lo", lo), ("hi", hi))),), 0)
        a, b = torch.randn(33, 20, device=device), torch.randn(20, 17, device=device)
        out = gemm_epilogue(a, b, [], epi, torch.float32)
        torch.testing.assert_close(out, reference(a, b, [], epi, torch.float32), rtol=1e-4, atol=1e-4)


def test_integer_power_of_negative_values_in_epilogue(device: str) -> None:
    """pow(x, 3) on negative x (GPT-2's gelu_new) must not go through exp(3*log(x))."""
    import torch

    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
    from kfuse.kernels.gemm import gemm_epilogue, reference

    epi = Epilogue((EpilogueStep("pow", (Operand("reg", 0), Operand("lit", value=3.0))),), 0)
    a, b = torch.randn(9, 16, device=device), torch.randn(16, 12, device=device)
    out = gemm_epilogue(a, b, [], epi, torch.float32)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, reference(a, b, [], epi, torch.float32), rtol=1e-4, atol=1e-3)


# ---- the resident-B kernel (B's column block loaded once per program) ----------------------
@pytest.mark.parametrize(
    "m,n,k,b_t,cfg",
    [
        (300, 72, 40, True, GemmConfig(32, 32, 64, 1, 4, 1, tma=True, resident_b=True)),  # ragged M, N; K 40 < BLOCK_K 64
        (1100, 64, 64, False, GemmConfig(64, 64, 64, 1, 4, 2, tma=True, resident_b=True)),  # row-major B, one column block
        (77, 100, 24, True, GemmConfig(16, 32, 32, 1, 4, 1, tma=True, resident_b=True)),  # 4 column blocks, 3 ragged
    ],
    ids=["ragged", "row_major_b", "four_columns"],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_resident_b_kernel(launches, four_sms, m, n, k, b_t, cfg, dtype, device):
    """bias + GELU + residual, NaN-poisoned output, more row tiles than programs (4 SMs: the
    interpreter's 'GPU', pinned on a real one): every program loops, and programs sharing a column
    block split the rows."""
    a, b = torch.randn(m, k, device=device).to(dtype), _operand_b((k, n), b_t, dtype, device)
    extras = [torch.randn(n, device=device).to(dtype), torch.randn(m, n, device=device).to(dtype)]
    _check(a, b, extras, BIAS_GELU_RES, dtype, cfg, (m, n))
    [(name, grid, kw)] = launches
    n_cols = -(-n // cfg.block_n)
    assert name == "gemm_tma_resident_kernel" and grid == (kw["NUM_PROGRAMS"],) and kw["B_KMAJOR"] == b_t
    assert kw["NUM_PROGRAMS"] % n_cols == 0 and kw["NUM_PROGRAMS"] < n_cols * -(-m // cfg.block_m)


@pytest.mark.parametrize(
    "shape_a,shape_b,why",
    [
        ((3, 40, 32), (3, 32, 24), "batched B"),
        ((40, 80), (80, 24), "K 80 > BLOCK_K 64"),
    ],
)
def test_resident_b_falls_back_when_ineligible(launched, shape_a, shape_b, why, device):
    a, b = torch.randn(shape_a, device=device), torch.randn(shape_b, device=device)
    cfg = GemmConfig(32, 32, 64, 1, 4, 1, tma=True, resident_b=True)
    extras = [torch.randn(b.shape[-1], device=device)]
    _check(a, b, extras, BIAS_GELU, torch.float32, cfg, tuple(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) + (a.shape[-2], 24))
    assert launched == ["gemm_tma_kernel"], why


def test_resident_b_space_rules():
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.space import GemmProblem, hard_reject, smem_bytes, valid_configs

    p = GemmProblem(262144, 256, 256, b_t=True)
    best = GemmConfig(64, 128, 256, 1, 4, 4, tma=True, resident_b=True)
    assert hard_reject(best, p, DEFAULT) is None
    assert smem_bytes(best, p) == (256 * 128 + 4 * 64 * 256 + 64 * 128) * 2  # B once, 4 A tiles, staged C
    assert "shared memory" in hard_reject(GemmConfig(64, 256, 256, 1, 4, 3, tma=True, resident_b=True), p, DEFAULT)
    assert "BLOCK_K must be K" in hard_reject(GemmConfig(64, 128, 128, 1, 4, 4, tma=True, resident_b=True), p, DEFAULT)
    wide_k = GemmConfig(64, 32, 1024, 1, 4, 1, tma=True, resident_b=True)
    assert "K 768 > 256" in hard_reject(wide_k, GemmProblem(65536, 32, 768), DEFAULT)
    assert "one batch" in hard_reject(best, GemmProblem(4096, 256, 256, batch=4), DEFAULT)
    assert "2 per program" in hard_reject(best, GemmProblem(4096, 256, 256), DEFAULT)
    assert "no split-K" in hard_reject(GemmConfig(64, 128, 256, 1, 4, 4, split_k=2, tma=True, resident_b=True), p, DEFAULT)
    resident = [c for c in valid_configs(p, DEFAULT) if c.resident_b]
    assert best in resident and all(c.block_k == 256 for c in resident)
    assert not any(c.resident_b for c in valid_configs(GemmProblem(4096, 3072, 768, b_t=True), DEFAULT))


def test_search_measures_the_resident_kernel():
    """However the model ranks it, the best two resident configs are in the measured batch."""
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.search import _varied_top
    from kfuse.tune.space import GemmProblem, valid_configs

    valid = valid_configs(GemmProblem(262144, 256, 256, b_t=True), DEFAULT)
    ranked = sorted(valid, key=lambda c: (c.resident_b, c.describe()))  # a model that ranks every resident config last
    batch = _varied_top(ranked, 10, set())
    # six kernels (tile, resident, three ping-pong forms, coop): the batch grows to two of each
    assert len(batch) == 12 and sum(c.resident_b for c in batch) == 2
    assert [c for c in batch if c.resident_b] == [c for c in ranked if c.resident_b][:2]


_SASS_RESIDENT_SCRIPT = r"""
import json, os, re, subprocess, sys, tempfile
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from kfuse.ir import ops
from kfuse.kernels.gemm import GemmConfig, _module, resident_smem_bytes
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
bm, bn, bk, warps, stages = json.loads(sys.argv[1])
epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)
fn = _module(epi).gemm_tma_resident_kernel
sig = {"a_desc": f"tensordesc<fp16[{bm}, {bk}]>", "b_desc": f"tensordesc<fp16[{bn}, {bk}]>", "c_ptr": "*fp16",
       "c_desc": f"tensordesc<fp16[{bm}, {bn}]>", "x0_ptr": "*fp16"}
consts = {"PDL": False, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "NUM_PROGRAMS": 132, "B_KMAJOR": True, "INPUT_PRECISION": "tf32",
          "TMA_STORE": True, "C_BATCHED": False, "XB0": True}
for name in fn.arg_names:
    sig.setdefault(name, "constexpr" if name in consts else "i32")
src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
    f.write(k.asm["cubin"])
sass = subprocess.run([os.path.join(bindir, "cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
usage = subprocess.run([os.path.join(bindir, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
cfg = GemmConfig(bm, bn, bk, 1, warps, stages, tma=True, resident_b=True)
print(json.dumps({"HGMMA": sass.count("HGMMA"), "UTMALDG": sass.count("UTMALDG"), "UTMASTG": sass.count("UTMASTG"),
                  "STL": sass.count(" STL"), "LOCAL": int(re.search(r"LOCAL:(\d+)", usage).group(1)),
                  "shared": k.metadata.shared, "estimate": resident_smem_bytes(cfg, 2)}))
"""


def test_sass_resident_b_on_sm90():
    """The tuner's best resident config at M x 256 x 256 on sm_90: wgmma, TMA loads and stores, no
    spills, and the shared memory it asks for is ``resident_smem_bytes`` (B once + 4 A tiles +
    the staged C tile: 212992 B) plus at most 2 KB of barriers, under the H200's 232448 B."""
    got = _run_sass_script(_SASS_RESIDENT_SCRIPT, [64, 128, 256, 4, 4])
    assert got["HGMMA"] > 0 and got["UTMALDG"] > 0 and got["UTMASTG"] > 0 and got["STL"] == 0 and got["LOCAL"] == 0, got
    assert got["estimate"] == 212992 and got["estimate"] <= got["shared"] <= got["estimate"] + 2048 <= 232448, got


def test_search_orders_an_unseen_kernel_by_the_rules():
    """A model trained without any resident-B measurement ranks those configs at random; their
    order among themselves falls back to the analytic estimate (64x128x256 s4 first)."""
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.search import _rules_within_unseen, _varied_top
    from kfuse.tune.space import GemmProblem, valid_configs

    p = GemmProblem(262144, 256, 256, b_t=True)
    valid = valid_configs(p, DEFAULT)
    ranked = sorted(valid, key=lambda c: (c.resident_b, -c.num_stages, c.describe()))  # a model that likes 2 stages
    samples = [(GemmConfig(128, 128, 64, 8, 4, 3, tma=True), GemmProblem(4096, 768, 768), 0.02)]
    fixed = _rules_within_unseen(ranked, samples, p, DEFAULT)
    picked = [c for c in _varied_top(fixed, 10, set()) if c.resident_b]
    assert picked[0] == GemmConfig(64, 128, 256, 1, 4, 4, tma=True, resident_b=True), picked
    assert [i for i, c in enumerate(fixed) if c.resident_b] == [i for i, c in enumerate(ranked) if c.resident_b]
    from kfuse.tune.search import _kernel

    ws_kinds = ("pingpong", "pingpong pieces", "pingpong rows", "coop")
    ws_seen = [(next(c for c in valid if _kernel(c) == w), p, 0.1) for w in ws_kinds]  # the other kernels, seen
    seen = samples + [(picked[0], p, 0.08)] + ws_seen
    assert _rules_within_unseen(ranked, seen, p, DEFAULT) == ranked  # measured once: the model's order stands


def test_search_always_measures_the_rules_pick_of_each_kernel():
    """The model may carry another problem's winner; the analytic estimate's first config of each
    kernel (tile, resident B, the warp-specialised ones) is measured as well, in place of the
    batch's last configs of a kernel that has several."""
    from kfuse.tune.hardware import DEFAULT
    from kfuse.tune.search import _kernel, _with_rules_best
    from kfuse.tune.space import GemmProblem, estimate_ms, valid_configs

    p = GemmProblem(1048576, 256, 256, b_t=True)
    valid = valid_configs(p, DEFAULT)
    firsts = {kind: min((c for c in valid if _kernel(c) == kind), key=lambda c: estimate_ms(c, p, DEFAULT))
              for kind in ("tile", "resident", "pingpong", "pingpong pieces", "pingpong rows", "coop")}  # fmt: skip
    rules_first = firsts["resident"]
    assert rules_first == GemmConfig(64, 128, 256, 1, 4, 4, tma=True, resident_b=True)
    others = [c for c in valid if c.resident_b and c != rules_first][:2]
    tiles = [c for c in valid if _kernel(c) == "tile"][:8]
    batch = _with_rules_best(tiles + others, valid, p, DEFAULT, set(), 10)
    assert len(batch) == 10 and all(c in batch for c in firsts.values()), batch
    assert tiles[0] in batch and all(sum(_kernel(c) == kind for c in batch) >= 1 for kind in firsts)
    done = set(firsts.values())
    assert _with_rules_best(tiles + others, valid, p, DEFAULT, done, 10) == tiles + others  # already measured
