"""Inspecting the generated code without a GPU: offline sm_90 compiles and PTX analyses."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import torch

from kfuse.kernels.b2b.chain import B2BConfig, Chain, chunked_parts, pad_constexprs, pad_width
from kfuse.kernels.b2b.launcher import conv_tma_block_k
from kfuse.kernels.b2b.source import _module, _rowbcast_names
from kfuse.kernels.codegen import interpreting

_CONSTEXPRS = (
    "SH",
    "SW",
    "PH",
    "PW",
    "DH",
    "DW",
    "KH",
    "KW",
    "BLOCK_M",
    "BLOCK_K",
    "BLOCK_N",
    "SMEM",
    "PREC",
    "SINGLE_K",
    "SINGLE_N",
    "PRELOAD",
    "N_STAGES",
    "NUM_PROGRAMS",
    "TILE_STAGES",
    "PDL",
    "BNI",
    "BH",
    "BW",
    "BLOCK_H",
    "MASK_H",
    "K_STEP",
    "K_PARTS",
    "N_A",
    "N_B",
)
_TT = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_asm(
    chain: Chain, widths: list[int], cfg: B2BConfig, dtype: torch.dtype = torch.float16, arch: int = 90,
    kernel_hw: tuple[int, int] = (1, 1), widths_k0: int = 1 << 30, jit_like: bool = False,
    int_args: dict[str, int] | None = None, rowbcast: bool = False,
) -> dict[str, str]:  # fmt: skip
    """Compile the chain's kernel for sm_<arch> on any machine and return its ``asm`` dict
    (``ttgir``, ``ptx``, ``cubin``...). Under ``TRITON_INTERPRET=1`` the compile runs in a child
    process without it (the interpreter replaces ``@triton.jit`` functions). ``jit_like``: a GEMM
    chain on contiguous tensors as the JIT specialises it; ``int_args``: integer arguments' values
    (e.g. a conv chain's sizes and strides), specialised as the JIT would (1 -> constant, multiples
    of 16 -> divisible); ``rowbcast``: every epilogue extra is a row-broadcast vector (a bias).
    A conv chain's config with ``tma`` and ``tile_h`` compiles ``b2b_conv_tma_kernel`` (descriptors
    ``tensordesc<t[BNI, BH, BW, BLOCK_K]>`` for x, ``[BNI, BH, BW, BLOCK_N]`` for the output; C =
    ``widths_k0`` narrows BLOCK_K as the launcher does)."""
    if interpreting():
        import pickle
        import subprocess
        import sys

        env = dict(os.environ, TRITON_INTERPRET="0")  # "0", not unset: kfuse's import would set it again
        code = (
            "import pickle,sys;from kfuse.kernels.b2b import compile_asm;"
            "a=pickle.loads(sys.stdin.buffer.read());"
            "sys.stdout.buffer.write(pickle.dumps({k:v for k,v in compile_asm(*a).items() if isinstance(v,(str,bytes,int))}))"
        )
        job = pickle.dumps((chain, widths, cfg, dtype, arch, kernel_hw, widths_k0, jit_like, int_args, rowbcast))
        proc = subprocess.run([sys.executable, "-c", code], input=job, capture_output=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the b2b kernel for sm_{arch} failed:\n{proc.stderr.decode()[-3000:]}")
        return pickle.loads(proc.stdout)
    import triton
    from triton.backends.compiler import GPUTarget

    tma = cfg.persistent and cfg.tma and not chain.conv
    conv_tma = chain.conv and cfg.tma and cfg.tile_h > 0  # b2b_conv_tma_kernel: 4-D NHWC boxes
    if conv_tma and widths_k0 < 1 << 30:  # the launcher's channel step for C = widths_k0
        cfg = replace(cfg, block_k=conv_tma_block_k(cfg, widths_k0))
    mod = _module(chain)
    jf = mod.b2b_persistent_kernel if cfg.persistent else mod.b2b_kernel
    if conv_tma:
        jf = mod.b2b_conv_tma_persistent_kernel if cfg.persistent else mod.b2b_conv_tma_kernel
    elif tma:
        jf = mod.b2b_tma_kernel
    chunked = cfg.residence == "chunked"
    if chunked:  # TMA descriptors for x, both weights and the output (K0 in K_PARTS steps, N1 in 1-2 parts)
        jf = mod.b2b_chunked_kernel
        k_step, k_parts, n_a, n_b = chunked_parts(min(widths_k0, 256), widths[-1])
        cfg = replace(cfg, block_k=k_step)
    t = _TT[dtype]
    sig: dict[str, str] = {}
    const: dict[str, Any] = {}
    divisible: list[str] = []
    block_n = min(cfg.block_n, pad_width(widths[-1]))
    for name in jf.arg_names:
        if chunked and name in ("x_desc", "w0_desc", "w1_desc", "out_desc", "w1b_desc", "outb_desc"):
            box = {"x_desc": (cfg.block_m, k_step), "w0_desc": (k_step, cfg.block_h), "w1_desc": (cfg.block_h, n_a),
                   "out_desc": (cfg.block_m, n_a), "w1b_desc": (cfg.block_h, n_b or n_a),
                   "outb_desc": (cfg.block_m, n_b or n_a)}[name]  # fmt: skip
            sig[name] = f"tensordesc<{t}[{box[0]}, {box[1]}]>"
        elif name in ("x_desc", "out_desc"):
            inner = cfg.block_k if name == "x_desc" else block_n
            rows = f"{cfg.tile_n}, {cfg.tile_h}, {cfg.block_m // (cfg.tile_h * cfg.tile_n)}" if conv_tma else f"{cfg.block_m}"
            sig[name] = f"tensordesc<{t}[{rows}, {inner}]>"
        elif name.endswith("_ptr"):
            sig[name] = f"*{t}"
            divisible.append(name)
        elif name in _CONSTEXPRS or (name.startswith("P") and name[1:].isdigit()) or name.startswith(("ROWBCAST_", "PADDED")):
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    const.update(SH=1, SW=1, PH=kernel_hw[0] // 2, PW=kernel_hw[1] // 2, DH=1, DW=1, KH=kernel_hw[0], KW=kernel_hw[1])
    const.update(pad_constexprs(widths))
    const.update({b: rowbcast for b in _rowbcast_names(chain)})
    const.update(BLOCK_M=cfg.block_m, BLOCK_K=cfg.block_k, BLOCK_N=min(cfg.block_n, pad_width(widths[-1])))
    const.update(SMEM=cfg.residence == "smem", PREC="tf32" if dtype == torch.float32 else "ieee")
    # the launcher's specialisations for a GEMM chain whose K0 and last width fit one tile each
    const.update(SINGLE_K=kernel_hw == (1, 1) and widths_k0 <= cfg.block_k, SINGLE_N=widths[-1] <= const["BLOCK_N"])
    # as launch(): one program per row tile always preloads (a Triton 3.6 sm_90 miscompile otherwise)
    per_tile = jf is mod.b2b_kernel
    const.update(PRELOAD=(cfg.preload or per_tile) and const["SINGLE_N"], N_STAGES=cfg.n_stages or cfg.num_stages)
    if cfg.persistent:
        const.update(NUM_PROGRAMS=264, TILE_STAGES=cfg.num_stages)
    if tma:
        const.update(NUM_PROGRAMS=132 * cfg.programs_per_sm, TILE_STAGES=cfg.num_stages, PDL=cfg.pdl)
    if chunked:
        const.update(NUM_PROGRAMS=132 * cfg.programs_per_sm, BLOCK_H=cfg.block_h, MASK_H=widths[0] % cfg.block_h != 0, PDL=cfg.pdl)
        const.update(K_STEP=k_step, K_PARTS=k_parts, N_A=n_a, N_B=n_b)
    if conv_tma:
        const.update(BNI=cfg.tile_n, BH=cfg.tile_h, BW=cfg.block_m // (cfg.tile_h * cfg.tile_n))
        if cfg.persistent:
            const.update(NUM_PROGRAMS=132 * cfg.programs_per_sm)
    if jit_like and not chain.conv:
        # what the JIT sees for a GEMM chain on contiguous tensors: the unit strides and the 1x1
        # "image" sizes are specialised to 1, the other integers are multiples of 16
        for name in ("sxc", "sxh", "sxw", "soc", "soh", "sow", "H", "W", "OH", "OW"):
            if name not in sig:
                continue
            sig[name] = "constexpr"
            const[name] = 1
        divisible += [k for k, v in sig.items() if v == "i32"]
    for name, v in (int_args or {}).items():  # what the JIT sees for these values: 1 is a constant,
        if name not in sig or sig[name] != "i32":  # multiples of 16 are marked divisible
            raise ValueError(f"compile_asm: {name!r} is not an integer argument of the kernel")
        if v == 1:
            sig[name] = "constexpr"
            const[name] = 1
        elif v % 16 == 0:
            divisible.append(name)
    names = list(jf.arg_names)
    const = {k: v for k, v in const.items() if k in names}  # e.g. the tile loop's constexprs of another kernel
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in divisible}
    src = triton.compiler.ASTSource(jf, sig, constexprs=const, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return {**ck.asm, "shared": ck.metadata.shared}  # bytes of shared memory a program needs


def ptx_summary(ptx: str) -> dict[str, int]:
    """Counts of the instructions that show where data lives: global stores/loads, shared
    stores/loads, and tensor-core MMAs (wgmma with A from registers vs from shared memory)."""
    import re

    lines = [ln.strip() for ln in ptx.splitlines()]
    wg = [ln for ln in lines if ln.startswith("wgmma.mma_async")]
    # wgmma's A operand is either a register list "{%r..}" or a 64-bit shared-memory descriptor "%rd.."
    wg_rs = [ln for ln in wg if re.search(r"\}\s*,\s*\{", ln)]
    return {
        "st.global": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?st\.global", ln)),
        "ld.global": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?ld\.global", ln)),
        "cp.async": sum(1 for ln in lines if ln.startswith("cp.async") and "commit" not in ln and "wait" not in ln),
        "st.shared": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?st\.shared", ln) or ln.startswith("stmatrix")),
        "ld.shared": sum(1 for ln in lines if re.match(r"(@%p\d+\s+)?ld\.shared", ln) or ln.startswith("ldmatrix")),
        "wgmma": len(wg),
        "wgmma_a_regs": len(wg_rs),
        "mma.sync": sum(1 for ln in lines if ln.startswith("mma.sync")),
    }


def ptx_global_store_bases(ptx: str) -> list[set[str]]:
    """For every ``st.global`` in ``ptx``, the kernel parameters its address is computed from
    (a forward taint analysis over the PTX registers, iterated to a fixpoint for loops)."""
    import re

    params: dict[str, int] = {}
    taint: dict[str, set[str]] = {}
    body = [ln.strip() for ln in ptx.splitlines()]
    for ln in body:
        m = re.match(r"ld\.param\.\w+\s+(%\w+),\s*\[(\w+)\]", ln)
        if m:
            taint.setdefault(m.group(1), set()).add(m.group(2))
            params[m.group(2)] = 1
    ins = []
    for ln in body:
        m = re.match(r"(@!?%p\d+\s+)?([a-z][\w.]*)\s+(.*);", ln)
        if m:
            ins.append((m.group(2), m.group(3)))
    changed = True
    while changed:
        changed = False
        for op, rest in ins:
            if op.startswith(("st.", "ld.param", "bra", "wgmma", "mma")):
                continue
            regs = re.findall(r"%\w+", rest)
            if len(regs) < 2:
                continue
            dst, srcs = regs[0], regs[1:]
            src_t: set[str] = set()
            for r in srcs:
                src_t |= taint.get(r, set())
            if src_t - taint.get(dst, set()):
                taint.setdefault(dst, set()).update(src_t)
                changed = True
    out = []
    for op, rest in ins:
        if op.startswith("st.global"):
            addr = re.search(r"\[\s*(%\w+)", rest)
            out.append(set(taint.get(addr.group(1), set())) if addr else set())
    return out
