"""Tutorial-style Triton kernels used by the SASS tuner's tests, benchmark and CLI demo.

Also holds `compile_sm90`, which builds an sm_90 cubin on any machine (no GPU needed), even when
TRITON_INTERPRET=1 turned every `@triton.jit` function into an interpreter object.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.runtime.jit import JITFunction


def as_jit_function(fn: Any) -> JITFunction:
    """Return a real JITFunction even under TRITON_INTERPRET=1 (where @triton.jit yields an InterpretedFunction)."""
    if isinstance(fn, JITFunction):
        return fn
    inner = getattr(fn, "fn", None)
    if inner is None or not callable(inner):
        raise TypeError(f"expected a @triton.jit kernel, got {type(fn).__name__}")
    return JITFunction(inner)


# Triton's tensor-core code on sm_90: "wgmma" (its default: HGMMA, operands read from shared memory by the tensor
# core) or "mma-sync" (Ampere's path: HMMA.16816 fed by LDSM from shared memory, the code SIP tuned on the A100;
# Triton's DISABLE_MMA_V3, which is part of its cache key)
MMA_FORMS = ("wgmma", "mma-sync")


def check_mma_form(form: str) -> None:
    """ValueError unless ``form`` is one of ``MMA_FORMS``."""
    if form not in MMA_FORMS:
        raise ValueError(f"unknown tensor-core form {form!r}: one of {', '.join(MMA_FORMS)}")


@contextlib.contextmanager
def mma_form(form: str) -> Iterator[None]:
    """Compile inside this block with Triton's ``form`` of tensor-core code (``MMA_FORMS``); the environment as it was
    afterwards. Kernels compiled before keep their code."""
    check_mma_form(form)
    before = os.environ.get("DISABLE_MMA_V3")
    if form == "mma-sync":
        os.environ["DISABLE_MMA_V3"] = "1"
    else:
        os.environ.pop("DISABLE_MMA_V3", None)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DISABLE_MMA_V3", None)
        else:
            os.environ["DISABLE_MMA_V3"] = before


def compile_sm90(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any] | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    arch: int = 90,
    divisible: tuple[str, ...] = (),
) -> Any:
    """Compile a Triton kernel for sm_<arch> without touching a GPU.

    Returns the CompiledKernel; under TRITON_INTERPRET=1 the code generator cannot see through interpreted
    library functions (tl.max, tl.cdiv, ...), so compilation then runs in a clean child process and only a
    namespace with `asm`, `name` and `metadata` comes back."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return _compile_in_child(fn, signature, constexprs, num_warps, num_stages, arch, divisible)
    jf = as_jit_function(fn)
    # the launcher walks the signature in order: it must follow the kernel's parameter order
    missing = [n for n in jf.arg_names if n not in signature and n not in (constexprs or {})]
    if missing:
        raise ValueError(f"{jf.__name__}: no type or constexpr value for {missing}")
    sig = {n: signature.get(n, "constexpr") for n in jf.arg_names}
    # what the JIT would infer from 16-aligned pointers and sizes: lets Triton vectorise the memory ops
    names = list(jf.arg_names)
    hints = set(divisible) | {k for k, v in signature.items() if v.startswith("*")}
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in hints}
    src = triton.compiler.ASTSource(jf, sig, constexprs=dict(constexprs or {}), attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps, "num_stages": num_stages})


def _compile_in_child(
    fn: Any,
    signature: dict[str, str],
    constexprs: dict[str, Any] | None,
    num_warps: int,
    num_stages: int,
    arch: int,
    divisible: tuple[str, ...],
) -> SimpleNamespace:
    inner = getattr(fn, "fn", fn)
    # a generated kernel module (kfuse.kernels.codegen.load_generated) is not importable by name: the child loads its file
    path = getattr(sys.modules.get(inner.__module__), "__file__", None)
    job = pickle.dumps((inner.__module__, path, inner.__name__, signature, constexprs, num_warps, num_stages, arch, divisible))
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # explicit: kfuse/__init__ would switch the interpreter on again
    code = (
        "import pickle,sys,importlib,importlib.util;from kfuse.sass.examples import compile_sm90;"
        "m,p,n,s,c,w,st,a,d=pickle.loads(sys.stdin.buffer.read());"
        "spec=importlib.util.find_spec(m) if not m.startswith('kfuse_gen_') else None;"
        "spec=spec or importlib.util.spec_from_file_location(m,p);"
        # a generated module that imports another (a PTB or fused kernel importing a template's block function): they
        # all live in the kernel cache's folder, so that folder on the path resolves the import by name
        "m.startswith('kfuse_gen_') and sys.path.insert(0,p.rsplit('/',1)[0]);"
        "mod=importlib.util.module_from_spec(spec);sys.modules[m]=mod;spec.loader.exec_module(mod);"
        "ck=compile_sm90(getattr(mod,n),s,c,w,st,a,d);"
        "sys.stdout.buffer.write(pickle.dumps((ck.name,{k:v for k,v in ck.asm.items()},ck.metadata._asdict())))"
    )
    proc = subprocess.run([sys.executable, "-c", code], input=job, capture_output=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling {inner.__name__} for sm_{arch} failed:\n{proc.stderr.decode()[-3000:]}")
    name, asm, meta = pickle.loads(proc.stdout)
    return SimpleNamespace(name=name, asm=asm, metadata=SimpleNamespace(**meta))


@triton.jit
def add_kernel(x_ptr, y_ptr, z_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(z_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def matmul_leaky_relu_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    # grouped ordering as in the Triton matmul tutorial, fp32 accumulation, LeakyReLU(0.01) epilogue
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * num_pid_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % group) % size_m)
    pid_n = (pid % group) // size_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = tl.where(acc >= 0, acc, 0.01 * acc)
    c = acc.to(tl.float16)
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + stride_cm * cm[:, None] + stride_cn * cn[None, :]
    tl.store(c_ptrs, c, mask=(cm[:, None] < M) & (cn[None, :] < N))


@triton.jit
def attention_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    sm_scale,
    stride_qz,
    stride_qh,
    stride_qm,
    stride_qk,
    stride_kz,
    stride_kh,
    stride_kn,
    stride_kk,
    stride_vz,
    stride_vh,
    stride_vn,
    stride_vk,
    stride_oz,
    stride_oh,
    stride_om,
    stride_ok,
    H,
    N_CTX,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # flash-attention forward in the style of Triton's fused-attention tutorial (non-causal, online softmax)
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_z = off_hz // H
    off_h = off_hz % H
    q_base = q_ptr + off_z.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh
    k_base = k_ptr + off_z.to(tl.int64) * stride_kz + off_h.to(tl.int64) * stride_kh
    v_base = v_ptr + off_z.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh
    o_base = o_ptr + off_z.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qk)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    for start_n in range(0, N_CTX, BLOCK_N):
        kt = tl.load(k_base + (start_n + offs_n)[None, :] * stride_kn + offs_d[:, None] * stride_kk)
        qk = tl.dot(q, kt)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = tl.load(v_base + (start_n + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vk)
        acc = tl.dot(p.to(tl.float16), v, acc)
        m_i = m_ij
    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_ok, acc.to(tl.float16))


def compile_add(block: int = 1024) -> Any:
    return compile_sm90(add_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "z_ptr": "*fp16", "n": "i32"}, {"BLOCK": block})


def compile_matmul_leaky_relu(
    block_m: int = 128, block_n: int = 128, block_k: int = 64, group_m: int = 8, num_warps: int = 8, num_stages: int = 3
) -> Any:
    # row-major A [M,K], B [K,N], C [M,N]: unit strides are constants, as the JIT specialises them
    sig = {
        "a_ptr": "*fp16",
        "b_ptr": "*fp16",
        "c_ptr": "*fp16",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "stride_am": "i32",
        "stride_bk": "i32",
        "stride_cm": "i32",
    }
    const = {"stride_ak": 1, "stride_bn": 1, "stride_cn": 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": group_m}
    return compile_sm90(
        matmul_leaky_relu_kernel,
        sig,
        const,
        num_warps=num_warps,
        num_stages=num_stages,
        divisible=("M", "N", "K", "stride_am", "stride_bk", "stride_cm"),
    )


def compile_attention(head_dim: int = 64, block_m: int = 128, block_n: int = 64, num_warps: int = 8, num_stages: int = 3) -> Any:
    names = ["q_ptr", "k_ptr", "v_ptr", "o_ptr"]
    sig: dict[str, str] = {n: "*fp16" for n in names}
    sig["sm_scale"] = "fp32"
    const: dict[str, Any] = {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n}
    for t in "qkvo":
        for s in ("z", "h", "m" if t in "qo" else "n"):
            sig[f"stride_{t}{s}"] = "i32"
        const[f"stride_{t}k"] = 1  # contiguous head dimension
    sig["H"] = "i32"
    sig["N_CTX"] = "i32"
    div = tuple(k for k in sig if k.startswith("stride_")) + ("N_CTX",)
    return compile_sm90(attention_fwd_kernel, sig, const, num_warps=num_warps, num_stages=num_stages, divisible=div)


GemmTile = tuple[int, int, int, int, int]  # BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages
TUTORIAL_GEMM: GemmTile = (128, 128, 64, 8, 3)  # the tutorial's tile (every SIP run before session 57 tuned it)


def parse_gemm_config(text: str) -> GemmTile:
    """``128x128x64w8s3`` -> (128, 128, 64, 8, 3); ValueError saying what is wrong."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", text.strip())
    if m is None:
        raise ValueError(f"a GEMM config reads BMxBNxBKwWARPSsSTAGES (e.g. 128x128x64w8s3), got {text!r}")
    bm, bn, bk, w, st = (int(g) for g in m.groups())
    if any(x & (x - 1) for x in (bm, bn, bk)) or min(bm, bn) < 16 or bk < 16 or w not in (4, 8) or not 1 <= st <= 6:
        raise ValueError(f"{text!r}: tiles powers of two >= 16, 4 or 8 warps, 1-6 stages")
    return bm, bn, bk, w, st


def config_name(cfg: GemmTile) -> str:
    return "{}x{}x{}w{}s{}".format(*cfg)


def gemm_launch(m: int, n: int, k: int, config: GemmTile = TUTORIAL_GEMM, device: str = "cuda") -> tuple:
    """GEMM + LeakyReLU on random fp16 [m, k] x [k, n]: (compiled kernel, launch arguments, grid). ``config``: BLOCK_M,
    BLOCK_N, BLOCK_K, warps, stages (the tutorial's 128 x 128 x 64 with 8 warps and 3 stages by default)."""
    import math

    import torch

    bm, bn, bk, w, st = config
    ck = compile_matmul_leaky_relu(bm, bn, bk, 8, num_warps=w, num_stages=st)
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    b = torch.randn(k, n, device=device, dtype=torch.float16)
    c = torch.empty(m, n, device=device, dtype=torch.float16)
    args = [a, b, c, m, n, k, a.stride(0), 1, b.stride(0), 1, c.stride(0), 1, bm, bn, bk, 8]
    return ck, args, (math.ceil(m / bm) * math.ceil(n / bn), 1, 1)


def attention_args(z: int, h: int, n: int, d: int, device: str = "cuda", block_m: int = 128, block_n: int = 64) -> list[Any]:
    """Random fp16 Q, K, V [z, h, n, d] and the output, as ``attention_fwd_kernel`` takes them (strides, H, N_CTX and
    the constexprs after the tensors)."""
    import math

    import torch

    q, k, v = (torch.randn(z, h, n, d, device=device, dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    args: list[Any] = [q, k, v, o, 1.0 / math.sqrt(d)]
    for t in (q, k, v, o):
        args += [t.stride(0), t.stride(1), t.stride(2), 1]
    return args + [h, n, d, block_m, block_n]


def check_attention_seq(n: int) -> None:
    """ValueError unless the example attention kernel can run sequences of ``n`` (whole 128-row query blocks)."""
    if n % 128:
        raise ValueError(f"the example attention kernel takes sequences of a multiple of 128, not {n}")


def attention_launch(z: int, h: int, n: int, d: int, device: str = "cuda") -> tuple:
    """Tutorial-style attention forward on random fp16 [z, h, n, d] (128-row query blocks, 64-row key blocks, 8 warps,
    3 stages): (compiled kernel, launch arguments, grid)."""
    check_attention_seq(n)
    ck = compile_attention(head_dim=d, block_m=128, block_n=64, num_warps=8, num_stages=3)
    return ck, attention_args(z, h, n, d, device), (n // 128, z * h, 1)
