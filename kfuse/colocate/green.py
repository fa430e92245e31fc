"""SM partitions through CUDA green contexts: an LC kernel on one set of SMs, a BE slice on the disjoint rest.

The fused versions (``fuser.py``) share each SM between LC and BE programs, so a BE program competes with the
LC GEMM's programs for its SM's registers, shared memory, issue slots and (on Hopper) the FP32 pipe a wgmma
main loop also drives (sessions 10-19: only short-block, FP32-light BE kernels such as histogram overlapped
well). ``prio`` (two kernels on prioritized streams) lets BE blocks take whole SMs, but any of them: a long BE
block on an SM the next LC kernel needs delays it. A green context confines a stream's kernels to a fixed set
of SMs, so the two sides share no SM: the LC kernel runs on ``N - S`` SMs, the BE slice on the other ``S``,
and a BE block can never sit on an LC SM. Two things follow that no fused version has:

* every LC kernel can co-run, not only the PTB GEMMs: attention, norms and glue segments replay unchanged
  (their CUDA graph launched on the LC partition's stream);
* any BE kernel co-runs on whole SMs of its own, FP32-heavy ones (sgemm, cutcp) included.

The price is the LC kernel's: it loses ``S`` SMs, which costs nothing where it has fewer programs than SMs
(BERT-base B8's GEMMs fill 48-192 128x128 tiles) and up to ``N / (N - S)`` where it fills every SM. The
profile measures that price per LC kernel shape and split, like any fused version's (the ``green<S>`` versions).

The partition comes from the driver (``cuDevSmResourceSplitByCount``: one group of ``S`` SMs for the BE, the
remaining SMs for the LC, disjoint by construction) through ctypes, since PyTorch's ``GreenContext.create``
takes only a count and gives two contexts overlapping SMs. Green contexts need CUDA 12.4+ and a driver that
exposes them; where they are missing ``split_sms`` raises ``GreenContextError`` saying why.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.colocate.prio import run_beside

CU_DEV_RESOURCE_TYPE_SM = 1
CU_GREEN_CTX_DEFAULT_STREAM = 0x1
CU_STREAM_NON_BLOCKING = 0x1
# CUdevResource: type (4 bytes), 92 bytes the driver keeps, then the union whose first field is the SM count
# (CUDA 12: a 48-byte union; CUDA 13: a 40-byte union and a next pointer): 144 bytes and smCount at 96 in both
RESOURCE_BYTES = 144
SM_COUNT_OFFSET = 96


class GreenContextError(RuntimeError):
    """Green contexts (SM partitions) are not available here; the message says why."""


class _Resource(ctypes.Structure):
    _fields_ = [("raw", ctypes.c_ubyte * RESOURCE_BYTES)]

    @property
    def sm_count(self) -> int:
        return int.from_bytes(bytes(self.raw[SM_COUNT_OFFSET : SM_COUNT_OFFSET + 4]), "little")


def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise GreenContextError(f"no CUDA driver library (libcuda.so.1): {e}") from e
    for fn in ("cuDevSmResourceSplitByCount", "cuGreenCtxCreate", "cuGreenCtxStreamCreate", "cuDevResourceGenerateDesc"):
        if not hasattr(lib, fn):
            raise GreenContextError(f"the CUDA driver has no {fn} (green contexts need a CUDA 12.4+ driver)")
    return lib


def _check(lib: Any, rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise GreenContextError(f"{what} failed: {name.value.decode() if name.value else rc}")


@dataclass
class SmPartition:
    """Two disjoint SM sets of one GPU, each with a stream whose kernels run only there."""

    lc_sms: int
    be_sms: int
    lc_stream: torch.cuda.Stream
    be_stream: torch.cuda.Stream
    device: int = 0
    # a second stream on the LC's SMs at the lowest priority: BE blocks there take only what the LC leaves (backfill)
    lc_fill_stream: torch.cuda.Stream | None = None
    _handles: list[Any] = field(default_factory=list, repr=False)  # the green contexts, kept alive with the streams

    def describe(self) -> str:
        return f"LC on {self.lc_sms} SMs, BE on {self.be_sms}"


def _ctx_stream(lib: Any, ctx: Any, priority: int) -> torch.cuda.Stream:
    stream = ctypes.c_void_p()
    _check(
        lib, lib.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, CU_STREAM_NON_BLOCKING, ctypes.c_int(priority)), "cuGreenCtxStreamCreate"
    )
    return torch.cuda.ExternalStream(stream.value)


def _green_stream(lib: Any, res: _Resource, dev: ctypes.c_int, priority: int) -> tuple[torch.cuda.Stream, Any]:
    desc = ctypes.c_void_p()
    _check(lib, lib.cuDevResourceGenerateDesc(ctypes.byref(desc), ctypes.byref(res), 1), "cuDevResourceGenerateDesc")
    ctx = ctypes.c_void_p()
    _check(lib, lib.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
    return _ctx_stream(lib, ctx, priority), ctx


def split_sms(be_sms: int, device: int | None = None) -> SmPartition:
    """The GPU's SMs in two disjoint green contexts: ``be_sms`` (rounded by the driver to its partition granularity)
    for BE work and the rest for the LC, each with a stream (the LC's at the highest priority), and on the LC's SMs a
    second stream at the lowest priority for backfill."""
    if not torch.cuda.is_available():
        raise GreenContextError("no CUDA device")
    dev_index = torch.cuda.current_device() if device is None else device
    total = torch.cuda.get_device_properties(dev_index).multi_processor_count
    if not 0 < be_sms < total:
        raise GreenContextError(f"be_sms must be in (0, {total}), got {be_sms}")
    torch.cuda.init()  # the primary context exists before any green context retains it
    lib = _driver()
    dev = ctypes.c_int()
    _check(lib, lib.cuDeviceGet(ctypes.byref(dev), dev_index), "cuDeviceGet")
    whole = _Resource()
    _check(lib, lib.cuDeviceGetDevResource(dev, ctypes.byref(whole), CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    if whole.sm_count != total:  # the layout assumption above, checked against what PyTorch reports
        raise GreenContextError(f"unexpected CUdevResource layout: SM count {whole.sm_count}, device has {total}")
    # the BE's group is the one the split sizes (the driver rounds a count up to its granularity, 8 SMs on sm_90, so
    # a multiple of 8 stays exact); the LC takes what remains
    be_res, rest = _Resource(), _Resource()
    groups = ctypes.c_uint(1)
    ref = ctypes.byref
    rc = lib.cuDevSmResourceSplitByCount(ref(be_res), ref(groups), ref(whole), ref(rest), 0, be_sms)
    _check(lib, rc, f"cuDevSmResourceSplitByCount({be_sms} of {total} SMs)")
    if groups.value != 1 or be_res.sm_count + rest.sm_count != total or rest.sm_count == 0:
        raise GreenContextError(f"split of {total} SMs gave {groups.value} group(s) of {be_res.sm_count} and {rest.sm_count} remaining")
    least, most = torch.cuda.Stream.priority_range()
    lc_stream, lc_ctx = _green_stream(lib, rest, dev, most)
    be_stream, be_ctx = _green_stream(lib, be_res, dev, 0)
    fill_stream = _ctx_stream(lib, lc_ctx, least)
    return SmPartition(rest.sm_count, be_res.sm_count, lc_stream, be_stream, dev_index, fill_stream, [lc_ctx, be_ctx, lib])


_PARTITIONS: dict[tuple[int, int], SmPartition] = {}


def partition(be_sms: int, device: int | None = None) -> SmPartition:
    """``split_sms``, made once per (device, BE SM count) and kept: green contexts are created once, not per launch."""
    dev = torch.cuda.current_device() if device is None else device
    key = (dev, be_sms)
    if key not in _PARTITIONS:
        _PARTITIONS[key] = split_sms(be_sms, dev)
    return _PARTITIONS[key]


def run_partitioned(part: SmPartition | None, lc: Any, be: Any, fill: Any = None) -> None:
    """``lc`` enqueued on the LC partition's stream and ``be`` on the BE partition's, both after the current stream's
    work; the current stream then waits for both. ``fill``: enqueued last, on the LC's SMs at the lowest priority, so
    its blocks take only the slots the LC's pending blocks leave. Without a partition (no GPU: the interpreter) they
    run in order."""
    if part is None:
        for f in (lc, be, fill):
            if f is not None:
                f()
        return
    fs = part.lc_fill_stream
    if fill is not None and fs is None:
        raise GreenContextError("this partition has no backfill stream")
    cur = torch.cuda.current_stream()
    if fill is not None:
        fs.wait_stream(cur)  # before run_beside makes the current stream wait for both: the fill waits for neither
    run_beside(part.lc_stream, lc, part.be_stream, be)
    if fill is not None:
        with torch.cuda.stream(fs):
            fill()
        cur.wait_stream(fs)


@triton.jit
def _record_smid(out_ptr, SPIN: tl.constexpr):
    pid = tl.program_id(0)
    sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    acc = pid
    for _ in range(SPIN):  # keep the program resident a while, so the grid spreads over every SM it may use
        acc = (acc * 1103515245 + 12345) & 0x7FFFFFFF
    tl.store(out_ptr + pid, sm + (acc & 0))


def sm_ids(stream: torch.cuda.Stream, programs: int = 4096, spin: int = 20000) -> set[int]:
    """The SMs that a grid of ``programs`` programs launched on ``stream`` ran on (GPU only): what a partition's
    stream may use, read back through ``%smid``."""
    out = torch.full((programs,), -1, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(stream):
        _record_smid[(programs,)](out, SPIN=spin)
    stream.synchronize()
    return set(out.tolist())
