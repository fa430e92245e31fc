"""``torch.einsum`` imported as permutes, sums and one batched matmul; ``new_zeros`` and friends as constants."""

from __future__ import annotations

import pytest
import torch

import kfuse
from kfuse.frontend import einsum

CASES = [
    ("bghid,bghjd->bghij", [(2, 3, 4, 5, 6), (2, 3, 4, 7, 6)]),  # MaxViT's scores
    ("bghij,bghjd->bghid", [(2, 3, 4, 5, 7), (2, 3, 4, 7, 6)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),  # implicit output
    ("i,j->ij", [(3,), (4,)]),  # outer product: nothing contracted
    ("ij,j->i", [(3, 4), (4,)]),
    ("bij->bji", [(2, 3, 4)]),
    ("bij->b", [(2, 3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4, 5), (2, 3, 5, 6)]),
    ("abc,cda->bd", [(2, 3, 4), (4, 5, 2)]),  # a batch-less contraction over two indices
    ("ab,ab->", [(3, 4), (3, 4)]),
    ("abk,kcd->abcd", [(2, 3, 4), (4, 5, 6)]),
    ("bnd,bmd->bnm", [(2, 5, 7), (2, 3, 7)]),
    ("ijk,ik->j", [(2, 3, 4), (2, 4)]),  # j kept by one side, i contracted, k contracted
    ("xyz,z->yx", [(2, 3, 5), (5,)]),
]


def _run_plan(eq: str, xs: list[torch.Tensor]) -> torch.Tensor:
    res: list[torch.Tensor] = []
    for st in einsum.plan(eq, [tuple(x.shape) for x in xs]):
        ins = [xs[i] if kind == "in" else res[i] for kind, i in st.inputs]
        a = dict(st.attrs)
        if st.op == "sum":
            res.append(ins[0].sum(dim=a["dims"]))
        elif st.op == "permute":
            res.append(ins[0].permute(a["dims"]))
        elif st.op == "reshape":
            res.append(ins[0].reshape(a["shape"]))
        else:
            assert st.op == "matmul"
            res.append(ins[0] @ ins[1])
    return res[-1] if res else xs[0]


@pytest.mark.parametrize("eq,shapes", CASES)
def test_plan_matches_torch_einsum(eq: str, shapes: list[tuple[int, ...]]) -> None:
    torch.manual_seed(0)
    xs = [torch.randn(s, dtype=torch.float64) for s in shapes]
    torch.testing.assert_close(_run_plan(eq, xs), torch.einsum(eq, *xs))


REFUSED = [("ii->i", [(3, 3)]), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)])]


@pytest.mark.parametrize("eq,shapes", REFUSED)
def test_unsupported_forms_are_refused(eq: str, shapes: list[tuple[int, ...]]) -> None:
    with pytest.raises(einsum.EinsumUnsupported):
        einsum.plan(eq, shapes)


class _MaxVitAttention(torch.nn.Module):
    """MaxViT's relative attention: einsum scores over five dims, a per-head bias, einsum with V."""

    def __init__(self, heads: int, p: int, d: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(heads, p, p))
        self.scale = d**-0.5

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        s = torch.einsum("B G H I D, B G H J D -> B G H I J", q * self.scale, k)
        p = torch.softmax(s + self.bias, dim=-1)
        return torch.einsum("B G H I J, B G H J D -> B G H I D", p, v).swapaxes(2, 3)


def test_maxvit_attention_compiles_without_fallback() -> None:
    torch.manual_seed(0)
    m = _MaxVitAttention(3, 7, 8).eval()
    q, k, v = (torch.randn(2, 4, 3, 7, 8) for _ in range(3))
    c = kfuse.compile(m, (q, k, v))
    assert c.report["fallback"] == []
    torch.testing.assert_close(c(q, k, v), m(q, k, v), rtol=1e-4, atol=1e-5)


class _ShiftMask(torch.nn.Module):
    """torchvision's Swin builds its shifted-window mask with ``new_zeros`` and slice writes: all constant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros((6, 6))
        mask[:3, :] = 1.0
        mask[3:, 4:] = 2.0
        ones = x.new_ones((6,))
        full = x.new_full((6, 6), 0.5)
        return x + mask + ones + full


def test_new_zeros_and_slice_writes_fold() -> None:
    x = torch.randn(2, 6, 6)
    c = kfuse.compile(_ShiftMask(), (x,))
    assert c.report["fallback"] == []
    torch.testing.assert_close(c(x), _ShiftMask()(x))
