"""The measured lowering choice: the fastest candidate wins, a failing one never does, results
are cached per problem, and representative inputs can replace random ones (CPU: wall-clock timing)."""

import time

import torch

from kfuse.ir.graph import GraphBuilder, Node, TensorType
from kfuse.runtime import choice


def _graph():
    gb = GraphBuilder("g")
    x = gb.add_input("x", TensorType((4, 8), torch.float32))
    y = gb.add_node(Node("y", "relu", (x,), TensorType((4, 8), torch.float32)))
    g = gb.build([y])
    return g, g.nodes[-1]


def test_fastest_wins_failing_never_and_cache(monkeypatch) -> None:
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device="cuda": [torch.randn(4, 8)])
    g, node = _graph()
    calls = {"fast": 0}

    def slow(xs):
        time.sleep(0.002)
        return xs[0]

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


def test_given_inputs_are_used() -> None:
    g, node = _graph()
    seen = []
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)

    def cand(xs):
        seen.append(xs[0])
        return xs[0]

    choice.choose(node, g, {"only": cand}, ("k", 2), [cu])
    assert seen and all(x is cu for x in seen)


def test_choices_persist_in_the_tuning_database(monkeypatch, tmp_path) -> None:
    """A second process (a cleared in-process cache) reads the choice back instead of measuring."""
    from kfuse.tune.database import TuningDB

    db = TuningDB(tmp_path / "t.sqlite")
    monkeypatch.setattr(choice, "_persistent_db", lambda: db)
    monkeypatch.setattr(choice, "example_inputs", lambda node, graph, device="cuda": [torch.randn(4, 8)])
    g, node = _graph()
    calls = {"n": 0}

    def a(xs):
        calls["n"] += 1
        time.sleep(0.002)
        return xs[0]

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
