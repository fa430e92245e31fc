"""Implicit-GEMM conv template on NHWC (in the Triton interpreter on the CPU, compiled on a GPU):
1x1/3x3/7x7, stride, padding, dilation, both K orders, bias + residual epilogue, NCHW input,
poisoned outputs; grouped convs are refused with a reason and reported as a fallback by the
lowering; the cuDNN candidates of the lowering."""

import pytest
import torch

from kfuse.ir import ops  # noqa: F401
from kfuse.kernels.conv import ConvConfig, ConvParams, conv_epilogue, reference, supported
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


def test_grouped_is_refused_with_reason(device):
    p = ConvParams(groups=4)
    assert "groups=4" in supported((8, 2, 3, 3), p)
    with pytest.raises(ValueError, match="groups=4"):
        conv_epilogue(
            torch.randn(1, 8, 5, 5, device=device), torch.randn(8, 2, 3, 3, device=device), None, [], Epilogue(), p, torch.float32
        )


def test_grouped_conv_model_reports_fallback_and_depthwise_runs_its_kernel(device, exact_fp32_convs, monkeypatch):
    import kfuse

    # the template, not a cuDNN candidate timed faster on the GPU (the CPU times nothing)
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    m = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=8), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1, groups=4),
                            torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).to(device).eval()  # fmt: skip
    x = torch.randn(2, 8, 6, 6, device=device)
    c = kfuse.compile(m, (x,))
    kinds = {k["template"] for k in c.report["kernels"]}
    fb = [k for k in c.report["kernels"] if k["template"] == "fallback"]
    assert "conv_epilogue" in kinds and "depthwise_conv" in kinds
    assert len(fb) == 1 and "groups=4" in fb[0]["config"]
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
