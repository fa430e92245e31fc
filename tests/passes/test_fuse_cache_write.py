"""A KV cache's update (``index_copy`` along the sequence dim, the key's rotary embedding before it) as one
``cache_write`` kernel, run in place on the cache buffer; the rotary node folds in only where the update is its
only reader."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import kfuse

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class _Layer(nn.Module):
    """A decode step's attention over a static cache held in buffers, as gpt-fast / transformers write it."""

    def __init__(self, keep_rotated_key: bool = False) -> None:
        super().__init__()
        self.heads, self.dim, self.slots = 2, 8, 12
        self.qkv = nn.Linear(16, 3 * 16)
        self.register_buffer("k", torch.zeros(1, self.heads, self.slots, self.dim))
        self.register_buffer("v", torch.zeros(1, self.heads, self.slots, self.dim))
        self.keep = keep_rotated_key

    def forward(self, x: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, self.heads, self.dim).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        self.k.index_copy_(2, pos, k)
        self.v.index_copy_(2, pos, v)
        mask = torch.arange(self.slots, device=x.device)[None, None, None, :] <= pos[-1]
        o = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
        out = o.transpose(1, 2).reshape(b, t, -1)
        return out + k.sum() if self.keep else out  # keep: the rotated key has a second reader


def _inputs(step: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(step)
    angle = torch.randn(1, 1, 1, 8, generator=g)
    return tuple(t.to(DEVICE) for t in (torch.randn(1, 1, 16, generator=g), torch.tensor([step]), angle.cos(), angle.sin()))


def _run(keep: bool) -> kfuse.CompiledModel:
    torch.manual_seed(0)
    model, eager = _Layer(keep).eval().to(DEVICE), _Layer(keep).eval().to(DEVICE)
    eager.load_state_dict(model.state_dict())
    compiled = kfuse.compile(model, _inputs(0))
    for step in range(3):
        args = _inputs(step)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.k, eager.k, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.v, eager.v, rtol=1e-5, atol=1e-5)
    return compiled


def test_key_and_value_writes_are_cache_write_kernels_in_place() -> None:
    compiled = _run(keep=False)
    graph = compiled.plan.graph
    writes = [n for n in graph.nodes if n.op == "cache_write"]
    assert len(writes) == 2 and sorted(len(n.inputs) for n in writes) == [3, 5]  # the value's, the key's with cos / sin
    assert [n.op for n in graph.nodes].count("rotary") == 1  # the query's; the key's folded into its write
    assert all(w["how"] == "in place" and w["op"] == "cache_write" for w in compiled.report["state_writes"])
    assert not any(k["template"] == "fallback" for k in compiled.report["kernels"])


def test_a_rotated_key_read_elsewhere_keeps_its_rotary_node() -> None:
    compiled = _run(keep=True)
    graph = compiled.plan.graph
    assert [n.op for n in graph.nodes].count("rotary") == 2
    assert sorted(len(n.inputs) for n in graph.nodes if n.op == "cache_write") == [3, 3]


def test_the_option_turns_it_off() -> None:
    torch.manual_seed(0)
    compiled = kfuse.compile(_Layer().eval().to(DEVICE), _inputs(0), fuse_cache_write=False)
    assert not any(n.op == "cache_write" for n in compiled.plan.graph.nodes)
    assert all(w["how"] == "in place" and w["op"] == "aten.index_copy.default" for w in compiled.report["state_writes"])


def test_pytorch_backend_writes_the_cache_in_place_too() -> None:
    """With ``backend="torch"`` (PyTorch's ops for every kernel) the cache's update still runs in place
    (``index_copy_``): copying the whole cache back every token is what the op exists to avoid."""
    torch.manual_seed(0)
    model, eager = _Layer().eval().to(DEVICE), _Layer().eval().to(DEVICE)
    eager.load_state_dict(model.state_dict())
    compiled = kfuse.compile(model, _inputs(0), backend="torch")
    assert all(w["how"] == "in place" for w in compiled.report["state_writes"]), compiled.report["state_writes"]
    for step in range(2):
        args = _inputs(step)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.k, eager.k, rtol=1e-5, atol=1e-5)


class _CountedLayer(_Layer):
    """transformers' ``StaticLayer``: the positions are ``arange(T) + length``, the length a buffer bumped before the
    writes read the positions. ``mask_from_positions``: the mask reads the positions too (a second reader)."""

    def __init__(self, mask_from_positions: bool = False) -> None:
        super().__init__()
        self.register_buffer("length", torch.tensor(0))
        self.mask_from_positions = mask_from_positions

    def forward(self, x: torch.Tensor, last: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, self.heads, self.dim).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
        k = k * cos + _rotate_half(k) * sin
        positions = torch.arange(t, device=x.device) + self.length
        self.length.add_(t)
        self.k.index_copy_(2, positions, k)
        self.v.index_copy_(2, positions, v)
        limit = positions[-1] if self.mask_from_positions else last[-1]
        mask = torch.arange(self.slots, device=x.device)[None, None, None, :] <= limit
        o = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=mask)
        return o.transpose(1, 2).reshape(b, t, -1)


def _run_counted(mask_from_positions: bool) -> kfuse.CompiledModel:
    torch.manual_seed(0)
    model, eager = _CountedLayer(mask_from_positions).eval().to(DEVICE), _CountedLayer(mask_from_positions).eval().to(DEVICE)
    eager.load_state_dict(model.state_dict())
    compiled = kfuse.compile(model, _inputs(0))
    assert int(model.length) == 0  # compiling wrote nothing
    for step in range(4):
        args = _inputs(step)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*args), eager(*args), rtol=1e-5, atol=1e-5)
        for name in ("k", "v", "length"):
            torch.testing.assert_close(getattr(model, name), getattr(eager, name), rtol=1e-5, atol=1e-5)
    assert int(model.length) == 4
    return compiled


def test_the_positions_add_folds_into_the_writes_and_the_counter_moves_after_them() -> None:
    """``arange + length`` is read by the two writes alone: both add it as they read the index (no add launch), and
    the counter's bump, which came before the writes, runs after them, in place."""
    compiled = _run_counted(mask_from_positions=False)
    writes = [n for n in compiled.plan.graph.nodes if n.op == "cache_write"]
    assert len(writes) == 2 and all(n.attrs.get("index_offset") for n in writes)
    assert all(n.inputs[-1] == "length" or "length" in n.inputs[-1] for n in writes), [n.inputs for n in writes]
    assert all(w["how"] == "in place" for w in compiled.report["state_writes"]), compiled.report["state_writes"]
    steps = compiled.plan.steps
    bump = max(i for i, s in enumerate(steps) if "add" in s.info.ops and s.info.template == "torch")
    assert max(i for i, s in enumerate(steps) if s.info.template == "cache_write") < bump


def test_positions_read_elsewhere_keep_their_add() -> None:
    compiled = _run_counted(mask_from_positions=True)
    assert not any(n.attrs.get("index_offset") for n in compiled.plan.graph.nodes if n.op == "cache_write")
    assert all(w["how"] == "in place" for w in compiled.report["state_writes"]), compiled.report["state_writes"]
