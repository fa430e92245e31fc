"""Layout pass: NHWC once at the boundary, conv outputs channels-last, outputs back to NCHW,
stem channel padding (numerics unchanged), graphs without convs untouched."""

import torch

from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.layout import padding_pays, to_nhwc


def _conv_graph(c=3):
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((2, c, 10, 9), torch.float32))
    w1 = b.add_constant(torch.randn(8, c, 3, 3))
    w2 = b.add_constant(torch.randn(4, 8, 1, 1))
    y = b.op("conv2d", [x, w1], {"stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "groups": 1})
    y = b.op("relu", [y])
    z = b.op("conv2d", [y, w2], {"stride": (1, 1), "padding": (0, 0), "dilation": (1, 1), "groups": 1})
    return b.build([z]), torch.randn(2, c, 10, 9)


def test_boundary_conversion_and_outputs():
    g, x = _conv_graph()
    g2 = to_nhwc(g, pad="never")
    assert g2.op_counts()["to_nhwc"] == 1
    assert all(n.ttype.layout == "channels_last" for n in g2.nodes if n.op == "conv2d")
    assert g2.node_map()[g2.outputs[0]].op == "contiguous"
    (ref,) = reference_run(g, [x])
    (got,) = reference_run(g2, [x])
    assert got.is_contiguous()
    torch.testing.assert_close(got, ref)


def test_stem_padding_always_keeps_numerics():
    g, x = _conv_graph(3)
    g2 = to_nhwc(g, pad="always")
    nhwc = next(n for n in g2.nodes if n.op == "to_nhwc")
    assert nhwc.attrs["pad_c"] == 5 and nhwc.ttype.shape[1] == 8
    conv = next(n for n in g2.nodes if n.op == "conv2d")
    assert g2.constants[conv.inputs[1]].shape[1] == 8
    torch.testing.assert_close(reference_run(g2, [x])[0], reference_run(g, [x])[0], rtol=1e-5, atol=1e-5)


def test_auto_padding_decision_is_made_and_correct():
    g, x = _conv_graph(3)
    g2 = to_nhwc(g, pad="auto")
    # the pass applies the cost rule's answer for the stem conv, the only reader of x
    want = padding_pays(3, [n for n in g.nodes if n.op == "conv2d" and n.inputs[0] == "x"], g)
    nhwc = next(n for n in g2.nodes if n.op == "to_nhwc")
    assert nhwc.attrs.get("pad_c", 0) == want and nhwc.ttype.shape[1] == 3 + want
    stem = next(n for n in g2.nodes if n.op == "conv2d" and n.inputs[0] == nhwc.name)
    assert g2.constants[stem.inputs[1]].shape[1] == 3 + want
    torch.testing.assert_close(reference_run(g2, [x])[0], reference_run(g, [x])[0], rtol=1e-5, atol=1e-5)


def test_no_convs_untouched():
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((2, 3, 4, 5), torch.float32))
    g = b.build([b.op("relu", [x])])
    assert to_nhwc(g) is g


def test_fused_conv_keeps_channels_last():
    g, x = _conv_graph(4)
    g2 = fuse_epilogues(to_nhwc(g))
    convs = [n for n in g2.nodes if n.op == "conv_epilogue"]
    assert len(convs) == 2 and all(n.ttype.layout == "channels_last" for n in convs)
    torch.testing.assert_close(reference_run(g2, [x])[0], reference_run(g, [x])[0], rtol=1e-5, atol=1e-5)


def test_keep_outputs_channels_last_skips_the_copy_back():
    g, x = _conv_graph(4)
    g2 = to_nhwc(g, pad="never", keep_outputs=True)
    assert "contiguous" not in g2.op_counts()
    (got,) = reference_run(g2, [x])
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    torch.testing.assert_close(got, reference_run(g, [x])[0])


def test_compile_returns_the_memory_format_eager_returns():
    """A channels-last example input gives channels-last outputs (as eager does), with no copy-back
    step in the plan; a contiguous input gives contiguous outputs."""
    import kfuse

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU()).eval()
    for cl in (True, False):
        x = torch.randn(2, 4, 6, 5)
        if cl:
            x = x.to(memory_format=torch.channels_last)
        c = kfuse.compile(model, (x,), cuda_graphs=False)
        out = c(x)
        ref = model(x)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
        assert out.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last)
        assert out.is_contiguous() == ref.is_contiguous()
        assert any(k["ops"] == ["contiguous"] for k in c.report["kernels"]) != cl
