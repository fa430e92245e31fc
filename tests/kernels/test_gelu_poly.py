"""gelu_poly: the FMA-pipe GELU that takes half of gelu_mix's values, checked on every finite fp16 input
through its fp16 emulation, which follows the PTX step by step."""

from __future__ import annotations

import re

import numpy as np

from kfuse.kernels import gelu_poly


def _all_fp16() -> np.ndarray:
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    return x[np.isfinite(x)]


def _mufu_path(x: np.ndarray) -> np.ndarray:
    # the f16x2 tanh form of gemm_ws._gelu_f16x2 in fp16 steps, with an exact tanh (the MUFU's error aside)
    fma = gelu_poly._fma
    h = fma(x, 0.5, 0.0)  # gelu(x) = h + h tanh(h (2 k0 + 8 k1 h^2)): the constants as gemm_ws writes them (0x3491, 0x3E62)
    q = fma(fma(h, h, 0.0), np.float16(0.285419265090401), np.float16(1.5957691216057308))
    q = fma(h, q, 0.0)
    return fma(h, np.tanh(q.astype(np.float64)).astype(np.float16), h)


def test_poly_matches_the_tanh_form_as_closely_as_the_mufu_path() -> None:
    """Over every finite fp16 x (the large ones overflow nothing: relu(x) + a value under 2e-4):
    |poly - tanh form| <= 1.3e-3, within 3% of the MUFU path's own fp16 error, and relative to
    max(|y|, 1) under 1.3e-3 (what the GEMM tests' tolerance allows per value)."""
    x = _all_fp16()
    ref = gelu_poly.reference(x.astype(np.float64))
    with np.errstate(over="ignore", invalid="ignore"):
        got = gelu_poly.emulate(x).astype(np.float64)
        mufu = _mufu_path(x).astype(np.float64)
    ok = np.isfinite(ref) & (np.abs(x) < 30000)  # the MUFU path's x^2 overflows fp16 beyond
    err = np.abs(got - ref)[ok]
    assert err.max() <= 1.3e-3, err.max()
    assert err.max() <= 1.03 * np.abs(mufu - ref)[ok].max(), (err.max(), np.abs(mufu - ref)[ok].max())
    assert (np.abs(got - ref)[ok] / np.maximum(np.abs(ref[ok]), 1.0)).max() <= 1.3e-3
    big = np.abs(x) >= 30000
    assert np.array_equal(got[big & (x > 0)], x[big & (x > 0)].astype(np.float64))  # relu(x) + t q(t) rounds to x
    assert np.all(np.abs(got[big & (x < 0)]) < 2e-4)


def test_poly_keeps_nan_inf_and_signed_zero() -> None:
    got = gelu_poly.emulate(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float16))
    assert np.isnan(got[0]) and got[1] == np.inf and -2e-4 < got[2] <= 0 and got[3] == 0 and got[4] == 0


def test_coefficients_are_the_fit_rounded_to_fp16() -> None:
    c = gelu_poly.coefficients()
    assert len(c) == gelu_poly.DEGREE + 1 and all(np.float16(v) == v for v in c)
    s = np.linspace(-1, 1, 101)  # q(0) = -1/2 (gelu'(0) = 1/2) and q(CLAMP) ~ 0
    q = np.polynomial.Polynomial(c)(s)
    assert abs(q[0] + 0.5) < 2e-3 and abs(q[-1]) < 2e-3 and np.all(q <= 1e-3)


def test_ptx_is_fma_pipe_only() -> None:
    """The PTX: no MUFU instruction (tanh / ex2 / rcp), DEGREE + 2 fma.rn.f16x2 (s, the Horner steps, the
    final relu + t q), one clamp and one NaN-propagating max; every register it writes is declared."""
    ptx = gelu_poly.ptx_pair("$0", "$2")
    assert not re.search(r"tanh|ex2|rcp|lg2|sin|cos", ptx)
    assert ptx.count("fma.rn.f16x2") == gelu_poly.DEGREE + 2
    assert ptx.count("min.f16x2") == 1 and ptx.count("max.NaN.f16x2") == 1 and ptx.count("abs.f16x2") == 1
    declared = set(re.findall(r"%kp_\w+", gelu_poly.PTX_REGS))
    assert set(re.findall(r"%kp_\w+", ptx)) <= declared


# ---- the generated module's GELU asm, run by an f16x2 PTX emulator ----------------------------------

BIAS_GELU_FNS = {"_gelu_f16x2": (1, False), "_bias_gelu_f16x2": (1, True), "_gelu_mix_f16x2": (2, False), "_bias_gelu_mix_f16x2": (2, True)}


def test_every_inline_asm_gelu_of_gemm_ws_computes_the_tanh_form() -> None:
    """Each f16x2 GELU of the generated ping-pong module (MUFU only, the mixed ones, with and without the
    bias row) on random fp16 pairs of x and row / 2 and on special values: every output register equals
    the tanh-form GELU of x + row within the fp16 forms' error (the bias forms round (x + row) / 2 once)."""
    from ptx_f16x2 import asm_of, run

    from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
    from kfuse.kernels import gemm_ws
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    add = EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))
    src = gemm_ws.kernel_source(Epilogue((add, EpilogueStep("gelu", (Operand("reg", 1),))), 1), True, "prefetch", True, True)
    rng = np.random.default_rng(0)
    n = 4096
    for fn, (regs, has_row) in BIAS_GELU_FNS.items():
        asm = asm_of(src, fn)
        xs = [tuple(gelu_poly._f16(rng.uniform(-7, 7, n)) for _ in range(2)) for _ in range(regs)]
        xs[0] = (gelu_poly._f16(np.r_[np.array([0.0, -0.0, 1e-4, -1e-4, 3.99, -4.01, 20.0, -20.0]), rng.uniform(-7, 7, n - 8)]), xs[0][1])
        rows = [tuple(gelu_poly._f16(rng.uniform(-1, 1, n)) for _ in range(2)) for _ in range(regs)] if has_row else []
        outs = run(asm, xs + rows, regs)
        for r in range(regs):
            for h in (0, 1):
                x = xs[r][h].astype(np.float64) + (2 * rows[r][h].astype(np.float64) if has_row else 0.0)
                ref = gelu_poly.reference(x)
                err = np.abs(outs[r][h].astype(np.float64) - ref) / np.maximum(np.abs(ref), 1.0)
                assert err.max() < 2.5e-3, (fn, r, h, float(err.max()), x[err.argmax()])
