"""Programmatic dependent launch (kfuse.kernels.pdl): the launch keyword and the in-kernel wait always
go together, plans open the scope, and the compiled kernels wait before touching memory."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from cubin_facts import run_offline_script

import kfuse
from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.kernels import pdl
from kfuse.runtime.executor import KernelInfo, Plan, Step, lower, run_steps

KERNELS = Path(kfuse.__file__).parent / "kernels"


def test_launch_kwargs_only_inside_a_scope_and_never_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pdl, "interpreting", lambda: False)
    assert pdl.launch_kwargs() == {"PDL": False}
    with pdl.scope(True):
        assert pdl.launch_kwargs() == {"PDL": True, "launch_pdl": True}
        with pdl.scope(False):
            assert pdl.launch_kwargs() == {"PDL": False}
        assert pdl.active()
    assert not pdl.active()
    monkeypatch.setattr(pdl, "interpreting", lambda: True)
    with pdl.scope(True):
        assert pdl.launch_kwargs() == {"PDL": False}


def _plan(flag: bool, seen: list[bool]) -> Plan:
    gb = GraphBuilder()
    x = gb.add_input("x", TensorType((2,), torch.float32))
    y = gb.op("relu", [x])
    graph = gb.build([y])

    def fn(xs: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(pdl._ENABLED.get())
        return xs[0] + 1

    step = Step(y, (x,), fn, KernelInfo(name="relu", template="test", ops=("relu",)))
    return Plan(graph, [step], "triton", release_after=[[]], use_memory_plan=False, pdl=flag)


@pytest.mark.parametrize("flag", [False, True])
def test_a_plans_steps_run_inside_its_scope(flag: bool) -> None:
    seen: list[bool] = []
    plan = _plan(flag, seen)
    env = {n: torch.ones(2) for n, _ in plan.graph.inputs}
    run_steps(plan, env, 0, 1)
    assert seen == [flag] and not pdl._ENABLED.get()


def test_options_pdl_reaches_the_plan_on_the_gpu_backend_only() -> None:
    from kfuse.compiler import Options

    g = GraphBuilder().build([])
    assert lower(g, torch.device("cpu"), backend="triton", options=Options(pdl=True)).pdl
    assert Options().pdl  # on by default since measured (session 23)
    assert not lower(g, torch.device("cpu"), backend="triton", options=Options(pdl=False)).pdl
    assert not lower(g, torch.device("cpu"), backend="torch", options=Options(pdl=True)).pdl


def _launched_kernels(tree: ast.AST) -> set[str]:
    """Names of the kernels a module launches as ``name[grid](..., **pdl.launch_kwargs())``. The
    generated templates (GEMM, conv, Gluon GEMM, pointwise), launched through helpers, are checked
    on their rendered sources in ``test_the_generated_kernels_wait_first``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            uses = any(
                isinstance(k.value, ast.Call) and ast.unparse(k.value) == "pdl.launch_kwargs()" for k in node.keywords if k.arg is None
            )
            if uses:
                names.add(ast.unparse(node.func.value))
    return names


def _first_statement(fn: ast.FunctionDef) -> str:
    """The kernel's first statement that touches memory or waits: statements before it may only compute indices and
    prefetch a constant weight into L2 (``kernels/prefetch.py``: no value is read, so nothing can be stale)."""
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    for st in body:
        calls = [ast.unparse(c.func) for c in ast.walk(st) if isinstance(c, ast.Call)]
        if ast.unparse(st) in ("pdl_start(PDL)", "_pdl_start(PDL)") or any(
            w in c for c in calls for w in ("load", "store", "atomic", "asm", "wait", "pdl")
        ):
            return ast.unparse(st)
        assert all(c in _PRE_WAIT_CALLS for c in calls), (fn.name, calls)  # an unknown call before the wait: say which
    return ""


# what a kernel may call before its PDL wait: indices, and the L2 prefetch of a weight no kernel writes
_PRE_WAIT_CALLS = {"tl.program_id", "tl.cdiv", "min", "max", "prefetch_slab"}


@pytest.mark.parametrize("module", ["attention", "attention_ws", "norm", "rotary", "pool", "gated_gemm"])
def test_every_kernel_launched_with_pdl_waits_first(module: str) -> None:
    """The invariant PDL needs: a kernel launched with the attribute waits (``pdl_start(PDL)``) before
    anything else; one that did not could read what the previous kernel has not written yet."""
    tree = ast.parse((KERNELS / f"{module}.py").read_text())
    launched = _launched_kernels(tree)
    assert launched, f"{module}: no launch with pdl.launch_kwargs()"
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    for name in launched:
        assert "PDL" in [a.arg for a in defs[name].args.args], name
        assert _first_statement(defs[name]) == "pdl_start(PDL)", name


def test_the_generated_kernels_wait_first() -> None:
    from kfuse.kernels import conv, gemm, gemm_ws, pointwise, skinny_gemm
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
    sources = {"gemm": gemm.kernel_source(epi), "gemm_ws": gemm_ws.kernel_source(epi), "conv": conv.kernel_source(epi),
               "skinny": skinny_gemm.kernel_source(epi)}  # fmt: skip
    ew = pointwise.PointwiseProgram((False, False), (pointwise.PStep("add", (pointwise.Arg("in", 0), pointwise.Arg("in", 1))),), (0,))
    sources["pointwise"] = pointwise.kernel_source(ew, pointwise.Variant("ew", 1, (True, True, True), False))
    for family, src in sources.items():
        tree = ast.parse(src)
        kernels = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.endswith("_kernel") and n.decorator_list]
        assert kernels, family
        for fn in kernels:
            assert [a.arg for a in fn.args.args][-1] == "PDL", (family, fn.name)
            assert _first_statement(fn) in ("pdl_start(PDL)", "_pdl_start(PDL)"), (family, fn.name)


_PTX_SCRIPT = r"""
import json
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kfuse.kernels import gemm_ws, norm
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm_ws import WsConfig

def order(ptx):
    lines = ptx.splitlines()
    first = lambda pred: next((i for i, l in enumerate(lines) if pred(l.strip())), None)
    memory = first(lambda l: any(op in l for op in ("ld.global", "st.global", "cp.async", "atom.global")))
    return {"wait": first(lambda l: l.startswith("griddepcontrol.wait")),
            "launch": first(lambda l: l.startswith("griddepcontrol.launch_dependents")), "memory": memory}

out = {}
sig = {n: "*fp16" for n in ("X", "A0", "A1", "A2", "W", "Bias", "Y")}
sig.update({n: "i32" for n in ("M", "N", "stride_x", "stride_a0", "stride_a1", "stride_a2", "stride_y", "per0", "per1", "per2")})
sig["eps"] = "fp32"
names = norm._norm_fwd.arg_names
const = dict(N_ADD=1, RMS=False, HAS_W=True, HAS_B=True, ROWS=4, BLOCK_N=1024)
for flag in (False, True):
    c = dict(const, PDL=flag)
    s = {n: sig.get(n, "constexpr") for n in names}
    src = ASTSource(norm._norm_fwd, s, {(names.index(k),): v for k, v in c.items()})
    out[f"norm_{flag}"] = order(triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"])
epi = Epilogue((EpilogueStep("add", (Operand("reg", 0), Operand("in", 0))), EpilogueStep("gelu", (Operand("reg", 1),))), 1)
for flag in (False, True):
    ck = gemm_ws.compile_offline(epi, 1024, 768, 768, WsConfig("pingpong", 128, 128, 64, 4, 8), row_broadcast=(True,), pdl_wait=flag)
    out[f"gemm_ws_{flag}"] = order(ck.asm["ptx"])
print(json.dumps(out))
"""


def test_sm90_kernels_wait_before_their_first_global_access() -> None:
    got = run_offline_script(_PTX_SCRIPT, None, timeout=600)
    for fam in ("norm", "gemm_ws"):
        off, on = got[f"{fam}_False"], got[f"{fam}_True"]
        assert off["wait"] is None and off["launch"] is None, (fam, off)
        assert on["wait"] is not None and on["launch"] is not None and on["memory"] is not None, (fam, on)
        assert on["wait"] < on["launch"] < on["memory"], (fam, on)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (sm_90 for programmatic dependent launch)")
@pytest.mark.parametrize("name", ["bert-tiny", "llama-tiny", "resnet-tiny"])
def test_gpu_a_pdl_plan_gives_the_same_bits_in_its_cuda_graph(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel of the plan launched with PDL, replayed from one CUDA graph on fresh inputs, gives
    exactly the outputs of the plan without it: a kernel reading before its predecessor finished
    writing would differ somewhere. Both plans must hold the same kernels for that: the measured
    choices (cuBLAS or template, fused chain or not, and which tiling) are pinned to their rules, as
    two measurements may pick differently (session 28: resnet-tiny's plans differed by 1.2e-4)."""
    import kfuse.models as zoo

    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    monkeypatch.setenv("KFUSE_B2B_DECIDE", "rule")
    monkeypatch.setenv("KFUSE_GATED_DECIDE", "rule")

    torch.manual_seed(0)
    m, a, kw = zoo.build(name, batch=2, seq=64 if name != "resnet-tiny" else None, dtype=torch.float16, device="cuda")
    with torch.no_grad():
        plain = kfuse.compile(m, a, kw, pdl=False)
        fast = kfuse.compile(m, a, kw, pdl=True)
        assert fast.report["pdl"] and fast.report["cuda_graph"].startswith("captured"), fast.report["cuda_graph"]
        for seed in range(5):
            g = torch.Generator(device="cuda").manual_seed(seed)
            xs = tuple(
                torch.randint(0, int(x.max()) + 1, x.shape, device="cuda", generator=g) if not x.is_floating_point()
                else torch.randn(x.shape, device="cuda", dtype=x.dtype, generator=g) for x in a
            )  # fmt: skip
            want = torch.utils._pytree.tree_leaves(plain(*xs, **kw))
            got = torch.utils._pytree.tree_leaves(fast(*xs, **kw))
            for w, o in zip(want, got, strict=True):
                if isinstance(w, torch.Tensor):
                    assert torch.equal(w, o), (name, seed, (w.float() - o.float()).abs().max().item())
