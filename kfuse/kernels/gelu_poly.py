"""GELU on f16x2 pairs with no MUFU op: a polynomial on the FMA pipe, for epilogues the MUFU bounds.

Why: the GEMM epilogue's tanh-form GELU takes one MUFU op a value (``tanh.approx.f16x2`` is two
``MUFU.TANH.F16`` on sm_90), and the MUFU retires 16 values a cycle per SM against the FMA pipe's
128 (256 on f16x2 pairs). Where nothing else runs beside an epilogue (a program's last tile: BERT
T4096's one-tile shapes), the MUFU bounds it: ~1,536 cycles for a 192 x 128 tile, about half of the
epilogue's 1.5-1.7 us (docs/perf-notes.md, session 30). Sending half the values through this
polynomial instead moves their work onto the idle FMA pipe.

The form: with t = min(|x|, 4) and q(t) ~ -(1 - tanh(u(t))) / 2, u the tanh form's argument,

    gelu(x) = relu(x) + t * q(t)

(for x > 0: x - x (1 - Phi) ; for x < 0: -|x| Phi(-|x|); ``Phi`` as the tanh form writes it), with q
a degree-6 polynomial in s = t / 2 - 1 on [-1, 1] (Chebyshev least squares, rounded to fp16). In
fp16 arithmetic (``emulate``) its error against the tanh form is 1.25e-3 at most, as large as the
MUFU path's own fp16 error (1.29e-3 with an exact tanh; ``tests/kernels/test_gelu_poly.py``).
Per pair of values the PTX is 8 ``fma.rn.f16x2`` and 2 ``min``/``max`` (HMNMX2: ``min`` with ``|x|``, a
NaN-propagating ``max``), against the MUFU path's 5 FMA-pipe instructions and 2 MUFU ops; ptxas adds moves
of the constants (on sm_90 the 192 x 128 tile's epilogue grew by ~12 FMA-pipe instructions a pair sent
here). Session 31 measured that epilogue, with half its pairs here, bound by one warp's issue rate, no
longer by the MUFU (docs/perf-notes.md).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

CLAMP = 4.0  # t = min(|x|, CLAMP): past it the tanh form's x (1 - Phi(x)) is under 2e-4
DEGREE = 6


def _tanh_phi(x: np.ndarray) -> np.ndarray:
    # Phi(x) as the tanh form writes it: gelu(x) = x Phi(x)
    return 0.5 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@lru_cache(maxsize=1)
def coefficients() -> tuple[float, ...]:
    """q's coefficients in s = t / 2 - 1, lowest power first, as fp16 values."""
    t = np.linspace(0.0, CLAMP, 40001)
    q = _tanh_phi(t) - 1.0  # -(1 - tanh(u(t))) / 2
    s = t * (2.0 / CLAMP) - 1.0
    fit = np.polynomial.chebyshev.Chebyshev.fit(s, q, DEGREE, domain=[-1.0, 1.0])
    return tuple(float(c) for c in fit.convert(kind=np.polynomial.Polynomial).coef.astype(np.float16))


def _f16(a: np.ndarray | float) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(np.float16)


def _fma(a: np.ndarray, b: np.ndarray | float, c: np.ndarray | float) -> np.ndarray:
    # fma.rn.f16x2: one rounding (the float64 product and sum of fp16 values are exact or nearly so)
    return _f16(np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64))


def emulate(x: np.ndarray) -> np.ndarray:
    """The PTX of ``ptx_pair`` step by step in fp16 (numpy), for tests: ``x`` fp16, returns fp16."""
    x = _f16(x)
    with np.errstate(invalid="ignore"):
        t = np.fmin(np.abs(x), np.float16(CLAMP))  # min.f16x2: the non-NaN operand
        s = _fma(t, 0.5, -1.0)
        c = coefficients()
        a = np.full_like(s, np.float16(c[-1]))
        for k in range(len(c) - 2, -1, -1):
            a = _fma(a, s, c[k])
        r = np.maximum(x, np.float16(0.0))  # max.NaN.f16x2: NaN propagates
        return _fma(t, a, r)


def reference(x: np.ndarray) -> np.ndarray:
    """The tanh-form GELU in float64 (what both epilogue paths approximate)."""
    x = np.asarray(x, np.float64)
    return x * _tanh_phi(x)


def _splat(value: float) -> str:
    bits = int(np.array(value, dtype=np.float16).view(np.uint16))
    return f"0x{bits:04X}{bits:04X}"


def ptx_pair(out: str, v: str) -> str:
    """PTX computing ``out = gelu(v)`` on one f16x2 register with no MUFU op; it uses the registers
    %kp_t, %kp_s, %kp_a, %kp_c, %kp_r, which the caller declares (``PTX_REGS``)."""
    c = coefficients()
    lines = [
        f"abs.f16x2 %kp_t, {v};",
        f"mov.b32 %kp_c, {_splat(CLAMP)};",
        "min.f16x2 %kp_t, %kp_t, %kp_c;",
        f"mov.b32 %kp_c, {_splat(-1.0)};",
        f"mov.b32 %kp_s, {_splat(0.5)};",
        "fma.rn.f16x2 %kp_s, %kp_t, %kp_s, %kp_c;",
        f"mov.b32 %kp_a, {_splat(c[-1])};",
    ]
    for k in range(len(c) - 2, -1, -1):
        lines += [f"mov.b32 %kp_c, {_splat(c[k])};", "fma.rn.f16x2 %kp_a, %kp_a, %kp_s, %kp_c;"]
    lines += ["mov.b32 %kp_c, 0;", f"max.NaN.f16x2 %kp_r, {v}, %kp_c;", f"fma.rn.f16x2 {out}, %kp_t, %kp_a, %kp_r;"]
    return " ".join(lines)


PTX_REGS = ".reg .b32 %kp_t, %kp_s, %kp_a, %kp_c, %kp_r;"
