"""Implicit-GEMM conv template on NHWC (in the Triton interpreter on the CPU, compiled on a GPU):
1x1/3x3/7x7, stride, padding, dilation, both K orders, bias + residual epilogue, NCHW input,
poisoned outputs; grouped convs (one GEMM a group, both K orders); depthwise ones refused with a reason;
the cuDNN candidates of the lowering."""

import pytest
import torch

from kfuse.ir import ops  # noqa: F401
from kfuse.kernels.conv import ConvConfig, ConvParams, conv_epilogue, pack_weight, reference, supported
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

ADD_RELU = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)
RELU = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),), 0)


@pytest.fixture
def exact_fp32_convs():
    """On the GPU cuDNN runs fp32 convolutions in TF32 by default (~1e-3 relative): references and
    cuDNN candidates in IEEE fp32, as kfuse's fp32 conv kernels and the CPU compute."""
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


CASES = [  # (C, OC, H, W, k, params)
    (3, 8, 13, 11, 7, ConvParams((2, 2), (3, 3))),
    (20, 12, 9, 10, 3, ConvParams((1, 1), (1, 1))),
    (17, 9, 6, 7, 1, ConvParams((2, 2))),
    (8, 16, 9, 9, 3, ConvParams((2, 1), (2, 1), (2, 2))),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"c{c[0]}k{c[4]}")
@pytest.mark.parametrize("flat", [False, True])
def test_conv_bias_residual_relu(case, flat, device):
    c, oc, h, w, k, p = case
    x = torch.randn(2, c, h, w, device=device).contiguous(memory_format=torch.channels_last)
    wt, b = torch.randn(oc, c, k, k, device=device), torch.randn(oc, device=device)
    shape = reference(x.cpu(), wt.cpu(), b.cpu(), [], Epilogue(), p, torch.float32).shape
    res = torch.randn(shape, device=device)
    out = torch.full(shape, float("nan"), device=device).contiguous(memory_format=torch.channels_last)  # unwritten pixels stay NaN
    got = conv_epilogue(x, wt, b, [res], ADD_RELU, p, torch.float32, ConvConfig(32, 16, 16, 2, 4, 1, flat), out=out)
    ref = reference(x.cpu(), wt.cpu(), b.cpu(), [res.cpu()], ADD_RELU, p, torch.float32)  # on the CPU: no TF32
    assert got.data_ptr() == out.data_ptr() and got.is_contiguous(memory_format=torch.channels_last)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_fp16_nchw_input_no_bias(device):
    x = torch.randn(1, 16, 7, 5, device=device).half()  # plain NCHW strides: slower, still right
    wt = (torch.randn(24, 16, 3, 3, device=device) / 12).half()
    p = ConvParams((1, 1), (1, 1))
    out = torch.full((1, 24, 7, 5), float("nan"), dtype=torch.float16, device=device)  # NCHW, as channels_last=False asks
    got = conv_epilogue(x, wt, None, [], RELU, p, torch.float16, ConvConfig(16, 32, 16, 1, 4, 1), channels_last=False, out=out)
    ref = reference(x.cpu(), wt.cpu(), None, [], RELU, p, torch.float16)
    assert got.data_ptr() == out.data_ptr() and got.is_contiguous()
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu().float(), ref.float(), rtol=2e-2, atol=2e-2)


GROUPED = [  # (C, OC, groups, H, W, k, params): RegNet's 3x3 (64 channels a group), ResNeXt's narrow groups
    # (4 input channels a group: the flat K order), a strided one, odd sizes, 2 output channels a group
    (32, 32, 2, 7, 9, 3, ConvParams((1, 1), (1, 1), groups=2)),
    (16, 24, 4, 9, 8, 3, ConvParams((2, 2), (1, 1), groups=4)),
    (12, 6, 3, 5, 7, 1, ConvParams(groups=3)),
    (24, 40, 8, 6, 6, 3, ConvParams((1, 1), (2, 2), (2, 2), groups=8)),
]


@pytest.mark.parametrize("case", GROUPED, ids=lambda c: f"c{c[0]}g{c[2]}k{c[5]}")
@pytest.mark.parametrize("flat", [False, True])
def test_grouped_conv_is_one_gemm_a_group(case, flat, device):
    c, oc, g, h, w, k, p = case
    gen = torch.Generator().manual_seed(c * 10 + g)
    x = torch.randn(2, c, h, w, generator=gen).to(device).contiguous(memory_format=torch.channels_last)
    wt, b = torch.randn(oc, c // g, k, k, generator=gen).to(device), torch.randn(oc, generator=gen).to(device)
    shape = reference(x.cpu(), wt.cpu(), b.cpu(), [], Epilogue(), p, torch.float32).shape
    res = torch.randn(shape, generator=gen).to(device)
    out = torch.full(shape, float("nan"), device=device).contiguous(memory_format=torch.channels_last)
    conv_epilogue(x, wt, b, [res], ADD_RELU, p, torch.float32, ConvConfig(32, 16, 16, 2, 4, 1, flat), out=out)
    ref = reference(x.cpu(), wt.cpu(), b.cpu(), [res.cpu()], ADD_RELU, p, torch.float32)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    # the default config (a group's tile), and no config at all through the same packed weight
    got = conv_epilogue(x, wt, b, [res], ADD_RELU, p, torch.float32, packed_weight=pack_weight(wt, g))
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_depthwise_and_uneven_groups_are_refused_with_reason(device):
    assert "depthwise" in supported((8, 1, 3, 3), ConvParams(groups=8))
    assert "does not divide" in supported((9, 2, 3, 3), ConvParams(groups=4))
    assert supported((8, 2, 3, 3), ConvParams(groups=4)) is None
    with pytest.raises(ValueError, match="depthwise"):
        conv_epilogue(
            torch.randn(1, 8, 5, 5, device=device), torch.randn(8, 1, 3, 3, device=device), None, [], Epilogue(), ConvParams(groups=8),
            torch.float32,
        )  # fmt: skip
    with pytest.raises(ValueError, match="2 x 4 groups"):
        conv_epilogue(
            torch.randn(1, 6, 5, 5, device=device), torch.randn(8, 2, 3, 3, device=device), None, [], Epilogue(), ConvParams(groups=4),
            torch.float32,
        )  # fmt: skip


def test_grouped_conv_takes_its_epilogue_and_depthwise_runs_its_kernel(device, exact_fp32_convs, monkeypatch):
    import kfuse

    # the template, not a cuDNN candidate timed faster on the GPU (the CPU times nothing)
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1, groups=4),
                            torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).to(device).eval()  # fmt: skip
    x = torch.randn(2, 8, 6, 6, device=device)
    c = kfuse.compile(m, (x,))
    kinds = [k["template"] for k in c.report["kernels"]]
    assert kinds.count("conv_epilogue") == 2 and "depthwise_conv" in kinds and "fallback" not in kinds
    assert any(
        k["ops"] == ["conv2d", "relu"] or tuple(k["ops"]) == ("conv2d", "relu")
        for k in c.report["kernels"]
        if k["template"] == "conv_epilogue"
    )
    torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)


def test_cudnn_fusable_epilogues() -> None:
    from kfuse.kernels.conv import cudnn_fusable
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    r0, r1, in0 = Operand("reg", 0), Operand("reg", 1), Operand("in", 0)
    assert cudnn_fusable(Epilogue((EpilogueStep("relu", (r0,)),))) == "relu"
    assert cudnn_fusable(Epilogue((EpilogueStep("add", (in0, r0)), EpilogueStep("relu", (r1,))), 1)) == "add_relu"
    assert cudnn_fusable(Epilogue((EpilogueStep("add", (r0, in0)),), 1)) is None  # no ReLU after the residual
    assert cudnn_fusable(Epilogue((EpilogueStep("gelu", (r0,)),))) is None
    assert cudnn_fusable(Epilogue()) is None


def test_cudnn_candidates_cover_padding_and_fusion(device, exact_fp32_convs) -> None:
    """The candidate set (measured on a GPU) includes the fused and channel-padded cuDNN calls; the
    unfused candidates, padded or not, equal the reference (cuDNN's fused calls need a GPU)."""
    import torch.nn.functional as F

    from kfuse.ir.graph import GraphBuilder, Node, TensorType
    from kfuse.kernels.conv import ConvParams, cudnn_candidates
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    gb = GraphBuilder("stem")
    x = gb.add_input("x", TensorType((2, 3, 9, 9), torch.float32, "channels_last"))
    w = gb.add_constant(torch.randn(8, 3, 3, 3, device=device), "w")
    b = gb.add_constant(torch.randn(8, device=device), "b")
    epi = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),))
    attrs = dict(epilogue=epi, has_bias=True, stride=(1, 1), padding=(1, 1), dilation=(1, 1), fused_ops=("conv2d", "relu"))
    y = gb.add_node(Node("y", "conv_epilogue", (x, w, b), TensorType((2, 8, 9, 9), torch.float32, "channels_last"), attrs))
    g = gb.build([y])
    node = g.nodes[-1]
    params = ConvParams.of(node.attrs)
    cands = cudnn_candidates(node, g, epi, params, True, torch.float32)
    assert set(cands) == {"cudnn", "cudnn_fused", "cudnn_pad8", "cudnn_pad8_fused"}
    xs = [torch.randn(2, 3, 9, 9, device=device).contiguous(memory_format=torch.channels_last), g.constants["w"], g.constants["b"]]
    ref = F.relu(F.conv2d(xs[0], xs[1], xs[2], padding=1))
    for name in ("cudnn", "cudnn_pad8"):
        torch.testing.assert_close(cands[name](xs), ref, rtol=1e-4, atol=1e-4)


def test_cudnn_candidates_of_a_grouped_conv(device, exact_fp32_convs) -> None:
    """A grouped conv's cuDNN candidates pass the groups on, and no channel-padded one is offered (padding a
    group's channels would shift every later group)."""
    import torch.nn.functional as F

    from kfuse.ir.graph import GraphBuilder, Node, TensorType
    from kfuse.kernels.conv import cudnn_candidates

    gb = GraphBuilder("grouped")
    x = gb.add_input("x", TensorType((2, 6, 7, 7), torch.float32, "channels_last"))
    w = gb.add_constant(torch.randn(9, 2, 3, 3, device=device), "w")
    b = gb.add_constant(torch.randn(9, device=device), "b")
    attrs = dict(epilogue=RELU, has_bias=True, stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=3, fused_ops=("conv2d", "relu"))
    y = gb.add_node(Node("y", "conv_epilogue", (x, w, b), TensorType((2, 9, 7, 7), torch.float32, "channels_last"), attrs))
    g = gb.build([y])
    cands = cudnn_candidates(g.nodes[-1], g, RELU, ConvParams.of(attrs), True, torch.float32)
    assert set(cands) == {"cudnn", "cudnn_fused"}
    xs = [torch.randn(2, 6, 7, 7, device=device).contiguous(memory_format=torch.channels_last), g.constants["w"], g.constants["b"]]
    torch.testing.assert_close(cands["cudnn"](xs), F.relu(F.conv2d(xs[0], xs[1], xs[2], padding=1, groups=3)), rtol=1e-4, atol=1e-4)


def test_cudnn_candidate_converts_a_constant_weight_to_channels_last_once(monkeypatch, device, exact_fp32_convs) -> None:
    """On a channels-last conv the cuDNN call gets a channels-last weight, converted from the
    (contiguous) constant on the first call only: F.conv2d would otherwise copy it every call."""
    import torch.nn.functional as F

    from kfuse.ir.graph import GraphBuilder, Node, TensorType
    from kfuse.kernels import conv as conv_mod
    from kfuse.kernels.epilogue import Epilogue

    gb = GraphBuilder("c3")
    x = gb.add_input("x", TensorType((2, 16, 7, 7), torch.float32, "channels_last"))
    w = gb.add_constant(torch.randn(24, 16, 3, 3, device=device), "w")
    attrs = dict(epilogue=Epilogue(), has_bias=False, stride=(1, 1), padding=(1, 1), dilation=(1, 1), fused_ops=("conv2d",))
    y = gb.add_node(Node("y", "conv_epilogue", (x, w), TensorType((2, 24, 7, 7), torch.float32, "channels_last"), attrs))
    g = gb.build([y])
    node = g.nodes[-1]
    cands = conv_mod.cudnn_candidates(node, g, Epilogue(), conv_mod.ConvParams.of(node.attrs), False, torch.float32)
    seen = []
    real = F.conv2d
    monkeypatch.setattr(conv_mod.F, "conv2d", lambda x, w, *a: seen.append(w) or real(x, w, *a))
    xs = [torch.randn(2, 16, 7, 7, device=device).contiguous(memory_format=torch.channels_last), g.constants["w"]]
    ref = real(xs[0], xs[1], None, 1, 1)
    for _ in range(2):
        torch.testing.assert_close(cands["cudnn"](xs), ref, rtol=1e-4, atol=1e-4)
    assert len(seen) == 2 and seen[0] is seen[1], "the weight was converted again on the second call"
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and not xs[1].is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("channels_last", [True, False])
def test_patch_gemm_candidate_for_non_overlapping_windows(channels_last: bool, device: str, exact_fp32_convs) -> None:
    """ViT's patch embedding (stride = kernel, no padding) gets a reshape + GEMM candidate, equal
    to the convolution (also with sizes that do not divide by the patch)."""
    import torch.nn.functional as F

    from kfuse.ir.graph import GraphBuilder, Node, TensorType
    from kfuse.kernels.conv import ConvParams, cudnn_candidates
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    layout = "channels_last" if channels_last else "contiguous"
    gb = GraphBuilder("patch")
    x = gb.add_input("x", TensorType((2, 3, 18, 17), torch.float32, layout))
    w = gb.add_constant(torch.randn(8, 3, 4, 4, device=device), "w")
    b = gb.add_constant(torch.randn(8, device=device), "b")
    epi = Epilogue((EpilogueStep("relu", (Operand("reg", 0),)),))
    attrs = dict(epilogue=epi, has_bias=True, stride=(4, 4), padding=(0, 0), dilation=(1, 1), fused_ops=("conv2d", "relu"))
    y = gb.add_node(Node("y", "conv_epilogue", (x, w, b), TensorType((2, 8, 4, 4), torch.float32, layout), attrs))
    g = gb.build([y])
    node = g.nodes[-1]
    cands = cudnn_candidates(node, g, epi, ConvParams.of(node.attrs), True, torch.float32)
    assert "patch_gemm" in cands
    xt = torch.randn(2, 3, 18, 17, device=device)
    if channels_last:
        xt = xt.contiguous(memory_format=torch.channels_last)
    got = cands["patch_gemm"]([xt, g.constants["w"], g.constants["b"]])
    torch.testing.assert_close(got, F.relu(F.conv2d(xt, g.constants["w"], g.constants["b"], stride=4)), rtol=1e-4, atol=1e-4)
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    # overlapping windows: no patch candidate
    attrs3 = dict(attrs, stride=(2, 2))
    y3 = Node("y3", "conv_epilogue", (x, w, b), TensorType((2, 8, 8, 7), torch.float32, layout), attrs3)
    g3 = g.replace(nodes=(y3,), outputs=("y3",))
    assert "patch_gemm" not in cudnn_candidates(y3, g3, epi, ConvParams.of(attrs3), True, torch.float32)


@pytest.mark.parametrize("per_image", [True, False])
@pytest.mark.parametrize("flat,groups,k", [(False, 1, 1), (True, 1, 3), (False, 2, 3)])
def test_conv_reads_its_input_times_a_channel_scale(per_image, flat, groups, k, device):
    # squeeze-excitation's x * s[N, C, 1, 1] (or a [1, C, 1, 1] scale) multiplied in as the conv loads x
    gen = torch.Generator().manual_seed(k * 10 + groups)
    c, oc = 20, 12
    x = torch.randn(3, c, 7, 6, generator=gen).to(device).contiguous(memory_format=torch.channels_last)
    s = torch.rand(3 if per_image else 1, c, 1, 1, generator=gen).to(device) + 0.1
    wt, b = torch.randn(oc, c // groups, k, k, generator=gen).to(device), torch.randn(oc, generator=gen).to(device)
    p = ConvParams((1, 1), (k // 2, k // 2), groups=groups)
    ref = reference(x.cpu(), wt.cpu(), b.cpu(), [], RELU, p, torch.float32, in_scale=s.cpu())
    torch.testing.assert_close(ref, reference((x * s).cpu(), wt.cpu(), b.cpu(), [], RELU, p, torch.float32))
    out = torch.full(ref.shape, float("nan"), device=device).contiguous(memory_format=torch.channels_last)
    conv_epilogue(x, wt, b, [], RELU, p, torch.float32, ConvConfig(32, 16, 16, 2, 4, 1, flat), out=out, in_scale=s)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="in_scale must be"):
        conv_epilogue(x, wt, b, [], RELU, p, torch.float32, in_scale=s[:, :4])


@pytest.mark.parametrize("flat", [False, True])
def test_pad_end_makes_the_output_larger_and_reads_zeros(flat, device):
    # a folded TF "same" pad: one more row and column at the end than at the start (stride 2), poisoned output
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 16, 10, 9, generator=gen).to(device).contiguous(memory_format=torch.channels_last)
    wt, b = torch.randn(8, 16, 3, 3, generator=gen).to(device), torch.randn(8, generator=gen).to(device)
    p = ConvParams((2, 2), (0, 0), pad_end=(1, 1))
    want = torch.relu(torch.nn.functional.conv2d(torch.nn.functional.pad(x.cpu(), (0, 1, 0, 1)), wt.cpu(), b.cpu(), stride=2))
    torch.testing.assert_close(reference(x.cpu(), wt.cpu(), b.cpu(), [], RELU, p, torch.float32), want)
    out = torch.full(want.shape, float("nan"), device=device).contiguous(memory_format=torch.channels_last)
    conv_epilogue(x, wt, b, [], RELU, p, torch.float32, ConvConfig(32, 16, 16, 2, 4, 1, flat), out=out)
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("offset", [8, 3], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("tile_h", [0, 4], ids=["pointers", "tma"])
def test_conv_reads_and_writes_channel_slices_of_wider_buffers(offset: int, tile_h: int, device: str) -> None:
    """concat_in_place hands the conv a slice of a cat's buffer as its output, and a view cat (a channel prefix)
    as its input: pixel strides wider than the channels. 16-byte aligned slices may take the TMA paths (on sm_90),
    others store through pointers; the channels beside the slice stay untouched."""
    dt = torch.float16
    src = torch.randn(2, 40, 9, 11, device=device, dtype=dt).contiguous(memory_format=torch.channels_last)
    x = src[:, :24]  # a channel prefix: pixel stride 40
    wt, b = (torch.randn(16, 24, 3, 3, device=device) / 8).to(dt), torch.randn(16, device=device).to(dt)
    p = ConvParams((1, 1), (1, 1))
    buf = torch.full((2, offset + 16 + 5, 9, 11), float("nan"), device=device, dtype=dt).contiguous(memory_format=torch.channels_last)
    out = buf[:, offset : offset + 16]
    cfg = ConvConfig(64, 16, 16, 1, 4, 1, tile_h=tile_h)
    got = conv_epilogue(x, wt, b, [], RELU, p, dt, cfg, out=out)
    ref = reference(x.cpu().float(), wt.cpu().float(), b.cpu().float(), [], RELU, p, torch.float32)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-2, atol=2e-2)
    assert torch.isnan(buf[:, :offset]).all() and torch.isnan(buf[:, offset + 16 :]).all()


@pytest.mark.parametrize("flat,groups,k,pad", [(False, 1, 1, 0), (True, 1, 3, 1), (False, 1, 3, 1), (False, 2, 3, 1)])
@pytest.mark.parametrize("table_rank", [3, 4])
def test_conv_reads_relu_of_its_input_times_scale_plus_shift(flat, groups, k, pad, table_rank, device):
    """A batch norm + ReLU before the conv in its input loads: relu(x * s + t). The shift makes a padded tap's
    transform relu(t) > 0, so the padding must be applied to the transformed map (zeros), as the separate kernels
    did. Per-channel tables as (C, 1, 1) constants or (1, C, 1, 1)."""
    c, oc = 12, 10
    x = torch.randn(2, c, 7, 9, device=device).contiguous(memory_format=torch.channels_last)
    wt, b = torch.randn(oc, c // groups, k, k, device=device) / 4, torch.randn(oc, device=device)
    shape = (c, 1, 1) if table_rank == 3 else (1, c, 1, 1)
    s, t = torch.rand(shape, device=device) + 0.5, torch.randn(shape, device=device).abs() + 0.5  # relu(t) > 0 on padding
    p = ConvParams((1, 1), (pad, pad), groups=groups)
    out = torch.full((2, oc, 7 - k + 1 + 2 * pad, 9 - k + 1 + 2 * pad), float("nan"), device=device).contiguous(
        memory_format=torch.channels_last
    )
    cfg = ConvConfig(32, 16, 16, 2, 4, 1, flat)
    got = conv_epilogue(x, wt, b, [], RELU, p, torch.float32, cfg, out=out, in_scale=s, in_shift=t, in_relu=True)
    ref = reference(x.cpu(), wt.cpu(), b.cpu(), [], RELU, p, torch.float32, in_scale=s.cpu(), in_shift=t.cpu(), in_relu=True)
    manual = torch.relu(torch.nn.functional.conv2d(torch.relu(x.cpu() * s.cpu() + t.cpu()), wt.cpu(), b.cpu(), padding=pad, groups=groups))
    torch.testing.assert_close(ref, manual, rtol=1e-5, atol=1e-5)
    assert got.data_ptr() == out.data_ptr() and not torch.isnan(out).any()
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_prologue_arguments_are_checked(device):
    x = torch.randn(1, 4, 5, 5, device=device)
    wt = torch.randn(3, 4, 1, 1, device=device)
    with pytest.raises(ValueError, match="need in_scale"):
        conv_epilogue(x, wt, None, [], RELU, ConvParams(), torch.float32, in_shift=torch.randn(1, 4, 1, 1, device=device))
    with pytest.raises(ValueError, match="in_shift must be"):
        conv_epilogue(x, wt, None, [], RELU, ConvParams(), torch.float32, in_scale=torch.randn(1, 4, 1, 1, device=device),
                      in_shift=torch.randn(1, 5, 1, 1, device=device))  # fmt: skip
