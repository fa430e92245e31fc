"""Re-emission without an assembler: move whole 128-bit words and patch what points into .text."""

from __future__ import annotations

import struct

from .cubin import Cubin, load_cubin
from .schedule import Schedule


def emit(cubin: Cubin, kernel: str, schedule: Schedule) -> Cubin:
    """A new cubin whose `kernel` code follows `schedule`; offset tables and relocations are remapped."""
    k = cubin.kernel(kernel)
    words = schedule.words()
    if len(words) * 16 != k.text_size:
        raise ValueError(f"schedule has {len(words)} words, .text.{kernel} holds {k.text_size // 16}")
    # old offset -> new offset of the same instruction
    where = {n.ins.offset: 16 * pos for pos, n in enumerate(schedule.nodes)}
    data = bytearray(cubin.data)
    data[k.text_offset : k.text_offset + k.text_size] = b"".join(words)
    for attr, offsets in k.offset_tables():
        new = [where[o] if o in where else o for o in offsets]
        struct.pack_into(f"<{len(new)}I", data, attr.payload_offset, *new)
    for r in k.relocations:
        base, inner = r.r_offset - r.r_offset % 16, r.r_offset % 16
        if base in where:
            struct.pack_into("<Q", data, r.entry_offset, where[base] + inner)
    return load_cubin(bytes(data), (cubin.arch,))
