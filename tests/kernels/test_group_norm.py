"""GroupNorm's two kernels (``kfuse.kernels.group_norm``) against ``F.group_norm`` (+ SiLU): channels-last and
standard maps, [N, C, L], group widths that are not powers of two, several pixel slices per image and one, a mean
far from zero (E[x^2] - mean^2 in fp32), fp16, poisoned outputs; and the graph path: the importer's op, the SiLU
folded in, ``Options.group_norm=False`` writing the old layer-norm form."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from cubin_facts import run_offline_script

import kfuse
from kfuse.compiler import Options
from kfuse.kernels.group_norm import group_norm, launch_shape

CASES = [
    # shape, groups
    ((2, 20, 7, 9), 4),  # 5 channels a group
    ((3, 12, 5, 5), 12),  # one channel a group
    ((1, 96, 11, 13), 32),  # 3 a group, two channel blocks share none
    ((2, 80, 3, 3), 8),  # 10 a group: groups span the 64-channel blocks
    ((2, 6, 1, 1), 2),  # one pixel
    ((2, 16, 37), 4),  # [N, C, L]
]


def _reference(x, groups, w, b, silu):
    y = F.group_norm(x.float(), groups, w.float(), b.float(), 1e-5)
    return F.silu(y) if silu else y


@pytest.mark.parametrize("shape,groups", CASES)
@pytest.mark.parametrize("channels_last", [True, False])
@pytest.mark.parametrize("silu", [False, True])
def test_equals_pytorch(shape, groups, channels_last, silu, device) -> None:
    gen = torch.Generator().manual_seed(sum(shape) + groups)
    x = (torch.randn(shape, generator=gen) * 2 + 3).to(device)  # mean 3: the variance is not E[x^2] alone
    if channels_last and len(shape) == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    w, b = (torch.randn(shape[1], generator=gen).to(device) for _ in range(2))
    out = torch.full_like(x, float("nan"))
    got = group_norm(x, groups, w, b, silu=silu, out=out)
    assert got.stride() == x.stride()
    torch.testing.assert_close(got, _reference(x, groups, w, b, silu), rtol=2e-5, atol=2e-5)


def test_a_mean_far_from_zero_cancels_nothing(device) -> None:
    """Mean 100, std 1, fp32: E[x^2] - mean^2 unshifted would lose about four digits of the variance (PyTorch's
    own CPU GroupNorm is 1e-2 off here), so the reference is fp64."""
    gen = torch.Generator().manual_seed(5)
    x = (torch.randn(2, 24, 31, 29, generator=gen) + 100).to(device).contiguous(memory_format=torch.channels_last)
    w, b = torch.ones(24, device=device), torch.zeros(24, device=device)
    want = F.group_norm(x.double(), 6, w.double(), b.double()).float()
    torch.testing.assert_close(group_norm(x, 6, w, b), want, rtol=1e-4, atol=1e-4)


def test_half_precision_and_many_slices(device) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 40, 23, 19, device=device).half().contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(40, device=device).half(), torch.randn(40, device=device).half()
    assert launch_shape(2, 23 * 19, 64)[0] > 1  # several pixel slices an image: the partial sums are reduced
    got = group_norm(x, 8, w, b, silu=True)
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.float(), _reference(x, 8, w, b, True), rtol=2e-3, atol=2e-3)


def test_bad_arguments_are_refused() -> None:
    x = torch.randn(2, 6, 4, 4)
    with pytest.raises(ValueError, match="4 groups do not divide"):
        group_norm(x, 4, torch.ones(6), torch.zeros(6))
    with pytest.raises(ValueError, match="must be"):
        group_norm(x, 3, torch.ones(5), torch.zeros(6))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 24, 3, padding=1)
        self.norm = nn.GroupNorm(6, 24)
        self.out = nn.Conv2d(24, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.silu(self.norm(self.conv(x)))) + x


def test_a_group_norm_and_its_silu_are_one_step() -> None:
    torch.manual_seed(0)
    m = _Block().eval()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.normal_()
    x = torch.randn(2, 8, 9, 7)
    c = kfuse.compile(m, (x,))
    steps = [k for k in c.report["kernels"] if k["template"] == "group_norm"]
    assert len(steps) == 1 and "SiLU" in steps[0]["config"], c.report["kernels"]
    assert not [k for k in c.report["kernels"] if k["template"] in ("pointwise", "fused_norm")]
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    old = kfuse.compile(m, (x,), group_norm=False)  # the layer-norm form, as before
    assert not [k for k in old.report["kernels"] if k["template"] == "group_norm"]
    assert [k for k in old.report["kernels"] if k["template"] == "fused_norm"]
    with torch.no_grad():
        torch.testing.assert_close(old(x), m(x), rtol=1e-4, atol=1e-4)
    assert Options().group_norm


_SM90_SCRIPT = r"""
import json, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kfuse.kernels import group_norm as G

out = {}
ints = ("C", "HW", "G", "CG", "ROWS", "S", "sxn", "sxc", "sxp", "syn", "syc", "syp")
for name, k, const in (("partial", G._partial_sums, dict(BLOCK_R=64, BLOCK_C=64, BLOCK_G=32)),
                       ("normalize", G._normalize, dict(SILU=True, BLOCK_R=64, BLOCK_C=64, BLOCK_G=32, BLOCK_S=8))):
    names = k.arg_names
    sig = {n: ("*fp32" if n == "part_ptr" else "*fp16") for n in names if n.endswith("_ptr")}
    sig.update({n: "i32" for n in ints if n in names})
    sig.update({n: "fp32" for n in ("count", "eps") if n in names})
    s = {n: sig.get(n, "constexpr") for n in names}
    src = ASTSource(k, s, {(names.index(n),): v for n, v in const.items()})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    out[name] = {"loads": len(re.findall(r"ld\.global", ptx)), "stores": len(re.findall(r"st\.global", ptx))}
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90() -> None:
    """Both kernels compile for the H200 offline (the interpreter runs neither through Triton's GPU compiler)."""
    got = run_offline_script(_SM90_SCRIPT, None, timeout=600)
    assert got["partial"]["loads"] >= 1 and got["partial"]["stores"] >= 1, got
    assert got["normalize"]["loads"] >= 1 and got["normalize"]["stores"] >= 1, got


@pytest.mark.gpu
@pytest.mark.parametrize("shape,groups", [((2, 320, 64, 64), 32), ((1, 512, 128, 128), 32), ((2, 1280, 8, 8), 32)])
def test_diffusion_shapes_on_the_gpu(shape, groups) -> None:
    """SD 1.5's U-Net and VAE GroupNorm shapes in fp16, channels-last, poisoned output, against PyTorch's in fp32."""
    torch.manual_seed(0)
    x = torch.randn(shape, device="cuda").half().contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(shape[1], device="cuda").half(), torch.randn(shape[1], device="cuda").half()
    got = group_norm(x, groups, w, b, silu=True, out=torch.full_like(x, float("nan")))
    torch.testing.assert_close(got.float(), _reference(x, groups, w, b, True), rtol=5e-3, atol=5e-3)


def test_the_gpu_choice_is_timed_on_the_layout_the_norm_runs_in(monkeypatch) -> None:
    """In a graph the layout pass made NHWC the norm's input is channels-last at run time even where its type
    (set on conv outputs only) says otherwise: the kernel-vs-PyTorch choice is timed on that layout, under its
    own cache key. Elsewhere the inputs are the types' own (made on a cache miss only)."""
    from kfuse.compiler import optimize
    from kfuse.frontend.torch_export import import_module
    from kfuse.kernels import group_norm as gn
    from kfuse.runtime import choice

    seen = []

    def fake_choose(node, graph, candidates, key, inputs=None):
        seen.append((key, inputs))
        return "kernel", {"kernel": 1e-3, "torch": 2e-3}

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(choice, "choose", fake_choose)
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph: [torch.randn(graph.type_of(i).shape) for i in node.inputs])
    x = torch.randn(2, 8, 9, 7)
    for nhwc in (True, False):
        imp = import_module(_Block().eval(), (x,), {}, "block")
        g = optimize(imp.graph, Options(tune="none", layout="auto" if nhwc else "nchw")).graph
        node = next(n for n in g.nodes if n.op == "group_norm")
        step = gn.lower_group_norm(node, g, "triton")
        assert step is not None and "vs PyTorch" in step.info.config
        key, inputs = seen[-1]
        if nhwc:  # a function: choose makes the inputs on a cache miss only
            assert "channels_last" in key and inputs()[0].is_contiguous(memory_format=torch.channels_last)
        else:
            assert "channels_last" not in key and inputs is None
