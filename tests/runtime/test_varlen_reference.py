"""The PyTorch form of ``varlen_attention`` (the op's reference, and its step wherever the kernel
cannot run) on a bucket: rows past ``cu_seqlens[-1]`` are padding the bucket runner adds, and no
sequence may attend to them (session 27: on a GPU machine with a CPU model they were keys of the
last sequence, which changed its outputs)."""

from __future__ import annotations

import pytest
import torch

from kfuse.kernels.attention import varlen_reference
from kfuse.runtime.transformer_ops import _varlen_ref


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("extra", [0, 5])
def test_rows_past_the_last_sequence_are_not_keys(causal: bool, extra: int, device: str) -> None:
    torch.manual_seed(0)
    h, d = 2, 8
    cu = torch.tensor([0, 3, 3, 7, 12], dtype=torch.int32, device=device)  # an empty sequence too
    t = int(cu[-1]) + extra
    q, k, v = (torch.randn(t, h * d, device=device) for _ in range(3))
    k[int(cu[-1]) :] *= 50.0  # the bucket's extra rows: large keys would dominate if they were attended
    got = _varlen_ref([q, k, v, cu], {"heads": h, "head_dim": d, "scale": d**-0.5, "causal": causal})
    n = int(cu[-1])
    want = varlen_reference(*(x[:n].reshape(n, h, d) for x in (q, k, v)), cu, causal=causal, scale=d**-0.5).reshape(n, h * d)
    assert got.shape == (t, h * d) and torch.isfinite(got).all()
    torch.testing.assert_close(got[:n], want, atol=1e-5, rtol=1e-5)
