"""cuBLAS / cuBLASLt as a second candidate for every ``gemm_epilogue`` node.

Measured on the H200 (``benchmarks/experiments/gemm_variants.py``, docs/perf-notes.md): on the
K=768 GEMMs of BERT and GPT-2, cuBLAS reaches ~610 TFLOP/s where the best Triton template
(TMA loads, wgmma) reaches 330-390, and cuBLASLt's fused bias+GELU epilogue costs only 3-15%
over the bare GEMM. A fused epilogue does not pay for a 1.6x slower main loop, so, like
TensorRT's tactic selection and like the conv template-or-cuDNN choice, each GEMM node gets two
candidates timed at compile time from CUDA graphs (launch overhead excluded, as in the plan):

* the template: the whole epilogue fused into the Triton GEMM;
* the library: cuBLAS(Lt) with the part of the epilogue it can fuse (a bias vector, then ReLU or
  GELU: ``torch.addmm`` / ``torch._addmm_activation``), the rest of the epilogue applied by one
  generated elementwise kernel (the split-K reduce kernel of the template with one slice).

cuBLASLt's GELU epilogue is the tanh form; exact (erf) GELU differs from it by < 5e-4 absolute,
below fp16 resolution for |x| > 0.5. ``KFUSE_EXACT_GELU=1`` keeps exact GELU in the generated
kernel instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kfuse.kernels import epilogue
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.runtime.choice import choose, library_mode, problem_key

_ACTIVATIONS = {"relu": "relu", "gelu_tanh": "gelu", "gelu": "gelu"}


@dataclass(frozen=True)
class LibrarySplit:
    """Which part of an epilogue the library call absorbs."""

    bias: int | None  # extra input consumed as the bias vector (checked again at run time)
    activation: str | None  # "relu" | "gelu" fused by cuBLASLt (2-D GEMMs with a bias only)
    rest: Epilogue  # what is left, register 0 = the library's output

    def describe(self) -> str:
        # cuBLASLt's GELU epilogue is the tanh form (kfuse's GELU policy lets it stand in for the erf form)
        act = {"gelu": "gelu(tanh)"}.get(self.activation or "", self.activation)
        fused = ["gemm"] + (["bias"] if self.bias is not None else []) + ([act] if act else [])
        tail = f" + kernel[{self.rest.describe()}]" if self.rest.steps else ""
        return "cuBLAS(" + "+".join(fused) + ")" + tail


def _shift(epi: Epilogue, p: int) -> Epilogue | None:
    """``epi`` without its first ``p`` steps (register p becomes the accumulator); None when a
    later step still reads a register the library consumed."""
    steps = []
    for s in epi.steps[p:]:
        args = []
        for a in s.args:
            if a.kind == "reg":
                if a.index < p:
                    return None
                a = Operand("reg", a.index - p)
            args.append(a)
        steps.append(EpilogueStep(s.op, tuple(args), s.attrs, s.dtype))
    return Epilogue(tuple(steps), epi.n_inputs)


def split_epilogue(epi: Epilogue, batched: bool, exact_gelu: bool | None = None, dtype: torch.dtype | None = None) -> LibrarySplit:
    """The longest prefix of ``epi`` that cuBLAS(Lt) can fuse: ``add(acc, in_j)`` (a bias when
    ``in_j`` turns out to be a row vector), then ``relu``/``gelu`` (2-D GEMMs only; GELU as the
    policy ``epilogue.exact_gelu`` allows for the GEMM's ``dtype``)."""
    if exact_gelu is None:
        exact_gelu = epilogue.exact_gelu(dtype)
    steps = epi.steps
    bias = act = None
    p = 0
    if steps and steps[0].op == "add" and len(steps[0].args) == 2:
        kinds = {(a.kind, a.index) for a in steps[0].args}
        ins = [a.index for a in steps[0].args if a.kind == "in"]
        if ("reg", 0) in kinds and len(ins) == 1:
            bias, p = ins[0], 1
    if bias is not None and not batched and len(steps) > p:
        s = steps[p]
        name = _ACTIVATIONS.get(s.op)
        if name and not (s.op == "gelu" and exact_gelu) and len(s.args) == 1 and s.args[0] == Operand("reg", p):
            act, p = name, p + 1
    while p > 0:
        rest = _shift(epi, p)
        if rest is not None:
            return LibrarySplit(bias, act if p >= 2 else None, rest)
        p -= 1
        act = None
        if p == 0:
            bias = None
    return LibrarySplit(None, None, epi)


def gemm_library(
    a: torch.Tensor, b: torch.Tensor, extras: list[torch.Tensor], epi: Epilogue, split: LibrarySplit, out_dtype: torch.dtype
) -> torch.Tensor:
    """``epi(a @ b, *extras)`` with cuBLAS(Lt) for the GEMM and the fusable prefix of the epilogue,
    one generated elementwise kernel for the rest."""
    from kfuse.kernels.gemm import epilogue_pass, prepare

    g = prepare(a, b, extras, out_dtype)
    nb = g.a.shape[0]
    if a.dtype != b.dtype or not a.dtype.is_floating_point:
        raise TypeError(f"library GEMM needs matching floating operands, got {a.dtype} and {b.dtype}")
    bias = None
    rest = split.rest
    act = split.activation
    if split.bias is not None:
        e = g.extras[split.bias]
        if e.stride(0) == 0 and e.stride(1) == 0 and e.dtype == g.a.dtype:
            bias = e[0, 0]
        else:  # not a bias vector after all: the whole epilogue goes to the kernel
            rest, act = epi, None
    if nb == 1:
        a2, b2 = g.a[0], g.b[0]
        if bias is not None and act is not None and a2.is_cuda:  # cuBLASLt's epilogue: GELU in the tanh form
            y = torch._addmm_activation(bias, a2, b2, use_gelu=act == "gelu")
        elif bias is not None and act is not None:  # elsewhere the same maths, unfused
            y = torch.addmm(bias, a2, b2)
            y = torch.nn.functional.gelu(y, approximate="tanh") if act == "gelu" else torch.relu(y)
        elif bias is not None:
            y = torch.addmm(bias, a2, b2)
        else:
            y = torch.mm(a2, b2)
        y = y.unsqueeze(0)
    else:
        y = torch.baddbmm(bias, g.a, g.b) if bias is not None else torch.bmm(g.a, g.b)
    if not rest.steps:
        return (y if y.dtype == out_dtype else y.to(out_dtype)).view(g.out_shape)
    epilogue_pass(g, rest, y.contiguous())
    return g.c.view(g.out_shape)


# ---------------------------------------------------------------------------------------
# the lowering's choice between the template and the library
# ---------------------------------------------------------------------------------------
def maybe_library_step(
    node: Any, graph: Any, backend: str, run_template: Any, info: Any, options: Any = None,
    more: dict[str, tuple[Any, Any]] | None = None, row_scale: Any = None,
) -> Any:  # fmt: skip
    """The Step to use instead of the template when the library (or one of ``more``, other kfuse kernels: name ->
    (run, KernelInfo)) is the better or the forced choice; None keeps the template. ``row_scale``: applied to the
    A operand before the library's GEMM (a folded RMSNorm's scale, ``fold_row_norm``)."""
    from kfuse.runtime.executor import KernelInfo, Step
    from kfuse.runtime.plan_alternatives import offer, runners_up

    more = dict(more or {})
    mode = library_mode(options)
    if backend == "torch":
        return None
    a_t, b_t = graph.type_of(node.inputs[0]), graph.type_of(node.inputs[1])
    library_ok = mode != "never" and a_t.dtype == b_t.dtype and a_t.dtype in (torch.float16, torch.bfloat16, torch.float32)
    epi: Epilogue = node.attrs["epilogue"]
    split = split_epilogue(epi, batched=b_t.rank > 2, dtype=a_t.dtype)
    out_dtype = node.ttype.dtype

    def run_library(xs: list[torch.Tensor]) -> torch.Tensor:
        a = row_scale(xs[0]) if row_scale is not None else xs[0]
        return gemm_library(a, xs[1], xs[2:], epi, split, out_dtype)

    def library_step(why: str) -> Any:
        kinfo = KernelInfo(node.name, "library_gemm", info.ops, f"{split.describe()}: {why}", epi.describe())
        return Step(node.name, node.inputs, run_library, kinfo)

    if library_ok and mode == "always":
        return library_step("forced (gemm_library='always')")
    if not (backend == "triton" and torch.cuda.is_available()) or not (more or (library_ok and mode == "auto")):
        return None
    cands = {"template": run_template} | ({"library": run_library} if library_ok and mode == "auto" else {})
    cands |= {name: run for name, (run, _) in more.items()}
    key = problem_key(node, graph, str(node.attrs.get("config")))
    choice, times = choose(node, graph, cands, key, reference="template" if more else None)  # more: checked against the template
    if choice == "template":
        return None
    why = f"{times[choice] * 1e3:.1f} us vs template {info.config} {times['template'] * 1e3:.1f} us"
    others = sorted((t, n) for n, t in times.items() if n not in (choice, "template"))[:3]
    why += f" (then {', '.join(f'{n} {t * 1e3:.1f}' for t, n in others)})" if others else ""
    # a close kfuse runner-up may do in the plan what the race cannot see (its weight into L2 before the PDL wait):
    # the plan times it again (runtime/plan_alternatives); the library's winner is the case that matters
    if choice == "library":
        return offer(library_step(why), key, choice, {n: more[n] for n in runners_up(times, choice, lambda n: n in more)})
    run, kinfo = more[choice]
    return Step(node.name, node.inputs, run, KernelInfo(kinfo.name, kinfo.template, kinfo.ops, f"{kinfo.config}: {why}", kinfo.epilogue))
