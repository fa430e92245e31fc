"""ATen semantics the FX frontend must keep: rsub's alpha, log_softmax/softmax's dtype argument, and the
dtype (so the precision) of the Python scalars it turns into constants."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.frontend.fx_import import import_fx
from kfuse.ir import GraphBuilder, TensorType, reference_run


class _Fn(nn.Module):
    def __init__(self, fn) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor):  # noqa: ANN201
        return self.fn(*xs)


def _compile(fn, *xs: torch.Tensor, **opts):  # noqa: ANN001, ANN202
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return kfuse.compile(_Fn(fn), xs, **opts)


def _outs(v) -> tuple:  # noqa: ANN001
    return tuple(v) if isinstance(v, tuple | list) else (v,)


def _rel(a: torch.Tensor, r: torch.Tensor) -> float:
    return ((a - r).abs() / r.abs().clamp_min(1e-300)).max().item()


# --- rsub with alpha: other - alpha * input ---------------------------------------------------------------
@pytest.mark.parametrize(
    "fn",
    [
        lambda x, y: torch.rsub(x, y, alpha=3),
        lambda x, y: torch.rsub(x, 2.0, alpha=3) + y,
        lambda x, y: torch.rsub(x, y),
        lambda x, y: torch.sub(x, y, alpha=3),
        lambda x, y: torch.add(x, y, alpha=-2),
    ],
    ids=["rsub_tensor_alpha", "rsub_scalar_alpha", "rsub", "sub_alpha", "add_alpha"],
)
def test_binary_alpha_matches_eager(fn) -> None:  # noqa: ANN001
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    c = _compile(fn, x, y)
    torch.testing.assert_close(c(x, y), fn(x, y), rtol=1e-5, atol=1e-5)


# --- log_softmax / softmax with dtype= ---------------------------------------------------------------------
@pytest.mark.parametrize("op", [torch.log_softmax, torch.softmax], ids=["log_softmax", "softmax"])
@pytest.mark.parametrize(
    "src,dst", [(torch.float16, torch.float32), (torch.float64, torch.float32), (torch.float32, torch.float64)], ids=str
)
def test_softmax_dtype_argument(op, src: torch.dtype, dst: torch.dtype) -> None:  # noqa: ANN001
    x = torch.randn(3, 10).to(src)
    fn = lambda x: op(x, -1, dtype=dst)  # noqa: E731
    ref = fn(x)
    out = _compile(fn, x)(x)
    assert out.dtype == ref.dtype == dst
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [torch.ops.aten._log_softmax.default, torch.ops.aten._softmax.default])
@pytest.mark.parametrize("half_to_float", [True, False])
def test_underscore_softmax_half_to_float(target, half_to_float: bool) -> None:  # noqa: ANN001
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(target, (x, -1, half_to_float)))
    gm = torch.fx.GraphModule(nn.Module(), g)
    imp = import_fx(gm, {"x": TensorType((3, 10), torch.float16)})
    graph = imp.builder.build(imp.outputs)
    xs = torch.randn(3, 10).half()
    (out,) = reference_run(graph, [xs])
    assert out.dtype == (torch.float32 if half_to_float else torch.float16)
    ref = (torch.log_softmax if "log" in str(target) else torch.softmax)(xs.float(), -1)
    torch.testing.assert_close(out.float(), ref, rtol=1e-2 if not half_to_float else 1e-6, atol=1e-3 if not half_to_float else 1e-6)


# --- Python scalars keep the precision of the tensor they combine with -------------------------------------
def _f64_model(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return x * 0.1, x / 3, x + 1e-10, 0.7 - x, torch.where(x > 0, x, 0.3)


def test_float64_scalars_keep_double_precision() -> None:
    x = torch.randn(64, dtype=torch.float64) + 3.0
    # the pointwise kernels compute in fp32 whatever the dtype; unfused, the graph's constants decide the precision
    c = _compile(_f64_model, x, fuse_pointwise=False)
    consts = [t for t in c.plan.graph.constants.values() if t.dim() == 0 and t.is_floating_point()]
    assert consts and all(t.dtype == torch.float64 for t in consts)
    for a, r in zip(_outs(c(x)), _f64_model(x), strict=True):
        assert a.dtype == r.dtype == torch.float64
        assert _rel(a, r) < 1e-15


def test_float64_division_by_float32_constant_keeps_double_reciprocal() -> None:
    class Div(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("c", torch.tensor(3.0))  # float32, 0-d: does not promote the float64 input

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / self.c

    x = torch.randn(64, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = kfuse.compile(Div(), (x,), fuse_pointwise=False)
    out, ref = c(x), Div()(x)
    assert out.dtype == ref.dtype == torch.float64
    assert _rel(out, ref) < 1e-15


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(4, 8), ()], ids=["dims", "0d"])
def test_low_precision_scalar_ops_keep_eager_dtype(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    x = torch.randn(shape).to(dtype)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x * 0.1, x / 3, x + 1e-3, torch.rsub(x, 2.0, alpha=3)

    c = _compile(fn, x)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for a, r in zip(_outs(c(x)), fn(x), strict=True):
        assert a.dtype == r.dtype == dtype
        torch.testing.assert_close(a, r, rtol=tol, atol=tol)


def test_int_tensor_with_float_scalar_is_default_float() -> None:
    x = torch.arange(8)
    fn = lambda x: x * 0.5  # noqa: E731
    out = _compile(fn, x)(x)
    assert out.dtype == fn(x).dtype == torch.float32
    torch.testing.assert_close(out, fn(x))


@pytest.mark.parametrize(
    "like,expected",
    [
        (TensorType((4,), torch.float64), torch.float64),
        (TensorType((), torch.float64), torch.float64),
        (TensorType((4,), torch.float32), torch.float32),
        (TensorType((4,), torch.float16), torch.float32),
        (TensorType((4,), torch.bfloat16), torch.float32),
        (TensorType((), torch.float16), torch.float16),
        (TensorType((), torch.bfloat16), torch.bfloat16),
        (TensorType((4,), torch.int64), torch.float32),
        (None, torch.float32),
    ],
    ids=str,
)
def test_builder_scalar_dtype_follows_like(like: TensorType | None, expected: torch.dtype) -> None:
    b = GraphBuilder()
    name = b.add_input("x", like) if like is not None else None
    s = b.scalar(0.1, like=name)
    assert b.constants[s].dtype == expected
    if like is not None and like.dtype.is_floating_point:  # the scalar never changes the result dtype torch gives
        assert b.type_of(b.op("mul", [name, s])).dtype == like.dtype
    assert b.constants[b.scalar(2, like=name)].dtype == torch.int64
    assert b.constants[b.scalar(True, like=name)].dtype == torch.bool
    assert b.constants[b.scalar(0.1, dtype=torch.float16, like=name)].dtype == torch.float16


def test_float64_chains_keep_float64_precision_with_pointwise_fusion_on() -> None:
    """The generated pointwise kernels compute in fp32, so float64 chains are left to PyTorch's ops."""

    class F64(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(x * 0.1 + x / 3, dim=-1) + 1e-10

    x = torch.randn(4, 9, dtype=torch.float64)
    c = kfuse.compile(F64(), (x,))  # default options: fuse_pointwise on
    x2 = torch.randn(4, 9, dtype=torch.float64)
    got, want = c(x2), F64()(x2)
    assert got.dtype == torch.float64
    assert ((got - want).abs().max() / want.abs().max()).item() < 1e-14


# --- a fallback op's literal string arguments (session 35: MobileBERT's ``F.pad(..., value=0.0)``) ----------


@pytest.mark.parametrize("mode", ["constant", "reflect", "replicate"])
def test_fallback_keeps_string_arguments_literal(mode: str) -> None:
    """``aten.pad`` runs in PyTorch (a fallback) with ``mode`` as a string; the importer took every string
    argument for a kfuse value name, so the compile failed with "fallback reads undefined value 'constant'"."""
    x = torch.randn(2, 5, 7)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t * 2.0, (1, 2), mode=mode, value=0.5 if mode == "constant" else None) + 1.0

    cm = _compile(fn, x)
    # constant padding is imported as kfuse's own pad op since session 37; the other modes stay in PyTorch
    assert ("aten.pad.default" in cm.report["fallback"]) == (mode != "constant")
    out = cm(x)
    ref = fn(x)
    assert out.shape == ref.shape == (2, 5, 10)
    torch.testing.assert_close(out, ref)


# --- conv2d with padding="same" / "valid" (aten.conv2d.padding: EfficientNet's depthwise convs) --------------


@pytest.mark.parametrize(
    "k,dilation,groups,native",
    [(3, 1, 1, True), (5, 2, 4, True), (4, 2, 1, True), (4, 1, 1, False), (1, 1, 4, True)],
)
@pytest.mark.parametrize("mode", ["same", "valid"])
def test_conv2d_string_padding(mode: str, k: int, dilation: int, groups: int, native: bool) -> None:
    """ "same" becomes kfuse's symmetric padding where PyTorch's is symmetric (d * (k - 1) even); an odd total
    (k = 4, d = 1) pads one more on the right, which stays in PyTorch. "valid" is padding 0."""
    x = torch.randn(2, 8, 9, 11)
    w = torch.randn(8, 8 // groups, k, k) / k
    b = torch.randn(8)

    def fn(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.conv2d(t, w, b, padding=mode, dilation=dilation, groups=groups).relu()

    cm = _compile(fn, x)
    stays = mode == "same" and not native
    assert ("aten.conv2d.padding" in cm.report["fallback"]) == stays, cm.report["fallback"]
    torch.testing.assert_close(cm(x), fn(x), rtol=1e-4, atol=1e-4)


# --- addmm / baddbmm: beta * input + alpha * product (BLOOM's ALiBi attention scores) ---------------------


@pytest.mark.parametrize("beta,alpha", [(1.0, 1.0), (1.0, 0.125), (0.5, 2.0), (0.0, 0.25)])
def test_baddbmm_is_imported_natively(beta: float, alpha: float) -> None:
    """No fallback; with beta = 0 the input is ignored, NaNs included (as PyTorch does)."""
    bias = torch.randn(6, 1, 7)
    if beta == 0.0:
        bias[0, 0, 0] = float("nan")
    q, kt = torch.randn(6, 5, 8), torch.randn(6, 8, 7)

    def fn(b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(b, x, y, beta=beta, alpha=alpha).softmax(-1)

    cm = _compile(fn, bias, q, kt)
    assert "aten.baddbmm.default" not in cm.report["fallback_at_import"]
    out = cm(bias, q, kt)
    assert not out.isnan().any()
    torch.testing.assert_close(out, fn(bias, q, kt), rtol=1e-5, atol=1e-5)


# --- T5's fp16 overflow guard: isinf, any, clamp with tensor bounds (72 fallbacks in T5-encoder before session 37)


class _T5Guard(torch.nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        big = torch.finfo(torch.float16).max
        clamp_value = torch.where(torch.isinf(h).any(), big - 1000, big)
        h = torch.clamp(h * 3.0e4, min=-clamp_value, max=clamp_value)
        per_row = torch.isinf(h * 10).any(dim=-1, keepdim=True)
        return torch.where(per_row, 0.0, h + 1.0)


@pytest.mark.parametrize("with_inf", [False, True])
def test_t5_overflow_guard_is_imported_natively(with_inf: bool) -> None:
    x = torch.randn(2, 5, 8) * 3
    if with_inf:
        x[1, 2, 3] = float("inf")
    x[0, 1, 1] = float("nan")
    cm = kfuse.compile(_T5Guard(), (x,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    torch.testing.assert_close(cm(x), _T5Guard()(x), equal_nan=True)


def test_a_whole_tensor_reduction_is_left_to_pytorch() -> None:
    """Session 38: T5's any(isinf(h)) over (32, 128, 768), one generated program a row, one row: 24 such made
    T5-encoder 5.8x slower. A few long rows are not the generated reduction's; a row per token still is."""
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.passes.fuse_pointwise import FEW_ROWS, FEW_ROWS_MIN_LENGTH, reduction_dims

    b = GraphBuilder()
    x = b.add_input("x", TensorType((4, 128, 256), torch.float16))
    whole = b.op("amax", [x], {"dims": [0, 1, 2], "keepdim": False})
    rows = b.op("amax", [x], {"dims": [-1], "keepdim": True})
    few = b.op("sum", [x], {"dims": [1, 2], "keepdim": False})  # 4 rows of 32768: short enough to keep
    g = b.build([whole, rows, few])
    nodes = g.node_map()
    assert 4 * 128 * 256 >= FEW_ROWS_MIN_LENGTH and 4 < FEW_ROWS
    assert reduction_dims(nodes[whole], g) is None
    assert reduction_dims(nodes[rows], g) == ((2,), True)
    assert reduction_dims(nodes[few], g) == ((1, 2), False)
    h = torch.randn(4, 128, 256) * 3
    h[3, 5, 7] = float("inf")
    cm = kfuse.compile(_T5Guard(), (h,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    torch.testing.assert_close(cm(h), _T5Guard()(h), equal_nan=True)


class _Conv1dBlock(torch.nn.Module):
    """ConvBERT's separable conv (depthwise + pointwise Conv1d, then torch.multiply) and the other 1-D forms."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = torch.nn.Conv1d(12, 12, 5, padding=2, groups=12, bias=False)
        self.pw = torch.nn.Conv1d(12, 16, 1)
        self.strided = torch.nn.Conv1d(16, 8, 3, stride=2, dilation=2, padding=1)
        self.same = torch.nn.Conv1d(8, 8, 3, padding="same")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.multiply(self.pw(self.dw(x)), 2.0)
        y = torch.subtract(self.strided(y), 1.0)
        return torch.divide(self.same(y), torch.true_divide(y, 4.0).abs() + 1.0) * torch.greater(y, 0.1) + torch.less_equal(y, 0.1)


def test_conv1d_and_the_long_op_names_are_imported_natively() -> None:
    """Session 38's third exploratory sweep: ConvBERT fell back on aten.conv1d and aten.multiply."""
    torch.manual_seed(5)
    m = _Conv1dBlock().eval()
    x = torch.randn(2, 12, 37)  # an odd length, a stride-2 dilated conv, "same" padding
    cm = kfuse.compile(m, (x,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    convs = [k["ops"] for k in cm.report["kernels"] if k["ops"][0] == "conv2d"]
    assert len(convs) == 4 and ["conv2d", "mul"] in convs, convs  # the scale by 2 past the conv1d's squeeze, in its epilogue
    with torch.no_grad():
        torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-4)


class _MaxMinSquareFull(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.max(x, y) + torch.min(x, y * 2)  # max.other / min.other (XGLM, T5)
        b = torch.square(a) + torch.full_like(a, 3.0) + torch.full_like(x, 2, dtype=torch.int64)  # square (Persimmon), full_like (T5)
        return b, torch.max(x, dim=-1).values + torch.max(x)  # max over a dim is an amax; max(x) stays PyTorch's


def test_binary_max_min_square_and_full_like_are_imported_natively() -> None:
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    x[1, 2] = float("nan")  # maximum / minimum propagate NaN, as torch.max(x, y) does
    cm = kfuse.compile(_MaxMinSquareFull(), (x, y))
    assert sorted(cm.report["fallback"]) == ["aten.max.default"], cm.report["fallback"]
    for got, want in zip(cm(x, y), _MaxMinSquareFull()(x, y), strict=True):
        torch.testing.assert_close(got, want, equal_nan=True)


class _NormalizePoolUnflatten(torch.nn.Module):
    """Swin-V2's cosine attention (F.normalize: vector_norm, clamp_min, expand_as), FocalNet's 1-D pooler,
    SigLIP's unflatten, one-sided clamps with a tensor and a number."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = torch.nn.functional.normalize(x, dim=-1)
        pooled = torch.nn.functional.adaptive_avg_pool1d(x.transpose(1, 2), 1)
        heads = x.unflatten(-1, (2, -1)).sum(-2)
        clamped = torch.clamp_max(y, 0.3) + torch.clamp_min(y, x[..., :1])
        return q, pooled, heads, clamped, torch.linalg.vector_norm(x, ord=1, dim=-1)  # ord 1: PyTorch's


def test_normalize_pool1d_unflatten_and_one_sided_clamps_are_native() -> None:
    x, y = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    x[1, 0] = 0.0  # a zero row: normalize's eps floor decides it
    cm = kfuse.compile(_NormalizePoolUnflatten(), (x, y))
    assert cm.report["fallback"] == ["aten.linalg_vector_norm.default"], cm.report["fallback"]
    for got, want in zip(cm(x, y), _NormalizePoolUnflatten()(x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _ConstantIndex(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        key = x[..., [-2], :] * 2  # Falcon's key / value split: a negative, one-element constant index
        first = x[:, [0, 1, 2]] + 1  # consecutive positions on dim 1
        return key, first, x[..., [3, 1], :]  # not consecutive: PyTorch's gather


def test_a_constant_consecutive_index_is_a_slice() -> None:
    x = torch.randn(2, 4, 6, 3)
    cm = kfuse.compile(_ConstantIndex(), (x,))
    assert cm.report["fallback"] == ["aten.index.Tensor"], cm.report["fallback"]  # only the [3, 1] one
    for got, want in zip(cm(x), _ConstantIndex()(x), strict=True):
        torch.testing.assert_close(got, want)


class _GroupNorms(torch.nn.Module):
    """GroupNorm with groups of several channels (U-Nets), one group (MobileViT-V2's), no affine, on a 3-D input."""

    def __init__(self) -> None:
        super().__init__()
        self.g4 = torch.nn.GroupNorm(4, 12, eps=1e-6)
        self.g1 = torch.nn.GroupNorm(1, 12)
        self.bare = torch.nn.GroupNorm(3, 12, affine=False)
        for p in (self.g4.weight, self.g4.bias, self.g1.weight, self.g1.bias):
            torch.nn.init.normal_(p)  # not the identity affine

    def forward(self, x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.g4(x), self.g1(x) * 2, self.bare(s)


def test_group_norm_is_its_own_kernel_with_affine_and_a_layer_norm_over_groups_without() -> None:
    x, s = torch.randn(2, 12, 5, 7) * 3 + 1, torch.randn(3, 12, 9)
    model = _GroupNorms()
    cm = kfuse.compile(model, (x, s))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    templates = [k["template"] for k in cm.report["kernels"]]
    assert templates.count("group_norm") == 2 and templates.count("fused_norm") == 1, cm.report["kernels"]
    for got, want in zip(cm(x, s), model(x, s), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    old = kfuse.compile(model, (x, s), group_norm=False)  # the layer-norm form for all three
    assert sum(k["template"] == "fused_norm" for k in old.report["kernels"]) == 3, old.report["kernels"]
    for got, want in zip(old(x, s), model(x, s), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    xc = x.contiguous(memory_format=torch.channels_last)  # a conv net's layout: the group rows are not contiguous
    for got, want in zip(kfuse.compile(model, (xc, s))(xc, s), model(xc, s), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class _Patches(torch.nn.Module):
    """MobileViT-V2's unfold into 2x2 patches and fold back, a rectangular tile, and ConvBERT's overlapping
    (k, 1) unfold with padding, which stays PyTorch's."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.nn.functional
        p = f.unfold(x, kernel_size=2, stride=2)
        back = f.fold(p * 2, output_size=x.shape[-2:], kernel_size=2, stride=2)
        rect = f.unfold(x, kernel_size=(3, 2), stride=(3, 2))
        return p, back, rect, f.fold(rect, output_size=x.shape[-2:], kernel_size=(3, 2), stride=(3, 2)), f.unfold(x, (3, 1), padding=(1, 0))


def test_unfold_and_fold_of_whole_patches_are_a_reshape_and_a_permute() -> None:
    x = torch.randn(2, 3, 6, 8)
    cm = kfuse.compile(_Patches(), (x,))
    assert cm.report["fallback"] == ["aten.im2col.default"], cm.report["fallback"]  # only the overlapping one
    for got, want in zip(cm(x), _Patches()(x), strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("size", [(7, 7), (7, 8), (5, 9)])
def test_unfold_and_fold_drop_and_zero_what_no_whole_patch_covers(size: tuple[int, int]) -> None:
    """MobileViT-V2 at 224 pixels: its 7 x 7 maps cut into 2 x 2 patches; unfold drops the last row and
    column, fold gives them back as zeros (the test feeds fold non-zero patches, so a missed zero shows)."""

    class _Cut(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = torch.nn.functional
            p = f.unfold(x, kernel_size=2, stride=2)
            return p, f.fold(p + 1.0, output_size=x.shape[-2:], kernel_size=2, stride=2)

    x = torch.randn(2, 3, *size)
    cm = kfuse.compile(_Cut(), (x,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    for got, want in zip(cm(x), _Cut()(x), strict=True):
        torch.testing.assert_close(got, want)


class _Fulls(torch.nn.Module):
    """XGLM's floor, ``max(scores, full((), finfo.min))``, a full causal mask, and an integer full."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        floor = torch.max(x, torch.full((), torch.finfo(x.dtype).min, device=x.device))
        mask = torch.full((x.shape[-1], x.shape[-1]), torch.finfo(x.dtype).min, device=x.device).triu(1)
        counts = torch.full((2, 3), 7, device=x.device) * 2
        return floor.softmax(-1), (x + mask).softmax(-1), counts


def test_full_is_a_constant_not_a_fallback() -> None:
    x = torch.randn(2, 5, 5)
    x[0, 1, 2] = float("-inf")
    cm = kfuse.compile(_Fulls(), (x,))
    assert not any("full" in f for f in cm.report["fallback_at_import"]), cm.report["fallback_at_import"]
    for got, want in zip(cm(x), _Fulls()(x), strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)


class _Rolls(torch.nn.Module):
    """Swin's shifted windows (roll by -3 and back by +3 over H and W), a shift longer than the dim, a zero
    shift, and a roll of the flattened tensor (no dims: stays PyTorch's)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shifted = torch.roll(x, shifts=(-3, -3), dims=(1, 2))
        return shifted, torch.roll(shifted * 2, shifts=(3, 3), dims=(1, 2)), torch.roll(x, 9, -1), torch.roll(x, 0, 1), torch.roll(x, 5)


def test_roll_along_dims_is_two_slices_and_a_cat() -> None:
    x = torch.randn(2, 7, 5, 4)
    cm = kfuse.compile(_Rolls(), (x,))
    assert cm.report["fallback"] == ["aten.roll.default"], cm.report["fallback"]  # only the flattened roll
    for got, want in zip(cm(x), _Rolls()(x), strict=True):
        torch.testing.assert_close(got, want)


class _StackRepeatReshapeAs(torch.nn.Module):
    """GPT-J's interleaved rotary (stack of the rotated halves on a new last dim, then flatten), a stack on a
    middle dim, SwiftFormer's repeat (more repeat counts than dims), a repeat of ones, RoFormer's reshape_as, tile
    and DINOv3's meshgrid (both indexings)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x1, x2 = x[..., ::2], x[..., 1::2]
        rot = torch.stack((-x2, x1), dim=-1).flatten(-2)
        mid = torch.stack([x, y, x * y], dim=1)
        rep = x[:, 0].unsqueeze(1).repeat(1, 3, 2) + 1
        more = y[0, 0].repeat(2, 1, 3)
        tiles = x.tile((2,)) * 2, y.tile(3, 1, 1, 1)  # fewer counts than dims, more
        ij = torch.meshgrid(x[0, 0], y[1, :, 2], indexing="ij")
        xy = torch.meshgrid(x[0, 0], y[1, :, 2], x[1, 1, :3], indexing="xy")
        return (rot * y, mid, rep, more, x.repeat(1, 1, 1), (x * 2).reshape_as(y.transpose(1, 2)), x.view_as(y) + y, *tiles,
                ij[0] + ij[1], *xy)  # fmt: skip


def test_stack_repeat_tile_meshgrid_and_reshape_as_are_native() -> None:
    x, y = torch.randn(2, 5, 6), torch.randn(2, 5, 6)
    cm = kfuse.compile(_StackRepeatReshapeAs(), (x, y))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    for got, want in zip(cm(x, y), _StackRepeatReshapeAs()(x, y), strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want)


class _ReduceWithIndices(torch.nn.Module):
    """Hiera's query pooling (``max(dim).values``), a min over a dim, a max pool whose indices are dropped, and
    the ones whose indices are read (those stay PyTorch's)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pooled = x.view(2, 4, 3, 5).max(dim=1).values
        low = torch.min(x, -1, keepdim=True)[0]
        pool = torch.nn.functional.max_pool2d(x.view(2, 3, 4, 5), 2, return_indices=True)[0]
        vals, idx = x.max(dim=0)
        return pooled + 1, low * 2, pool, vals, idx, torch.nn.functional.max_pool2d(x.view(2, 3, 4, 5) * 2, 2, return_indices=True)[1]


def test_max_and_min_over_a_dim_are_native_when_their_indices_are_unread() -> None:
    x = torch.randn(2, 12, 5)
    cm = kfuse.compile(_ReduceWithIndices(), (x,))
    assert sorted(cm.report["fallback"]) == ["aten.max.dim", "aten.max_pool2d_with_indices.default"], cm.report["fallback"]
    for got, want in zip(cm(x), _ReduceWithIndices()(x), strict=True):
        torch.testing.assert_close(got, want)


class _PositionIds(torch.nn.Module):
    """RoBERTa's position ids (cumsum of the non-padding mask) and token types gathered by them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("types", torch.arange(64).remainder(3).unsqueeze(0))

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = ids.ne(1).int()
        pos = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        return pos, torch.gather(self.types.expand(ids.shape[0], -1), 1, pos)


def test_cumsum_and_gather_are_native() -> None:
    ids = torch.randint(0, 5, (3, 11))
    ids[:, -3:] = 1  # padding
    cm = kfuse.compile(_PositionIds(), (ids,))
    assert cm.report["fallback"] == [], cm.report["fallback"]
    assert not {"aten.cumsum.default", "aten.gather.default"} & set(cm.report["fallback_at_import"])
    for got, want in zip(cm(ids), _PositionIds()(ids), strict=True):
        torch.testing.assert_close(got, want)
