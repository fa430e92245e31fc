"""Attention over five dims (MaxViT, Hiera) folded to the four ``fuse_attention`` matches, then fused."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kfuse
from kfuse.compiler import Options, optimize
from kfuse.frontend.torch_export import import_module
from kfuse.ir.interpret import reference_run
from kfuse.passes.fold_batch_dims import fold_batch_dims


class _HieraAttention(torch.nn.Module):
    """Hiera's mask-unit attention: [B, heads, windows, N, D], scores scaled, softmax, times V."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        attn = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)
        return attn.softmax(dim=-1) @ v


class _BiasedAttention(torch.nn.Module):
    """A per-head bias [H, N, N] and a per-window mask [1, W, 1, N, N] (leading 1s) added to the scores."""

    def __init__(self, h: int, w: int, n: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(h, n, n))
        self.register_buffer("mask", torch.randn(1, w, 1, n, n))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-1, -2) * 0.3 + self.bias + self.mask
        return torch.softmax(s, dim=-1) @ v


class _Sdpa5d(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


def _qkv(shape: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.randn(shape) for _ in range(3))


BASE = Options(fuse_attention=False, fuse_epilogue=False, fuse_pointwise=False, fuse_b2b=False, tune="none")


def test_hiera_scores_fold_to_four_dims_and_keep_values() -> None:
    q, k, v = _qkv((2, 3, 4, 5, 8))  # [B, heads, windows, N, D], odd N
    g = optimize(import_module(_HieraAttention(), (q, k, v), {}, "hiera").graph, BASE).graph
    out = fold_batch_dims(g)
    for n in out.nodes:
        if n.op in ("matmul", "softmax"):
            assert n.ttype.rank == 4, n
    torch.testing.assert_close(reference_run(out, [q, k, v])[0], _HieraAttention()(q, k, v))


def test_broadcast_masks_fold_with_the_scores() -> None:
    m = _BiasedAttention(3, 4, 5).eval()
    q, k, v = _qkv((2, 4, 3, 5, 8))  # [B, windows, heads, N, D]
    out = fold_batch_dims(optimize(import_module(m, (q, k, v), {}, "biased").graph, BASE).graph)
    assert all(n.ttype.rank <= 4 for n in out.nodes if n.op in ("matmul", "softmax", "add"))
    torch.testing.assert_close(reference_run(out, [q, k, v])[0], m(q, k, v))


def test_a_five_dim_matmul_that_is_no_attention_stays() -> None:
    class _Batched(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.relu(a @ b)

    a, b = torch.randn(2, 3, 4, 5, 6), torch.randn(2, 3, 4, 6, 7)
    g = optimize(import_module(_Batched(), (a, b), {}, "batched").graph, BASE).graph
    assert fold_batch_dims(g) is g


def test_five_dim_attention_compiles_to_the_fused_kernel() -> None:
    for m, shape in ((_HieraAttention(), (2, 3, 4, 7, 8)), (_Sdpa5d(), (2, 2, 3, 9, 16)), (_BiasedAttention(3, 4, 5), (2, 4, 3, 5, 8))):
        q, k, v = _qkv(shape)
        c = kfuse.compile(m.eval(), (q, k, v))
        kinds = [k_["template"] for k_ in c.report["kernels"] if k_["template"] != "torch"]
        assert kinds == ["fused_attention"], (type(m).__name__, kinds)
        torch.testing.assert_close(c(q, k, v), m(q, k, v), rtol=1e-4, atol=1e-5)
