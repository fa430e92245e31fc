"""Memory-ordering and hazard rules of the SASS move model, on snippets and on the real sm_90 GEMM + LeakyReLU cubin."""

from __future__ import annotations

import random

import pytest

from kfuse.sass import examples, schedule
from kfuse.sass.control import NO_BARRIER, Control, encode
from kfuse.sass.cubin import load_cubin
from kfuse.sass.disasm import Instr, disassemble
from kfuse.sass.schedule import Move, Schedule, defs_uses

SHARED = {"LDS", "STS", "LDSM", "STSM"}
GLOBAL = {"LDG", "STG"}
STORES = {"STS", "STG", "STSM", "ST", "STL", "LDGSTS", "ATOM", "ATOMS", "ATOMG", "RED"}
SYNC = {"BAR", "SYNCS", "MEMBAR", "FENCE", "DEPBAR", "LDGDEPBAR", "ARRIVES", "WARPSYNC", "ERRBAR", "CCTL", "WARPGROUP", "BSSY", "BSYNC"}


def _space(base: str) -> set[str]:
    """Address spaces an instruction may touch ("all" for generic LD/ST)."""
    if base in SHARED:
        return {"shared"}
    if base in GLOBAL:
        return {"global"}
    if base == "LDGSTS":
        return {"global", "shared"}
    if base in ("LD", "ST", "ATOM", "RED"):
        return {"global", "shared", "local"}
    if base in ("LDL", "STL"):
        return {"local"}
    return set()


def _ins(text: str, index: int = 0, stall: int = 1, wbar: int = NO_BARRIER, rbar: int = NO_BARRIER, wait: int = 0) -> Instr:
    pred = ""
    if text.startswith("@"):
        pred, text = text.split(" ", 1)
    op, _, rest = text.partition(" ")
    word = encode(bytes(16), Control(stall=stall, yield_bit=0, wbar=wbar, rbar=rbar, wait=wait, reuse=0))
    return Instr(index, 16 * index, pred, op, rest.replace(" ", ""), word, op in ("BRA", "EXIT"))


def _seq(*texts: str | tuple) -> Schedule:
    out = []
    for k, t in enumerate(texts):
        text, kw = (t, {}) if isinstance(t, str) else (t[0], t[1])
        out.append(_ins(text, k, **kw))
    return Schedule.build(out)


@pytest.fixture(scope="module")
def gemm():
    ck = examples.compile_matmul_leaky_relu(128, 128, 64, 8, num_warps=8, num_stages=3)
    return disassemble(load_cubin(ck.asm["cubin"]), ck.name)


# ---- snippets -----------------------------------------------------------------------------------------


def test_carry_out_predicates_are_written():
    d, u = defs_uses(_ins("IADD3 R6, P1, R88, R109, RZ"))
    assert {"R6", "P1"} <= d
    d, u = defs_uses(_ins("LEA R109, P2, R92, R109, 0x1"))
    assert {"R109", "P2"} <= d
    d, u = defs_uses(_ins("IADD3 R10, P0, P1, R9, R10, R24"))
    assert {"R10", "P0", "P1"} <= d
    d, u = defs_uses(_ins("UIADD3 UR8, UP0, UR8, 0x2, URZ"))
    assert {"UR8", "UP0"} <= d
    d, u = defs_uses(_ins("IMAD.X R9, R113, 0x1, R102, P4"))  # carry in: read only
    assert "P4" in u and "P4" not in d


def test_ldgsts_zero_fill_predicate_not_clobbered_by_a_carry_out():
    # the GEMM's loop: the async copy's zero-fill predicate P1 is overwritten by the next IADD3's carry
    s = _seq("LDGSTS.E.BYPASS.128 [R121+0xc000], desc[UR14][R12.64], P1", "IADD3 R6, P1, R88, R109, RZ", "NOP")
    assert "WAR" in s.why_illegal(Move(0, 1))


def test_store_keeps_order_with_same_space_accesses():
    load = {"wbar": 2}
    s = _seq(
        "STS [R2], R4",
        ("LDSM.16.M88.4 R24, [R3]", load),
        ("LDSM.16.M88.4 R20, [R5]", load),
        "STS [R7], R9",
        ("LDG.E R10, desc[UR4][R12.64]", load),
        "STG.E desc[UR4][R14.64], R16",
    )
    assert "same memory" in s.why_illegal(Move(0, 1))  # STS / LDSM
    assert "same memory" in s.why_illegal(Move(3, -1))  # LDSM / STS
    assert s.why_illegal(Move(1, 1)) is None  # two shared loads
    assert s.why_illegal(Move(4, -1)) is None  # shared store vs global load: different spaces
    assert "same memory" in s.why_illegal(Move(4, 1))  # LDG / STG may alias
    # a non-movable store is still a store: an LDG may not pass it
    t = Schedule.build([_ins("LDG.E R10, desc[UR4][R12.64]", 0), _ins("STG.E desc[UR4][R14.64], R16", 1)], movable=frozenset({"LDG"}))
    assert "same memory" in t.why_illegal(Move(0, 1))
    g = _seq("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R24.64], P6", "LDSM.16.M88.4 R28, [R7]", "STG.E desc[UR4][R14.64], R16")
    assert "same memory" in g.why_illegal(Move(0, 1))  # async copy writes shared
    assert g.why_illegal(Move(1, 1)) is None  # LDS / STG: different spaces


@pytest.mark.parametrize(
    "sync",
    [
        "BAR.SYNC.DEFER_BLOCKING 0x0",
        "BAR.ARV 0x1, 0x100",
        "SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4], RZ",
        "MEMBAR.ALL.CTA",
        "FENCE.VIEW.ASYNC.S",
        "DEPBAR.LE SB0, 0x2",
        "LDGDEPBAR",
        "ARRIVES.LDGSTSBAR.64 [UR4]",
        "WARPSYNC 0xffffffff",
        "ERRBAR",
        "CCTL.IVALL",
        "UCGABAR_WAIT",
    ],
)
def test_no_memory_op_crosses_a_barrier(sync):
    s = _seq("STS [R2], R4", sync, "LDG.E R10, desc[UR4][R12.64]")
    assert "barrier or fence" in s.why_illegal(Move(0, 1))
    assert "barrier or fence" in s.why_illegal(Move(2, -1))


def test_never_executed_padding_stays():
    s = _seq("IADD3 R1, R2, 0x1, RZ", "@!PT LDS RZ, [RZ]", "@!PT LDS RZ, [RZ]", "LDG.E R10, desc[UR4][R12.64]")
    assert not s.is_movable(1) and not s.is_movable(2)
    assert "never executes" in s.why_illegal(Move(1, -1))
    assert "never executes" in s.why_illegal(Move(3, -1))  # nothing moves across it either


def test_memory_access_keeps_its_distance_from_a_barrier():
    # BAR.SYNC.DEFER_BLOCKING blocks a few cycles late: an STS moved to 3 cycles after it could overwrite a buffer
    # other warps still read (session 60's 128 x 64 GEMM epilogue); ptxas keeps memory >= 6 cycles after one, so no
    # move brings a memory access closer to a barrier within BAR_SETTLE_CYCLES
    s = _seq(
        ("BAR.SYNC.DEFER_BLOCKING 0x0", {"stall": 3}),
        ("IMAD.WIDE R22, R0, 0x2, R22", {"stall": 3}),
        ("LDG.E R10, desc[UR4][R12.64]", {"stall": 4}),
        ("IADD3 R30, R31, 0x1, RZ", {"stall": 2}),
        ("LDG.E R11, desc[UR4][R14.64]", {"stall": 4}),
        ("IADD3 R32, R31, 0x1, RZ", {"stall": 1}),
        ("LDG.E R16, desc[UR4][R18.64]", {"stall": 1}),
    )
    assert "3 cycles after a barrier" in s.why_illegal(Move(2, -1))
    assert s.why_illegal(Move(2, 1)) is None  # further from it is fine
    assert "10 cycles after a barrier" in s.why_illegal(Move(4, -1))  # 12 -> 10: still inside the window
    assert s.why_illegal(Move(6, -1)) is None  # 14 -> 13: past the window
    s.bar_settle = False  # the switch the bisect uses to re-test the refused moves
    assert s.why_illegal(Move(2, -1)) is None


def test_operand_reads_in_issue_order():
    # the LDSM without a read scoreboard relies on the later one's (waited by the overwrite of R8)
    s = _seq(
        ("LDSM.16.M88.4 R4, [R8+0x800]", {"wbar": 3, "stall": 4}),
        ("LDSM.16.M88.4 R20, [R8+0xc00]", {"wbar": 5, "rbar": 4, "stall": 2}),
        ("NOP", {"stall": 13}),
        ("IMAD.SHL.U32 R8, R13, 0x2, RZ", {"wait": 1 << 4}),
    )
    assert "in-order operand reads" in s.why_illegal(Move(0, 1))


def test_scoreboard_set_too_close_to_its_waiter():
    # the STS sets read scoreboard 1 with stall 1; moving it below the NOP puts its waiter 1 cycle behind
    s = _seq(
        ("STS [R21+0x100], R24", {"rbar": 1, "stall": 1}),
        ("IADD3 R30, R31, 0x1, RZ", {"stall": 1}),
        ("IMAD R26, R15, R3, RZ", {"wait": 1 << 1}),
        ("NOP", {"stall": 1}),
    )
    assert "scoreboard hazard" in s.why_illegal(Move(0, 1))


# ---- the real GEMM + LeakyReLU kernel ------------------------------------------------------------------


def _violations(s: Schedule, moves: list[Move]) -> list[str]:
    bad = []
    for m in moves:
        i, j = m.pair
        a, b = s.nodes[i], s.nodes[j]
        for n in (a, b):
            if n.base in SYNC:
                bad.append(f"crosses {n.ins.text()}")
        # two async copies of one commit group (no LDGDEPBAR between them, that is a fence) complete in no defined
        # order anyway, so swapping their issue order is the one store/store exchange allowed
        both_async = a.base == b.base == "LDGSTS"
        if (a.base in STORES or b.base in STORES) and _space(a.base) & _space(b.base) and not both_async:
            bad.append(f"reorders {a.ins.text()} / {b.ins.text()}")
        # predicate defs/uses written out by hand (carry-outs included): predicates are the easy ones to miss
        pa, pb = _preds(a.ins), _preds(b.ins)
        if pa[0] & pb[1] or pa[1] & pb[0] or pa[0] & pb[0]:
            bad.append(f"predicate dependency {a.ins.text()} / {b.ins.text()}")
    return bad


def _preds(ins: Instr) -> tuple[set[str], set[str]]:
    ops = [o.strip() for o in ins.operands.split(",")]
    uses = {ins.pred.lstrip("@!")} if ins.pred else set()
    defs: set[str] = set()
    for k, o in enumerate(ops):
        name = o.lstrip("!").split("[")[0]
        if not (name.startswith("P") or name.startswith("UP")) or name in ("PT", "UPT"):
            continue
        # destinations: leading predicates of compare-like ops, or predicates right after a register destination
        if all(p.startswith(("P", "UP")) for p in ops[:k]) or (
            ops[0].startswith(("R", "UR")) and all(p.startswith(("P", "UP")) for p in ops[1:k])
        ):
            if not o.startswith("!") and ins.base not in schedule.NO_DEST:
                defs.add(name)
                continue
        uses.add(name)
    return defs - {"PT", "UPT"}, uses - {"PT", "UPT"}


def _walk_moves(ins: list[Instr], seeds: int = 6, steps: int = 85):
    s0 = Schedule.build(ins)
    yield s0, s0.legal_moves()
    for seed in range(seeds):
        rng, s = random.Random(seed), s0
        for _ in range(steps):
            moves = s.legal_moves()
            yield s, moves
            if not moves:  # a dead end: not every legal move can be undone
                break
            s = s.apply(rng.choice(moves))


def test_gemm_moves_keep_memory_order_and_barriers(gemm):
    bad = [v for s, moves in _walk_moves(gemm) for v in _violations(s, moves)]
    assert not bad, bad[:5]


def test_gemm_checker_catches_a_permissive_model(gemm, monkeypatch):
    # the test above must be able to fail: with memory order and fences switched off it finds violations
    monkeypatch.setattr(schedule, "_memory_commutes", lambda x, y: True)
    monkeypatch.setattr(schedule, "FENCES", frozenset({"BRA", "EXIT"}))
    monkeypatch.setattr(schedule, "BAR_SETTLE_CYCLES", 0)
    bad = [v for s, moves in _walk_moves(gemm, seeds=2, steps=40) for v in _violations(s, moves)]
    assert any("reorders" in v for v in bad) and any("crosses" in v for v in bad)


def test_gemm_ldgsts_predicate_war_refused(gemm):
    s = Schedule.build(gemm)
    # the pairs that made candidates wrong on the H200 (suspected): LDGSTS reading Pn, next instruction writing Pn as a carry
    pairs = [k for k in range(len(gemm) - 1) if gemm[k].base == "LDGSTS" and _preds(gemm[k])[1] & _preds(gemm[k + 1])[0]]
    assert pairs, "expected an LDGSTS followed by a carry-out of its zero-fill predicate"
    for k in pairs:
        assert "WAR" in s.why_illegal(Move(k, 1)), gemm[k + 1].text()
    assert len(s.legal_moves()) >= 20  # the model still leaves moves to search


def test_gemm_128x64_epilogue_store_keeps_clear_of_its_barrier():
    # the kernel of session 59's 955 wrong SIP candidates: its one STS 6 cycles after a BAR.SYNC may not come closer
    ck = examples.compile_matmul_leaky_relu(128, 64, 64, 8, num_warps=4, num_stages=4)
    s = Schedule.build(disassemble(load_cubin(ck.asm["cubin"]), ck.name))
    settle, after = schedule.BAR_SETTLE_CYCLES, schedule._cycles_after_barrier
    near = [k for k, n in enumerate(s.nodes) if n.base in ("STS", "LDS", "LDSM", "STG", "LDG", "LDGSTS") and after(s.nodes, k) < settle]
    assert near, "expected a memory access within BAR_SETTLE_CYCLES of a barrier"
    reasons = [s.why_illegal(Move(k, -1)) for k in near if s.is_movable(k)]
    assert all(reasons), "a memory access near a barrier may move up"
    assert any("after a barrier" in r for r in reasons)  # the STS the old model let move (the others: other rules)
    for m in s.legal_moves():  # no legal move brings any access closer
        t = s.apply(m)
        i = m.pair[0]
        assert t.nodes[i].base not in schedule.MEMORY_OPS or after(t.nodes, i) >= min(after(s.nodes, i + 1), settle)
