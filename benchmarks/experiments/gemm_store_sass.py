"""Offline probe (no GPU): what storing the output tile by TMA changes in the sm_90 SASS of
``gemm_tma_persistent_kernel``.

The kernel is compiled for sm_90 (``GPUTarget("cuda", 90, 32)``, the wheel's ptxas) with a bias +
activation epilogue (the bias a row-broadcast (1, BLOCK_N) vector, ``XB0``), A row-major, B
column-major (a transposed nn.Linear weight, as in a model), fp16, the flattened tile loop, for a
few tile configs, each twice: C stored by pointers (a masked ``tl.store``, ``TMA_STORE=False``) and
by TMA (``c_desc.store``, ``TMA_STORE=True``).

By default the compile is specialised as Triton's JIT specialises a real launch of the problem
``--mnk`` (BERT FFN1, 4096 x 3072 x 768): an integer argument equal to 1 (``stride_cn``, the
bias's column stride, ``n_batch``) becomes a constexpr, one divisible by 16 and every (aligned)
pointer get ``tt.divisibility`` 16. ``--generic`` compiles without that (every integer a plain
i32): the pointer store then cannot prove contiguity or alignment and stores element by element.

The cubin is disassembled with the wheel's ``nvdisasm`` and its instructions are counted, in the
whole kernel and in its hot loop (the largest backward branch holding an HGMMA: the flattened
tile x K loop; the kernel also holds a cold copy for K = 0 and the prologue): all, global stores
(STG), shared stores (STS/STSM, the staging of a layout conversion or of the TMA store), local
spills (STL/LDL), bulk tensor stores (UTMASTG/UBLKCP), MUFU (the activation's exp / reciprocal),
HGMMA; with registers per thread (``cuobjdump -res-usage``) and the shared memory the kernel asks
for (``metadata.shared``), next to ``kfuse.tune.space.smem_bytes``'s estimate (TMA rows: launch stores by TMA).

    PYTHONPATH=. python benchmarks/experiments/gemm_store_sass.py [--out FILE.json] [--act gelu] [--generic]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

os.environ.pop("TRITON_INTERPRET", None)  # compile for the GPU target, never interpret

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

sys.path.insert(0, os.getcwd())
from kfuse.ir import ops  # noqa: E402,F401 - registers the ops the epilogue references
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand  # noqa: E402
from kfuse.kernels.gemm import GemmConfig, _module  # noqa: E402
from kfuse.tune.space import GemmProblem, smem_bytes  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


@dataclass(frozen=True)
class Case:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    subtile: bool = False

    def name(self) -> str:
        return f"{self.block_m}x{self.block_n}x{self.block_k} w{self.num_warps} s{self.num_stages}" + (" sub" if self.subtile else "")

    def config(self) -> GemmConfig:
        return GemmConfig(self.block_m, self.block_n, self.block_k, 8, self.num_warps, self.num_stages, persistent=True, tma=True,
                          flatten=True, epilogue_subtile=self.subtile)  # fmt: skip


CASES = [Case(128, 128, 64, 8, 4), Case(128, 256, 64, 8, 3), Case(128, 256, 64, 8, 3, subtile=True), Case(64, 256, 64, 8, 4)]

# what to count: a regex over one instruction (its opcode and modifiers)
PATTERNS = {
    "STG": r"\bSTG\b",
    "STS": r"\bSTSM?\b",
    "STL": r"\bSTL\b",
    "LDL": r"\bLDL\b",
    "bulk_store": r"\bUTMASTG\b|\bUBLKCP\b|\bUTMAREDG\b",
    "MUFU": r"\bMUFU\b",
    "HGMMA": r"\bHGMMA\b",
}
_INSTR = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L\w+):")
_BRANCH = re.compile(r"\bBRA\b.*`\((\.L\w+)\)")


def epilogue(act: str) -> Epilogue:
    steps = [EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))]
    if act != "none":
        steps.append(EpilogueStep(act, (Operand("reg", 1),)))
    return Epilogue(tuple(steps), 1)


def runtime_ints(m: int, n: int, k: int) -> dict[str, int]:
    """The integer arguments ``launch`` passes for a (1, M, K) x (1, K, N) problem with a bias."""
    return {"M": m, "N": n, "K": k, "n_batch": 1, "stride_cb": m * n, "stride_cm": n, "stride_cn": 1,
            "stride_x0b": 0, "stride_x0m": 0, "stride_x0n": 1}  # fmt: skip


def compile_case(case: Case, tma_store: bool, act: str, mnk: tuple[int, int, int] | None) -> Any:
    """The compiled kernel (a ``triton.compiler.CompiledKernel``) of one case and store path,
    specialised for the problem ``mnk`` as the JIT would (None: not specialised)."""
    jf = _module(epilogue(act)).gemm_tma_persistent_kernel
    store_n = case.block_n // 2 if case.subtile else case.block_n
    consts: dict[str, Any] = {
        "BLOCK_M": case.block_m, "BLOCK_N": case.block_n, "BLOCK_K": case.block_k, "GROUP_M": 8, "NUM_PROGRAMS": 132,
        "A_BATCHED": False, "B_BATCHED": False, "B_KMAJOR": True, "INPUT_PRECISION": "tf32", "FLATTEN": True,
        "WARP_SPECIALIZE": False, "EPILOGUE_SUBTILE": case.subtile, "TMA_STORE": tma_store, "C_BATCHED": False, "XB0": True,
    }  # fmt: skip
    sig: dict[str, str] = {
        "a_desc": f"tensordesc<fp16[{case.block_m}, {case.block_k}]>",
        "b_desc": f"tensordesc<fp16[{case.block_n}, {case.block_k}]>",  # B^T (N, K)
        # without TMA_STORE c_desc is an unused placeholder (launch passes C itself)
        "c_desc": f"tensordesc<fp16[{case.block_m}, {store_n}]>" if tma_store else "*fp16",
    }
    ints = runtime_ints(*mnk) if mnk else {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(jf.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif ints.get(name) == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig.setdefault(name, "*fp16" if name.endswith("_ptr") else "i32")
            if mnk and (sig[name].startswith("*") or (name in ints and ints[name] % 16 == 0)):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = triton.compiler.ASTSource(jf, sig, constexprs={k: v for k, v in consts.items() if k in jf.arg_names}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": case.num_warps, "num_stages": case.num_stages})


def _tool(name: str, *args: str, cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([os.path.join(BIN, name), *args, f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def disassemble(cubin: bytes) -> tuple[list[str], list[str]]:
    """The instructions of a cubin (one string each, predicate and operands included), and those
    of its hot loop (the largest backward branch's range that holds an HGMMA)."""
    ins: list[str] = []
    labels: dict[str, int] = {}
    for line in _tool("nvdisasm", "-c", cubin=cubin).splitlines():
        if m := _LABEL.match(line):
            labels[m.group(1)] = len(ins)
        elif m := _INSTR.match(line):
            ins.append(m.group(1))
    loop: list[str] = []
    for i, text in enumerate(ins):
        m = _BRANCH.search(text)
        lo = labels.get(m.group(1), i) if m else i
        if lo < i and i + 1 - lo > len(loop) and any("HGMMA" in t for t in ins[lo : i + 1]):
            loop = ins[lo : i + 1]
    return ins, loop


def counts(ins: list[str]) -> dict[str, int]:
    return {"instructions": len(ins), **{key: sum(1 for i in ins if re.search(pat, i)) for key, pat in PATTERNS.items()}}


def probe(case: Case, tma_store: bool, act: str, mnk: tuple[int, int, int] | None) -> dict[str, Any]:
    """One row: the counts of the kernel and its hot loop, registers, shared bytes, the estimate."""
    row: dict[str, Any] = {"config": case.name(), "store": "tma" if tma_store else "pointer"}
    try:
        ck = compile_case(case, tma_store, act, mnk)
    except Exception as e:  # noqa: BLE001 - a compile failure is a result of the probe
        lines = str(e).strip().splitlines()
        row["error"] = f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300]
        return row
    ins, loop = disassemble(ck.asm["cubin"])
    row["kernel"], row["loop"] = counts(ins), counts(loop)
    regs = re.search(r"REG:(\d+)", _tool("cuobjdump", "-res-usage", cubin=ck.asm["cubin"]))
    row["regs"] = int(regs.group(1)) if regs else None
    row["shared"] = ck.metadata.shared
    # the tuner's estimate for the config, which launch runs with the TMA store (N x 2 B 16-byte aligned)
    m, n, k = mnk or (4096, 3072, 768)
    row["estimate"] = smem_bytes(case.config(), GemmProblem(m, n, k, b_t=True)) if tma_store else ""
    return row


def table(rows: list[dict[str, Any]]) -> str:
    keys = ["instructions", "STG", "STS", "bulk_store", "STL", "LDL", "MUFU"]
    head = ["config", "store", *(f"{k}" for k in keys), "| loop:", *keys, "| regs", "shared", "estimate"]
    body = []
    for r in rows:
        if "error" in r:
            body.append([r["config"], r["store"], "ERROR " + r["error"]])
            continue
        body.append([r["config"], r["store"], *(r["kernel"][k] for k in keys), "|", *(r["loop"][k] for k in keys),
                     f"| {r['regs']}", r["shared"], r["estimate"]])  # fmt: skip
    cols = max(len(b) for b in [head, *body])
    widths = [max(len(str(b[i])) for b in [head, *body] if i < len(b)) for i in range(cols)]
    return "\n".join("  ".join(str(v).ljust(w) for v, w in zip(b, widths, strict=False)).rstrip() for b in [head, *body])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the rows as JSON to this file")
    ap.add_argument("--act", default="gelu", help="the activation after the bias (an epilogue op: gelu, gelu_tanh, relu, none)")
    ap.add_argument("--mnk", type=int, nargs=3, default=(4096, 3072, 768), help="the problem the compile is specialised for")
    ap.add_argument("--generic", action="store_true", help="no launch specialisation (every integer argument a plain i32)")
    args = ap.parse_args()
    mnk = None if args.generic else (args.mnk[0], args.mnk[1], args.mnk[2])
    rows = [probe(case, tma, args.act, mnk) for case in CASES for tma in (False, True)]
    spec = f"specialised for M, N, K = {mnk}" if mnk else "generic"
    print(f"gemm_tma_persistent_kernel, sm_90, fp16, bias + {args.act}, flattened loop, {spec}")
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            meta = {"act": args.act, "specialised_for": mnk, "triton": triton.__version__, "target": "sm_90"}
            json.dump({**meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
