"""Generated Triton kernels for memory-bound glue: elementwise chains, broadcasts and one
single-axis reduction (softmax, sum/mean/amax/var, global average pooling) in one launch.

A ``PointwiseProgram`` is a list of SSA steps over a *domain* (the full shape of the fused
region) with an optional reduction axis (one or more adjacent logical dims, merged into one).
A value is either *full* (varies along the axis) or *row* (constant along it: reduction results
and inputs broadcast along the axis). The primitive reductions are ``rsum`` and ``rmax``;
softmax, mean and var are decomposed into them by the fusion pass.

Two kernel shapes are generated from the same program:
- elementwise (no axis): a 1-D grid over the domain; operands whose strides match the
  contiguous domain index with ``idx`` directly (vectorised, coalesced), broadcast or
  permuted operands use div/mod index arithmetic over the coalesced dims;
- row (an axis): each program owns ``BLOCK_R`` rows. If the axis fits in one tile the row is
  loaded once and every reduction reuses the registers; otherwise the kernel loops over
  chunks, one pass per reduction level (max, then sum of exp, then the stores for softmax).

Permutes, expands and contiguous reshapes reach the kernel as strided views, so they cost
nothing: index arithmetic uses the real strides (coalesced at launch).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kfuse.ir import ops
from kfuse.kernels import pdl
from kfuse.kernels.codegen import cdiv, generated, interpreting


@dataclass(frozen=True)
class Arg:
    kind: str  # "in" | "reg" | "lit"
    index: int = 0
    value: float | int | bool | None = None

    def describe(self) -> str:
        return f"in{self.index}" if self.kind == "in" else f"r{self.index}" if self.kind == "reg" else repr(self.value)


@dataclass(frozen=True)
class PStep:
    op: str  # an elementwise op of the registry, or "rsum" / "rmax"
    args: tuple[Arg, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    dtype: torch.dtype = torch.float32  # dtype of the value in the unfused graph
    row: bool = False  # constant along the reduction axis


@dataclass(frozen=True)
class PointwiseProgram:
    input_row: tuple[bool, ...]  # input j is constant along the axis
    steps: tuple[PStep, ...]
    outputs: tuple[int, ...]  # register (step index) of each output
    reduces: bool = False
    input_float: tuple[bool, ...] = ()  # input j is floating point (computed in fp32); default all

    def is_float(self, j: int) -> bool:
        return self.input_float[j] if self.input_float else True

    @property
    def n_inputs(self) -> int:
        return len(self.input_row)

    def describe(self) -> str:
        return " -> ".join(s.op for s in self.steps)

    def key(self) -> str:
        return self._key

    @functools.cached_property
    def _key(self) -> str:
        text = repr(
            (
                self.input_row,
                [(s.op, [(a.kind, a.index, a.value) for a in s.args], s.attrs, str(s.dtype), s.row) for s in self.steps],
                self.outputs,
                self.reduces,
                self.input_float,
            )
        )
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def levels(self) -> list[int]:
        """Reduction depth of each step: 0 before any reduction, +1 after each."""
        lv: list[int] = []
        for s in self.steps:
            base = max([lv[a.index] for a in s.args if a.kind == "reg"], default=0)
            lv.append(base + 1 if s.op in ("rsum", "rmax") else base)
        return lv


# ---------------------------------------------------------------------------------------
# Triton expressions
# ---------------------------------------------------------------------------------------
def _literal(v: float | int | bool | None) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if v is None:
        return "0.0"
    v = float(v)
    if v != v:
        return "float('nan')"
    if math.isinf(v):
        return "float('inf')" if v > 0 else "float('-inf')"
    return repr(v)


_TL_TYPES = {torch.bool: "tl.int1", torch.int32: "tl.int32", torch.int64: "tl.int64", torch.int8: "tl.int8", torch.uint8: "tl.uint8"}


def pow_supported(exponent: float | int | bool | None) -> bool:
    """pow is fused only with a literal exponent we can expand exactly (any sign of the base)."""
    if exponent is None or isinstance(exponent, bool):
        return False
    e = float(exponent)
    return e in (0.5, -0.5) or (e.is_integer() and abs(e) <= 4)


def _expr(step: PStep, args: list[str]) -> str:
    if step.op == "cast":
        tl_t = _TL_TYPES.get(step.dtype)
        return f"{args[0]}.to({tl_t})" if tl_t else f"{args[0]}.to(tl.float32)"
    if step.op == "pow":
        e = float(step.args[1].value)  # type: ignore[arg-type]
        if e == 0.5:
            return f"tl.sqrt({args[0]})"
        if e == -0.5:
            return f"tl.rsqrt({args[0]})"
        if e == 0:
            return f"({args[0]} * 0.0 + 1.0)"
        prod = " * ".join([args[0]] * int(abs(e)))
        return f"({prod})" if e > 0 else f"(1.0 / ({prod}))"
    d = ops.get(step.op)
    if d.triton is None:
        raise ValueError(f"op {step.op} has no Triton expression")
    attrs = {k: _literal(v) for k, v in step.attrs if v is not None}  # a missing clamp bound is unbounded
    attrs.setdefault("lo", "float('-inf')")
    attrs.setdefault("hi", "float('inf')")
    attrs.setdefault("slope", "0.01")
    return d.triton.format(*args, **attrs)


# ---------------------------------------------------------------------------------------
# source generation
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """What a launch specialises on besides the program: index rank and dense operands."""

    mode: str  # "ew" | "row" | "loop"
    rank: int  # coalesced (row) dims
    dense: tuple[bool, ...]  # per operand (inputs then outputs): plain contiguous indexing
    idx64: bool


def _decompose(var: str, rank: int, prefix: str, lines: list[str], indent: str) -> None:
    """``var`` (a flat index) -> multi-index ``{prefix}{d}`` over sizes ``s{d}`` (row-major)."""
    rest = var
    for d in range(rank - 1, -1, -1):
        if d == 0:
            lines.append(f"{indent}{prefix}{d} = {rest}")
        else:
            lines.append(f"{indent}{prefix}{d} = {rest} % s{d}")
            lines.append(f"{indent}{prefix}q{d} = {rest} // s{d}")
            rest = f"{prefix}q{d}"


def _offset(j: int, rank: int, prefix: str) -> str:
    return " + ".join(f"{prefix}{d} * st{j}_{d}" for d in range(rank)) or "0"


def _load_line(prog: PointwiseProgram, j: int, off: str, mask: str, ind: str) -> str:
    load = f"tl.load(in{j} + {off}, mask={mask}, other=0)"
    return f"{ind}x{j} = {load}.to(tl.float32)" if prog.is_float(j) else f"{ind}x{j} = {load}"


def kernel_source(prog: PointwiseProgram, var: Variant) -> str:
    n_in, n_out = prog.n_inputs, len(prog.outputs)
    n_ops = n_in + n_out
    ptrs = [f"in{j}" for j in range(n_in)] + [f"out{k}" for k in range(n_out)]
    sizes = [f"s{d}" for d in range(var.rank)]
    strides = [f"st{j}_{d}" for j in range(n_ops) for d in range(var.rank)]
    col_strides = [f"cs{j}" for j in range(n_ops)] if var.mode != "ew" else []
    row_strides = [f"rs{j}" for j in range(n_ops)] if var.mode != "ew" else []
    head = ["N"] if var.mode == "ew" else ["R", "L"]
    params = ptrs + head + sizes + strides + row_strides + col_strides
    consts = ["BLOCK: tl.constexpr"] if var.mode == "ew" else ["BLOCK_R: tl.constexpr", "BLOCK_C: tl.constexpr"]
    lines = [
        "import triton",
        "import triton.language as tl",
        "from kfuse.kernels.pdl import pdl_start",
        "",
        "",
        "@triton.jit",
        "def max_nan(a, b):  # torch.amax's max: a NaN wins (tl.max's default drops it on the GPU)",
        "    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)",
        "",
        "",
        "@triton.jit",
        f"def pointwise_kernel({', '.join(params + consts)}, PDL: tl.constexpr):",
        "    pdl_start(PDL)",
    ]
    ind = "    "
    if var.mode == "ew":
        _ew_body(prog, var, lines, ind)
    else:
        _row_body(prog, var, lines, ind)
    return "\n".join(lines) + "\n"


def _ew_body(prog: PointwiseProgram, var: Variant, lines: list[str], ind: str) -> None:
    idx = "tl.program_id(0).to(tl.int64) * BLOCK" if var.idx64 else "tl.program_id(0) * BLOCK"
    lines.append(f"{ind}idx = {idx} + tl.arange(0, BLOCK)")
    lines.append(f"{ind}mask = idx < N")
    if not all(var.dense):
        _decompose("idx", var.rank, "i", lines, ind)
    offs = [("idx" if var.dense[j] else _offset(j, var.rank, "i")) for j in range(len(var.dense))]
    for j in range(prog.n_inputs):
        lines.append(_load_line(prog, j, offs[j], "mask", ind))
    regs = _emit_steps(prog, range(len(prog.steps)), lines, ind, "mask")
    for k, r in enumerate(prog.outputs):
        j = prog.n_inputs + k
        lines.append(f"{ind}tl.store(out{k} + {offs[j]}, {regs[r]}.to(out{k}.dtype.element_ty), mask=mask)")


def _emit_steps(prog: PointwiseProgram, which: Sequence[int] | range, lines: list[str], ind: str, mask: str) -> dict[int, str]:
    regs: dict[int, str] = {}
    for i in which:
        s = prog.steps[i]
        args = [f"x{a.index}" if a.kind == "in" else f"r{a.index}" if a.kind == "reg" else _literal(a.value) for a in s.args]
        if s.op == "rsum":
            expr = f"tl.sum(tl.where({mask}, {args[0]}, 0.0), axis=1, keep_dims=True)"
        elif s.op == "rmax":
            expr = f"tl.reduce(tl.where({mask}, {args[0]}, float('-inf')), 1, max_nan, keep_dims=True)"
        else:
            expr = _expr(s, args)
        lines.append(f"{ind}r{i} = {expr}")
        regs[i] = f"r{i}"
    return regs


def _row_body(prog: PointwiseProgram, var: Variant, lines: list[str], ind: str) -> None:
    n_ops = len(var.dense)
    row = "tl.program_id(0).to(tl.int64) * BLOCK_R" if var.idx64 else "tl.program_id(0) * BLOCK_R"
    lines.append(f"{ind}rows = {row} + tl.arange(0, BLOCK_R)[:, None]")
    lines.append(f"{ind}rmask = rows < R")
    if not all(var.dense):
        _decompose("rows", var.rank, "i", lines, ind)
    for j in range(n_ops):  # the row part of each operand's offset
        roff = f"rows * rs{j}" if var.dense[j] else _offset(j, var.rank, "i")
        lines.append(f"{ind}ro{j} = {roff}")
    is_in_row = list(prog.input_row)
    for j in range(prog.n_inputs):  # inputs constant along the axis: loaded once per row
        if is_in_row[j]:
            lines.append(_load_line(prog, j, f"ro{j}", "rmask", ind))
    steps = prog.steps
    out_regs = {r: k for k, r in enumerate(prog.outputs)}

    def full_loads(needed_inputs: set[int], ind2: str) -> None:
        for j in sorted(needed_inputs):
            if not is_in_row[j]:
                lines.append(_load_line(prog, j, f"ro{j} + cols * cs{j}", "mask", ind2))

    def store_full(regs: list[int], ind2: str) -> None:
        for r in regs:
            k = out_regs[r]
            j = prog.n_inputs + k
            lines.append(f"{ind2}tl.store(out{k} + ro{j} + cols * cs{j}, r{r}.to(out{k}.dtype.element_ty), mask=mask)")

    def store_row() -> None:
        for r, k in out_regs.items():
            if steps[r].row:
                j = prog.n_inputs + k
                lines.append(f"{ind}tl.store(out{k} + ro{j}, r{r}.to(out{k}.dtype.element_ty), mask=rmask)")

    full_out = [r for r in prog.outputs if not steps[r].row]
    if var.mode == "row":  # the whole row in one tile: load once, compute everything in order
        lines.append(f"{ind}cols = tl.arange(0, BLOCK_C)[None, :]")
        lines.append(f"{ind}mask = rmask & (cols < L)")
        full_loads(set(range(prog.n_inputs)), ind)
        _emit_steps(prog, range(len(steps)), lines, ind, "mask")
        store_full(full_out, ind)
        store_row()
        return

    # loop mode: one pass over the row per reduction level
    lv = prog.levels()
    done: set[int] = set()

    def closure(targets: Sequence[int]) -> list[int]:
        need: set[int] = set()
        stack = list(targets)
        while stack:
            i = stack.pop()
            if i in need or i in done:
                continue
            need.add(i)
            stack.extend(a.index for a in steps[i].args if a.kind == "reg")
        return sorted(need)

    def emit_row_steps() -> None:  # row steps whose inputs are all available
        for i, s in enumerate(steps):
            if i in done or not s.row or s.op in ("rsum", "rmax"):
                continue
            if all(a.kind != "reg" or a.index in done for a in s.args):
                _emit_steps(prog, [i], lines, ind, "rmask")
                done.add(i)

    emit_row_steps()
    max_level = max(lv, default=0)
    for level in range(1, max_level + 1):
        reds = [i for i, s in enumerate(steps) if s.op in ("rsum", "rmax") and lv[i] == level]
        for i in reds:
            fill = "0.0" if steps[i].op == "rsum" else "float('-inf')"
            init = f"tl.full((BLOCK_R, 1), {fill}, tl.float32)"
            lines.append(f"{ind}r{i} = {init}")
        lines.append(f"{ind}for c0 in range(0, L, BLOCK_C):")
        ind2 = ind + "    "
        lines.append(f"{ind2}cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        lines.append(f"{ind2}mask = rmask & (cols < L)")
        body = [k for k in closure([a.index for i in reds for a in steps[i].args if a.kind == "reg"])]
        full_loads({a.index for k in body for a in steps[k].args if a.kind == "in"} | _direct_inputs(prog, reds), ind2)
        _emit_steps(prog, body, lines, ind2, "mask")
        for i in reds:
            a = steps[i].args[0]
            src = f"x{a.index}" if a.kind == "in" else f"r{a.index}"
            if steps[i].op == "rsum":
                lines.append(f"{ind2}r{i} += tl.sum(tl.where(mask, {src}, 0.0), axis=1, keep_dims=True)")
            else:
                lines.append(f"{ind2}r{i} = max_nan(r{i}, tl.reduce(tl.where(mask, {src}, float('-inf')), 1, max_nan, keep_dims=True))")
        done.update(reds)
        emit_row_steps()
    if full_out:
        lines.append(f"{ind}for c0 in range(0, L, BLOCK_C):")
        ind2 = ind + "    "
        lines.append(f"{ind2}cols = c0 + tl.arange(0, BLOCK_C)[None, :]")
        lines.append(f"{ind2}mask = rmask & (cols < L)")
        body = closure(full_out)
        full_loads({a.index for k in body for a in steps[k].args if a.kind == "in"}, ind2)
        _emit_steps(prog, body, lines, ind2, "mask")
        store_full(full_out, ind2)
    store_row()


def _direct_inputs(prog: PointwiseProgram, reds: list[int]) -> set[int]:
    return {a.index for i in reds for a in prog.steps[i].args if a.kind == "in"}


# ---------------------------------------------------------------------------------------
# launch
# ---------------------------------------------------------------------------------------

MAX_ROW_TILE = 8192  # longest axis kept in registers in one tile


def _coalesce(sizes: list[int], strides: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that are contiguous for every operand."""
    keep = [d for d, s in enumerate(sizes) if s != 1]
    sz = [sizes[d] for d in keep]
    st = [[s[d] for d in keep] for s in strides]
    d = len(sz) - 2
    while d >= 0:
        if all(s[d] == s[d + 1] * sz[d + 1] for s in st):
            sz[d] *= sz[d + 1]
            for s in st:
                s[d] = s[d + 1]
                del s[d + 1]
            del sz[d + 1]
        d -= 1
    return sz, st


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _kernel(prog: PointwiseProgram, var: Variant) -> Any:
    key = f"{prog.key()}_{var.mode}{var.rank}_{''.join('d' if x else 's' for x in var.dense)}{'_64' if var.idx64 else ''}"
    return generated("pointwise", key, lambda: kernel_source(prog, var)).pointwise_kernel


def run_program(
    prog: PointwiseProgram,
    inputs: Sequence[torch.Tensor],
    domain: tuple[int, ...],
    axis: tuple[int, ...],
    out_dtypes: Sequence[torch.dtype],
    outs: Sequence[torch.Tensor | None] | None = None,
) -> list[torch.Tensor]:
    """Run ``prog`` on ``inputs`` (each broadcastable to ``domain``); returns the outputs in the
    domain frame: full outputs have shape ``domain``, row outputs have the axis dims set to 1.

    ``outs`` may give preallocated output tensors of those shapes: contiguous ones (the planner's arena) are
    used in the layout the outputs take (``result_strides``), strided ones (elementwise only: a slice of a
    cat's buffer) as they are."""
    if len(inputs) != prog.n_inputs:
        raise ValueError(f"pointwise kernel takes {prog.n_inputs} inputs, got {len(inputs)}")
    device = inputs[0].device if inputs else torch.device("cuda")
    row_shape = tuple(1 if d in axis else s for d, s in enumerate(domain))
    result: list[torch.Tensor] = []
    for k, r in enumerate(prog.outputs):
        shape = row_shape if prog.steps[r].row else domain
        given = outs[k] if outs is not None and k < len(outs) else None
        if given is not None and not axis and not given.is_contiguous() and tuple(given.shape) == shape:
            result.append(given)  # an elementwise result into a strided slice (a cat's buffer): its own strides
            continue
        if given is not None and (tuple(given.shape) != shape or not given.is_contiguous()):
            raise ValueError(f"pointwise out buffer {k} has shape {tuple(given.shape)}, expected contiguous {shape}")
        strides = None if axis or prog.steps[r].row else result_strides(inputs, domain, given)
        if given is not None:
            result.append(given if strides is None else given.as_strided(shape, strides))
        elif strides is not None:
            result.append(torch.empty_strided(shape, strides, dtype=out_dtypes[k], device=device))
        else:
            result.append(torch.empty(shape, dtype=out_dtypes[k], device=device))
    numel = math.prod(domain)
    if numel == 0:
        return result
    ins = [torch.broadcast_to(x, domain) for x in inputs]
    operands = ins + [torch.broadcast_to(o, domain) for o in result]
    if not axis:
        return _launch_ew(prog, ins, result, operands, domain, numel)
    return _launch_row(prog, ins, result, operands, domain, axis)


def result_strides(inputs: Sequence[torch.Tensor], domain: tuple[int, ...], given: torch.Tensor | None = None) -> tuple[int, ...] | None:
    """The strides of an elementwise result over ``domain``, None for the standard (row-major) ones.

    A result is channels-last where a full-size 4-D operand is (PyTorch's rule for elementwise ops), so
    a kernel between two NHWC convolutions writes what the next one reads along its channels; row-major
    there would make this kernel's reads and the next conv's loads stride by the map's H*W. A result
    written into an operand's own bytes (``given`` is that operand's buffer: the planner's in-place
    reuse) takes that operand's strides, so every element lands where it was read."""
    if given is not None:
        for x in inputs:
            if tuple(x.shape) == domain and x.data_ptr() == given.data_ptr():
                return None if x.is_contiguous() else tuple(x.stride())
    if len(domain) != 4:
        return None
    for x in inputs:
        if tuple(x.shape) == domain and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            n, c, h, w = domain
            return (h * w * c, 1, w * c, c)
    return None


def _launch_ew(prog: PointwiseProgram, ins: list[torch.Tensor], result: list[torch.Tensor], operands: list[torch.Tensor],
               domain: tuple[int, ...], numel: int) -> list[torch.Tensor]:  # fmt: skip
    sizes, strides = _coalesce(list(domain), [list(o.stride()) for o in operands])
    if not sizes:
        sizes, strides = [1], [[0] for _ in operands]
    contig = [math.prod(sizes[d + 1 :]) for d in range(len(sizes))]
    dense = tuple(s == contig for s in strides)
    idx64 = _needs_64(numel, sizes, strides)
    var = Variant("ew", len(sizes), dense, idx64)
    block = 1024 if not interpreting() else 128
    warps = 4
    grid = (cdiv(numel, block),)
    flat = [s for st in strides for s in st]
    _kernel(prog, var)[grid](*ins, *result, numel, *sizes, *flat, BLOCK=block, num_warps=warps, **pdl.launch_kwargs())
    return result


def _needs_64(numel: int, sizes: list[int], strides: list[list[int]]) -> bool:
    span = max((sum((s - 1) * abs(t) for s, t in zip(sizes, st, strict=True)) for st in strides), default=0)
    return max(numel, span + 1) >= 2**31


def _launch_row(prog: PointwiseProgram, ins: list[torch.Tensor], result: list[torch.Tensor], operands: list[torch.Tensor],
                domain: tuple[int, ...], axis: tuple[int, ...]) -> list[torch.Tensor]:  # fmt: skip
    axis = tuple(sorted(axis))
    if list(axis) != list(range(axis[0], axis[-1] + 1)):
        raise ValueError(f"pointwise reduction dims {axis} are not adjacent")
    # merge the axis dims into one; an operand whose strides do not allow it is copied
    real = [a for a in axis if domain[a] != 1]  # a size-1 dim's stride says nothing (a [1, 1, 1, 1] sum is (1, 0, 1, 0))
    for j, o in enumerate(operands):
        st = o.stride()
        if any(st[a] != st[b] * domain[b] for a, b in zip(real, real[1:], strict=False)):
            if j >= len(ins):
                raise AssertionError("outputs are contiguous")
            c = o.contiguous()
            ins[j] = c
            operands[j] = c
    length = math.prod(domain[a] for a in axis)
    col_strides = [o.stride(axis[-1]) if domain[axis[-1]] != 1 else 0 for o in operands]
    if length > 1 and any(domain[a] == 1 for a in axis):  # stride of a merged axis with a size-1 part
        col_strides = [_merged_stride(o, axis, domain) for o in operands]
    row_dims = [d for d in range(len(domain)) if d not in axis]
    sizes, strides = _coalesce([domain[d] for d in row_dims], [[o.stride(d) for d in row_dims] for o in operands])
    if not sizes:
        sizes, strides = [1], [[0] for _ in operands]
    rows = math.prod(sizes)
    contig = [math.prod(sizes[d + 1 :]) for d in range(len(sizes))]
    dense, row_strides = [], []
    for st in strides:  # dense: the row offset is rows * stride (one row dim after coalescing)
        ok = len(sizes) == 1 or all(st[d] == contig[d] * st[-1] for d in range(len(sizes)))
        dense.append(ok)
        row_strides.append(st[-1] if ok else 0)
    idx64 = _needs_64(rows * length, sizes + [length], [st + [c] for st, c in zip(strides, col_strides, strict=True)])
    interp = interpreting()
    if length <= (256 if interp else MAX_ROW_TILE):
        block_c = _next_pow2(length)
        mode = "row"
    else:
        block_c = 128 if interp else 2048
        mode = "loop"
    budget = 1024 if interp else 4096  # elements per program
    block_r = max(1, min(_next_pow2(rows), budget // block_c, 64))
    warps = 4 if block_r * block_c <= 2048 else 8 if block_r * block_c <= 8192 else 16
    var = Variant(mode, len(sizes), tuple(dense), idx64)
    grid = (cdiv(rows, block_r),)
    flat = [s for st in strides for s in st]
    _kernel(prog, var)[grid](
        *ins, *result, rows, length, *sizes, *flat, *row_strides, *col_strides,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=warps, **pdl.launch_kwargs(),
    )  # fmt: skip
    return result


def _merged_stride(o: torch.Tensor, axis: tuple[int, ...], domain: tuple[int, ...]) -> int:
    real = [a for a in axis if domain[a] != 1]
    return o.stride(real[-1]) if real else 0


# ---------------------------------------------------------------------------------------
# reference
# ---------------------------------------------------------------------------------------
def reference(
    prog: PointwiseProgram,
    inputs: Sequence[torch.Tensor],
    domain: tuple[int, ...],
    axis: tuple[int, ...],
    out_dtypes: Sequence[torch.dtype],
) -> list[torch.Tensor]:
    """The same program with PyTorch ops, fp32 math, in the domain frame (like ``run_program``)."""
    xs = [torch.broadcast_to(x, domain) for x in inputs]
    xs = [x.float() if x.is_floating_point() else x for x in xs]
    regs: list[torch.Tensor] = []
    for s in prog.steps:
        args = [xs[a.index] if a.kind == "in" else regs[a.index] if a.kind == "reg" else torch.tensor(a.value) for a in s.args]
        if s.op == "rsum":
            v = torch.sum(args[0].float(), dim=axis, keepdim=True)
        elif s.op == "rmax":
            v = torch.amax(args[0].float(), dim=axis, keepdim=True)
        elif s.op == "cast" and s.dtype.is_floating_point:
            v = args[0].float()
        else:
            v = ops.run_reference(s.op, list(args), dict(s.attrs))
            if v.is_floating_point():
                v = v.float()
        regs.append(v)
    row_shape = tuple(1 if d in axis else n for d, n in enumerate(domain))
    outs = []
    for k, r in enumerate(prog.outputs):
        shape = row_shape if prog.steps[r].row else domain
        outs.append(torch.broadcast_to(regs[r], shape).to(out_dtypes[k]).contiguous())
    return outs
