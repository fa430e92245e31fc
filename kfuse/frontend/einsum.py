"""``torch.einsum`` as the IR's permute, sum, reshape and matmul (no fallback).

One operand: a permute of the kept indices and a sum over the rest. Two operands: each index is a batch index
(both operands and the output), a contracted one (both operands, not the output), a kept one (one operand and the
output) or a lone one (one operand only: summed away first). Each operand is permuted to
``[batch..., kept..., contracted...]`` (the second to ``[batch..., contracted..., kept...]``), its kept and
contracted groups are merged into one dim each, and one batched matmul computes ``[batch..., M, N]``; a reshape
splits M and N back and a permute puts the indices in the output's order. MaxViT's attention
(``"BGHID,BGHJD->BGHIJ"``) becomes ``q @ k^T`` over its five dims, which the attention matcher then reads.

Not taken (the converter falls back to PyTorch): a repeated index within one operand (a diagonal), more than two
operands, and a batch index that broadcasts (size 1 in one operand, n in the other).
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass


class EinsumUnsupported(Exception):
    pass


@dataclass(frozen=True)
class Op:
    """One IR op of the plan: ``op`` on ``inputs`` (operand numbers or earlier ops' results, as ``("op", i)``)."""

    op: str
    inputs: tuple[tuple[str, int], ...]
    attrs: tuple[tuple[str, object], ...]


def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' index strings and the output's, with ``...`` spelled out in unused letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise EinsumUnsupported(f"{len(terms)} terms for {len(ranks)} operands")
    used = set(eq) - set(".,->")
    spare = [ch for ch in string.ascii_letters if ch not in used]
    n_ell = max((r - (len(t) - 3) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    ell = "".join(spare[:n_ell])
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            k = r - (len(t) - 3)
            t = t.replace("...", ell[n_ell - k :])
        if len(t) != r:
            raise EinsumUnsupported(f"term {t!r} for a rank-{r} operand")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:  # implicit output: the ellipsis dims, then the indices seen once, in alphabetical order
        counts = {ch: sum(t.count(ch) for t in out_terms) for ch in set("".join(out_terms))}
        out = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch not in ell))
    for t in out_terms:
        if len(set(t)) != len(t):
            raise EinsumUnsupported(f"repeated index in {t!r} (a diagonal)")
    return out_terms, out


def plan(equation: str, shapes: list[tuple[int, ...]]) -> list[Op]:
    """The ops computing ``torch.einsum(equation, *operands)`` for operands of ``shapes``; the last op's result is
    the einsum's (an empty plan: the result is operand 0 itself)."""
    terms, out = parse(equation, [len(s) for s in shapes])
    size: dict[str, int] = {}
    for t, s in zip(terms, shapes, strict=True):
        for ch, n in zip(t, s, strict=True):
            if size.setdefault(ch, n) != n:
                raise EinsumUnsupported(f"index {ch!r} has sizes {size[ch]} and {n} (a broadcast)")
    ops: list[Op] = []

    def emit(op: str, src: tuple[str, int], **attrs: object) -> tuple[str, int]:
        ops.append(Op(op, (src,), tuple(attrs.items())))
        return ("op", len(ops) - 1)

    def reduce_to(src: tuple[str, int], term: str, keep: str) -> tuple[tuple[str, int], str]:
        gone = tuple(i for i, ch in enumerate(term) if ch not in keep)
        if gone:
            src = emit("sum", src, dims=gone, keepdim=False, dtype=None)
            term = "".join(ch for ch in term if ch in keep)
        return src, term

    def permute_to(src: tuple[str, int], term: str, order: str) -> tuple[str, int]:
        dims = tuple(term.index(ch) for ch in order)
        return src if dims == tuple(range(len(dims))) else emit("permute", src, dims=dims)

    if len(terms) == 1:
        src, term = reduce_to(("in", 0), terms[0], out)
        if sorted(term) != sorted(out):
            raise EinsumUnsupported(f"output {out!r} from {term!r}")
        permute_to(src, term, out)
        return ops
    if len(terms) != 2:
        raise EinsumUnsupported(f"{len(terms)} operands")
    ta, tb = terms
    a, ta = reduce_to(("in", 0), ta, tb + out)
    b, tb = reduce_to(("in", 1), tb, ta + out)
    batch = "".join(ch for ch in ta if ch in tb and ch in out)
    contracted = "".join(ch for ch in ta if ch in tb and ch not in out)
    m_idx = "".join(ch for ch in ta if ch not in tb)
    n_idx = "".join(ch for ch in tb if ch not in ta)
    bs = tuple(size[ch] for ch in batch)
    m, n, k = (math.prod(size[ch] for ch in g) for g in (m_idx, n_idx, contracted))
    a = permute_to(a, ta, batch + m_idx + contracted)
    b = permute_to(b, tb, batch + contracted + n_idx)
    if len(m_idx) != 1 or len(contracted) != 1:
        a = emit("reshape", a, shape=(*bs, m, k))
    if len(n_idx) != 1 or len(contracted) != 1:
        b = emit("reshape", b, shape=(*bs, k, n))
    ops.append(Op("matmul", (a, b), ()))
    y: tuple[str, int] = ("op", len(ops) - 1)
    term = batch + m_idx + n_idx
    if len(m_idx) != 1 or len(n_idx) != 1:
        y = emit("reshape", y, shape=tuple(size[ch] for ch in term))
    if term != out:
        if sorted(term) != sorted(out):
            raise EinsumUnsupported(f"output {out!r} from {term!r}")
        emit("permute", y, dims=tuple(term.index(ch) for ch in out))
    return ops


def emit(steps: list[Op], operands: Sequence[str], op: Callable[..., str]) -> str | None:
    """Add the plan's ops with ``op(name, inputs, **attrs)`` (a frontend's node builder); the einsum's value, or None
    for an empty plan (the result is operand 0 itself)."""
    results: list[str] = []
    for step in steps:
        ins = [operands[i] if kind == "in" else results[i] for kind, i in step.inputs]
        results.append(op(step.op, ins, **dict(step.attrs)))
    return results[-1] if results else None
