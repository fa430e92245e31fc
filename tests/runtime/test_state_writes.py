"""Forward writes into its inputs or buffers (a static KV cache, a counter): the compiled model writes the same
values into the same tensors, in place where the update is an ``index_copy`` / ``index_put`` of the old value,
and compiling writes nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import kfuse
from kfuse.frontend.torch_export import FrontendError
from kfuse.runtime.executor import plan_values
from kfuse.runtime.state_writes import protect, written_positions

# on a GPU the plans run kfuse's kernels in CUDA graphs (written inputs bound by address); on the CPU, the interpreter
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class _IndexCopyCache(nn.Module):
    """A decoder layer's cache update, as Hugging Face's ``StaticCache`` writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 9, 5))
        self.lin = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.k.index_copy_(1, pos, self.lin(x))
        return self.k.sum(1) * 2


class _IndexPutCache(nn.Module):
    """gpt-fast's ``KVCache.update``: ``k_out[:, :, input_pos] = k_val``."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 7, 3))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k = self.k
        k[:, :, pos] = torch.tanh(x)
        return k.softmax(-2)


class _ReadsOldValue(nn.Module):
    """Reads the cache before writing it: that read comes first in the plan, so the update still runs in place."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 9, 5))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        before = self.k.sum()
        self.k.index_copy_(1, pos, x)
        return self.k.sum(1) + before


class _Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x * 2 + self.count


class _IntCounter(nn.Module):
    """A cache's length as an int64 scalar buffer (Hugging Face's ``StaticLayer.cumulative_length``)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("n", torch.tensor(0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.n.add_(2)
        return x * self.n


class _LayerLengths(nn.Module):
    """A length counter per layer, each read (as the positions it writes at) and then bumped by one, as
    transformers' static cache does in every layer of a decode step."""

    def __init__(self) -> None:
        super().__init__()
        for i in range(3):
            self.register_buffer(f"n{i}", torch.tensor(i))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(3):
            n = getattr(self, f"n{i}")
            x = x * (n + 2)  # reads the old length (n + 1 would be the new value itself, after CSE)
            n.add_(1)
        return x


class _WritesItsInput(nn.Module):
    def forward(self, cache: torch.Tensor, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(0, pos, x)
        return cache.cumsum(0)


class _WritesAParameter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.w.add_(1)
        return x + self.w


def _pair(cls: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    a = cls().eval().to(DEVICE)
    b = cls().eval().to(DEVICE)
    b.load_state_dict(a.state_dict())
    return a, b


def _on_device(args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(a.to(DEVICE) for a in args)


def _steps(cls: type[nn.Module], make_args, n: int = 4) -> kfuse.CompiledModel:
    """Compile, then call ``n`` times beside eager PyTorch: outputs and buffers equal after every call."""
    model, eager = _pair(cls)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = kfuse.compile(model, _on_device(make_args(0)))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), f"compiling wrote {k}"
    for step in range(n):
        args = _on_device(make_args(step))
        with torch.no_grad():
            ref = eager(*[a.clone() for a in args])
        got = compiled(*args)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        for (k, v), w in zip(model.state_dict().items(), eager.state_dict().values(), strict=True):
            torch.testing.assert_close(v, w, rtol=1e-5, atol=1e-5, msg=f"buffer {k} after call {step}")
    return compiled


def test_index_copy_cache_updates_in_place() -> None:
    compiled = _steps(_IndexCopyCache, lambda s: (torch.randn(2, 1, 5), torch.tensor([s + 2])))
    (w,) = compiled.report["state_writes"]
    assert w["how"] == "in place" and w["op"] == "aten.index_copy.default"
    step = next(s for s in compiled.plan.steps if s.info.template == "in_place")
    v = compiled.variant
    xs = protect(v.imported.graph_inputs(list(_on_device((torch.randn(2, 1, 5), torch.tensor([5]))))), written_positions(v.plan))
    buffer = xs[v.plan.input_writes[0][1]]
    assert plan_values(v.plan, xs)[step.output] is buffer  # the update's value is the buffer itself: no copy


def test_index_put_cache_updates_in_place() -> None:
    compiled = _steps(_IndexPutCache, lambda s: (torch.randn(1, 2, 2, 3), torch.tensor([s, s + 3])))
    (w,) = compiled.report["state_writes"]
    assert w["how"] == "in place" and w["op"] == "aten.index_put.default"


class _KeepsOldValue(nn.Module):
    """Keeps the old cache (a clone, which kfuse imports as the same value) and reads it after the write: the
    update cannot run in place, the new value is copied back."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(2, 9, 5))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        old = self.k.clone()
        self.k.index_copy_(1, pos, x)
        return self.k.sum(1) * old.sum(1).tanh()


def test_reading_the_old_value_first_still_runs_in_place() -> None:
    compiled = _steps(_ReadsOldValue, lambda s: (torch.randn(2, 1, 5), torch.tensor([s])))
    assert compiled.report["state_writes"][0]["how"] == "in place"


def test_reading_the_old_value_after_the_write_copies_back() -> None:
    from kfuse.report import summary_lines

    compiled = _steps(_KeepsOldValue, lambda s: (torch.randn(2, 1, 5), torch.tensor([s])))
    (w,) = compiled.report["state_writes"]
    assert w["how"] == "copied back" and "a later step reads the input's old value" in w["why"]
    lines = summary_lines(compiled.report)  # what --explain and the CLI print
    assert "state writes: 0 of 1 in place" in lines and "  b_k copied back: a later step reads the input's old value" in lines


def test_counter_buffer() -> None:
    compiled = _steps(_Counter, lambda s: (torch.randn(3, 4),))
    (w,) = compiled.report["state_writes"]
    assert w["input"] == "b_count" and w["how"] == "in place"  # the elementwise add writes into the buffer
    assert any("into input b_count" in k.get("config", "") for k in compiled.report["kernels"])


def test_int_counter_buffer() -> None:
    compiled = _steps(_IntCounter, lambda s: (torch.randn(3, 4),))
    (w,) = compiled.report["state_writes"]
    assert w["how"] == "in place" and w["op"] == "add"  # PyTorch's add with out= the buffer: no copy after it


def test_counters_bumped_by_one_launch() -> None:
    """The three counters' increments become one ``_foreach_add_`` at the last of them (two steps launch nothing)."""
    compiled = _steps(_LayerLengths, lambda s: (torch.randn(3, 4),))
    writes = compiled.report["state_writes"]
    assert len(writes) == 3 and all(w["how"] == "in place" and "batched" in w for w in writes)
    configs = [k.get("config", "") for k in compiled.report["kernels"]]
    assert sum("_foreach_add_ of 3 inputs" in c for c in configs) == 1
    assert sum("deferred to" in c for c in configs) == 2


def test_written_caller_input() -> None:
    """A caller's tensor that forward writes is written by the compiled model too, once a call."""
    torch.manual_seed(1)
    cache = torch.randn(6, 3, device=DEVICE)
    compiled = kfuse.compile(_WritesItsInput(), _on_device((cache.clone(), torch.randn(1, 3), torch.tensor([2]))))
    assert compiled.report["state_writes"][0]["how"] == "in place"
    mine, theirs = cache.clone(), cache.clone()
    for step in range(3):
        x, pos = _on_device((torch.randn(1, 3), torch.tensor([step])))
        ref = _WritesItsInput()(theirs, x, pos)
        got = compiled(mine, x, pos)
        torch.testing.assert_close(got, ref)
        torch.testing.assert_close(mine, theirs)


def test_compile_check_covers_the_written_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compile's own check compares what forward writes, not only what it returns: a plan that drops
    the write-back is caught."""
    import kfuse.runtime.compiled_model as cm
    import kfuse.runtime.state_writes as sw

    monkeypatch.setattr(sw, "write_back", lambda plan, env, inputs: None)
    monkeypatch.setattr(cm, "write_in_place", lambda plan, pair=True: [])
    with pytest.warns(UserWarning, match="differs from PyTorch"):
        compiled = kfuse.compile(_Counter().eval().to(DEVICE), _on_device((torch.randn(3, 4),)))
    assert compiled.report["max_rel_err"] > 0.1


def test_writing_a_parameter_is_refused() -> None:
    with pytest.raises(FrontendError, match="writes in place to parameter w"):
        kfuse.compile(_WritesAParameter().eval(), (torch.randn(4),))


def test_step_errors_leave_the_state_alone() -> None:
    model, _ = _pair(_IndexCopyCache)
    compiled = kfuse.compile(model, _on_device((torch.randn(2, 1, 5), torch.tensor([1]))))
    before = model.k.clone()
    compiled.step_errors(*_on_device((torch.randn(2, 1, 5), torch.tensor([4]))))
    assert torch.equal(model.k, before)


def test_torch_compile_backend_with_a_buffer_cache() -> None:
    """Through Dynamo a module's buffers are frozen weights; one that forward writes stays the module's tensor."""
    model, eager = _pair(_IndexCopyCache)
    fast = torch.compile(model, backend="kfuse")
    for step in range(3):
        x, pos = _on_device((torch.randn(2, 1, 5), torch.tensor([step])))
        with torch.no_grad():
            torch.testing.assert_close(fast(x, pos), eager(x, pos), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.k, eager.k, rtol=1e-5, atol=1e-5)


class _KeyValueCache(nn.Module):
    """A decoder layer's key and value caches, written at the same positions (``[B, H, L, D]``, dim 2)."""

    read_values_between = False

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 2, 9, 4))
        self.register_buffer("v", torch.zeros(1, 2, 9, 4))
        self.lin = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kv = self.lin(x).view(1, x.shape[1], 2, 2, 4)  # [B, T, (k, v), H, D]
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        self.k.index_copy_(2, pos, k)
        before = self.v.sum() if self.read_values_between else 0.0  # the value cache's old rows, read after the key write
        self.v.index_copy_(2, pos, v)
        return (self.k * self.v).sum(-1) + before


class _ReadsValuesBetween(_KeyValueCache):
    read_values_between = True


def test_a_layers_key_and_value_writes_share_one_launch() -> None:
    """The two cache writes at one position run as one kernel (the value's step only names its written cache);
    every call's outputs and both caches equal eager's."""
    compiled = _steps(_KeyValueCache, lambda s: (torch.randn(1, 1, 8), torch.tensor([s + 1])))
    writes = compiled.report["state_writes"]
    assert [w["how"] for w in writes] == ["in place", "in place"]
    assert sum("paired" in w for w in writes) == 1
    templates = [k["template"] for k in compiled.report["kernels"]]
    assert templates.count("cache_write") == 1


def test_a_read_of_the_old_values_between_keeps_two_launches() -> None:
    """Moving the value write up to the key write's launch would let a read between them see the new rows: the
    writes stay apart (both still in place) and the outputs equal eager's."""
    compiled = _steps(_ReadsValuesBetween, lambda s: (torch.randn(1, 1, 8), torch.tensor([s + 1])))
    writes = compiled.report["state_writes"]
    assert [w["how"] for w in writes] == ["in place", "in place"] and not any("paired" in w for w in writes)
    assert [k["template"] for k in compiled.report["kernels"]].count("cache_write") == 2


def test_pairing_can_be_turned_off() -> None:
    """``Options.pair_cache_writes=False`` (the decode bench's ``kfuse_no_paired_writes``): two launches again."""
    model, _ = _pair(_KeyValueCache)
    compiled = kfuse.compile(model, _on_device((torch.randn(1, 1, 8), torch.tensor([1]))), pair_cache_writes=False)
    assert not any("paired" in w for w in compiled.report["state_writes"])
    assert [k["template"] for k in compiled.report["kernels"]].count("cache_write") == 2
