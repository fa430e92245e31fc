"""Squeeze-excitation's channel scale folded into the conv that reads it (kfuse.passes.fuse_input_scale): the
RegNet-Y / EfficientNet block end, and the look-alikes that must stay a multiply."""

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fuse_input_scale import fuse_input_scale

UP_TO_EPILOGUES = Options(fuse_b2b=False, fuse_pointwise=False, input_scale=False, varlen=False, layout="nchw")


class _SEBlock(nn.Module):
    """conv -> ReLU -> SE (pool, 1x1 convs, sigmoid) -> x * s -> 1x1 projection + residual -> ReLU.
    ``form``: "se" (the block), "spatial" (a [N, 1, H, W] scale: not per channel), "shared" (the scaled map is
    also an output), "constant" (a [1, C, 1, 1] parameter, a layer scale: the conv before takes it in its
    epilogue, which is better still)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1, self.fc2 = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.proj = nn.Conv2d(16, 8, 1)
        self.gamma = nn.Parameter(torch.rand(1, 16, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor):  # noqa: ANN201
        y = torch.relu(self.conv(x))
        if self.form == "spatial":
            s = torch.sigmoid(y.mean(1, keepdim=True))
        elif self.form == "constant":
            s = self.gamma
        else:
            s = torch.sigmoid(self.fc2(torch.relu(self.fc1(y.mean((2, 3), keepdim=True)))))
        scaled = y * s
        out = torch.relu(self.proj(scaled) + x)
        return (out, scaled) if self.form == "shared" else out


def _graph(model: nn.Module, x: torch.Tensor):  # noqa: ANN202
    return optimize(import_module(model, (x,)).graph, UP_TO_EPILOGUES).graph


@pytest.mark.parametrize("form,fused,mul_left", [("se", True, False), ("constant", False, False), ("spatial", False, True),
                                                  ("shared", False, True)])  # fmt: skip
def test_a_channel_scale_moves_into_the_conv(form, fused, mul_left, device):
    gen = torch.Generator().manual_seed(len(form))
    x = torch.randn(2, 8, 7, 9, generator=gen).to(device)
    model = _SEBlock(form).to(device).eval()
    g = _graph(model, x)
    r = fuse_input_scale(g)
    scaled = [n for n in r.nodes if n.op == "conv_epilogue" and n.attrs.get("in_scale")]
    assert len(scaled) == int(fused)
    muls = [n for n in r.nodes if n.op == "mul" and len(n.inputs) == 2 and r.type_of(n.inputs[0]).rank == 4]
    assert bool(muls) == mul_left
    if fused:
        assert scaled[0].attrs["fused_ops"][0] == "mul" and len(scaled[0].inputs) == 5  # x, w, b, s, residual
    for a, b in zip(reference_run(g, [x]), reference_run(r, [x]), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compiled_se_block_matches_eager(dtype, device, monkeypatch):
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")  # the template, not a cuDNN candidate timed faster on a GPU
    if dtype == torch.float16 and device == "cpu":
        pytest.skip("fp16 convs: the GPU")
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 8, 7, 9, generator=gen).to(device, dtype)
    model = _SEBlock("se").to(device, dtype).eval()
    cm = kfuse.compile(model, (x,))
    kern = [k for k in cm.report["kernels"] if k["template"] == "conv_epilogue" and k["ops"][0] == "mul"]
    assert len(kern) == 1, cm.report["kernels"]
    off = kfuse.compile(model, (x,), input_scale=False)
    assert not any(k["ops"][0] == "mul" for k in off.report["kernels"] if k["template"] == "conv_epilogue")
    x2 = torch.randn(2, 8, 7, 9, generator=gen).to(device, dtype)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    with torch.no_grad():
        torch.testing.assert_close(cm(x2), model(x2), rtol=tol, atol=tol)


class _PreAct(nn.Module):
    """DenseNet's layer: BN -> ReLU -> conv on a map no conv made (here a max pool: nothing to take the norm in its
    epilogue). ``form``: "bn_relu" (fused: scale, shift, ReLU), "bn" (no ReLU: a shift alone stays outside),
    "shared" (the ReLU's output is also returned: the transformed map must exist)."""

    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form
        self.bn = nn.BatchNorm2d(8)
        self.conv = nn.Conv2d(8, 6, 3, padding=1)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.bias.uniform_(0.2, 1)  # positive shifts: relu(t) > 0 where the conv pads

    def forward(self, x: torch.Tensor):  # noqa: ANN201
        y = self.bn(nn.functional.max_pool2d(x, 3, 1, 1))
        z = torch.relu(y) if self.form != "bn" else y
        out = self.conv(z)
        return (out, z) if self.form == "shared" else out


@pytest.mark.parametrize("form,fused", [("bn_relu", True), ("bn", False), ("shared", False)])
def test_a_norm_and_relu_move_into_the_conv(form, fused, device):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, 7, 9, generator=gen).to(device)
    model = _PreAct(form).to(device).eval()
    g = _graph(model, x)
    r = fuse_input_scale(g)
    convs = [n for n in r.nodes if n.op == "conv_epilogue" and n.attrs.get("in_scale")]
    assert len(convs) == int(fused)
    if fused:
        a = convs[0].attrs
        assert a["in_shift"] and a["in_act"] == "relu" and a["fused_ops"][:3] == ("mul", "add", "relu")
        assert len(convs[0].inputs) == 5  # x, w, b, scale, shift
        assert not [n for n in r.nodes if n.op in ("mul", "add", "relu")]
    for want, got in zip(reference_run(g, [x]), reference_run(r, [x]), strict=True):
        torch.testing.assert_close(want, got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_compiled_pre_activation_matches_eager(dtype, device, monkeypatch):
    monkeypatch.setenv("KFUSE_CONV_VS_CUDNN", "0")
    if dtype == torch.float16 and device == "cpu":
        pytest.skip("fp16 convs: the GPU")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 8, 7, 9, generator=gen).to(device, dtype)
    model = _PreAct("bn_relu").to(device, dtype).eval()
    cm = kfuse.compile(model, (x,))
    assert [k["ops"][:3] for k in cm.report["kernels"] if k["template"] == "conv_epilogue"] == [["mul", "add", "relu"]]
    x2 = torch.randn(2, 8, 7, 9, generator=gen).to(device, dtype)
    tol = 2e-2 if dtype == torch.float16 else 1e-4
    with torch.no_grad():
        torch.testing.assert_close(cm(x2), model(x2), rtol=tol, atol=tol)


@pytest.mark.parametrize("choice", ["template", "template_after_prologue", "cudnn"])
def test_every_candidate_of_a_prologue_conv_gives_the_same_values(choice, monkeypatch):
    """On a GPU the prologue conv races cuDNN with the transform run first, and the template on the transformed
    map (which may take TMA). Whichever wins, the step's values are the same (the race is forced here)."""
    import kfuse.runtime.choice as choice_mod
    from kfuse.kernels.conv import lower_conv_epilogue

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 8, 7, 9, generator=gen)
    model = _PreAct("bn_relu").eval()
    g = fuse_input_scale(_graph(model, x))
    node = next(n for n in g.nodes if n.op == "conv_epilogue")
    seen = {}

    def fake_choose(node, graph, cands, key, inputs=None):  # noqa: ANN001, ANN202
        seen.update(cands)
        name = next(n for n in cands if n.startswith(choice))
        return name, {n: 1.0 for n in cands}

    monkeypatch.setattr(choice_mod, "choose", fake_choose)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    step = lower_conv_epilogue(node, g, "triton")
    assert "template_after_prologue" in seen and any(n.startswith("cudnn") for n in seen)
    from kfuse.ir import ops

    t = g.type_of(node.inputs[0])
    xs = [torch.randn(t.shape, generator=gen), *(g.constants[v] for v in node.inputs[1:])]
    want = ops.run_reference(node.op, xs, dict(node.attrs))
    torch.testing.assert_close(step.fn(xs), want, rtol=1e-4, atol=1e-4)
