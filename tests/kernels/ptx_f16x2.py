"""A small emulator of the f16x2 PTX that kfuse's inline-asm GELUs use (for CPU tests): every b32
register is two fp16 arrays (its low and high halves), each instruction is applied per half in fp16
with one rounding, and tanh.approx is an exact tanh rounded to fp16 (the MUFU's own error aside)."""

from __future__ import annotations

import ast
import re

import numpy as np

Pair = tuple[np.ndarray, np.ndarray]


def _f16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, np.float64).astype(np.float16)


_OPS = {
    "mul.rn.f16x2": lambda a, b: _f16(a.astype(np.float64) * b),
    "add.rn.f16x2": lambda a, b: _f16(a.astype(np.float64) + b),
    "fma.rn.f16x2": lambda a, b, c: _f16(a.astype(np.float64) * b + c),
    "abs.f16x2": np.abs,
    "min.f16x2": np.fmin,  # the non-NaN operand
    "max.NaN.f16x2": np.maximum,  # NaN propagates
    "tanh.approx.f16x2": lambda a: _f16(np.tanh(a.astype(np.float64))),
}


def run(asm: str, inputs: list[Pair], n_out: int) -> list[Pair]:
    """Run ``asm`` (one inline_asm_elementwise string: ``$0..$n_out-1`` the outputs, then the inputs)."""
    regs: dict[str, Pair] = {f"${n_out + i}": p for i, p in enumerate(inputs)}
    size = inputs[0][0].shape
    for stmt in asm.replace("{", " ").replace("}", " ").split(";"):
        stmt = stmt.strip()
        if not stmt or stmt.startswith(".reg"):
            continue
        op, _, rest = stmt.partition(" ")
        args = [a.strip() for a in rest.split(",")]
        if op == "mov.b32":
            bits = int(args[1], 0)
            lo, hi = (np.full(size, np.uint16(v)).view(np.float16) for v in (bits & 0xFFFF, bits >> 16))
            regs[args[0]] = (lo, hi)
            continue
        if op not in _OPS:
            raise NotImplementedError(f"ptx_f16x2: {op}")
        srcs = [regs[a] for a in args[1:]]  # a KeyError here: a register read before it was written
        with np.errstate(invalid="ignore", over="ignore"):
            regs[args[0]] = tuple(_OPS[op](*(s[h] for s in srcs)) for h in (0, 1))  # type: ignore[assignment]
    return [regs[f"${i}"] for i in range(n_out)]


def asm_of(source: str, function: str) -> str:
    """The asm string of the inline_asm_elementwise call in ``function`` of a generated module's source."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "inline_asm_elementwise":
                    return call.args[0].value  # type: ignore[attr-defined]
    raise LookupError(f"no inline asm in {function}")


def n_regs(constraints: str) -> tuple[int, int]:
    outs = len(re.findall(r"=r", constraints))
    return outs, constraints.count("r") - outs
