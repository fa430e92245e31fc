"""A few-row RMSNorm folded into the GEMMs that read it (``kfuse.passes.fold_row_norm``): the norm's weight goes
into each GEMM's constant weight (``diag(w) W``), its row scale into the GEMM (``row_rms = eps``), the norm node
disappears and the graph computes what it did; norms or readers the fold cannot take leave the graph as it is.
End to end, a tiny Llama's decode step runs no in-layer norm kernel and generates eager's tokens, on the tiled
kernels and (``KFUSE_SKINNY_GEMM=always``) on the skinny kernel that computes the row scale itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.ir import ops
from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.kernels.skinny_gemm import MAX_ROWS
from kfuse.passes.fold_row_norm import fold_row_norm
from kfuse.passes.fuse_epilogue import fuse_epilogues
from kfuse.passes.fuse_norm import fuse_norms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
K = 37  # the normalised width, the GEMMs' K (odd)
EPS = 1e-5


def _rows(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Random rows of very different magnitudes (1e-2 .. 50), so a missing or wrong row scale shows."""
    g = torch.Generator().manual_seed(seed)
    m = 1
    for s in shape:
        m *= s
    scales = torch.logspace(-2, 1.7, m)[torch.randperm(m, generator=g)]
    x = torch.randn(m, K, generator=g) * scales[:, None]
    return x.reshape(*shape, K).to(dtype)


def _const(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) / K**0.5).to(dtype)


def _graph(
    rows: tuple[int, ...] = (3,), dtype: torch.dtype = torch.float32, readers: tuple[str, ...] = ("kn",), *,
    addend: bool = False, eps: float | None = EPS, norm: str = "rms_norm",
) -> tuple[Graph, list[torch.Tensor]]:  # fmt: skip
    """x -> norm -> readers, as fuse_norms and fuse_epilogues leave it. Readers: "kn" a GEMM on a constant [K, N]
    with a bias in its epilogue; "nk" a GEMM on a permute (1, 0) of a constant [N, K] (nn.Linear's layout);
    "runtime" a GEMM on a graph input; "relu" an elementwise reader; "output": the norm is a graph output;
    "same_weight" a GEMM on the previous GEMM's constant; "tied" an embedding of the previous "nk" reader's
    constant (a vocabulary projection tied to the embedding)."""
    b = GraphBuilder("fold")
    x = b.add_input("x", TensorType((*rows, K), dtype))
    xs = [_rows(rows, dtype)]
    if addend:
        r = b.add_input("r", TensorType((*rows, K), dtype))
        xs.append(_rows(rows, dtype, seed=1))
        x = b.op("add", [x, r], name="x_plus_r")
    w = b.add_constant((torch.rand(K, generator=torch.Generator().manual_seed(7)) * 1.5 + 0.25).to(dtype), "norm_w")
    if norm == "rms_norm":
        n = b.op("rms_norm", [x, w], {"normalized_shape": (K,), "eps": eps}, name="norm")
    else:
        bias = b.add_constant(_const((K,), dtype, 8), "norm_b")
        n = b.op("layer_norm", [x, w, bias], {"normalized_shape": (K,), "eps": eps}, name="norm")
    outs: list[str] = []
    last_const = None
    for i, kind in enumerate(readers):
        width = 23 + 6 * i
        if kind == "kn":
            last_const = b.add_constant(_const((K, width), dtype, 10 + i), f"W{i}")
            y = b.op("matmul", [n, last_const], name=f"mm{i}")
            outs.append(b.op("add", [y, b.add_constant(_const((width,), dtype, 20 + i), f"bias{i}")], name=f"y{i}"))
        elif kind == "nk":
            last_const = b.add_constant(_const((width, K), dtype, 10 + i), f"Wt{i}")
            p = b.op("permute", [last_const], {"dims": (1, 0)}, name=f"Wt{i}_T")
            outs.append(b.op("matmul", [n, p], name=f"y{i}"))
        elif kind == "runtime":
            v = b.add_input(f"B{i}", TensorType((K, width), dtype))
            xs.append(_const((K, width), dtype, 30 + i))
            outs.append(b.op("matmul", [n, v], name=f"y{i}"))
        elif kind == "relu":
            outs.append(b.op("relu", [n], name=f"y{i}"))
        elif kind == "output":
            outs.append(n)
        elif kind == "same_weight":
            assert last_const is not None
            outs.append(b.op("matmul", [n, last_const], name=f"y{i}"))
        elif kind == "tied":
            assert last_const is not None
            ids = b.add_input("ids", TensorType((4,), torch.int64))
            xs.append(torch.tensor([0, 5, 2, 11]))
            outs.append(b.op("embedding", [last_const, ids], name=f"y{i}"))
        else:
            raise AssertionError(kind)
    g = fuse_epilogues(fuse_norms(b.build(outs)))
    nodes = g.node_map()
    assert nodes["norm"].op == "fused_norm", g  # the fold's input: the norm template's node
    if "kn" in readers or "nk" in readers:
        assert any(u.op == "gemm_epilogue" and u.inputs[0] == "norm" for u in g.users()["norm"]), g
    return g, xs


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / float(want.float().abs().max())


def _tol(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 2e-2


def _assert_same_values(old: Graph, new: Graph, xs: list[torch.Tensor], dtype: torch.dtype) -> None:
    for want, got, o in zip(reference_run(old, xs), reference_run(new, xs), old.outputs, strict=True):
        assert got.shape == want.shape and got.dtype == want.dtype, o
        assert _rel_err(got, want) < _tol(dtype), (o, _rel_err(got, want))


def _without_row_scale(g: Graph) -> Graph:
    """``g`` with every ``row_rms`` dropped: what the fold would compute if the row scale were lost."""
    nodes = tuple(Node(n.name, n.op, n.inputs, n.type, {k: v for k, v in n.attrs.items() if k != "row_rms"}) for n in g.nodes)
    return g.replace(nodes=nodes)


def _check_folded(old: Graph, new: Graph, xs: list[torch.Tensor], dtype: torch.dtype, n_readers: int) -> list[Node]:
    """The norm is gone and each of its ``n_readers`` readers reads its input, the folded weight and ``row_rms``;
    the values are the old graph's (and would not be without the row scale). Returns the new readers."""
    new.verify()
    norm = old.node_map()["norm"]
    x, w_name = norm.inputs
    w = old.constants[w_name].float()
    assert not any(n.op == "fused_norm" for n in new.nodes), new
    assert "norm" not in {i for n in new.nodes for i in n.inputs}
    readers = [u for u in old.users()["norm"]]
    assert len(readers) == n_readers
    new_nodes, old_nodes = new.node_map(), old.node_map()
    out = []
    for u in readers:
        v = new_nodes[u.name]
        assert v.op == u.op and v.type == u.type
        assert v.inputs[0] == x and v.inputs[2:] == u.inputs[2:]
        assert v.attrs["row_rms"] == norm.attrs["eps"]
        assert tuple(v.attrs["fused_ops"])[0] == "rms_norm"
        b_old, b_new = u.inputs[1], v.inputs[1]
        if b_old in old.constants:  # W [K, N]: W' = diag(w) W, rounded once to W's dtype, stored [N, K] (K contiguous)
            W = old.constants[b_old]
            p_new = new_nodes[b_new]
            assert p_new.op == "permute" and tuple(p_new.attrs["dims"]) == (1, 0) and p_new.type == old.type_of(b_old)
            assert b_old not in new.constants and new.constants[p_new.inputs[0]].is_contiguous()
            assert torch.equal(new.constants[p_new.inputs[0]].t(), (w[:, None] * W.float()).to(W.dtype))
        else:  # a transposed view of [N, K]: the view stays, of the folded [N, K] constant
            p_old, p_new = old_nodes[b_old], new_nodes[b_new]
            assert p_new.op == "permute" and tuple(p_new.attrs["dims"]) == (1, 0) and p_new.type == p_old.type
            Wt = old.constants[p_old.inputs[0]]
            assert p_old.inputs[0] not in new.constants
            assert torch.equal(new.constants[p_new.inputs[0]], (Wt.float() * w[None, :]).to(Wt.dtype))
        out.append(v)
    _assert_same_values(old, new, xs, dtype)
    # the test has teeth: the rows' scales differ so much that the folded GEMMs without their row scale are far off
    for want, lost in zip(reference_run(old, xs), reference_run(_without_row_scale(new), xs), strict=True):
        assert _rel_err(lost, want) > 0.5
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_one_gemm_on_a_kn_constant(dtype: torch.dtype) -> None:
    g, xs = _graph((5,), dtype, ("kn",))
    new = fold_row_norm(g)
    (y,) = _check_folded(g, new, xs, dtype, 1)
    assert y.op == "gemm_epilogue" and len(y.inputs) == 3  # the bias stays in the epilogue
    assert [n.op for n in new.nodes] == ["permute", "gemm_epilogue"]  # the folded weight read K-contiguous


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_linear_layout_weight_at_the_row_limit(dtype: torch.dtype) -> None:
    """[2, 8, K]: 16 rows (``MAX_ROWS``), a 3-D A; the weight a permute (1, 0) of an [N, K] constant."""
    assert 2 * 8 == MAX_ROWS
    g, xs = _graph((2, 8), dtype, ("nk",))
    new = fold_row_norm(g)
    _check_folded(g, new, xs, dtype, 1)
    assert sorted(n.op for n in new.nodes) == ["gemm_epilogue", "permute"]


def test_two_readers_both_fold() -> None:
    g, xs = _graph((1, 7), torch.float32, ("kn", "nk"))
    new = fold_row_norm(g)
    folded = _check_folded(g, new, xs, torch.float32, 2)
    assert len({v.inputs[1] for v in folded}) == 2
    assert len(new.constants) == 3  # the two folded weights and the first reader's bias; W0, Wt1 and the norm's weight are gone


class _NormMlp(nn.Module):
    """A decoder's MLP behind its RMSNorm, the norm written out as Hugging Face writes it."""

    def __init__(self, hidden: int = K, inter: int = 19) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(hidden) * 1.5 + 0.25)
        self.gate, self.up = nn.Linear(hidden, inter, bias=False), nn.Linear(hidden, inter, bias=False)
        self.down = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
        h = self.weight * h
        return self.down(F.silu(self.gate(h)) * self.up(h))


def _mlp_graph() -> tuple[nn.Module, Graph, torch.Tensor]:
    from kfuse.frontend.torch_export import import_module

    torch.manual_seed(0)
    m = _NormMlp().eval()
    x = _rows((1, 5), torch.float32, seed=4)
    return m, import_module(m, (x,)).graph, x


def test_gated_gemm_folds_with_its_unfused_side() -> None:
    m, imported, x = _mlp_graph()
    g = optimize(imported, Options(fold_row_norm=False)).graph
    (gated,) = [n for n in g.nodes if n.op == "gated_gemm"]
    norm = g.node_map()[gated.inputs[0]]
    assert norm.op == "fused_norm" and len(g.users()[norm.name]) == 1
    x_name, w_name = norm.inputs
    new = fold_row_norm(g)
    new.verify()
    assert optimize(imported, Options()).graph.node_map()[gated.name].attrs["row_rms"] == norm.attrs["eps"]  # the pipeline's last stage
    assert not any(n.op == "fused_norm" for n in new.nodes)
    v = new.node_map()[gated.name]
    assert v.op == "gated_gemm" and v.inputs[0] == x_name and v.attrs["row_rms"] == norm.attrs["eps"]
    assert v.attrs["act"] == gated.attrs["act"] and v.attrs["gate_first"] == gated.attrs["gate_first"]
    W = g.constants[gated.inputs[1]]
    assert W.shape == (K, 38) and gated.inputs[1] not in new.constants
    view = new.node_map()[v.inputs[1]]  # the folded weight stored [N, K], read through a transposing view
    assert view.op == "permute" and tuple(view.attrs["dims"]) == (1, 0) and new.constants[view.inputs[0]].is_contiguous()
    folded = new.constants[view.inputs[0]].t()
    assert torch.equal(folded, (g.constants[w_name].float()[:, None] * W.float()).to(W.dtype))
    # its unfused side (timed against it on a GPU): the weightless norm of x, then the merged GEMM on the folded weight
    weightless, gemm, *rest = v.attrs["unfused"]
    assert weightless.op == "fused_norm" and weightless.inputs == (x_name,) and not weightless.attrs["has_weight"]
    assert weightless.attrs["eps"] == norm.attrs["eps"] and weightless.attrs["rms"]
    assert gemm.inputs[:2] == (weightless.name, v.inputs[1]) and v.attrs["input_names"] == (x_name, v.inputs[1])
    assert [n.op for n in rest] == [n.op for n in gated.attrs["unfused"][1:]]
    want = reference_run(g, [x])[0]
    with torch.no_grad():
        assert _rel_err(want, m(x)) < 1e-5
    _assert_same_values(g, new, [x], torch.float32)
    assert _rel_err(reference_run(_without_row_scale(new), [x])[0], want) > 0.5
    env = {x_name: x, v.inputs[1]: folded}  # the unfused chain, op by op, computes the gated node's value
    for n in v.attrs["unfused"]:
        env[n.name] = ops.run_reference(n.op, [env[i] for i in n.inputs], n.attrs)
    gated_out = ops.run_reference("gated_gemm", [x, folded], v.attrs)
    assert _rel_err(env[v.attrs["unfused"][-1].name], gated_out) < 1e-5


@pytest.mark.parametrize("skinny", ["auto", "always"])
def test_gated_mlp_compiled_equals_eager(skinny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folded gated GEMM's kernels (the norm kernel then the gated template; or the skinny kernel, which
    computes the row scale itself) compute eager's result."""
    monkeypatch.setenv("KFUSE_SKINNY_GEMM", skinny)
    m, _, x = _mlp_graph()
    m, x = m.to(DEVICE), x.to(DEVICE)
    compiled = kfuse.compile(m, (x,))
    (k,) = [k for k in compiled.report["kernels"] if k["ops"][0] == "rms_norm"]
    assert "silu" in k["ops"]
    if skinny == "always":
        assert k["template"] == "skinny_gemm" and "+ rms rows" in k["config"]
    elif DEVICE == "cpu":  # on a GPU the lowering times the candidates
        assert k["template"] == "gated_gemm"
    assert not any(k["template"] == "fused_norm" for k in compiled.report["kernels"])
    x2 = _rows((1, 5), torch.float32, seed=9).to(DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x2), m(x2), rtol=1e-4, atol=1e-5)


NOT_FOLDED = {
    "17_rows": dict(rows=(17,)),
    "17_rows_3d": dict(rows=(1, 17)),
    "norm_with_an_addend": dict(addend=True),
    "norm_also_read_by_a_relu": dict(readers=("kn", "relu")),
    "norm_a_graph_output": dict(readers=("nk", "output")),
    "norm_also_read_by_a_gemm_on_a_runtime_weight": dict(readers=("kn", "runtime")),
    "weight_read_by_two_gemms": dict(readers=("kn", "same_weight")),
    "weight_tied_to_an_embedding": dict(readers=("nk", "tied")),
    "layer_norm": dict(norm="layer_norm"),
}


@pytest.mark.parametrize("case", list(NOT_FOLDED))
def test_nothing_folds(case: str) -> None:
    g, xs = _graph(**NOT_FOLDED[case])
    new = fold_row_norm(g)
    new.verify()
    assert [(n.name, n.op, n.inputs) for n in new.nodes] == [(n.name, n.op, n.inputs) for n in g.nodes]
    assert not any(n.attrs.get("row_rms") is not None for n in new.nodes)
    assert set(new.constants) == set(g.constants)
    _assert_same_values(g, new, xs, torch.float32)


# nn.RMSNorm's default eps is None (F.rms_norm then uses finfo(dtype).eps): the fold uses the same.
def test_a_norm_without_eps() -> None:
    g, xs = _graph((3,), torch.float32, ("nk",), eps=None)
    new = fold_row_norm(g)
    new.verify()
    for n in new.nodes:
        if n.attrs.get("row_rms") is not None:
            assert n.attrs["row_rms"] == torch.finfo(torch.float32).eps
    _assert_same_values(g, new, xs, torch.float32)


# ---------------------------------------------------------------------------------------------------------------
# end to end: a tiny Llama's decode step with a static cache, through torch.compile(backend=kfuse)
# ---------------------------------------------------------------------------------------------------------------
def _llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, rms_norm_eps=1e-5,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg).to(DEVICE).eval()


def _generate(model: nn.Module, ids: torch.Tensor, new: int, backend: object = None) -> tuple[object, list]:
    """Greedy generation with a static cache; with ``backend`` the decode step compiled by kfuse (as
    tests/frontend/test_hf_static_cache.py does). Returns generate's output (tokens and logits) and kfuse's graphs."""
    import transformers

    from kfuse.frontend.dynamo import kfuse_backend

    made: list = []
    kw: dict = dict(max_new_tokens=new, do_sample=False, cache_implementation="static", return_dict_in_generate=True, output_logits=True)
    if backend is not None:

        def compile_step(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: object) -> object:
            fn = kfuse_backend(gm, example_inputs, **kwargs)
            made.append(fn)
            return fn

        torch._dynamo.reset()
        config = transformers.CompileConfig(backend=compile_step)
        config._compile_all_devices = True  # transformers compiles on the CPU only when told to
        kw["compile_config"] = config
    with torch.no_grad():
        return model.generate(ids, **kw), made


@pytest.mark.parametrize("skinny", ["auto", "always"])
def test_llama_decode_step_runs_no_in_layer_norm_kernel(skinny: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_SKINNY_GEMM", skinny)
    model = _llama()
    ids = torch.randint(0, 97, (1, 5), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    want, _ = _generate(model, ids, 4)
    got, made = _generate(model, ids, 4, backend="kfuse")
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.logits[1:], want.logits[1:], strict=True):  # the decode steps' (the prefill runs eagerly)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert len(made) == 1
    decode = made[0].kfuse_compiled
    kernels = decode.report["kernels"]
    norms = [k for k in kernels if k["template"] in ("fused_norm", "pointwise") and {"rsqrt", "rms_norm"} & set(k["ops"])]
    assert len(norms) <= 1, norms  # the final norm, which took the last residual add; the 4 in-layer ones folded
    folded = [k for k in kernels if k["ops"][0] == "rms_norm"]
    # a layer's merged QKV projection and its gated MLP projection
    assert len(folded) == 4, [(k["template"], k["ops"]) for k in kernels]
    assert sum("silu" in k["ops"] for k in folded) == 2
    if skinny == "always":
        assert all(k["template"] == "skinny_gemm" and "+ rms rows" in k["config"] for k in folded), folded
    elif DEVICE == "cpu":  # on a GPU each lowering times its candidates
        assert sorted(k["template"] for k in folded) == ["gated_gemm", "gated_gemm", "gemm_epilogue", "gemm_epilogue"]
        assert all("after the folded norm's row scale" in k["config"] for k in folded)
    rms = [n for n in decode.plan.graph.nodes if n.attrs.get("row_rms") is not None]
    assert len(rms) == 4 and all(n.attrs["row_rms"] == pytest.approx(1e-5, rel=1e-6) for n in rms)
