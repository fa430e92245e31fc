"""The stream gate of the real backend's timing windows (``kfuse.colocate.gate``): its ticket protocol with a scripted
driver (no GPU needed), ``timed``'s use of it, and on the GPU that a host stall inside a gated window is not timed."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from kfuse.colocate import cuda_backend as cb
from kfuse.colocate import gate as gate_mod
from kfuse.colocate.gate import CU_STREAM_WAIT_VALUE_GEQ, StreamGate


def test_no_gate_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate_mod.torch.cuda, "is_available", lambda: False)
    assert StreamGate.create() is None


@pytest.fixture
def scripted_gate(monkeypatch: pytest.MonkeyPatch) -> tuple[StreamGate, list[tuple], torch.Tensor]:
    """A gate over a plain host word and a driver that records each wait (and answers ``rc`` from ``calls[0]``)."""
    calls: list[tuple] = []
    rc = [0]

    def wait_value(stream, addr, value, flags):  # noqa: ANN001, ANN202
        calls.append((stream.value, addr, value, flags))
        return rc[0]

    monkeypatch.setattr(gate_mod.torch.cuda, "current_stream", lambda: SimpleNamespace(cuda_stream=77))
    flag = torch.full((1,), -1, dtype=torch.int32)
    g = StreamGate(wait_value, flag, device_ptr=0xABC0)
    g.rc = rc  # type: ignore[attr-defined]
    return g, calls, flag


def test_each_hold_waits_for_a_new_ticket_that_the_release_writes(scripted_gate) -> None:
    g, calls, flag = scripted_gate
    for ticket in (1, 2, 3):
        g.hold(watchdog_s=10.0)  # no watchdog in the way: a GC pause here can last 50 ms
        assert calls[-1] == (77, 0xABC0, ticket, CU_STREAM_WAIT_VALUE_GEQ)
        assert int(flag[0]) != ticket  # still held: the host has not written it
        g.release()
        assert int(flag[0]) == ticket
    assert g.holds == 3


def test_the_ticket_wraps_at_32_bits(scripted_gate) -> None:
    g, calls, flag = scripted_gate
    g._ticket = 0xFFFFFFFF
    g.hold(watchdog_s=10.0)
    g.release()
    assert calls[-1][2] == 0 and int(flag[0]) == 0  # GEQ compares cyclically (int32 difference): 0 follows 2^32 - 1


def test_a_failed_wait_raises_and_holds_nothing(scripted_gate) -> None:
    g, _, _ = scripted_gate
    g.rc[0] = 1  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="CUresult 1"):
        g.hold()
    assert g.holds == 0


def test_the_watchdog_opens_a_gate_the_host_is_stuck_behind(scripted_gate) -> None:
    g, _, flag = scripted_gate
    g.hold(watchdog_s=0.05)
    t0 = time.perf_counter()
    while int(flag[0]) != 1:  # the host waiting for the held stream (a lazy module load, a synchronising free)
        assert time.perf_counter() - t0 < 2.0, "the watchdog never opened the gate"
        time.sleep(0.001)
    assert g.timeouts == 1
    g.release()
    assert int(flag[0]) == 1


def test_a_gate_opened_in_time_is_not_opened_again_by_a_late_watchdog(scripted_gate) -> None:
    g, _, flag = scripted_gate
    g.hold(watchdog_s=0.2)  # released at once; its deadline passes during the sleep below
    g.release()
    g.hold(watchdog_s=10.0)  # the next window: held, its ticket not written
    time.sleep(0.4)  # past the first window's deadline
    assert int(flag[0]) == 1 and g.timeouts == 0  # the first window's watchdog was disarmed, not merely late
    g.release()
    assert int(flag[0]) == 2


@pytest.fixture
def gated_backend(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    windows: list[tuple[float, float]] = []
    monkeypatch.setattr(cb.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cb, "_gate", lambda: SimpleNamespace(timeouts=0))

    def window(fn, cycles=None, gate=None):  # noqa: ANN001, ANN202
        assert gate is not None, "the spin is not used where there is a gate"
        return (fn(), windows.pop(0))[1]

    monkeypatch.setattr(cb, "_window", window)
    monkeypatch.setattr(cb, "PREROLL", {**cb.PREROLL, "uncovered": 0, "retimed": 0, "gated": 0, "max_enqueue_ms": 0.0})
    return windows


def test_a_gated_window_stands_however_slow_the_enqueue(gated_backend: list[tuple[float, float]]) -> None:
    # a 5 ms enqueue behind a spin would have been an uncovered window, timed again where it could be
    gated_backend += [(0.3, 5.0), (0.25, 0.02)]
    calls = []
    assert cb.timed(lambda: calls.append(1)) == 0.3
    assert cb.timed(lambda: calls.append(1), retime=False) == 0.25
    assert calls == [1, 1]
    assert cb.PREROLL["gated"] == 2 and cb.PREROLL["uncovered"] == 0 and cb.PREROLL["retimed"] == 0
    assert cb.PREROLL["max_enqueue_ms"] == 5.0


def test_kfuse_colocate_gate_0_keeps_the_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFUSE_COLOCATE_GATE", "0")
    monkeypatch.setattr(cb, "_GATE", [])
    monkeypatch.setattr(cb.StreamGate, "create", classmethod(lambda cls: pytest.fail("no gate is made when it is turned off")))
    assert cb._gate() is None
    assert cb._GATE == [None]  # decided once per process


@pytest.mark.gpu
def test_the_gate_works_on_this_gpu() -> None:
    assert StreamGate.create() is not None  # the driver has the V2 memory operations and the self-test passed


@pytest.mark.gpu
def test_a_host_stall_inside_a_gated_window_is_not_timed() -> None:
    g = StreamGate.create()
    assert g is not None
    x = torch.randn(1 << 20, device="cuda")

    def stalled() -> None:
        x.mul_(1.0001)
        time.sleep(0.003)  # 3 ms of host time between the window's two kernels
        x.add_(1e-4)

    stalled()
    torch.cuda.synchronize()
    gated = min(cb._window(stalled, gate=g)[0] for _ in range(5))
    cb._calibrate_preroll()
    spun = min(cb._window(stalled)[0] for _ in range(3))
    assert gated < 0.5, gated  # two elementwise kernels on 4 MB: microseconds
    assert spun > 2.0, spun  # the spin covers 0.1 ms of the 3 ms: the rest is idle GPU time inside the window


@pytest.mark.gpu
def test_a_covered_window_times_the_same_with_or_without_the_gate() -> None:
    g = StreamGate.create()
    assert g is not None
    cb._calibrate_preroll()
    cycles = int(0.2 * cb.PREROLL["cycles_per_ms"])  # a 0.2 ms kernel
    gated = sorted(cb._window(lambda: torch.cuda._sleep(cycles), gate=g)[0] for _ in range(9))[4]
    spun = sorted(cb._window(lambda: torch.cuda._sleep(cycles))[0] for _ in range(9))[4]
    assert gated == pytest.approx(spun, rel=0.15, abs=0.01)


@pytest.mark.gpu
def test_the_gate_opens_when_the_window_raises() -> None:
    g = StreamGate.create()
    assert g is not None

    def broken() -> None:
        raise ValueError("a launch failed")

    with pytest.raises(ValueError):
        cb._window(broken, gate=g)
    y = torch.ones(4, device="cuda") * 2  # the stream runs again: this would hang behind a gate never opened
    torch.cuda.synchronize()
    assert float(y.sum()) == 8.0


@pytest.mark.gpu
def test_a_host_that_synchronises_inside_a_gated_window_is_freed_by_the_watchdog() -> None:
    g = StreamGate.create()
    assert g is not None
    before = g.timeouts
    t0 = time.perf_counter()
    cb._window(lambda: (torch.cuda._sleep(1000), torch.cuda.synchronize()), gate=g)  # would deadlock without it
    assert g.timeouts == before + 1 and time.perf_counter() - t0 < 2.0
