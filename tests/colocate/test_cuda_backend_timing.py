"""The real backend's timing rules, with the GPU window replaced by a script (no GPU needed)."""

from __future__ import annotations

import pytest

from kfuse.colocate import cuda_backend as cb


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    windows: list[tuple[float, float]] = []
    spins: list[int | None] = []  # each window's spin in cycles (None: the current one)
    monkeypatch.setattr(cb, "SPINS", spins, raising=False)
    monkeypatch.setattr(cb.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cb, "_gate", lambda: None)  # these tests are of the spin (the gate's own tests: test_stream_gate.py)
    monkeypatch.setattr(cb, "_window", lambda fn, cycles=None: (spins.append(cycles), fn(), windows.pop(0))[2])
    monkeypatch.setattr(cb, "PREROLL", {**cb.PREROLL, "cycles": 1000, "ms": 0.1, "cycles_per_ms": 10_000.0, "uncovered": 0, "retimed": 0})
    return windows


def test_covered_window_is_returned_as_is(fake_gpu: list[tuple[float, float]]) -> None:
    fake_gpu += [(0.25, 0.01)]
    calls = []
    assert cb.timed(lambda: calls.append(1)) == 0.25
    assert len(calls) == 1 and cb.PREROLL["uncovered"] == 0 and cb.PREROLL["retimed"] == 0


def test_uncovered_window_is_retimed_and_the_spin_grows(fake_gpu: list[tuple[float, float]]) -> None:
    # the host took 0.3 ms to enqueue behind a 0.1 ms spin: the GPU idled inside the first window
    fake_gpu += [(0.9, 0.3), (0.4, 0.02)]
    calls = []
    assert cb.timed(lambda: calls.append(1)) == 0.4
    assert len(calls) == 2
    assert cb.PREROLL["uncovered"] == 1 and cb.PREROLL["retimed"] == 1
    assert cb.PREROLL["ms"] == pytest.approx(0.45) and cb.PREROLL["cycles"] == 4500


def test_a_host_stall_beyond_the_longest_spin_keeps_the_spin_and_the_shorter_window(fake_gpu: list[tuple[float, float]]) -> None:
    fake_gpu += [(850.0, 849.0), (2.0, 1.5)]  # a GC pause, then a window still uncovered but far less idle
    assert cb.timed(lambda: None) == 2.0
    assert cb.PREROLL["ms"] == 0.1  # a stall longer than MAX_PREROLL_MS does not lengthen every later window


def test_without_retime_the_first_window_stands(fake_gpu: list[tuple[float, float]]) -> None:
    fake_gpu += [(0.9, 0.45)]  # longer than 0.8 x even the longest spin
    assert cb.timed(lambda: None, retime=False) == 0.9
    assert cb.PREROLL["uncovered"] == 1 and cb.PREROLL["retimed"] == 0


def test_a_window_that_cannot_run_twice_gets_the_longest_spin(fake_gpu: list[tuple[float, float]]) -> None:
    # a histogram's launch (atomics) cannot be re-timed: a 0.3 ms enqueue behind the 0.1 ms spin would stay in its time
    fake_gpu += [(0.25, 0.3), (0.2, 0.02)]
    assert cb.timed(lambda: None, retime=False) == 0.25
    assert cb.SPINS[-1] == int(cb.MAX_PREROLL_MS * cb.PREROLL["cycles_per_ms"])
    assert cb.PREROLL["uncovered"] == 0 and cb.PREROLL["ms"] == 0.1  # covered, and the repeatable windows' spin unchanged
    assert cb.timed(lambda: None) == 0.2
    assert cb.SPINS[-1] is None


def test_no_garbage_collection_inside_a_spun_window(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    class FakeEvent:
        def __init__(self, **_: object) -> None: ...
        def record(self) -> None: ...
        def synchronize(self) -> None: ...
        def elapsed_time(self, other: object) -> float:
            return 0.1

    monkeypatch.setattr(cb.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(cb.torch.cuda, "_sleep", lambda cycles: None)
    seen = []
    cb._window(lambda: seen.append(gc.isenabled()))
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError):
        cb._window(lambda: (_ for _ in ()).throw(ValueError("a launch failed")))
    assert gc.isenabled()


def test_segments_run_eagerly_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from kfuse.colocate.lc import LCItem

    # the no-GPU path on a GPU machine too (there ``graphed`` would capture the segment in a CUDA graph)
    monkeypatch.setattr(cb.torch.cuda, "is_available", lambda: False)
    ran = []
    items = [LCItem("seg0", None, lambda: ran.append(0), "", ("layer_norm",))]
    backend = cb.CudaBackend(items, {})
    assert backend.graphed_segments == 0
    backend.run_lc(0)
    assert ran == [0]


@pytest.fixture
def fresh_history(monkeypatch: pytest.MonkeyPatch) -> None:
    from collections import deque

    monkeypatch.setattr(cb, "_enqueues", deque(maxlen=cb.ENQUEUE_WINDOW))
    monkeypatch.setattr(cb, "_since_resize", 0)


def test_one_slow_enqueue_grows_the_spin_only_until_the_next_window_of_enqueues(fake_gpu, fresh_history) -> None:
    fake_gpu += [(0.9, 0.3), (0.4, 0.02)]  # one slow enqueue: the spin grows to 0.45 ms
    cb.timed(lambda: None)
    assert cb.PREROLL["ms"] == pytest.approx(0.45)
    # then fast enqueues (20-40 us): while the slow one is among the last window's, the spin stays; once a whole
    # window of fast ones has passed, it is back at its floor
    fast = [0.02 + 0.02 * (i % 3) / 2 for i in range(2 * cb.ENQUEUE_WINDOW)]
    fake_gpu += [(0.2, e) for e in fast]
    for i, _ in enumerate(fast):
        assert cb.timed(lambda: None) == 0.2
        if i == cb.ENQUEUE_WINDOW - 1:
            assert cb.PREROLL["ms"] == pytest.approx(0.45)
    assert cb.PREROLL["ms"] == pytest.approx(cb.MIN_PREROLL_MS)
    assert cb.PREROLL["cycles"] == int(cb.MIN_PREROLL_MS * cb.PREROLL["cycles_per_ms"])
    assert cb.PREROLL["shrinks"] == 1 and cb.PREROLL["uncovered"] == 1


def test_the_spin_shrinks_to_what_the_slowest_recent_enqueues_need(fake_gpu, fresh_history) -> None:
    cb.PREROLL.update(ms=0.5, cycles=5000)
    # mostly fast launches, and one in 50 enqueuing in 0.2 ms (a span's two partitions, say), and a 9 ms stall:
    # 1.5x the slow launches' time, not the floor (they stay covered) and not the stall's
    enq = [0.2 if i % 50 == 0 else 9.0 if i == 77 else 0.02 for i in range(cb.ENQUEUE_WINDOW)]
    fake_gpu += [(1.0, e) for e in enq]
    for _ in enq:
        cb.timed(lambda: None, retime=False)
    assert cb.PREROLL["ms"] == pytest.approx(0.3)
    assert cb.PREROLL["uncovered"] == 1  # the stall only


def test_the_spin_never_shrinks_below_what_the_enqueues_need(fake_gpu, fresh_history) -> None:
    cb.PREROLL.update(ms=0.1, cycles=1000)
    fake_gpu += [(0.2, 0.05)] * (2 * cb.ENQUEUE_WINDOW)
    for _ in range(2 * cb.ENQUEUE_WINDOW):
        cb.timed(lambda: None)
    assert cb.PREROLL["ms"] == pytest.approx(0.1) and cb.PREROLL["shrinks"] == 0
