"""Schedule model: basic blocks, register dependencies, scoreboards, fixed-latency hazards, legal moves.

A *move* takes one instruction of the move set (SIP's: the memory instructions; ``MOVE_SETS["all"]`` adds the
register-to-register arithmetic ptxas interleaves with them) one slot up or down inside its basic block, i.e. swaps
it with a neighbour.  The model is deliberately conservative: whatever it cannot prove harmless is refused, because
a wrong schedule either crashes the CUDA context or, worse, computes something else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .control import NO_BARRIER, Control
from .disasm import Instr

# memory instructions that may move (configurable per Schedule)
DEFAULT_MOVABLE = frozenset({"LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "LD", "ST", "LDL", "STL"})
LOADS = frozenset({"LDG", "LDS", "LDSM", "LD", "LDL", "LDC", "ULDC"})
SHARED_ONLY = frozenset({"LDS", "STS", "LDSM", "STSM"})
GLOBAL_ONLY = frozenset({"LDG", "STG"})
# instructions that order memory or threads, or act on state the model does not track: nothing crosses them
FENCES = frozenset(
    {
        "BAR",
        "BARRIER",
        "MEMBAR",
        "FENCE",
        "ERRBAR",
        "CCTL",
        "CCTLL",
        "DEPBAR",
        "LDGDEPBAR",
        "WARPSYNC",
        "BSSY",
        "BSYNC",
        "BMOV",
        "SYNCS",
        "HGMMA",
        "IGMMA",
        "QGMMA",
        "BGMMA",
        "WARPGROUP",
        "UTMALDG",
        "UTMASTG",
        "UTMAPF",
        "UBLKCP",
        "UBLKPF",
        "UBLKRED",
        "UTMACCTL",
        "UTMACMDFLUSH",
        "ATOM",
        "ATOMS",
        "ATOMG",
        "RED",
        "REDUX",
        "ELECT",
        "VOTE",
        "VOTEU",
        "MATCH",
        "NANOSLEEP",
        "ARRIVES",
        "CALL",
        "RET",
        "BRA",
        "BRX",
        "JMP",
        "JMX",
        "EXIT",
        "BPT",
        "KILL",
        "YIELD",
        "ACQBULK",
        "PMTRIG",
        "CS2R.32",
        "S2UR",
        "SETCTAID",
        "SETLMEMBASE",
        "UCGABAR_ARV",
        "UCGABAR_WAIT",
        "CGAERRBAR",
        "USETMAXREG",
        "PREEXIT",
    }
)
# register-to-register arithmetic, conversions and moves: the wider move set (session 51). Their legality is the same
# register, predicate, scoreboard and fixed-latency analysis as a memory instruction's; the uniform datapath
# (U* opcodes), tensor-core ops and everything in FENCES stay put.
ALU_MOVABLE = frozenset(
    {"FFMA", "FADD", "FMUL", "FMNMX", "FSEL", "FSETP", "HFMA2", "HADD2", "HMUL2", "HMNMX2", "HSETP2", "IMAD", "IADD3",
     "IMNMX", "IABS", "ISETP", "LOP3", "SHF", "LEA", "SEL", "MOV", "PRMT", "F2F", "F2FP", "I2F", "I2FP", "F2I", "FRND",
     "MUFU", "POPC", "FLO", "BREV", "VIADD", "VIMNMX"}
)  # fmt: skip
MOVE_SETS = {"memory": DEFAULT_MOVABLE, "all": DEFAULT_MOVABLE | ALU_MOVABLE}
# arithmetic with variable latency (the MUFU / conversion / shuffle units). ptxas gives some of them no write
# scoreboard: a later one of the same unit sets it, and a wait on it covers both since they complete in order
# (17 of the 37 MUFU in the attention example). So such an instruction is never fixed-latency, and two of them keep
# their order when either has no write scoreboard (session 51: moving them apart made 5 of 373 candidates wrong).
VARIABLE_LATENCY = frozenset({"MUFU", "I2F", "F2I", "F2F", "I2I", "FRND", "POPC", "FLO", "BREV", "SHFL", "S2R"})


def move_set(name: str) -> frozenset[str]:
    """The opcodes a named move set lets move ("memory": SIP's; "all": memory and register arithmetic)."""
    if name not in MOVE_SETS:
        raise ValueError(f"unknown move set {name!r}; known: {', '.join(MOVE_SETS)}")
    return MOVE_SETS[name]


# everything that reads or writes memory (movable or not): two of them only swap when _memory_commutes says so
MEMORY_OPS = DEFAULT_MOVABLE | frozenset({"STSM", "LDC", "ULDC", "ATOM", "ATOMS", "ATOMG", "RED", "SULD", "SUST", "SUATOM", "SURED"})
NO_DEST = frozenset(
    {
        "STG",
        "STS",
        "ST",
        "STL",
        "STSM",
        "LDGSTS",
        "RED",
        "BAR",
        "NOP",
        "MEMBAR",
        "DEPBAR",
        "LDGDEPBAR",
        "WARPSYNC",
        "CCTL",
        "ERRBAR",
        "FENCE",
        "EXIT",
        "BRA",
        "RET",
        "CALL",
        "BSSY",
        "BSYNC",
        "YIELD",
        "NANOSLEEP",
        "ARRIVES",
        "SYNCS",
        "UTMASTG",
        "UTMALDG",
        "UTMAPF",
    }
)
PREDICATES = tuple(f"P{i}" for i in range(7))
IGNORED = frozenset({"RZ", "PT", "URZ", "UPT", "SRZ"})
HAZARD_CYCLES = 12  # conservative bound on fixed-latency (ALU) result latency on sm_90
# A guard predicate (`@P1 FMUL ...`) is read earlier in the pipeline than an operand: in every kernel we compile ptxas
# puts a guarded instruction at least 13 cycles after the fixed-latency FSETP / ISETP that sets its guard (hundreds at
# exactly 13), where a predicate operand (`ISETP ..., !P0`, `P2R`) may follow in 2-4. Sessions 63-64 on an H100: each
# of the mma-sync GEMM's four wrong single moves took an `@!Pn FMUL` of the LeakyReLU epilogue from 13 to 12 cycles
# after its FSETP (an LDS.128 swapped with the FMUL or the FSETP); the same kind of move to 13 computed right, and with
# this rule legal moves reach none of the 87 wrong candidates recorded since session 62. An LDGSTS reads its zero-fill
# predicate as early (ptxas: 13 cycles or more from its ISETP in all 65 pairs of the example kernels), so that counts too.
GUARD_CYCLES = 13
# warp MMAs (mma.sync) are fixed-latency too, but long: ptxas leaves 24-28 cycles between an HMMA.16816 and the first
# reader of its accumulators with no scoreboard (the mma-sync examples on sm_90); 12 let SIP's moves bring readers
# closer (session 62). These many cycles, a margin over the 24 seen, before a reader or writer.
LONG_LATENCY = {"HMMA": 32, "IMMA": 32, "DMMA": 32}
LONG_WINDOW = max(LONG_LATENCY.values())
# a scoreboard set by one instruction is never waited on fewer than 2 cycles later in ptxas output (checked on the
# example kernels); a set takes effect a cycle after issue, so a closer waiter could miss it and read a stale register
MIN_SET_TO_WAIT = 2
# BAR.SYNC.DEFER_BLOCKING lets the warp issue a few more cycles before it blocks: ptxas never puts a memory access
# fewer than 6 cycles after one (it pads LDGSTS bursts to 9 with never-executed LDS) in any kernel we compile. Moved
# closer, an STS could overwrite a buffer other warps still read (session 60: the one STS 6 cycles after its BAR in
# the 128 x 64 GEMM's epilogue was the one such move, and 955 of 3,000 SIP candidates there computed wrong outputs).
# So no move brings a memory access closer to a preceding barrier than it was, within this many cycles.
BAR_SETTLE_CYCLES = 12
# bumped whenever a rule makes the model stricter: cached schedules of an older model are searched again (kfuse.sass.cache)
# (2: the barrier-settle rule, session 60; 3: loads covered by a later load's scoreboard, warp MMA register groups,
# STSM's data registers, session 62; 4: plain shared loads kept in place, session 63; 5: guard predicates read
# GUARD_CYCLES after their setter, which explained session 63's LDS data, so the LDS rule went; session 64)
LEGALITY_VERSION = 5
BLOCKING_BARRIERS = frozenset({"BAR", "BARRIER"})
_BARE_PRED = re.compile(r"U?P[0-6]")

_REG = re.compile(r"(?<![\w.])(UR\d+|URZ|UPT|UP\d|R\d+|RZ|PT|P\d|PR)((?:\.[A-Za-z0-9_]+)*)")


def _split_operands(ops: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in ops:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _expand(name: str, width: int) -> set[str]:
    if name in IGNORED:
        return set()
    if name == "PR":  # the whole predicate file (P2R / R2P)
        return set(PREDICATES)
    m = re.fullmatch(r"(UR|R)(\d+)", name)
    if not m:
        return {name}
    return {f"{m.group(1)}{int(m.group(2)) + k}" for k in range(width)}


def _data_width(opcode: str) -> int:
    parts = opcode.split(".")
    if "128" in parts or (parts[0] in ("LDSM", "STSM") and parts[-1] == "4"):
        return 4
    wide_ops = ("CS2R", "DADD", "DMUL", "DFMA", "DMNMX")
    if {"64", "WIDE", "U64", "F64"} & set(parts) or parts[0] in wide_ops or (parts[0] in ("LDSM", "STSM") and parts[-1] == "2"):
        return 2
    return 1


GMMA_OPS = frozenset({"HGMMA", "IGMMA", "QGMMA", "BGMMA"})
_GMMA_SHAPE = re.compile(r"64x(\d+)x\d+")


def _gmma_defs_uses(ins: Instr) -> tuple[frozenset[str], frozenset[str]]:
    """A warpgroup MMA's registers: the accumulator D (and C) spans the thread's share of the 64 x N tile (N / 2
    registers in F32 / S32, N / 4 in F16), a register A operand 4 registers (64 x 32 bytes over 128 threads), a
    shared-memory descriptor pair of uniform registers (4 where it describes A and B). Read as one register each, a
    write to the rest could come within cycles of the wgmma that reads it (session 51: 5 of 373 attention candidates
    of the wider move set computed wrong outputs)."""
    parts = ins.opcode.split(".")
    n = next((int(m.group(1)) for p in parts if (m := _GMMA_SHAPE.fullmatch(p))), 256)
    acc_regs = n // 2 if {"F32", "S32"} & set(parts) else n // 4
    ops = _split_operands(ins.operands)
    defs: set[str] = set()
    uses: set[str] = _expand(ins.pred.lstrip("@!"), 1) if ins.pred else set()
    a_in_regs = len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]) is not None
    seen_desc = False
    for pos, op in enumerate(ops):
        if pos == 0:
            defs |= _expand(op, acc_regs)
        elif "desc[" in op:
            m = re.search(r"desc\[(UR\d+)", op)
            if m:
                uses |= _expand(m.group(1), 2 if a_in_regs else 4)
            seen_desc = True
        elif re.fullmatch(r"R\d+", op):
            uses |= _expand(op, acc_regs if seen_desc else 4)  # C after the descriptor, A before it
        elif re.fullmatch(r"!?U?P(\d+|T)", op):
            uses |= _expand(op.lstrip("!"), 1)
    return frozenset(defs), frozenset(uses)


# warp-level MMA (mma.sync: Ampere's tensor-core path, Triton's "mma-sync" form on sm_90): D, A, B, C are register
# groups, each thread's share of an M x N x K tile (HMMA.16816.F32: D 4, A 4, B 2, C 4 registers)
SYNC_MMA_OPS = frozenset({"HMMA", "IMMA", "DMMA"})
_MMA_SHAPE = re.compile(r"(16|8)(8)(\d+)")  # 16816 -> 16 x 8 x 16, 1688 -> 16 x 8 x 8, 884 -> 8 x 8 x 4


def _sync_mma_widths(ins: Instr) -> tuple[int, int, int, int]:
    """Registers a thread holds of D, A, B and C."""
    parts = ins.opcode.split(".")
    shape = next((m for p in parts[1:] if (m := _MMA_SHAPE.fullmatch(p))), None)
    m, n, k = (int(shape.group(1)), int(shape.group(2)), int(shape.group(3))) if shape else (16, 8, 16)
    if ins.base == "DMMA":
        acc, inp = 8, 8
    elif ins.base == "IMMA":
        acc, inp = 4, 0.5 if {"S4", "U4"} & set(parts) else 1
    else:  # HMMA.<shape>.<accumulator>[.<input>]: F32 or F16 accumulators; F16 inputs unless BF16 or TF32 is named
        acc, inp = (4 if "F32" in parts[2:3] else 2), (4 if "TF32" in parts else 2)
    regs = lambda elems, size: max(1, int(elems * size) // (32 * 4))  # noqa: E731  (32 threads, 4-byte registers)
    return regs(m * n, acc), regs(m * k, inp), regs(k * n, inp), regs(m * n, acc)


def _sync_mma_defs_uses(ins: Instr) -> tuple[frozenset[str], frozenset[str]]:
    """A warp MMA's register groups. Read as one register each, a load writing the rest of a group could move across
    the MMA that reads it (session 62: 138 of 3,000 SIP candidates of the mma-sync GEMM computed wrong outputs)."""
    widths = _sync_mma_widths(ins)
    ops = _split_operands(ins.operands)
    defs: set[str] = set()
    uses: set[str] = _expand(ins.pred.lstrip("@!"), 1) if ins.pred else set()
    for pos, op in enumerate(ops):
        name = op.split(".")[0].lstrip("-|")
        if pos < 4 and re.fullmatch(r"R\d+|RZ", name):
            (defs if pos == 0 else uses).update(_expand(name, widths[pos]))
        elif re.fullmatch(r"!?U?P(\d+|T)", op):
            uses |= _expand(op.lstrip("!"), 1)
    return frozenset(defs), frozenset(uses)


def defs_uses(ins: Instr) -> tuple[frozenset[str], frozenset[str]]:
    """Registers (R, UR, P, UP) an instruction writes and reads: a superset where the text is ambiguous."""
    if ins.base in GMMA_OPS:
        return _gmma_defs_uses(ins)
    if ins.base in SYNC_MMA_OPS:
        return _sync_mma_defs_uses(ins)
    defs: set[str] = set()
    uses: set[str] = set()
    if ins.pred:
        uses |= _expand(ins.pred.lstrip("@!"), 1)
    ops = _split_operands(ins.operands)
    width = _data_width(ins.opcode)
    wide_src = "WIDE" in ins.opcode.split(".")
    leading = ins.base not in NO_DEST
    carry = False  # right after a register destination: bare predicates are carry-outs (IADD3 R6, P1, ...)
    for pos, op in enumerate(ops):
        if carry and (_BARE_PRED.fullmatch(op) or op == "PR"):
            # `IADD3 R6, P1, R88, R109, RZ` and `LEA R109, P2, R92, R109, 0x1` write P1 / P2 (carry out). Read
            # as uses, an LDGSTS whose zero-fill predicate is P1 could swap below the IADD3 and copy or zero-fill
            # by the carry bit (the GEMM failures on the H200). Kept as uses too (P2R R16, PR reads PR).
            defs |= _expand(op, 1)
            uses |= _expand(op, 1)
            continue
        carry = False
        in_mem = "[" in op
        for m in _REG.finditer(op):
            name, suffix = m.group(1), m.group(2)
            inside = in_mem and op.find("[") < m.start()
            if inside:  # address registers: R2.64 / desc[UR4] (a 64-bit descriptor pair)
                w = 2 if (".64" in suffix or op[max(0, m.start() - 5) : m.start()] == "desc[") else 1
                uses |= _expand(name, w)
                continue
            is_pred = name.startswith(("P", "UP")) or name == "PR"
            if leading and (pos == 0 or is_pred):
                w = width if not is_pred else 1
                defs |= _expand(name, w)
                if not is_pred and pos == 0 and ins.base not in ("ISETP", "FSETP", "DSETP", "HSETP2", "PLOP3", "UISETP"):
                    leading = False
                    carry = not in_mem
                continue
            if pos > 0 and leading and not is_pred:
                # first register after predicate destinations (e.g. SHFL PT, R5, ...): treat as written too
                defs |= _expand(name, width)
                uses |= _expand(name, width)
                leading = False
                continue
            leading = False
            # a store's data operand spans its width (STSM.16.M88.4 stores four registers)
            w = width if (ins.base in ("STG", "STS", "ST", "STL", "STSM") or "64" in suffix or ".64" in ins.opcode) else 1
            if wide_src and pos == len(ops) - 1:
                w = 2
            uses |= _expand(name, max(w, 1))
    return frozenset(defs), frozenset(uses)


@dataclass
class Node:
    ins: Instr
    ctrl: Control
    defs: frozenset[str]
    uses: frozenset[str]
    block: int

    @property
    def base(self) -> str:
        return self.ins.base

    @property
    def fixed_latency(self) -> bool:
        # a memory instruction with no write scoreboard is a store (no result) or a uniform constant load (ULDC, fixed)
        return self.ctrl.wbar == NO_BARRIER and self.base not in VARIABLE_LATENCY

    @property
    def late_reader(self) -> bool:
        """Reads its sources after issue with no read scoreboard to say when (memory or variable latency): a later
        writer of those sources relies on distance, or on a wait for its write scoreboard."""
        return self.ctrl.rbar == NO_BARRIER and (self.base in MEMORY_OPS or not self.fixed_latency)


@dataclass(frozen=True)
class Move:
    index: int  # current position of the memory instruction
    direction: int  # -1 = one slot up, +1 = one slot down

    @property
    def pair(self) -> tuple[int, int]:
        return (self.index - 1, self.index) if self.direction < 0 else (self.index, self.index + 1)


@dataclass
class Schedule:
    """A permutation of one kernel's instructions plus any control-code patches."""

    nodes: list[Node]
    movable: frozenset[str] = DEFAULT_MOVABLE
    pinned: frozenset[int] = frozenset()  # original offsets that must not move
    clear_reuse: bool = True
    applied: list[Move] = field(default_factory=list)
    bar_settle: bool = True  # the barrier-settle rule (off only to re-test the moves it refuses, sass_move_bisect.py)

    @classmethod
    def build(cls, instrs: list[Instr], movable: frozenset[str] = DEFAULT_MOVABLE, pinned: frozenset[int] = frozenset()) -> Schedule:
        targets = set()
        for i in instrs:
            if i.control_flow:
                for m in re.finditer(r"0x([0-9a-f]+)", i.operands):
                    targets.add(int(m.group(1), 16))
        nodes, block = [], 0
        for k, i in enumerate(instrs):
            if k > 0 and (i.offset in targets or instrs[k - 1].control_flow):
                block += 1
            d, u = defs_uses(i)
            nodes.append(Node(i, i.ctrl, d, u, block))
        return cls(nodes, movable, frozenset(pinned))

    def copy(self) -> Schedule:
        return Schedule(list(self.nodes), self.movable, self.pinned, self.clear_reuse, list(self.applied), self.bar_settle)

    @property
    def order(self) -> list[int]:
        """Original index of the instruction now at each position."""
        return [n.ins.index for n in self.nodes]

    def has_count_depbar(self) -> bool:
        return any(n.base == "DEPBAR" for n in self.nodes)

    def is_movable(self, pos: int) -> bool:
        n = self.nodes[pos]
        return n.base in self.movable and n.ins.offset not in self.pinned and not n.ins.control_flow and not _never_runs(n)

    def candidate_moves(self) -> list[Move]:
        return [Move(p, d) for p in range(len(self.nodes)) if self.is_movable(p) for d in (-1, 1)]

    def legal_moves(self) -> list[Move]:
        return [m for m in self.candidate_moves() if self.why_illegal(m) is None]

    # ---- legality -----------------------------------------------------------------------------------
    def why_illegal(self, move: Move) -> str | None:
        """None when the move is safe, otherwise a reason a person can read."""
        i, j = move.pair
        if i < 0 or j >= len(self.nodes):
            return "moves past the start or end of the kernel"
        if not self.is_movable(move.index):
            if _never_runs(self.nodes[move.index]):
                return f"{self.nodes[move.index].ins.text()} never executes (ptxas padding of unknown purpose)"
            return f"{self.nodes[move.index].ins.opcode} is not in the move set"
        a, b = self.nodes[i], self.nodes[j]
        if a.block != b.block:
            return "crosses a basic-block boundary"
        for n in (a, b):
            if n.ins.control_flow or n.base in FENCES or n.ins.opcode.split(".")[0] in FENCES:
                return f"{n.ins.opcode} is a branch, barrier or fence"
            if n.ins.offset in self.pinned:
                return f"instruction at {n.ins.offset:#x} is referenced by an .nv.info table of unknown meaning"
            if _never_runs(n):
                # `@!PT LDS RZ, [RZ]`: ptxas pads each LDGSTS burst after a BAR.SYNC with three of these. They never
                # execute, so moving them gains nothing (swapping two is a no-op); their role is undocumented: keep them.
                return f"{n.ins.text()} never executes (ptxas padding of unknown purpose)"
        if a.defs & b.uses:
            return f"data dependency (RAW on {sorted(a.defs & b.uses)})"
        if a.uses & b.defs:
            return f"data dependency (WAR on {sorted(a.uses & b.defs)})"
        if a.defs & b.defs:
            return f"data dependency (WAW on {sorted(a.defs & b.defs)})"
        # memory dependencies are not register dependencies: a store and any other access of the same space keep
        # their order unless the spaces differ (shared vs global) or both only read. Checked for every memory
        # instruction, movable or not (an LDG must not pass a pinned STG).
        if a.base in MEMORY_OPS and b.base in MEMORY_OPS and not _memory_commutes(a.base, b.base):
            return f"{a.ins.opcode} and {b.ins.opcode} may touch the same memory"
        if any(b.ctrl.waits_on(s) for s in a.ctrl.sets()):
            return "the second instruction waits on a scoreboard the first one sets"
        if a.base in VARIABLE_LATENCY and b.base in VARIABLE_LATENCY and NO_BARRIER in (a.ctrl.wbar, b.ctrl.wbar):
            return f"{a.ins.opcode} and {b.ins.opcode} complete in order, and one relies on the other's scoreboard"
        # loads complete in order too: ptxas gives some no write scoreboard and lets a later load's cover them (the
        # mma-sync GEMM's LDSM R96 waits on the next LDSM's; session 62: moved past it, its HMMA read a stale R96)
        if _loads_registers(a) and _loads_registers(b) and NO_BARRIER in (a.ctrl.wbar, b.ctrl.wbar):
            return f"{a.ins.opcode} and {b.ins.opcode} complete in order, and one relies on the other's scoreboard"
        if a.ctrl.sets() & b.ctrl.sets() and self.has_count_depbar():
            return "both set the same scoreboard and the kernel counts it with DEPBAR"
        if a.base in MEMORY_OPS and a.ctrl.rbar == NO_BARRIER and _reads_registers(a) and b.ctrl.rbar != NO_BARRIER:
            # memory instructions read their sources in issue order; ptxas lets a load/store without a read
            # scoreboard rely on a later one's (wait on it, then overwrite both's sources). Passing it breaks that.
            return "a memory instruction without a read scoreboard would pass one that sets one (in-order operand reads)"
        # new order: b at i (moved up), a at i+1 (moved down)
        new = list(self.nodes)
        new[i], new[j] = b, a
        # setters now closer to a waiter that depends on them: the one before the pair (b came closer) and a (moved
        # down). b now precedes a, but a never depended on b, so a waiting on b's scoreboard early is harmless.
        for k, before in ((i - 1, i - 1), (j, i)):
            if k >= 0 and _set_to_wait_cycles(new, k) < min(MIN_SET_TO_WAIT, _set_to_wait_cycles(self.nodes, before)):
                return f"scoreboard hazard: {new[k].ins.opcode} sets a scoreboard waited on fewer than {MIN_SET_TO_WAIT} cycles later"
        if self.bar_settle and b.base in MEMORY_OPS and b.base not in ("LDC", "ULDC"):
            after = _cycles_after_barrier(new, i)
            if after < min(_cycles_after_barrier(self.nodes, j), BAR_SETTLE_CYCLES):
                return f"{b.ins.opcode} would issue {after} cycles after a barrier (BAR.SYNC blocks late; ptxas keeps memory further)"
        if not _hazard_free_up(new, i, HAZARD_CYCLES):
            return "fixed-latency hazard: the instruction moving up would read/write a result too early, or overwrite a late read"
        if not _hazard_free_down(new, j, HAZARD_CYCLES):
            return "fixed-latency hazard: a later instruction would come too close to the one moving down"
        return None

    def apply(self, move: Move) -> Schedule:
        """Return a new schedule with the move applied; raises ValueError for an illegal move."""
        why = self.why_illegal(move)
        if why is not None:
            raise ValueError(f"illegal move of {self.nodes[move.index].ins.text()} {'up' if move.direction < 0 else 'down'}: {why}")
        s = self.copy()
        i, j = move.pair
        a, b = s.nodes[i], s.nodes[j]
        # b now issues before a: it must still honour the waits a performed for it
        b_ctrl = b.ctrl.with_(wait=b.ctrl.wait | a.ctrl.wait)
        a_ctrl = a.ctrl
        if self.clear_reuse:  # reuse-cache hints refer to the next instruction, which changed
            b_ctrl, a_ctrl = b_ctrl.with_(reuse=0), a_ctrl.with_(reuse=0)
            if i > 0:
                p = s.nodes[i - 1]
                s.nodes[i - 1] = Node(p.ins, p.ctrl.with_(reuse=0), p.defs, p.uses, p.block)
        s.nodes[i] = Node(b.ins, b_ctrl, b.defs, b.uses, b.block)
        s.nodes[j] = Node(a.ins, a_ctrl, a.defs, a.uses, a.block)
        s.applied.append(move)
        return s

    def words(self) -> list[bytes]:
        from .control import encode

        return [encode(n.ins.word, n.ctrl) for n in self.nodes]


def _never_runs(n: Node) -> bool:
    return n.ins.pred == "@!PT"


def _reads_registers(n: Node) -> bool:
    return any(r.startswith(("R", "UR")) for r in n.uses)


def _set_to_wait_cycles(seq: list[Node], pos: int) -> int:
    """Cycles from the instruction at `pos` to the first later one that waits on a scoreboard it sets (large if none)."""
    sets = seq[pos].ctrl.sets()
    if not sets:
        return 1 << 30
    cycles = seq[pos].ctrl.stall
    for k in range(pos + 1, min(pos + 16, len(seq))):
        if any(seq[k].ctrl.waits_on(s) for s in sets):
            return cycles
        if seq[k].ins.control_flow or cycles >= MIN_SET_TO_WAIT:
            break
        cycles += seq[k].ctrl.stall
    return 1 << 30


def _cycles_after_barrier(seq: list[Node], pos: int) -> int:
    """Issue cycles from the nearest blocking barrier before `pos` in its block to the instruction at `pos` (large if
    none within BAR_SETTLE_CYCLES)."""
    cycles = 0
    for k in range(pos - 1, -1, -1):
        p = seq[k]
        if p.block != seq[pos].block or p.ins.control_flow:
            break
        cycles += p.ctrl.stall
        if p.base in BLOCKING_BARRIERS:
            return cycles
        if cycles >= BAR_SETTLE_CYCLES:
            break
    return 1 << 30


def _memory_commutes(x: str, y: str) -> bool:
    if x in LOADS and y in LOADS:
        return True
    if x in ("LDC", "ULDC") or y in ("LDC", "ULDC"):  # the constant bank is read-only: no store reaches it
        return True
    if x == y == "LDGSTS":  # async copies of one group complete in no defined order anyway
        return True
    return (x in SHARED_ONLY and y in GLOBAL_ONLY) or (x in GLOBAL_ONLY and y in SHARED_ONLY)


def _latency(n: Node, window: int) -> int:
    """Cycles a fixed-latency result needs before a reader: ``window`` for the ALUs, longer for warp MMAs."""
    return LONG_LATENCY.get(n.base, window)


def _guard(n: Node) -> str:
    """The predicate that guards `n` ("P3" for `@!P3 ...`), "" when none or PT."""
    g = n.ins.pred.lstrip("@!")
    return "" if g in ("", "PT", "UPT") else g


def _early_predicates(n: Node) -> frozenset[str]:
    """Predicates `n` reads early, as a guard is read: its guard, and a memory instruction's predicate operands (an
    LDGSTS's zero-fill predicate: ptxas keeps it 13 cycles from its ISETP too, 65 pairs in the example kernels)."""
    preds = {_guard(n)} - {""}
    if n.base in MEMORY_OPS:
        preds |= {r for r in n.uses if r in PREDICATES}
    return frozenset(preds)


def _needed(producer: Node, reader: Node, window: int) -> int:
    """Cycles `reader` must issue after the fixed-latency `producer` whose result it reads or overwrites."""
    latency = _latency(producer, window)
    return max(latency, GUARD_CYCLES) if producer.defs & _early_predicates(reader) else latency


def _hazard_free_up(seq: list[Node], pos: int, window: int) -> bool:
    """The instruction now at `pos` issues earlier than before: check fixed-latency producers before it."""
    me = seq[pos]
    regs = me.uses | me.defs
    cycles = 0
    reach = max(window, LONG_WINDOW)
    for k in range(pos - 1, -1, -1):
        p = seq[k]
        cycles += p.ctrl.stall
        if cycles >= reach:
            return True
        if p.fixed_latency and p.defs & regs and cycles < _needed(p, me, window):
            return False
        # an earlier late reader of a register this one writes (the writer came closer; the reader moving down is
        # checked in _hazard_free_down), unless a wait for its write scoreboard lies between (it has completed)
        if cycles < window and p.late_reader and _data_uses(p) & me.defs and not _waited_on(seq, k, pos):
            return False
        if p.ins.control_flow or (k > 0 and seq[k].block != seq[k - 1].block and k != 0 and _is_branch_target(seq, k)):
            # other predecessors are unknown: past the ALU window only a warp MMA's result can still be in flight
            return not regs if cycles < (GUARD_CYCLES if _early_predicates(me) else window) else not (regs & _long_latency_defs(seq))
    return True


def _long_latency_defs(seq: list[Node]) -> frozenset[str]:
    return frozenset().union(*(n.defs for n in seq if n.base in LONG_LATENCY))


def _loads_registers(n: Node) -> bool:
    """A memory instruction that writes registers (a load, not a uniform constant load: those are fixed-latency)."""
    return n.base in MEMORY_OPS and n.base not in ("ULDC", "LDC") and any(r.startswith("R") for r in n.defs)


def _data_uses(n: Node) -> frozenset[str]:
    """The registers an instruction reads, less predicates (read at issue)."""
    return frozenset(r for r in n.uses if not r.startswith(("P", "UP")))


def _waited_on(seq: list[Node], k: int, pos: int) -> bool:
    """Some instruction in (k, pos] waits on the write scoreboard of the one at k."""
    w = seq[k].ctrl.wbar
    return w != NO_BARRIER and any(seq[m].ctrl.waits_on(w) for m in range(k + 1, pos + 1))


def _hazard_free_down(seq: list[Node], pos: int, window: int) -> bool:
    """The instruction now at `pos` issues later than before: later readers/writers of its registers come closer."""
    me = seq[pos]
    cycles = me.ctrl.stall
    # predicates (guards, LDGSTS zero-fill operands) are read at issue: ptxas overwrites them 1 cycle later
    data = _data_uses(me)
    reach = max(_latency(me, window), GUARD_CYCLES) if me.fixed_latency else window
    for k in range(pos + 1, len(seq)):
        c = seq[k]
        if cycles >= reach:
            return True
        if me.fixed_latency and me.defs & (c.uses | c.defs) and cycles < _needed(me, c, window):
            return False
        if cycles < window and me.ctrl.rbar == NO_BARRIER and data & c.defs:
            return False
        if c.ins.control_flow:
            return not (me.defs or me.uses)
        cycles += c.ctrl.stall
    return True


def _is_branch_target(seq: list[Node], k: int) -> bool:
    return not seq[k - 1].ins.control_flow
