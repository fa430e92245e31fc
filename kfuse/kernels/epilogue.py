"""Epilogue programs: an elementwise chain applied to a kernel's accumulator tile.

A fusion pass turns the elementwise nodes that follow a GEMM or convolution into an
``Epilogue``: a list of steps in SSA form. Register 0 is the accumulator; step ``i`` writes
register ``i + 1``; the last register is the result. Operands are registers, extra input
tensors (loaded at the tile's coordinates, broadcast by strides) or literals.

The same program is rendered to Triton source (``render``) for every template that has an
epilogue, and evaluated with the op registry's references (``apply_reference``) for tests and
the CPU path, so a template never hand-writes a bias/activation/residual combination.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfuse.ir import ops


@dataclass(frozen=True)
class Operand:
    kind: str  # "reg" | "in" | "lit"
    index: int = 0
    value: float | int | bool | None = None

    def describe(self) -> str:
        if self.kind == "reg":
            return "acc" if self.index == 0 else f"r{self.index}"
        if self.kind == "in":
            return f"in{self.index}"
        return repr(self.value)


@dataclass(frozen=True)
class EpilogueStep:
    op: str
    args: tuple[Operand, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    dtype: torch.dtype = torch.float32  # dtype of the value in the unfused graph


@dataclass(frozen=True)
class Epilogue:
    steps: tuple[EpilogueStep, ...] = ()
    n_inputs: int = 0

    def describe(self) -> str:
        if not self.steps:
            return "none"
        parts = []
        for s in self.steps:
            extra = [a.describe() for a in s.args if not (a.kind == "reg" and a.index == len(parts))]
            parts.append(s.op + (f"({', '.join(extra)})" if extra else ""))
        return " -> ".join(parts)

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        """A stable hash naming the generated kernel for this epilogue."""
        text = repr([(s.op, [(a.kind, a.index, a.value) for a in s.args], s.attrs, str(s.dtype)) for s in self.steps])
        return hashlib.sha1(f"{text}|{self.n_inputs}".encode()).hexdigest()[:12]


def exact_gelu(dtype: torch.dtype | None = None) -> bool:
    """kfuse's GELU numerics policy. By default a kernel that fuses GELU into an fp16 or bf16 GEMM
    may compute the exact (erf) GELU in the tanh form, as cuBLASLt's GELU epilogue does: the two
    differ by < 5e-4 (absolute, at x ~ -2.7), under a 16-bit output's rounding for |y| > 0.25.
    fp32 (``dtype``) keeps the erf form: 5e-4 is far above its rounding (session 28's GPU test run
    found fp32 models off by 2e-4 relative through cuBLASLt's epilogue). ``KFUSE_EXACT_GELU=1``
    keeps the erf form everywhere (the library path then applies GELU in a separate kernel)."""
    return os.environ.get("KFUSE_EXACT_GELU", "0") == "1" or dtype == torch.float32


def _literal(v: float | int | bool | None) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "0.0"
    if isinstance(v, float):
        if v != v:
            return "float('nan')"
        if v in (float("inf"), float("-inf")):
            return "3.0e38" if v > 0 else "-3.0e38"
        return repr(v)
    return f"{v}.0" if isinstance(v, int) else repr(v)


def _small_int(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and float(v).is_integer() and abs(v) <= 4


def pow_matches_torch(exponent: object) -> bool:
    """The rendered pow equals torch.pow for this literal exponent: a small integer becomes exact
    products; any other integer or a tensor exponent goes through exp(y * log(x)), NaN for a negative
    base where torch is finite. A non-integer exponent is NaN there in torch too."""
    if not isinstance(exponent, int | float) or isinstance(exponent, bool):
        return False
    return _small_int(exponent) or not float(exponent).is_integer()


_TL_TYPES = {
    torch.bool: "tl.int1",
    torch.int32: "tl.int32",
    torch.int64: "tl.int64",
}


def render(
    epi: Epilogue, acc: str = "acc", inp: Callable[[int], str] = lambda j: f"x{j}", indent: str = "    ",
    exprs: dict[str, str] | None = None,
) -> str:  # fmt: skip
    """Triton statements that apply ``epi`` to the fp32 tile ``acc`` in place.

    ``inp(j)`` names the already-loaded tile of extra input ``j``. Floating values are kept
    in fp32 through the chain; casts to integer or bool types are honoured. ``exprs``: a
    template's own expression for some ops (op name -> format string), instead of the registry's.
    """
    lines: list[str] = []
    regs = [acc]
    for i, step in enumerate(epi.steps):
        d = ops.get(step.op)
        if d.triton is None:
            raise ValueError(f"op {step.op} has no Triton expression and cannot be in an epilogue")
        args = []
        for a in step.args:
            if a.kind == "reg":
                args.append(regs[a.index])
            elif a.kind == "in":
                args.append(inp(a.index))
            else:
                args.append(_literal(a.value))
        # a missing bound (clamp(x, min=None)) is unbounded, not zero
        attrs = {k: _literal(v) for k, v in step.attrs if v is not None}
        attrs.setdefault("lo", "-3.0e38")
        attrs.setdefault("hi", "3.0e38")
        expr = (exprs or {}).get(step.op, d.triton).format(*args, **attrs)
        if step.op == "pow" and step.args[1].kind == "lit" and _small_int(step.args[1].value):
            # exp(y*log(x)) is NaN for x < 0; integer powers are exact products
            e = int(step.args[1].value)  # type: ignore[arg-type]
            prod = " * ".join([args[0]] * abs(e)) if e else "1.0"
            expr = f"({prod})" if e >= 0 else f"(1.0 / ({prod}))"
        if step.op == "cast":
            tl_t = _TL_TYPES.get(step.dtype)
            expr = f"{args[0]}.to({tl_t})" if tl_t else f"{args[0]}.to(tl.float32)"
        name = f"{acc}_r{i + 1}"
        lines.append(f"{indent}{name} = {expr}")
        regs.append(name)
    if epi.steps:
        lines.append(f"{indent}{acc} = {regs[-1]}")
    return "\n".join(lines)


def apply_reference(acc: torch.Tensor, inputs: Sequence[torch.Tensor], epi: Epilogue) -> torch.Tensor:
    """Evaluate ``epi`` with the op registry's PyTorch references."""
    regs = [acc]
    for step in epi.steps:
        args = []
        for a in step.args:
            if a.kind == "reg":
                args.append(regs[a.index])
            elif a.kind == "in":
                args.append(inputs[a.index])
            else:
                args.append(torch.tensor(a.value, device=acc.device))
        regs.append(ops.run_reference(step.op, args, dict(step.attrs)))
    return regs[-1]
