"""Offline experiment (session 14, not part of kfuse): a two-stage GEMM chain too wide for one
program's residence, fused across a pair of programs. Kept as the record of why this design was
not built into ``kfuse.kernels.b2b`` (run it: it checks the kernel in the interpreter and prints
the sm_90 compile facts; see "Result" at the end of this docstring).

y = act1(act0(x @ W0 + b0) @ W1 + b1), with x (M, K0), W0 (K0, N0), W1 (N0, N1), K0, N0, N1 <= 256.

Why: at N0 = N1 = 256 the two weights are 256 KB in fp16, more than a program's 227 KB of shared
memory. The one-program b2b kernel therefore streams both weights from L2 for every row tile (512
MB at M = 262144), and runs 0.22 ms against 0.16-0.17 ms for the two GEMMs unfused (session 14).
Unfused, the intermediate goes to DRAM and back (2 x 134 MB at M = 262144).

How: the intermediate's columns split in two halves, one per program of a pair. Program ``h``
keeps W0[:, half h] and W1[half h, :] resident (64 + 64 KB at 256 wide) and computes, per row
tile, its half of the intermediate, ``act0(x W0[:, h] + b0[h])``, in registers, then its partial
product with W1's matching rows. The intermediate never leaves registers. The two partial
outputs add up to the GEMM's result: one program (the *consumer*) receives the other's partial
through a small ring of L2-resident slots, adds it, applies the epilogue and stores y. Per row
tile, DRAM sees x once and y once, as in the fused floor. The roles alternate between tiles
(``ALTERNATE``) so both programs of a pair do the same work.

Synchronisation: slot flags in global memory (``full`` / ``free`` counters per slot, release /
acquire atomics at GPU scope, a CTA barrier around them, slot data read past L1). A partner
must run at the same time as its pair, so the grid is at most one program per SM for the
shared memory this needs (``pair_programs``), and the spin is bounded: a program that waits
longer than ``SPIN_LIMIT`` polls sets an error counter and goes on (its output is then wrong,
and ``pair_errors`` reports the counter). The Triton interpreter
runs programs one after another, so there a pair keeps fixed roles (``ALTERNATE=False``,
program 0 produces every tile first) and the ring holds every tile of the pair.

Epilogues: act0 and act1 from ``ACTS`` (the chain's activation after each bias); a chain with
other epilogue steps uses the generated single-program kernels.

Result (offline, Triton 3.6, sm_90, 256/256/256, 64-row tiles): correct in the interpreter (fixed
roles), but not worth a GPU run. With the role as an ``scf.if`` Triton's Hopper pipeliner aborts
(``TritonGPUPipeline`` failure). With branch-free roles (masked loads and stores, the spin in
inline PTX) it compiles but does not pipeline the tile loop: 163,848 B of shared memory, one x
buffer and one TMA load, against 204,816 B with the x tile double-buffered when the handoff is
left out. The partner's partial also lands in registers next to the program's own, so the
kernel takes 255 registers and spills (hundreds of local stores with 4 warps, 15-25 with 8). Without overlap the x
load latency (~1-2 us) adds to every tile's ~1.1 us of MMA and ~1 us of handoff. That makes
~3.5 us a tile and ~0.9 ms at M = 1M, against 0.65-0.71 ms for the two GEMMs unfused. A pointer
load of the slot that the pipeliner *did* move would be worse: it would read the slot before the
wait. The design needs explicit control of the pipeline (warp specialisation, Gluon), not the
compiler's.

    PYTHONPATH=. python benchmarks/experiments/b2b_pair_offline.py
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kfuse.kernels.codegen import cdiv, interpreting
from kfuse.kernels.tma import tma_device

ACTS = ("none", "relu", "gelu")
SPIN_LIMIT = 1 << 24
RING = 4  # slots per pair on the GPU (the producer runs at most RING tiles ahead)
SMEM_PER_SM = 233472


@triton.jit
def _act(v, ACT: tl.constexpr):
    if ACT == "relu":
        v = tl.maximum(v, 0.0)
    elif ACT == "gelu":
        v = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    return v


@triton.jit
def _wait_at_least(flag_ptr, target, err_ptr, SPIN_LIMIT: tl.constexpr):
    # one program polls a counter until it reaches target (acquire: the data written before the
    # matching release is visible after this); bounded, so a missing partner cannot hang the GPU
    seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < SPIN_LIMIT):
        seen = tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_add(err_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _spin_asm(flag_ptrs, target, SPIN_LIMIT: tl.constexpr):
    # every thread polls the counter with an acquire load until it reaches target, in PTX: a loop
    # the software pipeliner does not see (a while loop in the tile loop stops Triton from
    # pipelining the x loads), and each thread's own acquire orders its later reads of the slot.
    # Returns the last value seen (< target: gave up after SPIN_LIMIT polls)
    return tl.inline_asm_elementwise(
        """
        {
        .reg .pred p;
        .reg .s32 n;
        mov.s32 n, $3;
        SPIN:
        ld.acquire.gpu.global.s32 $0, [$1];
        setp.ge.s32 p, $0, $2;
        @p bra DONE;
        sub.s32 n, n, 1;
        setp.gt.s32 p, n, 0;
        @p bra SPIN;
        DONE:
        }
        """,
        "=r,l,r,r",
        [flag_ptrs, target, tl.full(flag_ptrs.shape, SPIN_LIMIT, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def b2b_pair_kernel(
    x_desc, w0_ptr, b0_ptr, w1_ptr, b1_ptr, y_ptr, ring_ptr, flags_ptr, err_ptr,
    M, K0, N0, N1, stride_ym,
    BLOCK_M: tl.constexpr, BK0: tl.constexpr, HALF: tl.constexpr, BN1: tl.constexpr,
    NUM_PAIRS: tl.constexpr, RING: tl.constexpr, ALTERNATE: tl.constexpr, TILE_STAGES: tl.constexpr,
    ACT0: tl.constexpr, ACT1: tl.constexpr, SPIN_LIMIT: tl.constexpr, SPIN_ASM: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    pair = pid // 2
    me = pid % 2
    # the resident halves, loaded once: W0[:, my half] (BK0, HALF) and W1[my half, :] (HALF, BN1)
    rk = tl.arange(0, BK0)
    rh = me * HALF + tl.arange(0, HALF)
    rn = tl.arange(0, BN1)
    w0 = tl.load(w0_ptr + rk[:, None] * N0 + rh[None, :], mask=(rk < K0)[:, None] & (rh < N0)[None, :], other=0.0)
    w1 = tl.load(w1_ptr + rh[:, None] * N1 + rn[None, :], mask=(rh < N0)[:, None] & (rn < N1)[None, :], other=0.0)
    b0 = tl.load(b0_ptr + rh, mask=rh < N0, other=0.0).to(tl.float32)
    b1 = tl.load(b1_ptr + rn, mask=rn < N1, other=0.0).to(tl.float32)
    rm = tl.arange(0, BLOCK_M)
    i = 0
    for t in tl.range(pair, tl.cdiv(M, BLOCK_M), NUM_PAIRS, num_stages=TILE_STAGES):
        x = x_desc.load([t * BLOCK_M, 0])  # (BLOCK_M, BK0), zero past M and K0
        h = _act(tl.dot(x, w0) + b0[None, :], ACT0)  # my half of the intermediate, in registers
        part = tl.dot(h.to(x.dtype), w1)  # my partial of the second GEMM, (BLOCK_M, BN1) fp32
        slot = pair * RING + i % RING
        ring = ring_ptr + slot * (BLOCK_M * BN1) + rm[:, None] * BN1 + rn[None, :]
        full = flags_ptr + 2 * slot
        free = full + 1
        if ALTERNATE:
            consumer = (i % 2) == me
        else:
            consumer = me == 1
        # no branches on the role (Triton's Hopper pipeliner fails on an scf.if holding these):
        # the consumer waits for the slot to be full, the producer for it to be free, and each
        # side's loads and stores are masked by its role
        wait_ptr = tl.where(consumer, full, free)
        target = tl.where(consumer, i + 1, i + 1 - RING)
        if SPIN_ASM:
            seen = _spin_asm(wait_ptr + tl.zeros([BLOCK_M], tl.int32), target, SPIN_LIMIT)
            stuck = tl.sum((seen < target).to(tl.int32), axis=0)
            tl.atomic_add(err_ptr, stuck, mask=stuck > 0, sem="relaxed", scope="gpu")
        else:
            _wait_at_least(wait_ptr, target, err_ptr, SPIN_LIMIT)
        other = tl.load(ring, mask=consumer, other=0.0, cache_modifier=".cg").to(tl.float32)
        y = _act(part + other + b1[None, :], ACT1)
        offs_m = t * BLOCK_M + rm
        tl.store(y_ptr + offs_m[:, None] * stride_ym + rn[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=consumer & (offs_m < M)[:, None] & (rn < N1)[None, :])  # fmt: skip
        tl.store(ring, part.to(ring_ptr.dtype.element_ty), mask=(consumer == 0) & (rm < BLOCK_M)[:, None], cache_modifier=".cg")
        tl.debug_barrier()  # every thread has read (consumer) or written (producer) the slot
        tl.atomic_xchg(tl.where(consumer, free, full), i + 1, sem="release", scope="gpu")
        i += 1


def pair_smem_bytes(k0: int, n0: int, n1: int, block_m: int, tile_stages: int, elem: int = 2) -> int:
    """Shared memory of one program: its two weight halves and ``tile_stages`` x tiles."""
    half = _pow2(cdiv(n0, 2))
    return (_pow2(k0) * half + half * _pow2(n1) + tile_stages * block_m * _pow2(k0)) * elem


def pair_programs(num_sms: int, tiles: int) -> int:
    """Programs of a launch: whole pairs, at most one program per SM (the partners must be resident
    together), at most one pair per row tile."""
    return 2 * max(1, min(num_sms // 2, tiles))


def _pow2(n: int) -> int:
    p = 16
    while p < n:
        p *= 2
    return p


def eligible(k0: int, n0: int, n1: int, act0: str, act1: str) -> str | None:
    """Why the pair kernel cannot run this chain (None: it can)."""
    if act0 not in ACTS or act1 not in ACTS:
        return f"pair kernel: activations {act0!r}/{act1!r} not in {ACTS}"
    if max(k0, n0, n1) > 256:
        return f"pair kernel: widths {k0}/{n0}/{n1} > 256"
    if n0 < 32:
        return f"pair kernel: N0 {n0} < 32 (a single program holds it)"
    return None


_BUFFERS: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _buffers(device: torch.device, pairs: int, ring: int, block_m: int, bn1: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    key = (str(device), pairs, ring, block_m, bn1, dtype)
    if key not in _BUFFERS:
        slots = pairs * ring
        _BUFFERS[key] = (
            torch.empty(slots * block_m * bn1, device=device, dtype=dtype),
            torch.zeros(2 * slots, device=device, dtype=torch.int32),
            torch.zeros(1, device=device, dtype=torch.int32),
        )
    return _BUFFERS[key]


def b2b_pair(
    x: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
    act0: str = "relu", act1: str = "none", block_m: int = 64, tile_stages: int = 3, num_warps: int = 4,
    out: torch.Tensor | None = None, num_sms: int | None = None,
) -> torch.Tensor:  # fmt: skip
    """``act1(act0(x @ w0 + b0) @ w1 + b1)`` by the pair kernel. ``x`` (M, K0) row-major, ``w0``
    (K0, N0) and ``w1`` (N0, N1) row-major (an ``nn.Linear`` weight transposed and made
    contiguous), fp16/bf16 on Hopper, any float dtype in the interpreter."""
    m, k0 = x.shape
    n0, n1 = w0.shape[1], w1.shape[1]
    why = eligible(k0, n0, n1, act0, act1)
    if why:
        raise ValueError(why)
    if w0.shape[0] != k0 or w1.shape[0] != n0 or b0.numel() != n0 or b1.numel() != n1:
        raise ValueError(f"b2b_pair: shapes x {tuple(x.shape)}, w0 {tuple(w0.shape)}, w1 {tuple(w1.shape)} do not chain")
    if not (tma_device(x) and x.is_contiguous() and (k0 * x.element_size()) % 16 == 0):
        raise ValueError("b2b_pair: x must be contiguous with 16-byte rows on a TMA-capable device (sm_90)")
    out = torch.empty((m, n1), device=x.device, dtype=x.dtype) if out is None else out
    if m == 0:
        return out
    from triton.tools.tensor_descriptor import TensorDescriptor

    bk0, half, bn1 = _pow2(k0), _pow2(cdiv(n0, 2)), _pow2(n1)
    tiles = cdiv(m, block_m)
    sms = num_sms or (torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4)
    programs = pair_programs(sms, tiles)
    pairs = programs // 2
    ring = cdiv(tiles, pairs) if interpreting() else RING  # sequential programs: the producer never waits
    ring_buf, flags, err = _buffers(x.device, pairs, ring, block_m, bn1, x.dtype)
    flags.zero_()
    x_desc = TensorDescriptor(x, [m, k0], [k0, 1], [block_m, bk0])
    b2b_pair_kernel[(programs,)](
        x_desc, w0.contiguous(), b0, w1.contiguous(), b1, out, ring_buf, flags, err,
        m, k0, n0, n1, out.stride(0),
        BLOCK_M=block_m, BK0=bk0, HALF=half, BN1=bn1, NUM_PAIRS=pairs, RING=ring, ALTERNATE=not interpreting(),
        TILE_STAGES=tile_stages, ACT0=act0, ACT1=act1, SPIN_LIMIT=SPIN_LIMIT, SPIN_ASM=not interpreting(), num_warps=num_warps,
    )  # fmt: skip
    return out


def pair_errors(device: torch.device | str = "cuda") -> int:
    """How many waits hit ``SPIN_LIMIT`` since the buffers were made (0: every handoff arrived)."""
    return int(sum(int(b[2].item()) for k, b in _BUFFERS.items() if k[0] == str(torch.device(device))))


def reference(
    x: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, act0: str, act1: str
) -> torch.Tensor:
    """fp32 oracle with the intermediate rounded to x's dtype (as the unfused chain stores it)."""

    def act(v: torch.Tensor, a: str) -> torch.Tensor:
        return torch.relu(v) if a == "relu" else torch.nn.functional.gelu(v) if a == "gelu" else v

    h = act(x.float() @ w0.float() + b0.float(), act0).to(x.dtype).float()
    return act(h @ w1.float() + b1.float(), act1).to(x.dtype)


def _interpreter_check() -> None:
    import subprocess
    import sys

    code = (
        "import os; os.environ['TRITON_INTERPRET'] = '1'\n"
        "import sys, torch; sys.path.insert(0, 'benchmarks/experiments')\n"
        "from b2b_pair_offline import b2b_pair, reference\n"
        "torch.manual_seed(0)\n"
        "for m, k0, n0, n1, a0, a1 in [(300, 40, 64, 48, 'relu', 'none'), (130, 64, 96, 64, 'gelu', 'relu')]:\n"
        "    x = torch.randn(m, k0); w0 = torch.randn(k0, n0) / k0 ** 0.5; w1 = torch.randn(n0, n1) / n0 ** 0.5\n"
        "    b0, b1 = torch.randn(n0), torch.randn(n1)\n"
        "    got = b2b_pair(x, w0, b0, w1, b1, a0, a1, block_m=32, out=torch.full((m, n1), float('nan')))\n"
        "    ref = reference(x, w0, b0, w1, b1, a0, a1)\n"
        "    print(f'interpreter M{m} {k0}x{n0}x{n1}: max rel err', float((got - ref).abs().max() / ref.abs().max()))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _sm90_facts(block_m: int = 64, stages: int = 2, warps: int = 4) -> dict[str, Any]:
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget

    consts = {"BLOCK_M": block_m, "BK0": 256, "HALF": 128, "BN1": 256, "NUM_PAIRS": 66, "RING": RING, "ALTERNATE": True,
              "TILE_STAGES": stages, "ACT0": "relu", "ACT1": "none", "SPIN_LIMIT": SPIN_LIMIT, "SPIN_ASM": True}  # fmt: skip
    sig = {"x_desc": f"tensordesc<fp16[{block_m}, 256]>", "flags_ptr": "*i32", "err_ptr": "*i32"}
    for name in b2b_pair_kernel.arg_names:
        sig.setdefault(name, "constexpr" if name in consts else "*fp16" if name.endswith("_ptr") else "i32")
    src = triton.compiler.ASTSource(b2b_pair_kernel, sig, constexprs=consts)
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    os.unlink(f.name)
    return {"block_m": block_m, "stages": stages, "warps": warps, "shared": ck.metadata.shared,
            "estimate_pipelined": pair_smem_bytes(256, 256, 256, block_m, stages), "regs": int(re.search(r"REG:(\d+)", usage).group(1)),
            "STL": sass.count(" STL"), "UTMALDG": sass.count("UTMALDG"), "HGMMA": sass.count("HGMMA")}  # fmt: skip


if __name__ == "__main__":
    import os

    os.environ.pop("TRITON_INTERPRET", None)
    _interpreter_check()
    for cfg in ((64, 2, 4), (64, 3, 4), (64, 2, 8)):
        print("sm_90", _sm90_facts(*cfg))
