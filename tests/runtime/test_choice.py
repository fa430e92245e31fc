"""The measured lowering choice: the fastest candidate wins, a failing one never does, results
are cached per problem, and representative inputs can replace random ones (CPU: wall-clock timing;
GPU: GPU time from CUDA-graph replays)."""

import time

import pytest
import torch

from kfuse.ir.graph import GraphBuilder, Node, TensorType
from kfuse.runtime import choice


@pytest.fixture(autouse=True)
def _measured_here(monkeypatch):
    """Every choice measured in this test: an empty in-process cache and, on a GPU, no tuning database
    (a choice stored there by an earlier run would be read back instead of measured, and this test's
    made-up problems must not be stored in it)."""
    monkeypatch.setattr(choice, "_CACHE", {})
    monkeypatch.setattr(choice, "_persistent_db", lambda: None)


def _slow(device):
    """A candidate slower than doing nothing by ~2 ms of the clock that times it: the wall clock on the CPU,
    GPU time on a GPU (a host sleep is not in a CUDA graph; a spinning kernel is)."""

    def run(xs):
        if device == "cuda":
            torch.cuda._sleep(2_000_000)  # GPU clock cycles: ~1 ms at the H200's ~1.98 GHz
        else:
            time.sleep(0.002)
        return xs[0]

    return run


def _graph():
    gb = GraphBuilder("g")
    x = gb.add_input("x", TensorType((4, 8), torch.float32))
    y = gb.add_node(Node("y", "relu", (x,), TensorType((4, 8), torch.float32)))
    g = gb.build([y])
    return g, g.nodes[-1]


def test_fastest_wins_failing_never_and_cache(monkeypatch, device) -> None:
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device=device: [torch.randn(4, 8, device=device)])
    g, node = _graph()
    calls = {"fast": 0}
    slow = _slow(device)

    def fast(xs):
        calls["fast"] += 1
        return xs[0]

    def broken(xs):
        raise RuntimeError("cannot run")

    name, times = choice.choose(node, g, {"slow": slow, "fast": fast, "broken": broken}, ("k", 1))
    assert name == "fast" and times["broken"] == float("inf") and times["slow"] > times["fast"]
    n = calls["fast"]
    assert choice.choose(node, g, {"slow": slow, "fast": fast, "broken": broken}, ("k", 1))[0] == "fast"
    assert calls["fast"] == n  # cached: not measured again


def test_given_inputs_are_used(device) -> None:
    g, node = _graph()
    seen = []
    cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)

    def cand(xs):
        seen.append(xs[0])
        return xs[0]

    choice.choose(node, g, {"only": cand}, ("k", 2), [cu])
    assert seen and all(x is cu for x in seen)


def test_an_inputs_function_is_called_on_a_miss_only(device) -> None:
    """Inputs given as a function (the pool kernels' channels-last copies) are made for a measurement only."""
    g, node = _graph()
    made = []

    def inputs():
        made.append(1)
        return [torch.randn(4, 8, device=device)]

    first = choice.choose(node, g, {"only": lambda xs: xs[0]}, ("k", 3), inputs)
    assert first[0] == "only" and made == [1]
    assert choice.choose(node, g, {"only": lambda xs: xs[0]}, ("k", 3), inputs) == first and made == [1]


def test_choices_persist_in_the_tuning_database(monkeypatch, tmp_path, device) -> None:
    """A second process (a cleared in-process cache) reads the choice back instead of measuring."""
    from kfuse.tune.database import TuningDB

    db = TuningDB(tmp_path / "t.sqlite")
    monkeypatch.setattr(choice, "_persistent_db", lambda: db)
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device=device: [torch.randn(4, 8, device=device)])
    g, node = _graph()
    calls = {"n": 0}
    slow = _slow(device)

    def a(xs):
        calls["n"] += 1
        return slow(xs)

    def b(xs):
        calls["n"] += 1
        return xs[0]

    first = choice.choose(node, g, {"a": a, "b": b}, ("persist", 1))
    assert first[0] == "b" and calls["n"] > 0
    choice._CACHE.clear()
    calls["n"] = 0
    again = choice.choose(node, g, {"a": a, "b": b}, ("persist", 1))
    assert again[0] == "b" and calls["n"] == 0
    assert again[1]["a"] == first[1]["a"]
    assert db.stats()["choices"] == 1
    # a different candidate list is a different question: measured again
    choice.choose(node, g, {"a": a, "b": b, "c": b}, ("persist", 1))
    assert calls["n"] > 0 and db.stats()["choices"] == 2
    db.clear()
    assert db.stats()["choices"] == 0


def test_identical_layers_share_one_problem_key_whatever_the_report_notes() -> None:
    """Two GEMMs of one shape in different layers: the b2b pass's "not fused" note names each node
    and the tuner's config may be set, but what they compute is the same problem (session 33: with
    the note in the key, BERT-base's twelve FFN1 GEMMs were each timed again and split between the
    library and the template by noise). A real attribute difference still changes the key."""
    gb = GraphBuilder("g")
    x = gb.add_input("x", TensorType((4, 8), torch.float32))
    t = TensorType((4, 8), torch.float32)
    a = gb.add_node(Node("gelu_59", "relu", (x,), t, {"b2b": "not fused: N0 of gelu_59 > 256", "config": "c1", "alpha": 1}))
    b = gb.add_node(Node("gelu_91", "relu", (a,), t, {"b2b": "not fused: N0 of gelu_91 > 256", "note": "n", "alpha": 1}))
    c = gb.add_node(Node("gelu_123", "relu", (b,), t, {"alpha": 2}))
    g = gb.build([c])
    na, nb, nc = g.nodes
    assert choice.problem_key(na, g) == choice.problem_key(nb, g)
    assert choice.problem_key(na, g) != choice.problem_key(nc, g)


def test_a_gpu_fault_stops_the_compile_and_names_the_candidate(monkeypatch) -> None:
    """An illegal address is not a candidate that lost: the CUDA context is gone, so going on made the error
    surface at an unrelated later call (session 35: ConvNeXt-T and Swin-T on the H200). An ordinary failure
    (a compile error, out of memory) still only loses. CPU: the faults are raised as torch reports them."""
    from kfuse.runtime import cuda_fault

    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device="cpu": [torch.randn(4, 8)])
    g, node = _graph()

    def ok(xs):
        return xs[0]

    def oom(xs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def fault(xs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    assert choice.choose(node, g, {"ok": ok, "oom": oom}, ("fault", 1))[0] == "ok"
    with pytest.raises(cuda_fault.CudaFault, match=r"candidate 'bad' of y \(relu\).*illegal memory access.*restart"):
        choice.choose(node, g, {"ok": ok, "bad": fault}, ("fault", 2))
    acc = getattr(torch, "AcceleratorError", None)
    if acc is not None:
        assert cuda_fault.is_fault(acc("CUDA error: an illegal memory access was encountered"))
        if not torch.cuda.is_available():  # a CUDA error after which the GPU still synchronizes only loses
            assert not cuda_fault.is_fault(acc("CUDA error: invalid argument"))
    assert not cuda_fault.is_fault(RuntimeError("triton: out of resources: shared memory"))
    assert not cuda_fault.is_fault(RuntimeError("CUDA error: out of memory"))
    assert cuda_fault.is_fault(RuntimeError("CUDA error: unspecified launch failure"))
    inner = cuda_fault.CudaFault("kfuse: the GPU faulted in the first calls of x's b2b candidates: ...")
    with pytest.raises(cuda_fault.CudaFault) as got:  # an outer decision passes an inner one on unchanged
        cuda_fault.check(inner, "the b2b decision of x")
    assert got.value is inner


def test_a_candidate_that_faulted_is_skipped_by_the_next_process(monkeypatch, tmp_path) -> None:
    """The fault is remembered in the tuning database: the compile retried in a new process (an empty
    in-process cache) never runs that candidate again and chooses among the others."""
    from kfuse.runtime import cuda_fault
    from kfuse.tune.database import TuningDB

    db = TuningDB(tmp_path / "t.sqlite")
    monkeypatch.setattr(choice, "_persistent_db", lambda: db)
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device="cpu": [torch.randn(4, 8)])
    g, node = _graph()
    runs = {"bad": 0}

    def ok(xs):
        return xs[0]

    def bad(xs):
        runs["bad"] += 1
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(cuda_fault.CudaFault, match="remembered"):
        choice.choose(node, g, {"bad": bad, "ok": ok}, ("retry", 1))
    choice._CACHE.clear()  # a new process
    runs["bad"] = 0
    name, times = choice.choose(node, g, {"bad": bad, "ok": ok}, ("retry", 1))
    assert name == "ok" and times["bad"] == float("inf") and runs["bad"] == 0


def test_a_candidate_that_computes_something_else_is_never_chosen(monkeypatch, device) -> None:
    """With a ``reference``, each other candidate's output is compared with its output first: the fastest one that
    is wrong (a new kernel whose reduction raced, say) gets no time and loses; one within rounding still wins."""
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device=device: [torch.randn(4, 8, device=device)])
    g, node = _graph()
    slow = _slow(device)

    def fast_but_wrong(xs):
        return xs[0] * 2

    def fast_and_rounded(xs):
        return xs[0] * (1 + 1e-3)

    name, times = choice.choose(node, g, {"template": slow, "wrong": fast_but_wrong}, ("ref", 1), reference="template")
    assert name == "template" and times["wrong"] == float("inf")
    name, times = choice.choose(node, g, {"template": slow, "rounded": fast_and_rounded}, ("ref", 2), reference="template")
    assert name == "rounded" and times["rounded"] < times["template"]


def test_a_transposed_weight_is_timed_in_the_layout_the_plan_reads(device) -> None:
    """A GEMM reading ``permute(W, (1, 0))`` of a constant ``[N, K]`` weight is timed on that view (K-contiguous),
    not on a random row-major ``[K, N]`` stand-in; runtime inputs stay random."""
    from kfuse.runtime.unfused import decision_inputs

    gb = GraphBuilder("t")
    x = gb.add_input("x", TensorType((1, 6), torch.float32))
    w = gb.add_constant(torch.randn(5, 6), "w")
    wt = gb.op("permute", [w], {"dims": (1, 0)}, name="wt")
    y = gb.op("matmul", [x, wt], name="y")
    g = gb.build([y])
    node = g.nodes[-1]
    for xs in (choice.example_inputs(node, g, device), decision_inputs(node, g, torch.device(device))):
        assert xs[1].shape == (6, 5) and xs[1].stride() == (1, 6)
        assert torch.equal(xs[1].cpu(), g.constants["w"].t())
        assert xs[0].shape == (1, 6)


def test_the_candidates_compile_together_before_any_is_timed(monkeypatch, device) -> None:
    """On a miss, every candidate but one that faulted goes to the compile workers in one batch, before the first is timed
    (the timing loop then finds the kernels in Triton's cache); a hit and a lone candidate compile nothing."""
    from kfuse.runtime import parallel_compile

    batches: list[list] = []
    order: list[str] = []
    monkeypatch.setattr(choice, "_on_gpu", lambda xs: True)
    monkeypatch.setattr(choice, "_faulted", lambda db, problem, names: {"faulty"})
    monkeypatch.setattr(parallel_compile, "precompile", lambda calls, wait=True: batches.append(list(calls)) or order.append("batch"))
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device=device: [torch.randn(4, 8, device=device)])
    g, node = _graph()

    def cand(tag):
        def run(xs):
            order.append(tag)
            return xs[0]

        return run

    cands = {"a": cand("a"), "b": cand("b"), "faulty": cand("faulty")}
    choice.choose(node, g, cands, ("together", 1))
    assert len(batches) == 1 and order[0] == "batch" and "faulty" not in order
    order.clear()
    for call in batches[0]:  # each recorded call runs its candidate on the race's inputs
        call()
    assert order == ["a", "b"]
    choice.choose(node, g, cands, ("together", 1))  # a hit
    choice.choose(node, g, {"a": cand("a")}, ("together", 2))  # nothing to compile side by side
    assert len(batches) == 1
