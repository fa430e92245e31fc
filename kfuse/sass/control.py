"""Control codes of Volta-and-later SASS words (sm_90 included).

Each instruction is one 128-bit little-endian word; the scheduling information ptxas computed lives in
bits 105-125 of that word:

    105-108 stall cycles before the next instruction may issue
    109     yield flag (as encoded: 1 = do not yield)
    110-112 write scoreboard barrier set when the result is written (7 = none)
    113-115 read scoreboard barrier set when the sources have been read (7 = none)
    116-121 wait mask: scoreboards that must be clear before this instruction issues
    122-125 operand reuse-cache flags (slots a, b, c, d)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

CTRL_SHIFT = 105  # first control bit in the 128-bit word
CTRL_BITS = 21
NO_BARRIER = 7


@dataclass(frozen=True)
class Control:
    stall: int
    yield_bit: int
    wbar: int
    rbar: int
    wait: int
    reuse: int

    def waits_on(self, barrier: int) -> bool:
        return barrier != NO_BARRIER and bool(self.wait >> barrier & 1)

    def sets(self) -> set[int]:
        """Scoreboards this instruction sets (write and read barriers)."""
        return {b for b in (self.wbar, self.rbar) if b != NO_BARRIER}

    def render(self) -> str:
        """Compact rendering in the usual `wait:rbar:wbar:yield:stall` order, e.g. `B-1--:R-:W2:-:S04`."""
        wait = "".join(str(i) if self.wait >> i & 1 else "-" for i in range(6))
        rb = "-" if self.rbar == NO_BARRIER else str(self.rbar)
        wb = "-" if self.wbar == NO_BARRIER else str(self.wbar)
        y = "-" if self.yield_bit else "Y"
        return f"B{wait}:R{rb}:W{wb}:{y}:S{self.stall:02d}"

    def with_(self, **kw: int) -> Control:
        return replace(self, **kw)


def _word_int(word: bytes) -> int:
    if len(word) != 16:
        raise ValueError(f"a SASS word is 16 bytes, got {len(word)}")
    return int.from_bytes(word, "little")


def decode(word: bytes) -> Control:
    """Control fields of one 16-byte instruction word."""
    c = _word_int(word) >> CTRL_SHIFT
    return Control(stall=c & 0xF, yield_bit=c >> 4 & 1, wbar=c >> 5 & 7, rbar=c >> 8 & 7, wait=c >> 11 & 0x3F, reuse=c >> 17 & 0xF)


def encode(word: bytes, ctrl: Control) -> bytes:
    """Return `word` with its control fields replaced by `ctrl`; all other bits untouched."""
    for name, value, width in (
        ("stall", ctrl.stall, 4),
        ("yield", ctrl.yield_bit, 1),
        ("wbar", ctrl.wbar, 3),
        ("rbar", ctrl.rbar, 3),
        ("wait", ctrl.wait, 6),
        ("reuse", ctrl.reuse, 4),
    ):
        if not 0 <= value < (1 << width):
            raise ValueError(f"control field {name}={value} does not fit in {width} bits")
    c = ctrl.stall | ctrl.yield_bit << 4 | ctrl.wbar << 5 | ctrl.rbar << 8 | ctrl.wait << 11 | ctrl.reuse << 17
    mask = ((1 << CTRL_BITS) - 1) << CTRL_SHIFT
    w = (_word_int(word) & ~mask) | (c << CTRL_SHIFT)
    return w.to_bytes(16, "little")
