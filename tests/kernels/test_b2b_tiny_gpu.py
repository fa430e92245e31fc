"""Every tiling the fused-vs-unfused decision measures, on the demo's mlp-tiny chain (64 -> 128 GELU
-> 128 ReLU -> 32, fp16) at M = 1-3 rows, far under one row tile: the persistent, TMA and preloading
kernels with all but one program idle. Session 27's whole-suite run on the H200 lost a worker to an
illegal address first seen in ``kfuse demo --model mlp-tiny --batch 2``; the b2b kernels had run on
the GPU only at benchmark sizes."""

from __future__ import annotations

import pytest
import torch
import triton

from kfuse.kernels import b2b
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

R = Operand("reg", 0)
BIAS_GELU = Epilogue((EpilogueStep("add", (R, Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
BIAS_RELU = Epilogue((EpilogueStep("add", (R, Operand("in", 0))), EpilogueStep("relu", (Operand("reg", 1),))), 1)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 3, 130])
def test_every_candidate_tiling_on_a_few_rows(m: int) -> None:
    torch.manual_seed(m)
    dt, k0, widths = torch.float16, 64, [128, 128, 32]
    chain = b2b.Chain((b2b.Stage(BIAS_GELU, dt), b2b.Stage(BIAS_RELU, dt), b2b.Stage(Epilogue(), dt)))
    x = torch.randn(m, k0, device="cuda", dtype=dt)
    ks = [k0] + widths[:-1]
    ws = [(torch.randn(n, k, device="cuda") / k**0.5).to(dt).t() for k, n in zip(ks, widths, strict=True)]  # nn.Linear's layout
    ex = [[torch.randn(widths[0], device="cuda", dtype=dt)], [torch.randn(widths[1], device="cuda", dtype=dt)], []]
    ref = b2b.reference(chain, x.cpu(), [w.cpu() for w in ws], [None] * 3, [[e.cpu() for e in es] for es in ex]).double()
    cfgs = b2b.candidate_configs(m, widths, k0, sms=1)  # sms=1: the persistent tilings too, which a decision skips on so few rows
    assert cfgs
    # and the two tilings that session 28 found miscompiled, as a user would write them (without
    # preload): the launcher preloads one-program-per-tile chains whatever the config says
    cfgs += [b2b.B2BConfig(64, 64, 32, 4, 2, "register"), b2b.B2BConfig(128, 64, 32, 8, 2, "register")]
    for cfg in cfgs:
        out = torch.full((m, widths[-1]), float("nan"), device="cuda", dtype=dt)
        try:
            b2b.b2b_chain(chain, x, ws, [None] * 3, ex, cfg, out=out)
        except triton.runtime.errors.OutOfResources:
            continue  # a tiling that does not fit (shared memory): the decision skips it the same way
        torch.cuda.synchronize()  # a fault shows here, on its tiling
        got = out.cpu().double()
        assert not torch.isnan(got).any(), cfg.describe()
        err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
        assert err < 2e-2, (cfg.describe(), err)


LAYER_SCALE = Epilogue((EpilogueStep("add", (R, Operand("in", 0))), EpilogueStep("mul", (Operand("in", 1), Operand("reg", 1)))), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("lead", [(2, 56, 56), (128, 49)])
def test_convnext_and_swin_mlp_chain(lead: tuple[int, ...]) -> None:
    """ConvNeXt-T's and Swin-T's first-stage MLP, 96 -> 384 (bias + GELU) -> 96 (bias, layer scale), fp16, on
    (B, H, W, C) rows (ConvNeXt) and (windows, tokens, C) rows (Swin), every tiling the decision measures.
    Session 35: both models' compiles hit an illegal address on the H200 while their CPU runs at real widths
    were right; this chain (chunked: K0 = 96 in three 32-column steps, N1 = 96 as 64 + 32) is the kernel
    only these two of the sweep's 22 architectures run."""
    torch.manual_seed(0)
    dt, k0, widths = torch.float16, 96, [384, 96]
    chain = b2b.Chain((b2b.Stage(BIAS_GELU, dt), b2b.Stage(LAYER_SCALE, dt)))
    x = torch.randn(*lead, k0, device="cuda", dtype=dt)
    ws = [(torch.randn(n, k, device="cuda") / k**0.5).to(dt).t() for k, n in zip([k0, widths[0]], widths, strict=True)]
    ex = [[torch.randn(widths[0], device="cuda", dtype=dt)], [torch.randn(widths[1], device="cuda", dtype=dt),
          torch.rand(widths[1], device="cuda", dtype=dt)]]  # fmt: skip
    ref = b2b.reference(chain, x.cpu(), [w.cpu() for w in ws], [None] * 2, [[e.cpu() for e in es] for es in ex]).double()
    m = x.numel() // k0
    cfgs = b2b.candidate_configs(m, widths, k0)
    assert cfgs
    for cfg in cfgs:
        out = torch.full((*lead, widths[-1]), float("nan"), device="cuda", dtype=dt)
        b2b.b2b_chain(chain, x, ws, [None] * 2, ex, cfg, out=out)
        torch.cuda.synchronize()  # a fault shows here, on its tiling
        got = out.cpu().double()
        assert not torch.isnan(got).any(), cfg.describe()
        err = (got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6)
        assert err < 2e-2, (cfg.describe(), err)
