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

* ``tailsm`` (tail fill, SM-exclusive by ``%smid``): the LC's solo grid, work handed out by ticket.
  Every program first takes LC blocks from a ticket counter; a program that finds the LC tickets gone
  waits until no LC block runs on *its* SM (a per-SM count, read by ``%smid``), then takes BE blocks
  in chunks from a second counter. So LC blocks never share an SM with BE work, whatever the
  hardware's placement, and the SMs without an LC block run BE work from the start. Session 10's
  probe showed the placement ``tailx`` assumed does not hold, and that BE code inside a fused kernel
  runs at its solo rate, so the cost of ``tail`` is contention on shared SMs; ``tailsm`` removes it
  where the LC leaves SMs idle (BERT-base's 48-tile GEMMs) and costs overlap where it does not (LC
  blocks > SMs: the BE work then waits for the LC), which is why it is a version the profile
  measures, not a replacement. The counters live in a per-(device, stream) buffer that the last
  program to finish resets, so launches on one stream need no memset between them.
  Session 11 measured the first version at 1.66-1.82 T_lc on the 48-tile GEMMs already at x = 0.25
  (``tail``: 1.04-1.11), the same with hotspot and stencil7, so the LC blocks themselves ran slower.
  The likely cause: the first programs to reach the ticket counter come in pairs from the same
  SMs, so LC tiles doubled up where the solo kernel spreads them. Also, a chunk of four 4 us
  hotspot blocks outlasted a 10 us GEMM. Now at most ``ceil(LC blocks / SMs)`` LC programs run on
  an SM, the second only once every SM got one tile, and the BE chunk is 1 until each free program
  would draw four tickets (``tailsm_plan``); ``trace`` records each LC block's SM for the probe.

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


@dataclass(frozen=True)
class FusedVersion:
    """A fused kernel version: r1 LC programs and r2 BE programs per SM."""

    r1: int
    r2: int
    mode: str = "partition"  # or "interleave"

    def describe(self) -> str:
        if self.mode in TAIL_MODES:
            return self.mode
        return f"{self.r1}:{self.r2}{'' if self.mode == 'partition' else 'il'}"

    def grid(self, sms: int | None = None) -> int:
        return (self.r1 + self.r2) * (sms or num_sms())


DEFAULT_VERSIONS = (FusedVersion(1, 1), FusedVersion(1, 2), FusedVersion(2, 1), FusedVersion(1, 3))
TAIL = FusedVersion(2, 0, "tail")  # the LC's solo grid (CudaBackend: 2 programs per SM) with its idle tail filled
TAILX = FusedVersion(2, 0, "tailx")  # the same, partners of LC programs idle (measured slower: see above)
TAILSM = FusedVersion(2, 0, "tailsm")  # the same, SM-exclusive by %smid and work tickets
TAIL_MODES = ("tail", "tailx", "tailsm")
SMID_SLOTS = 256  # per-SM counters (%smid < 256 on every NVIDIA GPU so far)
BE_CHUNK_MAX = 4  # BE blocks per ticket at most: amortises the atomic over ~1-4 us blocks
# the tailsm kernel's parameters after the shared ones: runtime values, then constexprs (launch_args order)
TAILSM_RUNTIME = ("ctr", "trace", "lc_cap", "n_sm", "be_chunk")
TAILSM_CONSTS = ("EMULATE_SMID", "SMID_SLOTS", "TRACE")


def tailsm_plan(n_lc: int, n_be: int, sms: int, programs_per_sm: int) -> tuple[int, int]:
    """(LC programs allowed per SM, BE blocks per ticket) of a ``tailsm`` launch. The cap spreads the LC
    blocks over as many SMs as they need and no fewer; the chunk stays 1 until every program that is free
    for BE work would draw four tickets or more, so chunking never makes a short slice run longer."""
    if sms < 1 or programs_per_sm < 1:
        raise ValueError(f"tailsm_plan: need sms >= 1 and programs_per_sm >= 1, got {sms}, {programs_per_sm}")
    cap = max(1, -(-n_lc // sms))
    free = max(1, sms * programs_per_sm - min(n_lc, cap * sms))
    chunk = max(1, min(BE_CHUNK_MAX, n_be // (4 * free)))
    return cap, chunk


def parse_version(text: str, lc_programs_per_sm: int = 2) -> FusedVersion:
    """``"1:2"`` (partition), ``"1:2il"`` (interleave), ``"tail"``, ``"tailx"`` or ``"tailsm"``."""
    t = text.strip()
    if t in TAIL_MODES:
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


@triton.jit(do_not_specialize=["l_start", "l_end", "b_start", "b_end", "period", "r1", "lc_cap", "n_sm", "be_chunk"])
def tailsm_kernel({params_sm}):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    if EMULATE_SMID:  # the interpreter has no %smid: programs p and p + nprog/2 play one SM
        sm = pid % (nprog // 2)
    else:
        sm = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    lc_on_sm = ctr + 4 + (sm % SMID_SLOTS)
    # counted on the SM *before* the ticket: a program that finds the tickets gone then sees every LC block
    # that got one (acq_rel atomics order the two through the ticket counter). At most lc_cap LC programs
    # an SM (ceil(LC blocks / SMs)), and the k-th of them draws only once k * n_sm tickets are out: the
    # first programs to reach the counter come in pairs from the same SMs, and two LC tiles on one SM
    # ran 1.7-1.8x T_lc (session 11). The wait ends: the first program of every SM never waits and draws
    # until the tickets are gone, and (lc_cap - 1) * n_sm < LC blocks
    here = tl.atomic_add(lc_on_sm, 1)
    if here < lc_cap:
        out = tl.atomic_add(ctr, 0, sem="relaxed")
        while out < here * n_sm:
            if not EMULATE_SMID:
                tl.inline_asm_elementwise("nanosleep.u32 200; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
            out = tl.atomic_add(ctr, 0, sem="relaxed")
        t = tl.atomic_add(ctr, 1)
        while t < l_end - l_start:
            if TRACE:  # which SM ran LC block t (the probe checks the placement)
                tl.store(trace + t, sm)
            lc_block(l_start + t, {lc_call})
            # relaxed: the ordering above needs only the first ticket (later RMWs continue its release sequence),
            # and an acq_rel fence here would wait for this block's stores before the next block starts
            t = tl.atomic_add(ctr, 1, sem="relaxed")
    tl.atomic_add(lc_on_sm, -1)
    # BE work only once no LC block runs on this SM (the LC blocks are all handed out by now)
    busy = tl.atomic_add(lc_on_sm, 0)
    while busy > 0:
        if not EMULATE_SMID:  # back off: the LC block on this SM keeps the issue slots
            tl.inline_asm_elementwise("nanosleep.u32 500; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        busy = tl.atomic_add(lc_on_sm, 0, sem="relaxed")
    # be_chunk blocks a ticket: 1 for slices with few blocks a program (four 4 us hotspot blocks in a row
    # would outlast a 10 us LC GEMM), up to 4 for long slices, where it amortises the atomic
    n_be = b_end - b_start
    c = tl.atomic_add(ctr + 1, be_chunk, sem="relaxed")
    while c < n_be:
        nxt = tl.atomic_add(ctr + 1, be_chunk, sem="relaxed")  # in flight while this chunk runs
        for j in range(be_chunk):
            if c + j < n_be:
                be_block(b_start + c + j, {be_call})
        c = nxt
    # the last program out resets the tickets for the next launch (launches on one stream do not overlap)
    done = tl.atomic_add(ctr + 2, 1)
    if done == nprog - 1:
        tl.atomic_xchg(ctr, 0)
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
    s = sms or num_sms()
    grid = version.grid(s)
    if version.mode == "partition":
        period, r1 = grid, version.r1 * s
    elif version.mode in TAIL_MODES:
        period, r1 = grid, grid  # unused by tail_kernel / tailx_kernel
    elif version.mode == "interleave":
        period, r1 = version.r1 + version.r2, version.r1
    else:
        raise ValueError(f"unknown fusion mode {version.mode!r} (partition | interleave | tail | tailx | tailsm)")
    for k, (a, b) in ((lc, lc_range), (be, be_range)):
        if not 0 <= a <= b <= k.n_blocks:
            raise ValueError(f"{k.name}: block range [{a}, {b}) is outside [0, {k.n_blocks})")
    args = [*lc.args, *lc_range, *be.args, *be_range, period, r1]
    if version.mode == "tailsm":
        n_lc = lc_range[1] - lc_range[0]
        if trace is not None and trace.numel() < n_lc:
            raise ValueError(f"trace has {trace.numel()} slots for {n_lc} LC blocks")
        cap, chunk = tailsm_plan(n_lc, be_range[1] - be_range[0], s, version.r1)
        ctr = ticket_counters(lc.args)
        args += [ctr, ctr if trace is None else trace, cap, s, chunk, interpreting(), SMID_SLOTS, trace is not None]
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
    """The ``tailsm`` kernel's counters (LC ticket, BE ticket, programs done, one spare, then LC blocks running
    per SM), one zeroed buffer per (device, stream): the kernel leaves them zeroed, and two launches sharing a
    buffer must not overlap, which holds within one stream."""
    dev = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
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
