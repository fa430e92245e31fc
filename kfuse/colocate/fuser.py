"""Horizontal fusion of an LC kernel and a BE kernel into one launch (Aker's static fuser).

Both kernels are PTB block functions (``ptb.BlockKernel``). The fused kernel is generated once per
pair of block-function signatures; the *ratio* is a runtime choice, so every version of a pair
shares one compiled kernel:

* ``partition`` (default): program ids ``[0, r1*S)`` run LC blocks, ``[r1*S, (r1+r2)*S)`` BE blocks,
  with S the number of SMs. The hardware hands out the first wave one program per SM, so every SM
  gets r1 LC programs first and then r2 BE programs: the two kinds sit on the same SM at once as
  long as r1 + r2 programs fit on an SM (registers / shared memory / warps of the fused kernel).
* ``interleave``: in every group of r1 + r2 consecutive program ids the first r1 are LC.
* ``tail`` (tail fill): the LC kernel keeps its own persistent grid of r1*S programs (r2 = 0). The
  LC blocks rarely divide the grid: the programs of the LC's last partial round have one LC block
  fewer (or none, when the GEMM has fewer tiles than the grid), and their SM slots would idle while
  the others finish. Exactly those programs then run BE blocks. Nothing competes with the LC blocks
  for a slot, so LC occupancy is the solo kernel's; the BE slice should be about one LC block time
  per idle program (the profile's load-ratio sweep finds it).
* ``tailx`` (tail fill, LC blocks alone on their SMs; **measured slower, not profiled by default**):
  as ``tail``, but when the LC has fewer blocks than half the grid, programs ``[S, S + rem)`` stay
  idle, on the premise that the first wave gives every SM one program before any gets a second (so
  ``p`` and ``p + S`` share an SM). Session 10 read ``%smid`` on the H200
  (``benchmarks/experiments/tail_placement_probe.py``): only 24 of 132 such pairs share an SM, and
  ``tailx`` took 1.56-1.62 T_lc against ``tail``'s 1.46-1.49 at x = 1 on a 48-tile GEMM. Kept for
  that probe. Placement is a performance premise only: every program still runs exactly its blocks.

* ``tailsm`` (tail fill, SM-exclusive by ``%smid``): the LC's solo grid and its static assignment
  (LC block t on program t while blocks <= programs). An LC program raises its SM's flag (a per-SM
  count, indexed by ``%smid``) for as long as it runs LC blocks; the other programs take BE blocks
  by ticket, but one whose SM's flag is up waits until it drops or the tickets are gone. So BE work
  runs on the SMs the LC leaves idle (BERT-base's 48-tile GEMMs leave 84 of 132) and not beside an
  LC tile, whatever the hardware's placement. Session 10's probe showed the placement ``tailx``
  assumed does not hold, and that BE code inside a fused kernel runs at its solo rate, so the cost
  of ``tail`` is contention on shared SMs. The flag is advisory: a late flag costs speed, never a
  block. Where the LC holds more than half the grid, the LC programs join the BE work after their
  blocks (``tailsm_plan``). It is a version the profile measures, not a replacement. The counters
  live in a per-(device, stream) buffer: the last BE program resets the tickets, and the flags
  return to zero by themselves, so launches on one stream need no memset between them.
  History: session 11 handed out LC blocks by ticket too. Its first version ran 1.66-1.82 T_lc on
  the 48-tile GEMMs at x = 0.25 (LC tiles doubled up on SMs); with the tiles spread one per SM
  (the trace showed 48 SMs) it still took 1.39 T_lc at x = 0 but only 1.41 at x = 0.5 on
  1024x768x768: the SM-exclusive BE work was nearly free, and the cost was a fixed ~4 us of serial
  atomics around each LC tile (its own ticket, a staging read, the exit count, and the partner
  program's polling before it could exit). The LC path now has no atomic it waits for.

Each side keeps its own persistent loop over its block range, so a fused launch computes exactly
what the two kernels compute on their own (tests check this for every ratio).

Limits of doing this in Triton rather than CUDA C++: a Triton program has one warp count and its
register / shared-memory budget is the larger of the two branches (Aker splits one CUDA block
into warp groups with named barriers instead). The occupancy limit is checked on the GPU through
the compiled kernel's metadata (``fits``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kfuse.colocate.ptb import BlockKernel, _params, num_sms
from kfuse.kernels.codegen import interpreting, load_generated
from kfuse.runtime.device import first_device


@dataclass(frozen=True)
class FusedVersion:
    """A fused kernel version: r1 LC programs and r2 BE programs per SM."""

    r1: int
    r2: int
    mode: str = "partition"  # or "interleave"

    def describe(self) -> str:
        if self.mode in GREEN_MODES:
            return f"{self.mode}{self.r2}"
        if self.mode in TAIL_MODES or self.mode in STREAM_MODES or self.mode == WS_MODE:
            return self.mode
        return f"{self.r1}:{self.r2}{'' if self.mode == 'partition' else 'il'}"

    def grid(self, sms: int | None = None) -> int:
        return (self.r1 + self.r2) * (sms or num_sms())


DEFAULT_VERSIONS = (FusedVersion(1, 1), FusedVersion(1, 2), FusedVersion(2, 1), FusedVersion(1, 3))
TAIL = FusedVersion(2, 0, "tail")  # the LC's solo grid (CudaBackend: 2 programs per SM) with its idle tail filled
TAILX = FusedVersion(2, 0, "tailx")  # the same, partners of LC programs idle (measured slower: see above)
TAILSM = FusedVersion(2, 0, "tailsm")  # the same, SM-exclusive by %smid and work tickets
TAIL_MODES = ("tail", "tailx", "tailsm")
# the LC kernel and the BE slice as two kernels on prioritized streams (kfuse.colocate.prio): a version
# the profile measures like the fused ones, launched by the backend, not by launch_fused
PRIO = FusedVersion(2, 0, "prio")
# the LC kernel on one SM partition and the BE slice on the disjoint rest (kfuse.colocate.green), r2 = the BE's SMs;
# two kernels like prio, and the only versions any LC kernel takes (segments too), not only the PTB GEMMs
GREEN_MODES = ("green",)
STREAM_MODES = ("prio", *GREEN_MODES)
# the plan's own GEMM step on a ping-pong kernel whose worker partition runs the BE slice (kfuse.colocate.ws_partition):
# one Gluon launch, each kernel its own warps and registers; the version of the LC items ``lc_items(gemms="plan-ws")``
# gives a host, and of no others
WS_MODE = "ws"
WS = FusedVersion(1, 1, WS_MODE)


def green(be_sms: int) -> FusedVersion:
    """The version that co-runs the BE slice on ``be_sms`` SMs of its own beside the LC kernel on the others."""
    if be_sms < 1:
        raise ValueError(f"green: the BE partition needs at least one SM, got {be_sms}")
    return FusedVersion(0, be_sms, "green")


def any_kernel(version: Any) -> bool:
    """Whether ``version`` co-runs with any LC kernel (segments included), not only with PTB GEMMs."""
    return getattr(version, "mode", None) in GREEN_MODES


def applies(version: Any, lc: Any) -> bool:
    """Whether ``version`` can co-run with LC kernel ``lc`` (a ``scheduler.LCKernel``): SM partitions with any, ``ws``
    with a plan GEMM step that hosts a worker partition, the others with a PTB block kernel."""
    if any_kernel(version):
        return True
    if getattr(version, "mode", None) == WS_MODE:
        return bool(getattr(lc, "host", False))
    return bool(lc.fusible) and not getattr(lc, "host", False)


SMID_SLOTS = 256  # per-SM counters (%smid < 256 on every NVIDIA GPU so far)
BE_CHUNK_MAX = 4  # BE blocks per ticket at most: amortises the atomic over ~1-4 us blocks
# the tailsm kernel's parameters after the shared ones: runtime values, then constexprs (launch_args order)
TAILSM_RUNTIME = ("ctr", "trace", "lc_progs", "lc_join", "be_chunk")
TAILSM_CONSTS = ("EMULATE_SMID", "SMID_SLOTS", "TRACE")


def tailsm_plan(n_lc: int, n_be: int, grid: int) -> tuple[int, bool, int]:
    """(LC programs, whether they join the BE work, BE blocks per ticket) of a ``tailsm`` launch on ``grid``
    programs. The LC keeps one program per block as in its solo grid (programs ``[0, lc_progs)``). They
    join the BE work once their blocks are done only when they hold more than half the grid: otherwise the
    free programs suffice, and the LC programs exit without an atomic to wait for. The chunk stays 1 until
    every program that runs BE work would draw four tickets or more, so chunking never makes a short slice
    longer."""
    if grid < 1:
        raise ValueError(f"tailsm_plan: need grid >= 1, got {grid}")
    lc_progs = max(0, min(n_lc, grid))
    join = 2 * lc_progs > grid
    chunk = max(1, min(BE_CHUNK_MAX, n_be // (4 * (grid if join else grid - lc_progs))))
    return lc_progs, join, chunk


def parse_version(text: str, lc_programs_per_sm: int = 2) -> FusedVersion:
    """``"1:2"`` (partition), ``"1:2il"`` (interleave), ``"tail"``, ``"tailx"``, ``"tailsm"``, ``"prio"``,
    ``"green<S>"`` (SM partitions, S SMs for the BE) or ``"ws"`` (the BE as a worker partition of the plan's GEMM)."""
    t = text.strip()
    if t == WS_MODE:
        return WS
    for mode in GREEN_MODES:
        if t.startswith(mode) and t[len(mode) :].isdigit():
            return green(int(t[len(mode) :]))
        if t == mode:
            raise ValueError(f"{mode!r} needs the BE partition's SM count, e.g. {mode}32")
    if t in TAIL_MODES or t in STREAM_MODES:
        return FusedVersion(lc_programs_per_sm, 0, t)
    mode = "interleave" if t.endswith("il") else "partition"
    r1, r2 = (int(x) for x in t.removesuffix("il").split(":"))
    return FusedVersion(r1, r2, mode)


_FUSED = """
import triton
import triton.language as tl
from {lc_module} import {lc_fn} as lc_block
from {be_module} import {be_fn} as be_block


# range bounds and ratios are not specialised: a split launches arbitrary [b_start, b_end), and each
# new ==1 / %16 class would be a JIT compile (hundreds of ms) timed as part of a launch mid-run
@triton.jit(do_not_specialize=["l_start", "l_end", "b_start", "b_end", "period", "r1"])
def fused_kernel({params}):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    # the grid is cut into groups of `period` programs; the first r1 of each group run LC blocks
    g = pid // period
    r = pid % period
    ngroups = nprog // period
    if r < r1:
        for bid in range(l_start + g * r1 + r, l_end, ngroups * r1):
            lc_block(bid, {lc_call})
    else:
        r2 = period - r1
        for bid in range(b_start + g * r2 + (r - r1), b_end, ngroups * r2):
            be_block(bid, {be_call})


@triton.jit(do_not_specialize=["l_start", "l_end", "b_start", "b_end", "period", "r1"])
def tail_kernel({params}):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for bid in range(l_start + pid, l_end, nprog):
        lc_block(bid, {lc_call})
    # programs [rem, nprog) ran one LC block fewer (all of them when the blocks divide the grid):
    # they would idle through the LC's last round, so they take the BE blocks
    rem = (l_end - l_start) % nprog
    if pid >= rem:
        for bid in range(b_start + pid - rem, b_end, nprog - rem):
            be_block(bid, {be_call})


@triton.jit(do_not_specialize=["l_start", "l_end", "b_start", "b_end", "period", "r1"])
def tailx_kernel({params}):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for bid in range(l_start + pid, l_end, nprog):
        lc_block(bid, {lc_call})
    rem = (l_end - l_start) % nprog
    # fewer LC blocks than SMs (half the grid): programs [half, half + rem) share an SM with an LC
    # block (the first wave gives each SM one program first) and stay idle, so LC blocks run alone
    half = nprog // 2
    skip_lo = half
    skip_hi = half
    if l_end - l_start < half:
        skip_hi = half + rem
    n_be = nprog - rem - (skip_hi - skip_lo)
    if pid >= rem:
        if pid < skip_lo:
            for bid in range(b_start + pid - rem, b_end, n_be):
                be_block(bid, {be_call})
        elif pid >= skip_hi:
            for bid in range(b_start + pid - rem - (skip_hi - skip_lo), b_end, n_be):
                be_block(bid, {be_call})


@triton.jit(do_not_specialize=["l_start", "l_end", "b_start", "b_end", "period", "r1", "lc_progs", "lc_join", "be_chunk"])
def tailsm_kernel({params_sm}):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if EMULATE_SMID:  # the interpreter has no %smid: programs p and p + nprog/2 play one SM
        sm = pid % (nprog // 2)
    else:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    lc_on_sm = ctr + 4 + (sm % SMID_SLOTS)
    # LC: the solo kernel's static assignment, no atomic on the LC's path but two whose result nobody
    # waits for. Session 11's tickets put ~4 us of serial atomics around each tile (x = 0: 1.39 T_lc).
    # The flag is advisory: it only keeps BE work off this SM while an LC block runs here
    if pid < lc_progs:
        tl.atomic_add(lc_on_sm, 1, sem="relaxed")
        for t in range(pid, l_end - l_start, lc_progs):
            if TRACE:  # which SM ran LC block t (the probe checks the placement)
                tl.store(trace + t, sm)
            lc_block(l_start + t, {lc_call})
        tl.atomic_add(lc_on_sm, -1, sem="relaxed")
    # BE: the programs without LC work, and with ``lc_join`` (LC blocks on more than half the grid, too
    # few programs free) also the LC programs once their blocks are done. A program on an SM with an LC
    # block waits until the block ends or the BE tickets are gone, so it never delays the launch's end
    if (pid >= lc_progs) | (lc_join != 0):
        n_be = b_end - b_start
        # the first look is also the delay that lets this SM's LC programs (lower ids, dispatched first)
        # raise the flag before it is read
        c = tl.atomic_add(ctr + 1, 0, sem="relaxed")
        busy = tl.atomic_add(lc_on_sm, 0, sem="relaxed")
        while (busy > 0) & (c < n_be):
            if not EMULATE_SMID:  # back off: the LC block on this SM keeps the issue slots
                tl.inline_asm_elementwise("nanosleep.u32 500; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
            c = tl.atomic_add(ctr + 1, 0, sem="relaxed")
            busy = tl.atomic_add(lc_on_sm, 0, sem="relaxed")
        # be_chunk blocks a ticket: 1 for slices with few blocks a program (four 4 us hotspot blocks in a row
        # would outlast a 10 us LC GEMM), up to 4 for long slices, where it amortises the atomic
        c = tl.atomic_add(ctr + 1, be_chunk, sem="relaxed")
        while c < n_be:
            nxt = tl.atomic_add(ctr + 1, be_chunk, sem="relaxed")  # in flight while this chunk runs
            for j in range(be_chunk):
                if c + j < n_be:
                    be_block(b_start + c + j, {be_call})
            c = nxt
        # the last BE program out resets the BE tickets for the next launch (launches on one stream do
        # not overlap; the LC flags come back to zero by themselves)
        n_join = nprog - lc_progs
        if lc_join != 0:
            n_join = nprog
        done = tl.atomic_add(ctr + 2, 1)
        if done == n_join - 1:
            tl.atomic_xchg(ctr + 1, 0)
            tl.atomic_xchg(ctr + 2, 0)
"""


def fused_source(lc: BlockKernel, be: BlockKernel) -> str:
    la, lcst = _params("l_", lc)
    ba, bcst = _params("b_", be)
    runtime = la + ["l_start", "l_end"] + ba + ["b_start", "b_end", "period", "r1"]
    consts = [f"{c}: tl.constexpr" for c in lcst + bcst]
    sm_runtime = list(TAILSM_RUNTIME)
    sm_consts = [f"{c}: tl.constexpr" for c in TAILSM_CONSTS]
    return _FUSED.format(
        lc_module=lc.module, lc_fn=lc.fn, be_module=be.module, be_fn=be.fn, params=", ".join(runtime + consts),
        params_sm=", ".join(runtime + sm_runtime + sm_consts + consts), lc_call=", ".join(la + lcst), be_call=", ".join(ba + bcst),
    )  # fmt: skip


def fused_module(lc: BlockKernel, be: BlockKernel) -> Any:
    return load_generated("fused", f"{lc.signature_key()}__{be.signature_key()}", fused_source(lc, be))


def launch_args(
    lc: BlockKernel, lc_range: tuple[int, int], be: BlockKernel, be_range: tuple[int, int], version: FusedVersion, sms: int | None = None,
    trace: torch.Tensor | None = None,
) -> tuple[int, list[Any], dict[str, Any]]:  # fmt: skip
    """(grid, positional args, launch options) of one fused launch. ``trace`` (``tailsm`` only): an int32
    tensor with one slot per LC block of the range, which receives the SM that ran each block."""
    s = sms or num_sms(first_device(lc.args, None))
    grid = version.grid(s)
    if version.mode in TAIL_MODES and "programs_per_sm" in lc.meta:  # the LC's own solo grid (a plan tile may fit one an SM)
        grid = int(lc.meta["programs_per_sm"]) * s
    if version.mode == "partition":
        period, r1 = grid, version.r1 * s
    elif version.mode in TAIL_MODES:
        period, r1 = grid, grid  # unused by tail_kernel / tailx_kernel
    elif version.mode == "interleave":
        period, r1 = version.r1 + version.r2, version.r1
    elif version.mode in STREAM_MODES:
        how = "SM partitions" if version.mode in GREEN_MODES else "prioritized streams"
        raise ValueError(f"{version.mode!r} is two kernels on {how}, not one fused launch (CudaBackend.run_fused runs it)")
    else:
        raise ValueError(f"unknown fusion mode {version.mode!r} (partition | interleave | tail | tailx | tailsm | prio | green)")
    for k, (a, b) in ((lc, lc_range), (be, be_range)):
        if not 0 <= a <= b <= k.n_blocks:
            raise ValueError(f"{k.name}: block range [{a}, {b}) is outside [0, {k.n_blocks})")
    args = [*lc.args, *lc_range, *be.args, *be_range, period, r1]
    if version.mode == "tailsm":
        n_lc = lc_range[1] - lc_range[0]
        if trace is not None and trace.numel() < n_lc:
            raise ValueError(f"trace has {trace.numel()} slots for {n_lc} LC blocks")
        lc_progs, join, chunk = tailsm_plan(n_lc, be_range[1] - be_range[0], grid)
        ctr = ticket_counters(lc.args)
        args += [ctr, ctr if trace is None else trace, lc_progs, int(join), chunk, interpreting(), SMID_SLOTS, trace is not None]
    elif trace is not None:
        raise ValueError(f"a placement trace needs the tailsm version, not {version.describe()}")
    args += [*lc.consts.values(), *be.consts.values()]
    opts = {"num_warps": max(lc.num_warps, be.num_warps), "num_stages": max(lc.num_stages, be.num_stages)}
    return grid, args, opts


def launch_fused(
    lc: BlockKernel, be: BlockKernel, version: FusedVersion = DEFAULT_VERSIONS[0],
    lc_range: tuple[int, int] | None = None, be_range: tuple[int, int] | None = None, sms: int | None = None,
    trace: torch.Tensor | None = None,
) -> None:  # fmt: skip
    """One launch running LC blocks ``lc_range`` and BE blocks ``be_range`` side by side (``trace``: see
    ``launch_args``)."""
    lr = lc_range or (0, lc.n_blocks)
    br = be_range or (0, be.n_blocks)
    grid, args, opts = launch_args(lc, lr, be, br, version, sms, trace)
    mod = fused_module(lc, be)
    kernel_fn(mod, version)[(grid,)](*args, **opts)


def kernel_fn(mod: Any, version: FusedVersion) -> Any:
    """The generated kernel of ``mod`` that runs ``version``."""
    return {"tail": mod.tail_kernel, "tailx": mod.tailx_kernel, "tailsm": mod.tailsm_kernel}.get(version.mode, mod.fused_kernel)


_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}


def ticket_counters(args: list[Any]) -> torch.Tensor:
    """The ``tailsm`` kernel's counters (one spare, BE ticket, BE programs done, one spare, then LC programs
    running per SM), one zeroed buffer per (device, stream): the kernel leaves them zeroed, and two launches
    sharing a buffer must not overlap, which holds within one stream."""
    dev = first_device(args)
    stream = torch.cuda.current_stream(dev).cuda_stream if dev.type == "cuda" else 0
    key = (str(dev), stream)
    if key not in _COUNTERS:
        _COUNTERS[key] = torch.zeros(4 + SMID_SLOTS, dtype=torch.int32, device=dev)
    return _COUNTERS[key]


def overlap(t_lc: float, t_be: float, t_fused: float) -> float:
    """Share of the serial time saved by running both in one launch: (T_lc + T_be - T_fused) / (T_lc + T_be).
    0: no co-residency (serial), 0.5: perfect overlap of two equal kernels."""
    return (t_lc + t_be - t_fused) / (t_lc + t_be)


def compiled_resources(lc: BlockKernel, be: BlockKernel) -> dict[str, int] | None:
    """Registers, spills and shared memory of the fused kernel as compiled for this GPU (None on the CPU)."""
    if not torch.cuda.is_available():
        return None
    mod = fused_module(lc, be)
    try:
        kern = next(iter(mod.fused_kernel.device_caches[torch.cuda.current_device()][0].values()))
    except Exception:  # no compiled variant yet (or a Triton with another cache layout)
        return None
    return {"n_regs": int(getattr(kern, "n_regs", 0)), "n_spills": int(getattr(kern, "n_spills", 0)), "shared": int(kern.metadata.shared)}


def fits(res: dict[str, int], version: FusedVersion, num_warps: int) -> bool:
    """Do r1 + r2 programs of the fused kernel fit on one H100/H200 SM at once?"""
    per_sm = version.r1 + version.r2
    regs_ok = res["n_regs"] * 32 * num_warps * per_sm <= 65536
    smem_ok = res["shared"] * per_sm <= 227 * 1024
    warps_ok = num_warps * per_sm <= 64
    return regs_ok and smem_ok and warps_ok
