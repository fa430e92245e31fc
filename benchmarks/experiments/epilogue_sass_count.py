"""Offline (no GPU): what an epilogue activation costs in sm_90 SASS.

Compiles ``gemm_tma_persistent_kernel`` (flattened tile loop) for sm_90 with the epilogue
bias -> {nothing, gelu_tanh, gelu} on a few tiles, disassembles the cubin with the nvdisasm that
ships in Triton's wheel, and prints instruction counts: the activation's cost per output value
is (count - count without it) / (tile values / threads). Session 7: exact GELU with libdevice's
erf cost ~62 instructions a value and spilled 128x256 / 256x128 tiles; with the A&S erfc form in
``kfuse/ir/ops.py`` ~28 (see docs/perf-notes.md).

    python benchmarks/experiments/epilogue_sass_count.py
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
import triton.backends.nvidia as nvidia_backend
from triton.backends.compiler import GPUTarget

from kfuse.ir import ops  # noqa: F401 - registers the ops the epilogue uses
from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand
from kfuse.kernels.gemm import _module

CONSTEXPRS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "NUM_PROGRAMS", "A_BATCHED", "B_BATCHED", "B_KMAJOR")
CONSTEXPRS += ("INPUT_PRECISION", "FLATTEN", "WARP_SPECIALIZE", "EPILOGUE_SUBTILE", "TMA_STORE")


def epilogue(act: str | None) -> Epilogue:
    steps = [EpilogueStep("add", (Operand("reg", 0), Operand("in", 0)))]
    if act:
        steps.append(EpilogueStep(act, (Operand("reg", 1),)))
    return Epilogue(tuple(steps), 1)


def sass_counts(act: str | None, bm: int, bn: int, bk: int, warps: int, stages: int) -> dict[str, int]:
    jf = _module(epilogue(act)).gemm_tma_persistent_kernel
    sig = {}
    for name in jf.arg_names:
        if name == "a_desc":
            sig[name] = f"tensordesc<fp16[{bm}, {bk}]>"
        elif name == "b_desc":
            sig[name] = f"tensordesc<fp16[{bk}, {bn}]>"
        elif name == "c_desc":
            sig[name] = f"tensordesc<fp16[{bm}, {bn}]>"
        elif name.endswith("_ptr"):
            sig[name] = "*fp16"
        elif name in CONSTEXPRS or name.startswith("XB"):
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    const = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, NUM_PROGRAMS=132, A_BATCHED=False, B_BATCHED=False, B_KMAJOR=False)
    const.update(INPUT_PRECISION="ieee", FLATTEN=True, WARP_SPECIALIZE=False, EPILOGUE_SUBTILE=False, TMA_STORE=False, XB0=True)
    const = {k: v for k, v in const.items() if k in jf.arg_names}
    for name, value in (("stride_cn", 1), ("stride_x0n", 1), ("stride_x0m", 0)):  # a contiguous C, a bias vector
        if name in sig:
            sig[name], const[name] = "constexpr", value
    ck = triton.compile(triton.compiler.ASTSource(jf, sig, constexprs=const), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": warps, "num_stages": stages})  # fmt: skip
    nvdisasm = os.path.join(os.path.dirname(nvidia_backend.__file__), "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    ins = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]

    def count(p: str) -> int:
        return sum(1 for line in ins if re.search(p, line))

    return {
        "instrs": len(ins),
        "MUFU": count("MUFU"),
        "FFMA": count("FFMA"),
        "STL": count("STL"),
        "LDL": count("LDL"),
        "shared": ck.metadata.shared,
    }


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    for bm, bn, bk, warps, stages in [(128, 128, 64, 8, 4), (64, 256, 64, 8, 4), (128, 256, 64, 8, 3)]:
        base = None
        for act in (None, "gelu_tanh", "gelu"):
            c = sass_counts(act, bm, bn, bk, warps, stages)
            base = base or c["instrs"]
            per_value = (c["instrs"] - base) / (bm * bn / (32 * warps))
            print(f"{bm}x{bn}x{bk} w{warps} s{stages} {str(act):9s} {c}  +{per_value:.1f} instructions a value")


if __name__ == "__main__":
    main()
