"""The padding-free bucket graph's body on the CPU: token indices without a host sync, the
scatter-unpack with its dummy row, and the whole body (index, pack, packed plan, unpack) against
the reference ``run_region`` on a compiled bert-tiny."""

from __future__ import annotations

import pytest
import torch

import kfuse
import kfuse.models
from kfuse.ir.graph import TensorType
from kfuse.runtime.varlen import device_token_index, run_region, scatter_unpack, token_index, unpack


def _masks() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    rnd = (torch.rand(5, 11, generator=gen) < 0.6).long()
    rnd[2] = 0  # a sequence with no valid token
    full = torch.ones(2, 4, dtype=torch.long)
    holes = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 1]])
    return [rnd, full, holes]


@pytest.mark.parametrize("k", range(3))
@pytest.mark.parametrize("extra", [0, 5])
def test_device_token_index_matches_the_host_version(k: int, extra: int) -> None:
    mask = _masks()[k]
    idx, cu, n = token_index(mask)
    tb = n + extra
    gather, scatter, cu_d = device_token_index(mask, tb)
    rows = mask.numel()
    assert gather.shape == scatter.shape == (tb,)
    assert torch.equal(scatter[:n], idx) and torch.equal(gather[:n], idx) and torch.equal(cu_d, cu)
    assert torch.all(scatter[n:] == rows)  # rows past T go to the dummy row
    assert torch.all((gather >= 0) & (gather < rows))  # and read a real (ignored) row


@pytest.mark.parametrize("flat", [False, True])
def test_scatter_unpack_drops_rows_past_t(flat: bool) -> None:
    mask = _masks()[0]
    b, s, h = mask.shape[0], mask.shape[1], 3
    idx, _, n = token_index(mask)
    tb = n + 7
    _, scatter, _ = device_token_index(mask, tb)
    y = torch.randn(tb, h)
    y[n:] = float("nan")  # whatever the packed plan leaves in rows past T must not show
    t = TensorType((b * s, h) if flat else (b, s, h), y.dtype)
    got = scatter_unpack(y, scatter, t, flat)
    want = unpack(y, idx, t, flat, n)
    assert torch.equal(got, want) and not torch.isnan(got).any()


def _bert_tiny_region() -> tuple[list[torch.Tensor], object]:
    """A compiled padding-free bert-tiny: the region step's outer inputs, as the plan passes them
    on a call, and the region's bucket runner."""
    m, a, kw = kfuse.models.build("bert-tiny", batch=3, seq=9, with_mask=True, avg_len_ratio=0.6)
    compiled = kfuse.compile(m, a, kw, check=False)
    plan = next(iter(compiled.variants.values())).plan
    step = next(s for s in plan.steps if s.info.template == "varlen_region")
    seen: list[list[torch.Tensor]] = []
    inner = step.fn
    step.fn = lambda xs, *rest: seen.append([x.clone() for x in xs]) or inner(xs, *rest)
    with torch.no_grad():
        compiled(*a, **kw)
    step.fn = inner
    return seen[-1], inner.region_state["runner"]


def test_bucket_body_equals_run_region_on_bert_tiny() -> None:
    xs, runner = _bert_tiny_region()
    r = runner.region
    n = int((xs[0] != 0).sum())
    tb = n + 6
    # poisoned: every row of a packed buffer must be written by the body
    packed = [
        torch.full((tb, *t.shape[1:]), float("nan") if t.dtype.is_floating_point else -1, dtype=t.dtype) if md == "pack" else None
        for (_, t), md in zip(r.graph.inputs[:-1], r.modes, strict=True)
    ]
    got = runner._body(tb, xs, packed)
    want = run_region(r, xs, runner.run_plan)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_capture_keeps_every_buffer_the_graph_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A captured graph holds raw addresses: the packed buffers it writes must belong to the bucket
    (session 3's first version kept them in a local of ``_capture``; after it returned, replays
    wrote into freed memory and an unrelated kernel read garbage indices at S=512)."""
    import contextlib
    import gc
    import weakref

    import kfuse.runtime.varlen as V

    class _Graph:
        def replay(self) -> None:
            pass

    class _Stream:
        def wait_stream(self, other: object) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "Stream", _Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g, **kw: contextlib.nullcontext())
    xs, runner = _bert_tiny_region()
    written: list[weakref.ref] = []
    body = runner._body

    def spy(tb: int, xs: list[torch.Tensor], packed: list[torch.Tensor | None]) -> list[torch.Tensor]:
        written.extend(weakref.ref(p) for p in packed if p is not None)
        written.extend(weakref.ref(x) for x in xs)
        return body(tb, xs, packed)

    monkeypatch.setattr(runner, "_body", spy)
    bucket = runner._capture(V.BUCKET, xs)
    gc.collect()
    assert written and all(w() is not None for w in written), "a buffer the graph writes was freed after capture"
    owned = {id(t) for t in bucket.inputs} | {id(p) for p in bucket.packed if p is not None}
    assert all(id(w()) in owned for w in written)


def test_refresh_copies_changed_inputs_in_one_call() -> None:
    from kfuse.runtime.varlen import _refresh

    dst = [torch.zeros(3, 4, dtype=torch.long), torch.zeros(2, dtype=torch.float16)]
    src = [torch.arange(12).reshape(3, 4), torch.randn(2).half()]
    _refresh(dst, src)
    assert all(torch.equal(d, s) for d, s in zip(dst, src, strict=True))
    _refresh(dst, dst)  # the same tensors: nothing to copy, nothing breaks
    assert torch.equal(dst[0], src[0])
