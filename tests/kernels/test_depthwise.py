"""Depthwise conv kernels (dense channels-last and general) vs F.conv2d(groups=C): odd sizes, strides, dilation,
padding, both memory formats, with and without bias, on a NaN-poisoned output; the lowering in a compiled ConvNeXt-style block."""

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse.kernels.depthwise import depthwise_conv2d, is_depthwise

CASES = [  # (N, C, H, W, K, stride, padding, dilation)
    (2, 24, 13, 11, 7, 1, 3, 1),  # ConvNeXt's 7x7 'same'
    (1, 40, 9, 10, 3, 2, 1, 1),  # MobileNet's strided 3x3
    (3, 17, 8, 12, 5, 1, 4, 2),  # dilated, odd channel count
    (1, 130, 5, 6, 3, 1, 0, 1),  # more channels than one tile, no padding
    (2, 32, 7, 9, 3, 2, 2, 2),  # whole channel tiles (no channel mask in the dense NHWC kernel), strided, dilated
]


COMBOS = [(CASES[0], True, torch.float16), (CASES[0], False, torch.float32), (CASES[1], True, torch.float32),
          (CASES[2], False, torch.float16), (CASES[3], True, torch.float16), (CASES[4], True, torch.float16),
          (CASES[4], False, torch.float32)]  # fmt: skip


@pytest.mark.parametrize("case,channels_last,dtype", COMBOS)
def test_equals_grouped_conv(case, channels_last, dtype, device):
    n, c, h, w, k, s, p, d = case
    gen = torch.Generator().manual_seed(n * 1000 + c * 10 + k)
    x = torch.randn(n, c, h, w, generator=gen).to(device, dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(c, 1, k, k, generator=gen) / k).to(device, dtype)
    b = torch.randn(c, generator=gen).to(device, dtype)
    for bias in (b, None):
        want = F.conv2d(x.float(), wt.float(), None if bias is None else bias.float(), s, p, d, groups=c)
        out = torch.full(want.shape, float("nan"), dtype=dtype, device=device)
        if channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        got = depthwise_conv2d(x, wt, bias, s, p, d, out=out)
        tol = 2e-2 if dtype == torch.float16 else 1e-4
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
        fresh = depthwise_conv2d(x, wt, bias, s, p, d)
        assert fresh.is_contiguous(memory_format=torch.channels_last) == (channels_last and fresh.shape[1] > 1)
        torch.testing.assert_close(fresh.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("layout", ["channels_last", "contiguous", "strided"])
def test_dense_channels_last_takes_the_specialised_kernel(layout, device, monkeypatch):
    from kfuse.kernels import depthwise as dw

    launched = []

    class Spy:
        def __init__(self, kernel, name):
            self.kernel, self.name = kernel, name

        def __getitem__(self, grid):
            launched.append(self.name)
            return self.kernel[grid]

    monkeypatch.setattr(dw, "_depthwise_nhwc_kernel", Spy(dw._depthwise_nhwc_kernel, "nhwc"))
    monkeypatch.setattr(dw, "_depthwise_kernel", Spy(dw._depthwise_kernel, "general"))
    x = torch.randn(1, 20, 6, 7, device=device)
    x = {"channels_last": x.contiguous(memory_format=torch.channels_last), "contiguous": x,
         "strided": torch.randn(1, 6, 7, 40, device=device).permute(0, 3, 1, 2)[:, ::2]}[layout]  # fmt: skip
    wt = torch.randn(20, 1, 3, 3, device=device)
    got = depthwise_conv2d(x, wt, None, 1, 1, 1)
    torch.testing.assert_close(got, F.conv2d(x, wt, None, 1, 1, 1, groups=20), atol=1e-4, rtol=1e-4)
    assert launched == (["nhwc"] if layout == "channels_last" else ["general"])


def test_what_it_takes_and_clear_errors(device):
    assert is_depthwise((8, 1, 3, 3), 8, 8)
    assert not is_depthwise((16, 1, 3, 3), 8, 8)  # a channel multiplier: left to PyTorch
    assert not is_depthwise((8, 2, 3, 3), 16, 8)  # grouped, not depthwise
    x = torch.randn(1, 8, 5, 5, device=device)
    with pytest.raises(ValueError, match="not a depthwise conv"):
        depthwise_conv2d(x, torch.randn(8, 2, 3, 3, device=device))
    with pytest.raises(ValueError, match="bias has shape"):
        depthwise_conv2d(x, torch.randn(8, 1, 3, 3, device=device), torch.randn(4, device=device))


class _Block(torch.nn.Module):
    """ConvNeXt's block head: depthwise 7x7 conv, then channels-last LayerNorm and an MLP."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.dw = torch.nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, 2 * c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.dw(x).permute(0, 2, 3, 1)))


def test_compiled_block_runs_the_depthwise_kernel(device):
    torch.manual_seed(3)
    model = _Block(24).to(device).eval()
    x = torch.randn(2, 24, 11, 9, device=device)
    compiled = kfuse.compile(model, (x,))
    kinds = {k["template"]: k for k in compiled.report["kernels"]}
    if device == "cpu":
        assert "depthwise_conv" in kinds and "depthwise 7x7" in kinds["depthwise_conv"]["config"], compiled.report["kernels"]
    else:  # on a GPU the kernel is timed against PyTorch and the faster kept; the report says which and why
        picked = kinds.get("depthwise_conv") or kinds.get("fallback")
        assert picked is not None and "depthwise" in picked["config"] and " us" in picked["config"], compiled.report["kernels"]
    x2 = torch.randn(2, 24, 11, 9, device=device)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2), model(x2), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("act", [("clamp", 0.0, 6.0), ("clamp", 0.0, None), ("clamp", None, 0.5), ("silu",), ("gelu",), ("hardswish",),
                                 ("hardsigmoid",)])  # fmt: skip
@pytest.mark.parametrize("channels_last", [True, False])
def test_activation_before_the_store(act, channels_last, device):
    """MobileNet's ReLU6 / EfficientNet's SiLU applied by the kernel (both kernels), NaN kept as PyTorch does."""
    gen = torch.Generator().manual_seed(7)
    x = (3 * torch.randn(2, 20, 7, 9, generator=gen)).to(device)
    x[0, 3, 2, 4] = float("nan")
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    wt, b = torch.randn(20, 1, 3, 3, generator=gen).to(device), torch.randn(20, generator=gen).to(device)
    want = F.conv2d(x, wt, b, 1, 1, 1, groups=20)
    fns = {"silu": F.silu, "gelu": F.gelu, "hardswish": F.hardswish, "hardsigmoid": F.hardsigmoid}
    want = fns[act[0]](want) if act[0] != "clamp" else torch.clamp(want, act[1], act[2])
    out = torch.full_like(want, float("nan"))
    got = depthwise_conv2d(x, wt, b, 1, 1, 1, out=out, act=act)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4, equal_nan=True)
    assert got.isnan().sum() == want.isnan().sum() > 0
    with pytest.raises(ValueError, match="unknown activation"):
        depthwise_conv2d(x, wt, b, 1, 1, 1, act=("tanh",))


@pytest.mark.parametrize("act", [("clamp", 0.0, None), ("gelu", None, None), ("hardswish", None, None)])
def test_both_kernels_compile_for_sm90(act):
    """The interpreter does not compile: the constexpr activation and None bounds must also pass Triton's sm_90
    code generator (offline, no GPU needed)."""
    from kfuse.kernels.depthwise import _depthwise_kernel, _depthwise_nhwc_kernel
    from kfuse.sass.examples import compile_sm90

    ptrs = {k: "*fp16" for k in ["x_ptr", "w_ptr", "b_ptr", "y_ptr"]}
    acts = dict(ACT=act[0], LO=act[1], HI=act[2])
    common = dict(KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, DH=1, DW=1, HAS_BIAS=True, BLOCK_P=64, BLOCK_C=32, PDL=False, **acts)
    dense = compile_sm90(_depthwise_nhwc_kernel, {"N": "i32", "n_rows": "i32", **ptrs},
                         dict(C=96, H=14, W=14, OH=14, OW=14, EVEN_C=True, **common), num_warps=2)  # fmt: skip
    general = compile_sm90(_depthwise_kernel, {**{k: "i32" for k in "N C H W OH OW n_rows sxn sxh sxw syn syh syw".split()}, **ptrs},
                           dict(sxc=1, syc=1, **common), num_warps=2)  # fmt: skip
    for k in (dense, general):
        assert k.asm["cubin"][:4] == b"\x7fELF" and ".target sm_90" in k.asm["ptx"]


ROWS_CASES = [  # (N, C, H, W, KH, KW, padding, config (BLOCK_W, BLOCK_C, ROWS, warps) or None)
    (1, 20, 9, 8, 7, 7, 3, (8, 16, 4, 4)),  # ConvNeXt's 7x7 'same': chunks of 4 rows (9 is not a multiple), channel mask
    (2, 32, 6, 11, 5, 5, 2, (8, 16, 5, 4)),  # whole channel tiles (no mask), a strip past the width
    (1, 16, 7, 5, 3, 3, 0, (4, 16, 8, 4)),  # no padding, one chunk taller than the image
    (1, 17, 5, 6, 3, 5, (1, 2), None),  # unequal kernel and padding, the default tile
    (1, 16, 4, 9, 1, 3, (0, 1), (8, 16, 2, 4)),  # one kernel row: the ring is one slot
]


@pytest.mark.parametrize("case", ROWS_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rows_kernel_equals_grouped_conv(case, dtype, device):
    """The rows kernel (a ring of KH output rows, each input row loaded once, the next row prefetched) on
    NaN-poisoned outputs, with and without bias, with the packed weight given or packed by the call."""
    from kfuse.kernels.depthwise import pack_rows_weight

    n, c, h, w, kh, kw, pad, cfg = case
    gen = torch.Generator().manual_seed(c * 100 + kh * 10 + kw)
    x = torch.randn(n, c, h, w, generator=gen).to(device, dtype).contiguous(memory_format=torch.channels_last)
    wt = (torch.randn(c, 1, kh, kw, generator=gen) / kw).to(device, dtype)
    b = torch.randn(c, generator=gen).to(device, dtype)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    for bias, packed in ((b, pack_rows_weight(wt)), (None, None)):
        want = F.conv2d(x.float(), wt.float(), None if bias is None else bias.float(), 1, pad, 1, groups=c)
        out = torch.full(want.shape, float("nan"), dtype=dtype, device=device).contiguous(memory_format=torch.channels_last)
        got = depthwise_conv2d(x, wt, bias, 1, pad, 1, out=out, config=cfg, kernel="rows", packed_weight=packed)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_rows_kernel_takes_only_what_it_can_run(device):
    x = torch.randn(1, 16, 6, 6, device=device)
    wt = torch.randn(16, 1, 3, 3, device=device)
    cl = x.contiguous(memory_format=torch.channels_last)
    refused = {"NCHW": (x, wt, None, 1, 1), "stride 2": (cl, wt, None, 2, 1), "dilation 2": (cl, wt, None, 1, 2, 2),
               "KH 9": (cl, torch.randn(16, 1, 9, 9, device=device), None, 1, 4)}  # fmt: skip
    for what, args in refused.items():
        with pytest.raises(ValueError, match="rows kernel takes"):
            depthwise_conv2d(*args, kernel="rows")
            pytest.fail(f"the rows kernel ran a {what} conv")
    with pytest.raises(ValueError, match="kernel must be"):
        depthwise_conv2d(cl, wt, None, 1, 1, kernel="ring")


def test_auto_takes_the_rows_kernel_where_measured_faster(device, monkeypatch):
    """``use_rows``: large 3x3 images only (session 38's probe); 7x7 stays on the taps kernel."""
    from kfuse.kernels import depthwise as dw

    assert dw.use_rows(3, 3, 112) and not dw.use_rows(3, 3, 28) and not dw.use_rows(7, 7, 112)
    launched = []
    monkeypatch.setattr(dw, "use_rows", lambda kh, kw, oh: kh == 3)
    for name in ("_depthwise_rows_kernel", "_depthwise_nhwc_kernel"):
        kernel = getattr(dw, name)
        monkeypatch.setattr(dw, name, type("Spy", (), {"__getitem__": lambda self, g, k=kernel, n=name: launched.append(n) or k[g]})())
    x = torch.randn(1, 16, 5, 7, device=device).contiguous(memory_format=torch.channels_last)
    for k in (3, 5):
        wt = torch.randn(16, 1, k, k, device=device)
        torch.testing.assert_close(depthwise_conv2d(x, wt, None, 1, k // 2), F.conv2d(x, wt, None, 1, k // 2, 1, 16), atol=1e-4, rtol=1e-4)
    assert launched == ["_depthwise_rows_kernel", "_depthwise_nhwc_kernel"]


@pytest.mark.parametrize("kh,act", [(7, ("gelu", None, None)), (3, ("clamp", 0.0, 6.0))])
def test_rows_kernel_compiles_for_sm90_without_spills(kh, act):
    """The ring (KH slots) and the prefetched row must fit the registers at the default tile (ptxas, offline)."""
    from kfuse.kernels.depthwise import _depthwise_rows_kernel
    from kfuse.sass.examples import compile_sm90

    ptrs = {"x_ptr": "*fp16", "wp_ptr": "*fp32", "b_ptr": "*fp16", "y_ptr": "*fp16"}
    k = compile_sm90(_depthwise_rows_kernel, ptrs, dict(C=96, H=56, W=56, OH=56, OW=56, KH=kh, KW=kh, PH=kh // 2, PW=kh // 2,
                     HAS_BIAS=True, BLOCK_W=16, BLOCK_C=32, ROWS=14, EVEN_C=True, PDL=False, ACT=act[0], LO=act[1], HI=act[2]),
                     num_warps=2)  # fmt: skip
    from kfuse.sass.disasm import _run_nvdisasm

    sass = _run_nvdisasm(k.asm["cubin"], "-c")
    spills = sass.count("STL") + sass.count("LDL")
    regs = getattr(k, "n_regs", None) or getattr(k.metadata, "n_regs", "?")
    assert "FFMA" in sass and spills == 0, f"{spills} local-memory instructions, {regs} registers (ptxas spilled)"


def test_which_values_are_channels_last_when_the_model_runs():
    """The depthwise choice is timed on the memory format the call will see (``nhwc_at_run_time``): a (0, 3, 1, 2)
    permute of a contiguous NHWC tensor is channels-last in memory though the IR types it NCHW (ConvNeXt's
    block inputs after sink_permutes); a plain NCHW input or another permute is not."""
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.kernels.conv import nhwc_at_run_time
    from kfuse.kernels.depthwise import may_use_rows

    b = GraphBuilder()
    nhwc = b.add_input("nhwc", TensorType((2, 7, 9, 16), torch.float16))
    nchw = b.add_input("nchw", TensorType((2, 16, 7, 9), torch.float16))
    cl = b.add_input("cl", TensorType((2, 16, 7, 9), torch.float16, "channels_last"))
    to_nchw = b.op("permute", [nhwc], {"dims": [0, 3, 1, 2]})
    other = b.op("permute", [nchw], {"dims": [0, 1, 3, 2]})
    g = b.build([to_nchw, other])
    assert nhwc_at_run_time(g, to_nchw) and nhwc_at_run_time(g, cl)
    assert not nhwc_at_run_time(g, nchw) and not nhwc_at_run_time(g, other)
    x = torch.randn(2, 7, 9, 16).permute(0, 3, 1, 2)
    assert x.is_contiguous(memory_format=torch.channels_last)  # what the claim rests on
    assert may_use_rows(3, 3, 112) and may_use_rows(3, 3, 56) and not may_use_rows(3, 3, 28) and not may_use_rows(7, 7, 56)


def test_the_chosen_rows_kernel_takes_any_layout_a_call_passes(monkeypatch):
    """The lowering's choice is timed on channels-last inputs (``nhwc_at_run_time``); a call that passes
    another layout must still get the right answer (the rows kernel alone would refuse it). The GPU timing is
    replaced by a choice of "rows" so the lowering's GPU branch runs here."""
    import kfuse.runtime.choice as choice
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.kernels.conv import lower_conv2d

    b = GraphBuilder()
    x = b.add_input("x", TensorType((1, 16, 6, 7), torch.float32, "channels_last"))
    w = b.add_constant(torch.randn(16, 1, 3, 3), name="w")
    y = b.op("conv2d", [x, w], {"stride": (1, 1), "padding": (1, 1), "dilation": (1, 1), "groups": 16})
    g = b.build([y])
    seen = {}

    def fake_choose(node, graph, candidates, key, inputs=None):
        seen.update(candidates=sorted(candidates), layout=inputs[0].is_contiguous(memory_format=torch.channels_last))
        return "rows", {name: 1.0 for name in candidates}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(choice, "choose", fake_choose)
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph: [torch.randn(1, 16, 6, 7), graph.constants["w"]])
    monkeypatch.setattr("kfuse.kernels.depthwise.may_use_rows", lambda kh, kw, oh: True)
    monkeypatch.setattr("kfuse.kernels.conv.may_use_rows", lambda kh, kw, oh: True)
    step = lower_conv2d(g.nodes[0], g, "triton")
    assert seen == {"candidates": ["rows", "taps", "torch"], "layout": True} and "rows kernel" in step.info.config
    for layout in (torch.channels_last, torch.contiguous_format):
        xin = torch.randn(1, 16, 6, 7).contiguous(memory_format=layout)
        got = step.fn([xin, g.constants["w"]])
        torch.testing.assert_close(got, F.conv2d(xin, g.constants["w"], None, 1, 1, 1, 16), atol=1e-4, rtol=1e-4)
