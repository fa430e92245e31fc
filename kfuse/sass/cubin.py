"""ELF model of an sm_90 cubin: the kernel's code, its offset tables in .nv.info and relocations into .text.

Everything a schedule permutation must keep consistent is located here as (file offset, value) pairs so that
emit.py can rewrite a copy of the file in place: the code section keeps its size, only words move.
"""

from __future__ import annotations

import hashlib
import io
import struct
from dataclasses import dataclass, field
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

SUPPORTED_ARCHS = (90,)
EM_CUDA = 190

# .nv.info attribute codes whose payload is a list of u32 offsets into the kernel's .text
OFFSET_ATTRS = {
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS",
    0x1D: "EIATTR_S2RCTAID_INSTR_OFFSETS",
    0x25: "EIATTR_LD_CACHEMOD_INSTR_OFFSETS",
    0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS",
}
# attributes known to hold no code offsets (the rest are treated conservatively, see `pinned_offsets`)
PLAIN_ATTRS = {0x04, 0x0A, 0x10, 0x11, 0x12, 0x17, 0x19, 0x1B, 0x23, 0x29, 0x2F, 0x36, 0x37, 0x50}


class CubinError(ValueError):
    """The input is not a cubin kfuse can work on (message names what and where)."""


@dataclass
class NvInfoAttr:
    fmt: int
    code: int
    payload_offset: int  # file offset of the payload
    payload: bytes

    @property
    def name(self) -> str:
        return OFFSET_ATTRS.get(self.code, f"EIATTR_0x{self.code:02x}")


@dataclass
class Relocation:
    entry_offset: int  # file offset of the relocation entry (its r_offset field comes first)
    r_offset: int  # offset into .text
    section: str


@dataclass
class Kernel:
    name: str
    text_offset: int  # file offset of .text.<name>
    text_size: int
    info_attrs: list[NvInfoAttr] = field(default_factory=list)
    relocations: list[Relocation] = field(default_factory=list)

    def offset_tables(self) -> list[tuple[NvInfoAttr, list[int]]]:
        out = []
        for a in self.info_attrs:
            if a.code in OFFSET_ATTRS and a.fmt == 4:
                out.append((a, list(struct.unpack(f"<{len(a.payload) // 4}I", a.payload))))
        return out

    def pinned_offsets(self) -> set[int]:
        """Code offsets mentioned by attributes of unknown meaning: instructions there must not move."""
        pins: set[int] = set()
        for a in self.info_attrs:
            if a.code in OFFSET_ATTRS or a.code in PLAIN_ATTRS or a.fmt != 4:
                continue
            for (v,) in struct.iter_unpack("<I", a.payload[: len(a.payload) // 4 * 4]):
                if v % 16 == 0 and v < self.text_size:
                    pins.add(v)
        return pins


@dataclass
class Cubin:
    data: bytes
    arch: int
    kernels: dict[str, Kernel]
    source: str = "<bytes>"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def kernel(self, name: str | None = None) -> Kernel:
        if name is None:
            if len(self.kernels) != 1:
                raise CubinError(f"{self.source} holds kernels {sorted(self.kernels)}; name one")
            return next(iter(self.kernels.values()))
        if name not in self.kernels:
            raise CubinError(f"kernel {name!r} is not in {self.source}; it holds {sorted(self.kernels)}")
        return self.kernels[name]

    def text(self, name: str | None = None) -> bytes:
        k = self.kernel(name)
        return self.data[k.text_offset : k.text_offset + k.text_size]

    def words(self, name: str | None = None) -> list[bytes]:
        t = self.text(name)
        return [t[i : i + 16] for i in range(0, len(t), 16)]


def _parse_nv_info(data: bytes, base: int) -> list[NvInfoAttr]:
    attrs, i = [], 0
    while i + 2 <= len(data):
        fmt, code = data[i], data[i + 1]
        if fmt == 4:  # EIFMT_SVAL: u16 size + payload
            (size,) = struct.unpack_from("<H", data, i + 2)
            attrs.append(NvInfoAttr(fmt, code, base + i + 4, data[i + 4 : i + 4 + size]))
            i += 4 + size
        elif fmt in (2, 3):  # byte / half-word value, padded to 4
            attrs.append(NvInfoAttr(fmt, code, base + i + 2, data[i + 2 : i + 4]))
            i += 4
        elif fmt == 1:  # EIFMT_NVAL
            attrs.append(NvInfoAttr(fmt, code, base + i + 2, b""))
            i += 2
        else:
            raise CubinError(f"unknown .nv.info entry format {fmt} at offset {base + i:#x}")
    return attrs


def load_cubin(src: bytes | str | Path, archs: tuple[int, ...] = SUPPORTED_ARCHS) -> Cubin:
    """Parse a cubin from bytes or a path; raises CubinError with a clear message on bad input."""
    label = "<bytes>"
    if not isinstance(src, bytes | bytearray):
        label = str(src)
        try:
            src = Path(src).read_bytes()
        except OSError as e:
            raise CubinError(f"cannot read cubin {label}: {e}") from e
    data = bytes(src)
    if data[:4] != b"\x7fELF":
        raise CubinError(f"{label} is not a cubin: no ELF header")
    try:
        elf = ELFFile(io.BytesIO(data))
        machine = elf["e_machine"]
        flags = elf["e_flags"]
        sections = list(elf.iter_sections())
    except (ELFError, struct.error, ValueError) as e:
        raise CubinError(f"{label} is not a valid ELF file: {e}") from e
    if machine not in ("EM_CUDA", EM_CUDA):
        raise CubinError(f"{label} is an ELF file for {machine}, not a CUDA cubin")
    # ABI version >= 7 (CUDA 12+) keeps the SM number in the low byte; older files in bits 16-23
    arch = flags & 0xFF if elf["e_ident"]["EI_ABIVERSION"] >= 7 else (flags >> 16) & 0xFF
    if arch not in archs:
        raise CubinError(f"{label} is for sm_{arch}; kfuse.sass supports {', '.join(f'sm_{a}' for a in archs)}")
    kernels: dict[str, Kernel] = {}
    for s in sections:
        if s.name.startswith(".text."):
            kernels[s.name[6:]] = Kernel(s.name[6:], s["sh_offset"], s["sh_size"])
    for s in sections:
        if s.name.startswith(".nv.info.") and s.name[9:] in kernels:
            kernels[s.name[9:]].info_attrs = _parse_nv_info(s.data(), s["sh_offset"])
        for prefix in (".rela.text.", ".rel.text."):
            if s.name.startswith(prefix) and s.name[len(prefix) :] in kernels:
                k = kernels[s.name[len(prefix) :]]
                for j, r in enumerate(s.iter_relocations()):
                    k.relocations.append(Relocation(s["sh_offset"] + j * s["sh_entsize"], r["r_offset"], s.name))
    if not kernels:
        raise CubinError(f"{label} holds no kernel code (.text.* section)")
    return Cubin(data, arch, kernels, label)
