"""A stream gate the host opens: the stream waits on a word of pinned host memory (``cuStreamWaitValue32``) until the
host has enqueued a whole timing window, so the window's events hold GPU time only, however long the enqueue took.

Why (``cuda_backend.timed``): the real backend times every launch between two CUDA events and advances the
scheduler's clock by that time. A launch's Python enqueue (Triton's launcher, a Gluon host's argument packing) takes
tens of microseconds, longer than many of the kernels it times, so the start event used to sit behind a GPU spin
(``torch.cuda._sleep``) of a guessed length. An enqueue that outlasts the spin (a GC pause, a slow first launch, a
busy host) leaves the GPU idle inside the window; that idle time reads as kernel time. Work that can run only once per
window (a histogram's atomics) cannot be timed again, so the idle time stayed in the measurement of a fused launch and
in the scheduler's online model. A gate has no length to guess: the GPU starts the window when the host says so.

The V2 stream memory operations need no driver option (CUDA >= 11.7). Without ``libcuda`` or the entry point,
``StreamGate.create`` returns None and the caller keeps the spin. A self-test at creation checks that the wait holds
the stream and that the host's write opens it.

A held stream and a host that waits for the GPU deadlock: a kernel's first launch may load its module lazily, which
can synchronise the context (CUDA's lazy loading), and an allocation that frees cached memory synchronises the device.
A watchdog thread therefore opens the gate itself if the host has not done so within ``WATCHDOG_S`` (``timeouts``
counts those windows; they hold host time again, as a spin's uncovered window does).
"""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any

import torch

CU_STREAM_WAIT_VALUE_GEQ = 0x0  # (int32)(*addr - value) >= 0: a ticket that only grows opens every earlier wait too
SELF_TEST_S = 2.0
WATCHDOG_S = 0.05  # an enqueue takes microseconds to a few ms; a host blocked on the held stream never finishes one
WATCHDOG_POLL_S = 0.02  # the watchdog looks every 20 ms: a stuck window opens 50-70 ms after its hold


class _Watchdog(threading.Thread):
    """Writes the armed ticket when its deadline passes; disarming and the host's own write happen under the same
    lock, so a late watchdog can never write an older ticket over a newer one."""

    def __init__(self, flag: torch.Tensor) -> None:
        super().__init__(name="kfuse-stream-gate-watchdog", daemon=True)
        self.flag = flag  # kept alive with the thread, which may outlive its gate
        self.word = ctypes.c_uint32.from_address(flag.data_ptr())
        self.cv = threading.Condition()
        self.armed: tuple[int, float] | None = None
        self.timeouts = 0

    def arm(self, ticket: int, seconds: float) -> None:
        with self.cv:  # no notify: waking the thread (and taking the GIL from the enqueue) every window costs more
            self.armed = (ticket, time.monotonic() + seconds)

    def open(self, ticket: int) -> None:
        with self.cv:
            self.armed = None
            self.word.value = ticket

    def run(self) -> None:
        with self.cv:
            while True:
                self.cv.wait(WATCHDOG_POLL_S)
                if self.armed is not None and time.monotonic() >= self.armed[1]:
                    self.word.value = self.armed[0]
                    self.armed = None
                    self.timeouts += 1


class StreamGate:
    """``hold()`` puts a wait for the next ticket on the current stream; ``release()`` writes that ticket from the host.
    Every ``hold`` must be followed by a ``release`` (``timed`` does so in a ``finally``): a held stream never runs."""

    def __init__(self, wait_value: Any, flag: torch.Tensor, device_ptr: int) -> None:
        self._wait_value = wait_value
        self._flag = flag  # kept alive: the GPU polls its memory
        self._device_ptr = device_ptr
        self._ticket = 0
        self.holds = 0
        self._watchdog = _Watchdog(flag)
        self._watchdog.start()

    @property
    def timeouts(self) -> int:
        """Windows the watchdog opened because the host had not within ``WATCHDOG_S``."""
        return self._watchdog.timeouts

    @classmethod
    def create(cls) -> StreamGate | None:
        """A working gate on this process's CUDA device, or None (no GPU, no driver entry point, or the self-test
        failed)."""
        if not torch.cuda.is_available():
            return None
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            wait_value = lib.cuStreamWaitValue32_v2
            host_to_device = lib.cuMemHostGetDevicePointer_v2
        except (OSError, AttributeError):
            return None
        wait_value.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        wait_value.restype = ctypes.c_int
        host_to_device.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
        host_to_device.restype = ctypes.c_int
        torch.cuda.init()
        flag = torch.zeros(1, dtype=torch.int32).pin_memory()
        device_ptr = ctypes.c_uint64(0)
        if host_to_device(ctypes.byref(device_ptr), ctypes.c_void_p(flag.data_ptr()), 0) != 0:
            return None
        gate = cls(wait_value, flag, device_ptr.value)
        return gate if gate.self_test() else None

    def hold(self, watchdog_s: float = WATCHDOG_S) -> None:
        self._ticket = (self._ticket + 1) & 0xFFFFFFFF
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self._wait_value(stream, self._device_ptr, self._ticket, CU_STREAM_WAIT_VALUE_GEQ)
        if rc != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed with CUresult {rc}")
        self._watchdog.arm(self._ticket, watchdog_s)
        self.holds += 1

    def release(self) -> None:
        self._watchdog.open(self._ticket)

    def self_test(self) -> bool:
        """The wait holds work behind it while the host sleeps, and the write lets it run."""
        done = torch.cuda.Event()
        torch.cuda._sleep(1)  # loaded before the hold: a lazy module load inside it would wait for the held stream
        torch.cuda.synchronize()
        try:
            self.hold(watchdog_s=1.0)
        except RuntimeError:
            return False
        try:
            torch.cuda._sleep(1000)
            done.record()
            time.sleep(0.005)
            held = not done.query()
        finally:
            self.release()
        t0 = time.perf_counter()
        while not done.query():
            if time.perf_counter() - t0 > SELF_TEST_S:  # the GPU never saw the write: nothing below can use the gate
                raise RuntimeError("StreamGate: the stream did not open after the host's write")
            time.sleep(1e-4)
        return held
