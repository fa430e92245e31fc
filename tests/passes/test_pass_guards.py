"""Guards of the graph passes: subgraphs a pass must leave alone (or read differently) so that the
compiled model still computes what eager PyTorch does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.kernels.attention import attention
from kfuse.passes.attention_mask import classify
from kfuse.passes.fuse_attention import fuse_attention
from kfuse.passes.fuse_rotary import fuse_rotary
from kfuse.passes.sink_reshapes import sink_reshapes

BASE = Options(fuse_attention=False, fuse_rotary=False, fuse_epilogue=False, fuse_pointwise=False, varlen=False, layout="nchw")


class _Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _imported(fn, xs):
    return optimize(import_module(_Fn(fn), tuple(xs), {}).graph, BASE).graph


def _compiled_matches(fn, xs, atol=1e-4):
    out = kfuse.compile(_Fn(fn), tuple(xs), check=False)(*xs)
    ref = fn(*xs)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, atol=atol, rtol=1e-4)


def _ops(g, op):
    return [n for n in g.nodes if n.op == op]


# 1. integer (and bool) masks added to the scores are additive biases, not "nonzero = attend"

B, H, S, D = 2, 2, 8, 16


def _explicit(q, k, v, bias):
    return torch.softmax(q @ k.transpose(-1, -2) * 0.25 + bias, -1) @ v


def _qkv(b=B, h=H, s=S, d=D, dv=None):
    torch.manual_seed(0)
    return torch.randn(b, h, s, d), torch.randn(b, h, s, d), torch.randn(b, h, s, d if dv is None else dv)


def _pad():
    pad = torch.zeros(B, S, dtype=torch.long)
    pad[0, 5:] = 1
    pad[1, 3:] = 1
    return pad


def test_int64_additive_padding_bias_matches_eager():
    def fn(q, k, v, pad):  # pad: 1 = padding (blocked); the bias is 0 (attend) or -10000 (blocked), int64
        return _explicit(q, k, v, pad[:, None, None, :] * -10000)

    xs = (*_qkv(), _pad())
    g = fuse_attention(_imported(fn, xs))
    (n,) = _ops(g, "fused_attention")
    assert n.attrs["mask_kind"] == "dense"  # blocked where pad != 0: not the kernel's "nonzero = attend"
    _compiled_matches(fn, xs)


def test_int64_additive_keep_bias_is_key_padding():
    def fn(q, k, v, keep):  # keep: 1 = attend; bias 0 where kept, -10000 elsewhere, int64
        return _explicit(q, k, v, (1 - keep[:, None, None, :]) * -10000)

    xs = (*_qkv(), 1 - _pad())
    g = fuse_attention(_imported(fn, xs))
    (n,) = _ops(g, "fused_attention")
    assert n.attrs["mask_kind"] == "padding"
    _compiled_matches(fn, xs)


def test_classify_reads_non_float_masks_by_position():
    b = GraphBuilder()
    x = b.add_input("x", TensorType((B, S), torch.int64))
    g = b.build([b.op("reshape", [b.op("ne", [x, b.scalar(0)])], {"shape": (B, 1, 1, S)})])  # bool: nonzero
    q_t = TensorType((B, H, S, D), torch.float32)
    assert classify(g, g.outputs[0], q_t, S).kind == "padding"  # SDPA attn_mask: True = attend
    assert classify(g, g.outputs[0], q_t, S, additive=True).kind == "dense"  # added as 0/1: a soft bias


def test_bool_mask_added_to_scores_matches_eager():
    def fn(q, k, v, m):
        return _explicit(q, k, v, m)

    m = torch.rand(S, S) > 0.5
    _compiled_matches(fn, (*_qkv(), m))


# 2. V's head dim must be Q's


def test_value_head_dim_mismatch_is_not_fused():
    xs = _qkv(b=1, dv=8)
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), lambda q, k, v: _explicit(q, k, v, 0.0)):
        assert not _ops(fuse_attention(_imported(fn, xs)), "fused_attention")
        _compiled_matches(fn, xs)


def test_attention_kernel_rejects_value_head_dim_mismatch():
    q, k, v = _qkv(b=1, dv=8)
    with pytest.raises(ValueError, match="do not match"):
        attention(q, k, v)


# 3. broadcast batch dims of K / V


@pytest.mark.parametrize("kv_batch", [(1, 2), (1, 1), (2, 1)])
def test_broadcast_kv_batch_is_not_fused(kv_batch):
    torch.manual_seed(0)
    q = torch.randn(2, H, S, D)
    k, v = torch.randn(kv_batch[0], H, S, D), torch.randn(kv_batch[1], H, S, D)
    fns = [lambda q, k, v: _explicit(q, k, v, 0.0)]
    if kv_batch[0] == kv_batch[1]:
        fns.append(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    for fn in fns:
        assert not _ops(fuse_attention(_imported(fn, (q, k, v))), "fused_attention")
        _compiled_matches(fn, (q, k, v))


def test_one_kv_head_broadcast_to_every_query_head_is_fused_as_multi_query():
    """Falcon's multi-query attention: K and V with one head broadcast over Q's heads (explicit and SDPA forms)
    are read with kv_group = H; a K / V head count that does not broadcast is never matched."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, H, S, D), torch.randn(2, 1, S, D), torch.randn(2, 1, S, D)
    for fn in (lambda q, k, v: _explicit(q, k, v, 0.0), lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)):
        fused = _ops(fuse_attention(_imported(fn, (q, k, v))), "fused_attention")
        assert len(fused) == 1 and fused[0].attrs["kv_group"] == H, fused
        _compiled_matches(fn, (q, k, v))


def test_matching_shapes_still_fuse():
    xs = _qkv()
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), lambda q, k, v: _explicit(q, k, v, 0.0)):
        assert len(_ops(fuse_attention(_imported(fn, xs)), "fused_attention")) == 1
        _compiled_matches(fn, xs)


# 4. rotary: x broadcast by cos / sin


def _rotary(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def test_rotary_with_broadcast_x_is_not_fused():
    torch.manual_seed(0)
    xs = (torch.randn(1, 2, 4, 8), torch.randn(3, 1, 4, 8), torch.randn(3, 1, 4, 8))
    assert not _ops(fuse_rotary(_imported(_rotary, xs)), "rotary")
    _compiled_matches(_rotary, xs)


def test_rotary_with_broadcast_cos_still_fuses():
    torch.manual_seed(0)
    xs = (torch.randn(3, 2, 4, 8), torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8))
    assert len(_ops(fuse_rotary(_imported(_rotary, xs)), "rotary")) == 1
    _compiled_matches(_rotary, xs)


# 5. sink_reshapes: an operand of higher rank than the reshape's output


def _exp_add_reshape(bias_shape):
    b = GraphBuilder()
    x = b.add_input("x", TensorType((2, 3, 4), torch.float32))
    y = b.op("add", [b.op("exp", [x]), b.add_constant(torch.randn(*bias_shape))])
    return b.build([b.op("reshape", [y], {"shape": (6, 4)})])


@pytest.mark.parametrize("bias_shape,moves", [((1, 1, 4), False), ((4,), True), ((1, 4), True)])
def test_sink_reshapes_keeps_the_output_type(bias_shape, moves):
    g = _exp_add_reshape(bias_shape)
    g2 = sink_reshapes(g)
    assert g2.type_of(g2.outputs[0]) == g.type_of(g.outputs[0])
    assert (g2.node_map()[g2.outputs[0]].op == "add") == moves
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(reference_run(g2, [x])[0], reference_run(g, [x])[0])


def test_sink_reshapes_higher_rank_bias_compiles():
    bias = torch.randn(1, 1, 4)

    def fn(x):
        return (x.exp() + bias).reshape(6, 4)

    _compiled_matches(fn, (torch.randn(2, 3, 4),))


def test_cse_keeps_negative_zero_apart_from_zero() -> None:
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.ir.interpret import reference_run
    from kfuse.passes.simplify import cse

    b = GraphBuilder("z")
    x = b.add_input("x", TensorType((3,), torch.float32))
    pos, neg = b.add_constant(torch.tensor(0.0), "pz"), b.add_constant(torch.tensor(-0.0), "nz")
    g = b.build([b.op("div", [x, pos]), b.op("div", [x, neg])])
    xs = [torch.tensor([1.0, -2.0, 3.0])]
    got, want = reference_run(cse(g), xs), reference_run(g, xs)
    for o, r in zip(got, want, strict=True):
        torch.testing.assert_close(o, r)  # +inf where it should be, -inf where it should be


@pytest.mark.parametrize("exponent", [5.0, 6, "tensor"])
def test_epilogue_pow_keeps_negative_bases_finite(exponent: object) -> None:
    """x ** 6 of a negative x is finite; the epilogue's exp(6 * log(x)) is NaN, so such a pow stays unfused."""
    import kfuse

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 5)

        def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            return torch.pow(y, e if exponent == "tensor" else exponent)

    torch.manual_seed(0)
    m = M().eval()
    x, e = torch.randn(6, 8), torch.full((6, 5), 3.0)
    c = kfuse.compile(m, (x, e))
    x2 = torch.randn(6, 8)
    got, want = c(x2, e), m(x2, e)
    assert (want < 0).any() or exponent != "tensor"
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_norm_over_more_features_than_registers_hold_stays_pytorch():
    """``fuse_norm.MAX_FEATURES``: the template holds a row in registers; a LayerNorm over more features
    (a whole C x H x W image) is left to PyTorch, and gives the right answer; a normal one is still fused."""
    from kfuse.passes.fuse_norm import MAX_FEATURES

    class TwoNorms(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.long, self.short = torch.nn.LayerNorm(MAX_FEATURES + 8), torch.nn.LayerNorm(64)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.long(x), self.short(y)

    model = TwoNorms().eval()
    x, y = torch.randn(2, MAX_FEATURES + 8) * 3 + 1, torch.randn(2, 64)
    cm = kfuse.compile(model, (x, y))
    kinds = sorted(k["template"] for k in cm.report["kernels"] if "layer_norm" in k["ops"])
    assert kinds == ["fused_norm", "torch"], cm.report["kernels"]
    for got, want in zip(cm(x, y), model(x, y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
