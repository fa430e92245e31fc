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
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import torch

CU_STREAM_WAIT_VALUE_GEQ = 0x0  # (int32)(*addr - value) >= 0: a ticket that only grows opens every earlier wait too
SELF_TEST_S = 2.0


class StreamGate:
    """``hold()`` puts a wait for the next ticket on the current stream; ``release()`` writes that ticket from the host.
    Every ``hold`` must be followed by a ``release`` (``timed`` does so in a ``finally``): a held stream never runs."""

    def __init__(self, wait_value: Any, flag: torch.Tensor, device_ptr: int) -> None:
        self._wait_value = wait_value
        self._flag = flag  # kept alive: the GPU polls its memory
        self._word = ctypes.c_uint32.from_address(flag.data_ptr())
        self._device_ptr = device_ptr
        self._ticket = 0
        self.holds = 0

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

    def hold(self) -> None:
        self._ticket = (self._ticket + 1) & 0xFFFFFFFF
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = self._wait_value(stream, self._device_ptr, self._ticket, CU_STREAM_WAIT_VALUE_GEQ)
        if rc != 0:
            raise RuntimeError(f"cuStreamWaitValue32 failed with CUresult {rc}")
        self.holds += 1

    def release(self) -> None:
        self._word.value = self._ticket

    def self_test(self) -> bool:
        """The wait holds work behind it while the host sleeps, and the write lets it run."""
        done = torch.cuda.Event()
        torch.cuda.synchronize()
        try:
            self.hold()
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
