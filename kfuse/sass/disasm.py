"""Disassembly with nvdisasm (shipped in the Triton wheel), tied word by word to the cubin's code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .control import Control, decode
from .cubin import Cubin, CubinError


@dataclass(frozen=True)
class Instr:
    index: int  # position in the original code
    offset: int  # original byte offset in .text
    pred: str  # guard such as "@!P0", "" when none
    opcode: str  # e.g. "LDG.E.128"
    operands: str  # comma-separated, as nvdisasm prints them
    word: bytes  # the 16-byte encoding (carries the control code)
    control_flow: bool  # nvdisasm marks branches, exits, calls

    @property
    def ctrl(self) -> Control:
        return decode(self.word)

    @property
    def base(self) -> str:
        return self.opcode.split(".")[0]

    def text(self) -> str:
        ops = self.operands.replace(",", ", ")
        return f"{self.pred + ' ' if self.pred else ''}{self.opcode} {ops}".strip()


def tool(name: str) -> str:
    """Path of an NVIDIA binary tool: $KFUSE_NVDISASM-style override, the Triton wheel, then PATH."""
    env = os.environ.get(f"KFUSE_{name.upper()}")
    if env:
        return env
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if p.exists():
            return str(p)
    except ImportError:  # pragma: no cover
        pass
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (looked in the Triton wheel and PATH)")
    return found


def _run_nvdisasm(data: bytes, *args: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        proc = subprocess.run([tool("nvdisasm"), *args, f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CubinError(f"nvdisasm failed: {proc.stderr.strip()[:2000]}")
    return proc.stdout


def disassemble(cubin: Cubin, kernel: str | None = None) -> list[Instr]:
    """Instructions of one kernel, in code order, each tied to its 128-bit word."""
    k = cubin.kernel(kernel)
    doc = json.loads(_run_nvdisasm(cubin.data, "-json"))
    funcs = {f["function-name"]: f for f in doc[1]}
    if k.name not in funcs:
        raise CubinError(f"nvdisasm found no function {k.name!r} in {cubin.source}")
    f = funcs[k.name]
    insts = f["sass-instructions"]
    words = cubin.words(k.name)
    if len(insts) != len(words):
        raise CubinError(f"{k.name}: nvdisasm printed {len(insts)} instructions for {len(words)} code words")
    out = []
    for i, (d, w) in enumerate(zip(insts, words, strict=True)):
        attrs = d.get("other-attributes") or {}
        cf = isinstance(attrs, dict) and attrs.get("control-flow") == "True"
        out.append(Instr(i, 16 * i, d.get("predicate", ""), d["opcode"], d.get("operands", ""), w, cf))
    return out


def listing(cubin: Cubin) -> str:
    """nvdisasm's own text listing of the code sections (used to compare schedules)."""
    return _run_nvdisasm(cubin.data, "-c")


def instruction_texts(cubin: Cubin, kernel: str | None = None) -> list[str]:
    """One normalised text per instruction, in code order."""
    return [i.text() for i in disassemble(cubin, kernel)]
