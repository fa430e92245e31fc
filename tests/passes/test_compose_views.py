"""View chains composed into one (``compose_views``) and row permutes moved above a GEMM (``hoist_row_views``):
``nn.MultiheadAttention`` runs with no copy of Q, K and V, the attention writes the merged heads, and the output
projection's epilogue takes bias and residual."""

from __future__ import annotations

import math
import random

import pytest
import torch

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.graph import GraphBuilder, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.compose_views import Layout, NotAView, canonical_steps, compose_views, copies, with_shapes
from kfuse.passes.hoist_row_views import hoist_row_views, sink_row_permutes


def _apply(x: torch.Tensor, op: str, attrs: dict, shape: tuple[int, ...]) -> torch.Tensor:
    if op == "reshape":
        return x.reshape(shape)
    if op == "permute":
        return x.permute(attrs["dims"])
    if op == "select":
        return x.select(attrs["dim"], attrs["index"])
    if op == "slice":
        idx = [slice(None)] * x.dim()
        idx[attrs["dim"]] = slice(attrs["start"], attrs["end"], attrs.get("step", 1))
        return x[tuple(idx)]
    raise AssertionError(op)


def _random_chain(rng: random.Random, base: tuple[int, ...], n: int) -> list[tuple[str, dict, tuple[int, ...]]]:
    """``n`` random view ops on a tensor of ``base``'s shape, with their output shapes."""
    x = torch.empty(base, device="meta")
    chain = []
    for _ in range(n):
        kind = rng.choice(["reshape", "permute", "select", "slice"]) if x.dim() > 1 else "reshape"
        if kind == "reshape":
            sizes = [f for d in x.shape for f in _factors(rng, d)]
            rng.shuffle(sizes) if rng.random() < 0.2 else None
            merged: list[int] = []
            for s in sizes:
                if merged and rng.random() < 0.4:
                    merged[-1] *= s
                else:
                    merged.append(s)
            attrs = {"shape": tuple(merged)}
        elif kind == "permute":
            dims = list(range(x.dim()))
            rng.shuffle(dims)
            attrs = {"dims": tuple(dims)}
        elif kind == "select":
            d = rng.randrange(x.dim())
            attrs = {"dim": d, "index": rng.randrange(x.shape[d])}
        else:
            d = rng.randrange(x.dim())
            n_d = x.shape[d]
            start = rng.randrange(n_d)
            attrs = {"dim": d, "start": start, "end": rng.randrange(start + 1, n_d + 1), "step": rng.choice([1, 1, 2])}
        x = _apply(x, kind, attrs, attrs.get("shape", ()))
        chain.append((kind, attrs, tuple(x.shape)))
    return chain


def _factors(rng: random.Random, n: int) -> list[int]:
    out = []
    for p in (2, 3, 5):
        while n % p == 0 and rng.random() < 0.7:
            out.append(p)
            n //= p
    return [*out, n] if n > 1 else out or [1]


def test_layout_matches_pytorch_on_random_chains() -> None:
    """Every composite the algebra accepts addresses exactly the elements PyTorch's chain picks, and its canonical
    chain gives the same tensor; chains of plain strided views are always accepted."""
    rng = random.Random(0)
    accepted = views = 0
    for trial in range(400):
        base = rng.choice([(12, 10), (6, 4, 10), (2, 3, 4, 5), (30, 6), (8, 9)])
        chain = _random_chain(rng, base, rng.randint(1, 5))
        src = torch.arange(math.prod(base)).reshape(base)
        want = src
        for op, attrs, shape in chain:
            want = _apply(want, op, attrs, shape)
        # PyTorch ran the chain without a copy: the algebra must follow it
        is_view = want.numel() > 0 and want.untyped_storage().data_ptr() == src.untyped_storage().data_ptr()
        try:
            layout = Layout.contiguous(base)
            for op, attrs, shape in chain:
                layout = layout.apply(op, attrs, shape)
        except NotAView:
            assert not is_view, (trial, chain)
            continue
        views += is_view
        assert layout.shape() == tuple(want.shape), (trial, chain)
        # the element at each index is offset + sum(part index * part stride)
        got = torch.full(want.shape, layout.offset, dtype=torch.int64)
        for axis, parts in enumerate(layout.dims):
            idx = torch.arange(want.shape[axis])
            addr = torch.zeros_like(idx)
            for n, s in reversed(parts):
                addr += (idx % n) * s
                idx = idx // n
            view = [1] * want.dim()
            view[axis] = want.shape[axis]
            got = got + addr.reshape(view)
        assert torch.equal(got, want), (trial, chain)
        try:
            steps = canonical_steps(base, layout)
        except NotAView:
            continue
        accepted += 1
        out = src
        for op, attrs, shape in with_shapes(base, steps):
            out = _apply(out, op, attrs, shape)
        assert torch.equal(out, want), (trial, chain, steps)
        # the canonical chain copies at most once: in its last reshape
        assert copies(base, with_shapes(base, steps)) <= 1
    assert accepted > 150 and views > 50, (accepted, views)


def test_canonical_chain_of_the_mha_head_split_copies_nothing() -> None:
    """``F.multi_head_attention_forward``'s Q: [S, B, 3E] -> ... -> view(S, B*H, D) (a copy) -> [B, H, S, D]."""
    s, b, h, d = 7, 2, 3, 8
    e = h * d
    chain = [
        ("reshape", {"shape": (s, b, 3, e)}, (s, b, 3, e)),
        ("reshape", {"shape": (1, s, b, 3, e)}, (1, s, b, 3, e)),
        ("permute", {"dims": (3, 1, 2, 0, 4)}, (3, s, b, 1, e)),
        ("reshape", {"shape": (3, s, b, e)}, (3, s, b, e)),
        ("select", {"dim": 0, "index": 1}, (s, b, e)),
        ("reshape", {"shape": (s, b * h, d)}, (s, b * h, d)),
        ("permute", {"dims": (1, 0, 2)}, (b * h, s, d)),
        ("reshape", {"shape": (b, h, s, d)}, (b, h, s, d)),
    ]
    base = (s, b, 3 * e)
    assert copies(base, chain) == 1
    layout = Layout.contiguous(base)
    for op, attrs, shape in chain:
        layout = layout.apply(op, attrs, shape)
    steps = canonical_steps(base, layout)
    assert [op for op, _ in steps] == ["reshape", "select", "permute"]
    assert copies(base, with_shapes(base, steps)) == 0


def test_overlapping_or_broadcast_views_are_refused() -> None:
    layout = Layout.contiguous((4, 6)).apply("expand", {"shape": (3, 4, 6)}, (3, 4, 6))
    with pytest.raises(NotAView):
        canonical_steps((4, 6), layout)
    with pytest.raises(NotAView):  # a slice that cuts across two parts of a merged dim
        Layout.contiguous((4, 6)).apply("permute", {"dims": (1, 0)}, (6, 4)).apply("reshape", {"shape": (24,)}, (24,)).apply(
            "slice", {"dim": 0, "start": 1, "end": 7}, (6,)
        )


class _Block(torch.nn.Module):
    def __init__(self, e: int, h: int, batch_first: bool) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(e)
        self.attn = torch.nn.MultiheadAttention(e, h, batch_first=batch_first)
        self.fc = torch.nn.Linear(e, e)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x)
        y, _ = self.attn(y, y, y, need_weights=False)
        x = x + y
        return x + self.fc(x)


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_fuses_like_a_hugging_face_layer(batch_first: bool) -> None:
    torch.manual_seed(0)
    e, h, s, b = 24, 3, 7, 2  # head dim 8, odd sequence
    m = _Block(e, h, batch_first).eval()
    x = torch.randn(b, s, e) if batch_first else torch.randn(s, b, e)
    imp = import_module(m, (x,), {}, "mha")
    g = optimize(imp.graph, Options(tune="none")).graph
    att = [n for n in g.nodes if n.op == "fused_attention"]
    assert len(att) == 1
    assert att[0].attrs["out_layout"] == ("bshd" if batch_first else "sbhd")
    producer = g.node_map()
    # Q, K and V reach the kernel through views of the projection that PyTorch runs without a copy
    for name in att[0].inputs[:3]:
        chain, cur = [], name
        while (p := producer.get(cur)) is not None and p.op in ("reshape", "permute", "select", "slice"):
            chain.append((p.op, dict(p.attrs), p.ttype.shape))
            cur = p.inputs[0]
        base = g.type_of(cur)
        assert isinstance(base, TensorType)
        assert copies(base.shape, chain[::-1]) == 0
        # batch first: the in-projection runs on [B, S, E] rows (its transpose sunk below it), the layout the TMA
        # attention kernel reads; sequence first: on [S, B, E]
        assert base.shape == ((b, s, 3 * e) if batch_first else (s, b, 3 * e))
    assert not [n for n in g.nodes if n.op == "fused_norm" and n.attrs.get("row_index")]  # no row gather left
    # the output projection reads the merged heads and takes bias and residual in its epilogue
    out_proj = [n for n in g.nodes if n.op == "gemm_epilogue" and n.inputs[0] == att[0].name]
    assert len(out_proj) == 1 and out_proj[0].attrs["epilogue"].describe() == "add(in0) -> add(in1)"
    assert out_proj[0].inputs[3] == "x"  # the residual, in its own layout
    assert not [n for n in g.nodes if n.op in ("gather_rows", "pointwise")]
    c = kfuse.compile(m, (x,))
    torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-5)


def test_transformer_encoder_compiles_to_the_fused_plan() -> None:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 48, dropout=0.0, batch_first=True, norm_first=True)
    m = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(2, 9, 32)
    c = kfuse.compile(m, (x,))
    kernels = [k["template"] for k in c.report["kernels"] if k["template"] != "torch"]
    assert kernels.count("fused_attention") == 2 and "gather_rows" not in kernels and "pointwise" not in kernels
    assert c.report["max_rel_err"] < 1e-4


def _graph(build) -> object:
    b = GraphBuilder("g")
    out = build(b)
    return b.build([out])


def test_hoist_leaves_a_permute_of_a_plain_gemm_input() -> None:
    """A GEMM whose input is no copy: moving the permute up would only move the copy to the input."""

    def build(b: GraphBuilder) -> str:
        x = b.add_input("x", TensorType((5, 2, 8), torch.float32))
        w = b.add_constant(torch.randn(8, 6))
        bias = b.add_constant(torch.randn(6))
        y = b.op("add", [b.op("matmul", [x, w]), bias])
        return b.op("permute", [y], {"dims": (1, 0, 2)})

    g = _graph(build)
    assert hoist_row_views(g) is g


def test_hoist_keeps_an_operand_that_varies_by_row() -> None:
    """A full-size second operand of the add is per row: the rows cannot be reordered past it alone."""

    def build(b: GraphBuilder) -> str:
        a = b.add_input("a", TensorType((2, 3, 5, 8), torch.float32))
        r = b.add_input("r", TensorType((5, 2, 6), torch.float32))
        x = b.op("reshape", [b.op("permute", [a], {"dims": (2, 0, 1, 3)})], {"shape": (5, 2, 24)})
        w = b.add_constant(torch.randn(24, 6))
        y = b.op("add", [b.op("matmul", [x, w]), r])
        return b.op("permute", [y], {"dims": (1, 0, 2)})

    g = _graph(build)
    assert hoist_row_views(g) is g


def test_hoist_then_compose_gives_the_head_merge_and_keeps_values() -> None:
    def build(b: GraphBuilder) -> str:
        a = b.add_input("a", TensorType((2, 3, 5, 8), torch.float32))  # [B, H, S, D]
        x = b.op("reshape", [b.op("permute", [a], {"dims": (2, 0, 1, 3)})], {"shape": (10, 24)})  # [S*B, E]
        w = b.add_constant(torch.randn(24, 6))
        bias = b.add_constant(torch.randn(6))
        y = b.op("reshape", [b.op("add", [b.op("matmul", [x, w]), bias])], {"shape": (5, 2, 6)})
        r = b.add_input("r", TensorType((2, 5, 6), torch.float32))  # the residual, batch first
        return b.op("add", [b.op("permute", [y], {"dims": (1, 0, 2)}), r])

    g = _graph(build)
    from kfuse.passes.simplify import algebraic_simplify
    from kfuse.passes.sink_reshapes import sink_reshapes

    g1 = algebraic_simplify(sink_reshapes(g))
    g2 = compose_views(hoist_row_views(g1))
    assert g2 is not g1
    ops_ = [n.op for n in g2.nodes]
    assert ops_.count("permute") == 1 and ops_[-1] == "add"
    perm = next(n for n in g2.nodes if n.op == "permute")
    assert tuple(perm.attrs["dims"]) == (0, 2, 1, 3)  # [B, H, S, D] -> [B, S, H, D]: the bshd merge
    a, r = torch.randn(2, 3, 5, 8), torch.randn(2, 5, 6)
    torch.testing.assert_close(reference_run(g2, [a, r])[0], reference_run(g, [a, r])[0])


def test_hoist_leaves_rows_that_a_layer_norm_reads() -> None:
    """Swin-V2's post-norm: the reordered rows go into a LayerNorm, which takes the reorder as a row gather."""

    def build(b: GraphBuilder) -> str:
        a = b.add_input("a", TensorType((2, 3, 5, 8), torch.float32))
        x = b.op("reshape", [b.op("permute", [a], {"dims": (2, 0, 1, 3)})], {"shape": (5, 2, 24)})
        w = b.add_constant(torch.randn(24, 6))
        y = b.op("add", [b.op("matmul", [x, w]), b.add_constant(torch.randn(6))])
        p = b.op("permute", [y], {"dims": (1, 0, 2)})
        return b.op("layer_norm", [p], {"normalized_shape": (6,), "eps": 1e-5})

    g = _graph(build)
    assert hoist_row_views(g) is g


def test_sink_leaves_a_permute_whose_views_would_still_copy() -> None:
    """Swin's window partition before its QKV GEMM: after the GEMM the head split would still copy, so the
    partition stays in front (where the LayerNorm takes it as a row gather)."""

    def build(b: GraphBuilder) -> str:
        x = b.add_input("x", TensorType((2, 4, 4, 8), torch.float32))  # [B, H, W, C], windows of 2 x 2
        win = b.op("permute", [b.op("reshape", [x], {"shape": (2, 2, 2, 2, 2, 8)})], {"dims": (0, 1, 3, 2, 4, 5)})
        w = b.add_constant(torch.randn(8, 24))
        y = b.op("matmul", [win, w])  # [2, 2, 2, 2, 2, 24]
        q = b.op("reshape", [y], {"shape": (8, 4, 2, 12)})  # windows x tokens x heads x dim: a copy
        return b.op("softmax", [q], {"dim": -1})

    g = _graph(build)
    assert sink_row_permutes(g) is g


@pytest.mark.gpu
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_compiles_and_matches_on_the_gpu(batch_first: bool) -> None:
    """The whole path on the H200 in fp16: head views of the packed projection, the fused attention writing
    ``[B, S, H*D]`` or ``[S, B, H*D]`` (``sbhd``) through strides, the out-projection's epilogue."""

    torch.manual_seed(0)
    e, h, s, b = 256, 4, 77, 3  # head dim 64, a sequence not a multiple of the tile
    m = _Block(e, h, batch_first).eval().cuda().half()
    x = (torch.randn(b, s, e) if batch_first else torch.randn(s, b, e)).cuda().half()
    c = kfuse.compile(m, (x,))
    assert [k["template"] for k in c.report["kernels"]].count("fused_attention") == 1
    with torch.no_grad():
        torch.testing.assert_close(c(x).float(), m(x).float(), rtol=2e-2, atol=2e-2)
