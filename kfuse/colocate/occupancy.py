"""Programs per SM of the PTB and fused kernels, from an offline sm_90 compile (no GPU needed).

The co-location design assumes that the LC GEMM's persistent grid (``CudaBackend``: 2 programs per
SM) and the tail-fill fused kernel really hold two programs per SM: the tail's BE blocks run in the
SM slots the LC's last round leaves free. Session 9 found offline that the PTB GEMM tile used until
then (128x128x64, 8 warps, 3 stages) takes 167 registers a thread, so one program fits an SM. Its
tail-fill kernel with hotspot takes the same, so half the grid waited for the other half. This
module compiles a kernel the way the JIT specialises it at launch: integer arguments equal to 1
become constants, and those divisible by 16 get the divisibility hint. It then reads registers
(``cuobjdump -res-usage``) and shared memory and returns how many programs fit an H100/H200 SM.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from kfuse.colocate.fuser import TAILSM_CONSTS, TAILSM_RUNTIME, FusedVersion, fused_module, kernel_fn, launch_args
from kfuse.colocate.ptb import BlockKernel, _module_for, _params
from kfuse.tune.hardware import programs_per_sm as hardware_programs_per_sm


def cubin_resources(cubin: bytes) -> dict[str, int]:
    """Registers per thread and stack bytes of the (single) kernel in ``cubin``."""
    from kfuse.sass.disasm import tool

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([tool("cuobjdump"), "-res-usage", str(path)], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if "REG:" in ln)
    return {"regs": int(line.split("REG:")[1].split()[0]), "stack": int(line.split("STACK:")[1].split()[0])}


def programs_per_sm(regs: int, shared: int, num_warps: int) -> int:
    """Programs of one kernel resident on an SM at once (registers rounded up to 8 a thread)."""
    return hardware_programs_per_sm(regs, shared, num_warps)


def _type_of(v: Any) -> str:
    from triton.tools.tensor_descriptor import TensorDescriptor

    if isinstance(v, TensorDescriptor):  # a host-side TMA descriptor, as the JIT specialises it (dtype and block shape)
        return f"tensordesc<{_type_of(v.base)[1:]}{list(v.block_shape)}>"
    if isinstance(v, torch.Tensor):
        return {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64",
                torch.uint8: "*u8", torch.int8: "*i8"}[v.dtype]  # fmt: skip
    if isinstance(v, float):
        return "fp32"
    return "i32" if abs(int(v)) < 2**31 else "i64"


def _compile(fn: Any, named: list[tuple[str, Any]], consts: dict[str, Any], num_warps: int, num_stages: int) -> Any:
    """Generated kernel ``fn`` compiled for sm_90, specialised as the JIT does at launch."""
    from kfuse.sass.examples import compile_sm90

    ones = {n: 1 for n, v in named if isinstance(v, int) and not isinstance(v, bool) and v == 1}
    sig = {n: _type_of(v) for n, v in named if n not in ones}
    div = tuple(n for n, v in named if isinstance(v, int) and not isinstance(v, bool) and v != 0 and v % 16 == 0)
    return compile_sm90(fn, sig, {**consts, **ones}, num_warps=num_warps, num_stages=num_stages, divisible=div)


def _report(ck: Any, num_warps: int) -> dict[str, int]:
    res = cubin_resources(bytes(ck.asm["cubin"]))
    shared = int(ck.metadata.shared)
    return {**res, "shared": shared, "num_warps": num_warps, "programs_per_sm": programs_per_sm(res["regs"], shared, num_warps)}


def ptb_occupancy(k: BlockKernel) -> dict[str, int]:
    """Resources and programs per SM of ``k``'s PTB kernel, compiled for sm_90."""
    names, consts = _params("", k)
    named = [*zip(names, k.args, strict=True), ("start", 0), ("end", k.n_blocks)]
    ck = _compile(_module_for(k).ptb_kernel, named, dict(zip(consts, k.consts.values(), strict=True)), k.num_warps, k.num_stages)
    return _report(ck, k.num_warps)


def fused_occupancy(lc: BlockKernel, be: BlockKernel, version: FusedVersion) -> dict[str, int]:
    """Resources and programs per SM of the fused LC + BE kernel of ``version``, compiled for sm_90."""
    la, lcst = _params("l_", lc)
    ba, bcst = _params("b_", be)
    _, args, opts = launch_args(lc, (0, lc.n_blocks), be, (0, be.n_blocks), version, sms=132)
    names = la + ["l_start", "l_end"] + ba + ["b_start", "b_end", "period", "r1"]
    const_names = lcst + bcst
    if version.mode == "tailsm":  # its counter buffer, then the %smid path as the GPU runs it (not the interpreter's)
        names += TAILSM_RUNTIME
        const_names = [*TAILSM_CONSTS, *const_names]
        args[len(names)] = False
    runtime = args[: len(names)]
    consts = dict(zip(const_names, args[len(names) :], strict=True))
    mod = fused_module(lc, be)
    fn = kernel_fn(mod, version)
    ck = _compile(fn, list(zip(names, runtime, strict=True)), consts, opts["num_warps"], opts["num_stages"])
    return _report(ck, opts["num_warps"])
