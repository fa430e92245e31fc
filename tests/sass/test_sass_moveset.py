"""The wider move set (``MOVE_SETS["all"]``: memory instructions and register arithmetic) on the real sm_90 GEMM +
LeakyReLU and attention cubins: many more legal moves than SIP's memory-only set, and random walks of them keep
three invariants checked here from the original schedule, not from the model's own verdicts: no two dependent
instructions change order, no fixed-latency result reaches a reader sooner than before (unless >= HAZARD_CYCLES
later, or GUARD_CYCLES for a guard predicate), and every reader of a variable-latency result still waits on its
scoreboard."""

from __future__ import annotations

import random

import pytest

from kfuse.sass import examples, schedule
from kfuse.sass.control import NO_BARRIER
from kfuse.sass.cubin import load_cubin
from kfuse.sass.disasm import disassemble
from kfuse.sass.emit import emit
from kfuse.sass.schedule import GUARD_CYCLES, HAZARD_CYCLES, MOVE_SETS, Schedule, move_set
from kfuse.sass.search import random_walk


@pytest.fixture(scope="module")
def kernels() -> dict[str, tuple]:
    out = {}
    for form, suffix in (("wgmma", ""), ("mma-sync", "_mma_sync")):
        with examples.mma_form(form):  # the Ampere-style code SIP tuned on the A100 (HMMA fed by LDSM) as the second form
            cks = (("gemm", examples.compile_matmul_leaky_relu()), ("attention", examples.compile_attention()))
        for name, ck in cks:
            cub = load_cubin(ck.asm["cubin"])
            out[name + suffix] = (cub, ck.name, disassemble(cub, ck.name), frozenset(cub.kernel(ck.name).pinned_offsets()))
    return out


ALL_KERNELS = ["gemm", "attention", "gemm_mma_sync", "attention_mma_sync"]


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_the_two_tensor_core_forms(kernels, name) -> None:
    import os

    ops = lambda key: {x.base for x in kernels[key][2]}  # noqa: E731
    assert "HGMMA" in ops(name) and "HMMA" not in ops(name)
    assert "HMMA" in ops(name + "_mma_sync") and "HGMMA" not in ops(name + "_mma_sync") and "LDSM" in ops(name + "_mma_sync")
    assert "DISABLE_MMA_V3" not in os.environ  # mma_form leaves the environment as it found it
    with pytest.raises(ValueError, match="unknown tensor-core form"), examples.mma_form("mma-v4"):
        pass


def test_move_sets_are_named() -> None:
    assert move_set("memory") == schedule.DEFAULT_MOVABLE and move_set("all") > move_set("memory")
    assert not (MOVE_SETS["all"] & schedule.FENCES)  # nothing that orders memory or threads moves
    with pytest.raises(ValueError, match="unknown move set"):
        move_set("everything")


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_the_wider_set_has_many_more_legal_moves(kernels, name) -> None:
    _, _, ins, pinned = kernels[name]
    memory = len(Schedule.build(ins, move_set("memory"), pinned).legal_moves())
    wider = len(Schedule.build(ins, move_set("all"), pinned).legal_moves())
    assert memory > 0 and wider >= 5 * memory  # gemm 34 -> 238, attention 11 -> 369 (session 51)


VARIABLE = {"MUFU", "I2F", "F2I", "F2F", "SHFL", "S2R"}  # written out here, not taken from the model
MMA_CYCLES = 24  # the fewest cycles ptxas leaves between an HMMA.16816 and the first reader of its result (no scoreboard)


def _variable(n: schedule.Node) -> bool:
    return n.base in VARIABLE or n.base in schedule.MEMORY_OPS or n.ctrl.wbar != NO_BARRIER


def _late_reader(n: schedule.Node) -> bool:
    """Reads its sources after issue with no read scoreboard to say when (memory instructions and other
    variable-latency ones): a later writer of those sources relies on distance alone."""
    return n.ctrl.rbar == NO_BARRIER and _variable(n)


def _cover(nodes: list[schedule.Node], x: int, y: int) -> tuple[int, int] | None:
    """(setter, waiter) of the scoreboard that tells the reader at y the variable-latency result of x is there: x's own,
    or, where ptxas gave x none, a later instruction of the same unit's (they complete in order)."""
    setters = [x] if nodes[x].ctrl.wbar != NO_BARRIER else [v for v in range(x + 1, y) if nodes[v].base == nodes[x].base]
    for v in setters:
        w = nodes[v].ctrl.wbar
        if w == NO_BARRIER:
            continue
        for k in range(v + 1, y + 1):
            if nodes[k].ctrl.waits_on(w):
                return v, k
    return None


def _deps(s0: Schedule) -> list[tuple[int, int, str]]:
    """(producer, consumer, kind) index pairs of the original schedule within a basic block: register and predicate
    RAW / WAR / WAW between any two instructions (not only neighbours); "late_war" where the first reads a register
    late (``_late_reader``) and the second writes it with no wait on the first's scoreboard between them."""
    out = []
    nodes = s0.nodes
    for x in range(len(nodes)):
        for y in range(x + 1, len(nodes)):
            if nodes[y].block != nodes[x].block:
                break
            a, b = nodes[x], nodes[y]
            if a.defs & b.uses:
                out.append((x, y, "raw"))
            elif a.uses & b.defs or a.defs & b.defs:
                late = _late_reader(a) and {r for r in a.uses if not r.startswith(("P", "UP"))} & b.defs
                waited = a.ctrl.wbar != NO_BARRIER and any(nodes[k].ctrl.waits_on(a.ctrl.wbar) for k in range(x + 1, y + 1))
                out.append((x, y, "late_war" if late and not waited else "war"))
    return out


def _cycles(s: Schedule, pos: dict[int, int], x: int, y: int) -> int:
    return sum(s.nodes[k].ctrl.stall for k in range(pos[x], pos[y]))


def _guarded_by(n: schedule.Node) -> str:
    g = n.ins.pred.lstrip("@!")
    return "" if g in ("", "PT") else g


MEMORY = {"LDG", "STG", "LDS", "STS", "LDSM", "STSM", "LDGSTS", "LD", "ST", "LDL", "STL"}  # written out, not the model's


def _read_early(n: schedule.Node) -> set[str]:
    """The predicates read as early as a guard: the guard, and a memory instruction's predicate operands."""
    preds = {_guarded_by(n)} - {""}
    if n.base in MEMORY:
        preds |= {r for r in n.uses if r[0] == "P" and r[1:].isdigit()}
    return preds


def _violations(s0: Schedule, deps: list[tuple[int, int, str]], s: Schedule) -> list[str]:
    pos = {idx: p for p, idx in enumerate(s.order)}
    bad = []
    for x, y, kind in deps:
        px, py = pos[x], pos[y]
        a = s0.nodes[x]
        if px > py:
            bad.append(f"order: {a.ins.text()} / {s0.nodes[y].ins.text()}")
            continue
        if kind == "late_war":
            before, after = _cycles(s0, {i: i for i in range(len(s0.nodes))}, x, y), _cycles(s, pos, x, y)
            if after < min(before, HAZARD_CYCLES):
                bad.append(f"late read: {a.ins.text()} -> {s0.nodes[y].ins.text()} {before} -> {after} cycles")
            continue
        if kind != "raw":
            continue
        if not _variable(a):
            before, after = _cycles(s0, {i: i for i in range(len(s0.nodes))}, x, y), _cycles(s, pos, x, y)
            guard = bool(_read_early(s0.nodes[y]) & a.defs)  # a guard is read earlier than an operand (GUARD_CYCLES)
            if after < min(before, MMA_CYCLES if a.base in ("HMMA", "IMMA") else GUARD_CYCLES if guard else HAZARD_CYCLES):
                bad.append(f"latency: {a.ins.text()} -> {s0.nodes[y].ins.text()} {before} -> {after} cycles")
        elif (cover := _cover(s0.nodes, x, y)) is not None:
            v, _ = cover
            w = s0.nodes[v].ctrl.wbar
            if not (px <= pos[v] < py and any(s.nodes[k].ctrl.waits_on(w) for k in range(pos[v] + 1, py + 1))):
                bad.append(f"scoreboard: {a.ins.text()} -> {s0.nodes[y].ins.text()} (covered by {s0.nodes[v].ins.text()})")
    return bad


def _walk(ins, pinned, seed: int, steps: int) -> tuple[Schedule, Schedule]:
    s0 = s = Schedule.build(ins, move_set("all"), pinned)
    rng = random.Random(seed)
    return s0, random_walk(s, steps, rng)


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_random_walks_keep_order_latency_and_scoreboards(kernels, name) -> None:
    _, _, ins, pinned = kernels[name]
    deps = None
    for seed in range(3):
        s0, s = _walk(ins, pinned, seed, 60)
        deps = deps if deps is not None else _deps(s0)
        assert sum(o != k for k, o in enumerate(s.order)) > 0
        assert not (bad := _violations(s0, deps, s)), bad[:5]
        assert any(s.nodes[k].base in schedule.ALU_MOVABLE and s.nodes[k].ins.index != k for k in range(len(s.nodes)))


def test_the_checker_catches_a_model_that_reads_scoreboardless_mufu_as_fixed_latency(kernels, monkeypatch) -> None:
    # the hole session 51's GPU run found (5 of 373 candidates wrong): ptxas leaves some MUFU without a scoreboard and
    # lets the next MUFU's cover it; a model that reads them as fixed-latency lets the two swap, and the walks fail
    _, _, ins, pinned = kernels["attention"]
    monkeypatch.setattr(schedule, "VARIABLE_LATENCY", frozenset())
    bad = []
    for seed in range(3):
        s0, s = _walk(ins, pinned, seed, 60)
        bad += _violations(s0, _deps(s0), s)
    assert any(v.startswith("scoreboard") and "MUFU" in v for v in bad), bad[:3]


def test_the_checker_catches_a_model_without_latency_checks(kernels, monkeypatch) -> None:
    # the test above must be able to fail: with the fixed-latency checks off, walks bring results to readers too soon
    _, _, ins, pinned = kernels["attention"]
    monkeypatch.setattr(schedule, "_hazard_free_up", lambda *a: True)
    monkeypatch.setattr(schedule, "_hazard_free_down", lambda *a: True)
    bad = []
    for seed in range(3):
        s0, s = _walk(ins, pinned, seed, 60)
        bad += _violations(s0, _deps(s0), s)
    assert any(v.startswith("latency") for v in bad)


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_wider_walks_re_emit_the_permuted_words(kernels, name) -> None:
    cub, kname, ins, pinned = kernels[name]
    _, s = _walk(ins, pinned, 11, 40)
    dis = disassemble(emit(cub, kname, s), kname)
    norm = [x.text().replace(".reuse", "") for x in dis]
    assert norm == [ins[k].text().replace(".reuse", "") for k in s.order]
    assert all(d.ctrl.wbar == NO_BARRIER or d.ctrl.wbar == ins[k].ctrl.wbar for d, k in zip(dis, s.order, strict=True))


def test_cli_inspect_takes_the_move_set(kernels, tmp_path) -> None:
    import re

    from typer.testing import CliRunner

    from kfuse.sass.cli import app

    cub, kname, _, _ = kernels["gemm"]
    path = tmp_path / "gemm.cubin"
    path.write_bytes(cub.data)
    runner = CliRunner()
    counts = {}
    for moves in ("memory", "all"):
        r = runner.invoke(app, ["inspect", str(path), "--kernel", kname, "--no-deps", "--moves", moves])
        assert r.exit_code == 0, r.output
        counts[moves] = int(re.search(r"(\d+) legal moves", r.output).group(1))
    assert counts["all"] >= 5 * counts["memory"] > 0
    bad = runner.invoke(app, ["inspect", str(path), "--moves", "everything"])
    assert bad.exit_code != 0 and "unknown move set" in bad.output


def _seq(*rows: tuple[str, dict]) -> Schedule:
    from kfuse.sass.control import Control, encode
    from kfuse.sass.disasm import Instr

    out = []
    for k, (text, kw) in enumerate(rows):
        pred, text = text.partition(" ")[::2] if text.startswith("@") else ("", text)
        op, _, rest = text.partition(" ")
        ctrl = Control(
            stall=kw.get("stall", 1), yield_bit=0, wbar=kw.get("wbar", NO_BARRIER), rbar=NO_BARRIER, wait=kw.get("wait", 0), reuse=0
        )
        out.append(Instr(k, 16 * k, pred, op, rest.replace(" ", ""), encode(bytes(16), ctrl), False))
    return Schedule.build(out, move_set("all"))


def test_a_mufu_without_a_scoreboard_keeps_its_order_with_the_one_that_covers_it() -> None:
    # ptxas's pattern: the first MUFU sets no scoreboard, the consumer waits on the second's (they complete in order)
    s = _seq(("MUFU.EX2 R54, R54", {"stall": 8}), ("MUFU.EX2 R55, R55", {"wbar": 2, "stall": 2}), ("FADD R50, R50, R51", {}),
             ("F2FP.F16.F32.PACK_AB R103, R55, R54", {"wait": 1 << 2}))  # fmt: skip
    assert not s.nodes[0].fixed_latency
    assert "complete in order" in s.why_illegal(schedule.Move(0, 1))
    assert s.why_illegal(schedule.Move(2, -1)) is None  # an unrelated add may still pass the covering MUFU


def test_a_writer_does_not_come_closer_to_an_earlier_late_reader() -> None:
    # LDSM reads its address register late and sets no read scoreboard: ptxas keeps the next write of R8 6 cycles away
    s = _seq(("LDSM.16.M88.4 R4, [R8+0x800]", {"wbar": 1, "stall": 2}), ("FADD R50, R50, R51", {"stall": 4}),
             ("IMAD.SHL.U32 R8, R13, 0x2, RZ", {}))  # fmt: skip
    assert "fixed-latency hazard" in s.why_illegal(schedule.Move(2, -1))


def test_wgmma_operands_span_the_warpgroup_tile(kernels) -> None:
    _, _, ins, _ = kernels["attention"]
    pv = next(i for i in ins if i.base == "HGMMA" and i.operands.split(",")[1].strip().startswith("R"))
    d, u = schedule.defs_uses(pv)
    acc = int(pv.operands.split(",")[0][1:])
    a = int(pv.operands.split(",")[1].strip()[1:])
    assert {f"R{acc + k}" for k in range(32)} == d  # 64 x 64 F32 over 128 threads
    assert {f"R{a + k}" for k in range(4)} <= u and {f"R{acc + k}" for k in range(32)} <= u


def test_warp_mma_and_stsm_registers_span_their_groups() -> None:
    from kfuse.sass.disasm import Instr

    def regs(text: str) -> tuple[set[str], set[str]]:
        op, _, rest = text.partition(" ")
        d, u = schedule.defs_uses(Instr(0, 0, "", op, rest, bytes(16), False))
        return set(d), set(u)

    span = lambda r, n: {f"R{r + k}" for k in range(n)}  # noqa: E731
    # mma.sync m16n8k16: D and C 4 F32 registers a thread, A 4, B 2 (F16 accumulators: 2)
    assert regs("HMMA.16816.F32 R104, R92.reuse, R32, R104") == (span(104, 4), span(92, 4) | span(32, 2) | span(104, 4))
    assert regs("HMMA.16816.F16 R4, R8, R12, R4") == (span(4, 2), span(8, 4) | span(12, 2) | span(4, 2))
    assert regs("HMMA.1688.F32.TF32 R4, R8, R12, R16") == (span(4, 4), span(8, 4) | span(12, 2) | span(16, 4))
    assert regs("STSM.16.M88.4 [R148+0x200], R8") == (set(), {"R148"} | span(8, 4))


def test_a_load_without_a_scoreboard_keeps_its_order_with_the_load_that_covers_it() -> None:
    # the mma-sync GEMM's pattern (session 62): LDSM R96 sets no scoreboard, its HMMA waits on the next LDSM's
    s = _seq(("LDSM.16.MT88.4 R96, [R27+0xa080]", {"stall": 5}), ("LDSM.16.MT88.4 R92, [R26+0xa000]", {"wbar": 4, "stall": 5}),
             ("HMMA.16816.F32 R116, R68, R96, R116", {"wait": 1 << 4}))  # fmt: skip
    assert "complete in order" in s.why_illegal(schedule.Move(0, 1))
    both = _seq(("LDSM.16.M88.4 R8, [R30]", {"wbar": 1, "stall": 4}), ("LDSM.16.M88.4 R4, [R30+0x100]", {"wbar": 2, "stall": 4}))
    assert both.why_illegal(schedule.Move(0, 1)) is None  # each has its own scoreboard: free to swap


def test_a_warp_mma_result_is_not_read_sooner_than_its_latency() -> None:
    # HMMA has no scoreboard; ptxas leaves 24+ cycles before the first reader of its accumulators
    rows = [("HMMA.16816.F32 R104, R92, R32, R104", {"stall": 6})] + [("FADD R50, R50, R51", {"stall": 6})] * 3
    s = _seq(*rows, ("LDG.E.128 R8, desc[UR4][R30.64]", {"wbar": 1, "stall": 6}), ("FMUL R105, R105, 0.5", {}))
    assert "fixed-latency hazard" in s.why_illegal(schedule.Move(4, 1))  # the FMUL 30 -> 24 cycles after the HMMA
    far = _seq(*rows, *[("FADD R50, R50, R51", {"stall": 6})] * 2, ("LDG.E.128 R8, desc[UR4][R30.64]", {"wbar": 1, "stall": 6}),
               ("FMUL R105, R105, 0.5", {}))  # fmt: skip
    assert far.why_illegal(schedule.Move(6, 1)) is None  # 42 -> 36 cycles: past the 32 the model keeps
    assert schedule.LONG_LATENCY["HMMA"] >= MMA_CYCLES


def test_the_gpu_s_wrong_mma_sync_candidates_are_now_out_of_reach(kernels) -> None:
    # session 62 on an H100: SIP on the mma-sync kernels, 225 of 7,126 candidates computed wrong outputs (caught by
    # the check, never kept); the record keeps 20 of each search's. The model since (warp MMA register groups and
    # latency, loads covered by a later load's scoreboard) refuses the moves that reach 57 of these 60: a greedy
    # walk of legal moves from the original reached all 60 before
    import json
    import re
    from pathlib import Path

    # session 63: the re-run's 20 recorded wrong orders (legality version 3), the 3 left above, and the 7 of a run with
    # a broader spacing rule; session 64: each brings an `@!Pn FMUL` of the LeakyReLU epilogue to 12 cycles after the
    # FSETP of its guard, which GUARD_CYCLES (13) refuses, so every one is out of reach
    results = Path(__file__).resolve().parents[2] / "benchmarks/results/h100"
    kinds = {"gemm_leaky_relu_bert_4096x3072x768": "gemm_mma_sync", "gemm_leaky_relu_512x512x2048": "gemm_mma_sync",
             "attention_sip_1x4x16384x64": "attention_mma_sync"}  # fmt: skip
    reached = total = 0
    for record in ("sass_s62_mma_sync.json", "sass_s62_mma_sync_v3.json", "sass_s63_spacing_rule.json"):
        for rec in json.loads((results / record).read_text()):
            _, _, ins, pinned = kernels[kinds[rec["case"]]]
            s0 = Schedule.build(ins, move_set("memory"), pinned)
            for cand in rec["failed_candidates_displaced"]:
                moved = {int(m.group(1), 16) // 16: int(m.group(2)) for m in (re.match(r"0x([0-9a-f]+) .* @(\d+)$", x) for x in cand)}
                order = sorted(range(len(ins)), key=lambda i: moved.get(i, i))
                reached += _greedy_reach(s0, order)
                total += 1
    assert total == 87 and reached == 0


def test_the_gpu_s_wrong_single_moves_are_refused(kernels) -> None:
    # single moves (1-8 slots) verified alone on the mma-sync GEMM on an H100: of the instructions every recorded wrong
    # candidate displaced (sass_s63_bisect.json), then every move of models without session 63's LDS rules
    # (sass_s63_spacing_bisect.json, sass_s64_rule_scope_mma_sync.json). The 9 wrong verdicts (4 distinct moves) each
    # take a guarded FMUL to 12 cycles after the FSETP of its guard (swapping it, or the FSETP, with an LDS.128); the
    # model refuses exactly those and allows every one of the 135 that computed right
    import json
    from pathlib import Path

    _, _, ins, pinned = kernels["gemm_mma_sync"]
    s0 = Schedule.build(ins, move_set("memory"), pinned)
    at = {n.ins.offset: p for p, n in enumerate(s0.nodes)}
    verdicts = []
    for name in ("sass_s63_bisect.json", "sass_s63_spacing_bisect.json", "sass_s64_rule_scope_mma_sync.json"):
        record = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/h100" / name).read_text())
        for r in record["results"]:
            step = -1 if r["direction"] == "up" else 1
            s, why = s0, None
            for k in range(r["steps"]):
                move = schedule.Move(at[int(r["offset"], 16)] + k * step, step)
                if (why := s.why_illegal(move)) is not None:
                    break
                s = s.apply(move)
            verdicts.append((r["ok"], why))
    wrong = [why for ok, why in verdicts if not ok]
    assert len(wrong) == 9 and all(why is not None and "fixed-latency" in why for why in wrong)
    right = [why for ok, why in verdicts if ok]
    assert len(right) == 135 and all(why is None for why in right)


def test_a_guarded_instruction_issues_guard_cycles_after_its_predicate_setter() -> None:
    rows = [("FSETP.GE.AND P3, PT, R75, RZ, PT", {"stall": 2})] + [("FADD R50, R50, R51", {"stall": 1})] * 10
    s = _seq(*rows, ("LDS.128 R8, [R30+UR5]", {"wbar": 2, "stall": 1}), ("@!P3 FMUL R75, R75, 0.01", {"stall": 1}),
             ("LDS.128 R4, [R30+UR5+0x100]", {"wbar": 3, "stall": 1}))  # fmt: skip
    assert "fixed-latency hazard" in s.why_illegal(schedule.Move(11, 1))  # the FMUL 13 -> 12 cycles after the FSETP
    assert s.why_illegal(schedule.Move(13, -1)) is None  # the other LDS up: the FMUL 13 -> 14 cycles
    # a predicate read as an operand, not a guard, keeps the ALU window only
    t = _seq(*rows, ("LDS.128 R8, [R30+UR5]", {"wbar": 2, "stall": 1}), ("ISETP.LT.AND P1, PT, R17, R24, !P3", {}))
    assert t.why_illegal(schedule.Move(11, 1)) is None  # 13 -> 12 cycles: at HAZARD_CYCLES
    # and the setter moving down towards its guarded reader is refused too
    u = _seq(("FSETP.GE.AND P1, PT, R76, RZ, PT", {"stall": 1}), ("LDS.128 R12, [R30+UR5]", {"wbar": 5, "stall": 2}),
             *[("FADD R50, R50, R51", {"stall": 1})] * 10, ("@!P1 FMUL R76, R76, 0.01", {}))  # fmt: skip
    assert "fixed-latency hazard" in u.why_illegal(schedule.Move(1, -1))  # FSETP 13 -> 11 cycles before its reader
    # an async copy's zero-fill predicate is read as early as a guard
    v = _seq(("ISETP.NE.U32.AND P6, PT, R32, RZ, PT", {"stall": 2}), *[("FADD R50, R50, R51", {"stall": 1})] * 10,
             ("IMAD R40, R41, R42, RZ", {"stall": 1}), ("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R24.64], P6", {}))  # fmt: skip
    assert "fixed-latency hazard" in v.why_illegal(schedule.Move(12, -1))  # 13 -> 12 cycles after the ISETP
    assert GUARD_CYCLES == 13


@pytest.mark.parametrize("name", ALL_KERNELS)
def test_ptxas_keeps_guard_cycles_between_a_predicate_setter_and_its_guarded_readers(kernels, name) -> None:
    # the rule's basis: in every example kernel ptxas puts a guarded instruction (or an LDGSTS reading its zero-fill
    # predicate) at least GUARD_CYCLES after the fixed-latency instruction that sets the predicate in the same block
    # (hundreds of pairs at exactly 13), while an ALU's predicate operand follows its setter in as few as 2-4 cycles
    _, _, ins, pinned = kernels[name]
    nodes = Schedule.build(ins, move_set("memory"), pinned).nodes
    closest = {}
    for pos, n in enumerate(nodes):
        for g in _read_early(n):
            cycles = 0
            for k in range(pos - 1, -1, -1):
                cycles += nodes[k].ctrl.stall
                if nodes[k].block != n.block or nodes[k].ins.control_flow or cycles > 40:
                    break
                if g in nodes[k].defs:
                    if nodes[k].fixed_latency:
                        closest[(pos, g)] = cycles
                    break
    assert closest and min(closest.values()) == GUARD_CYCLES


def _greedy_reach(s: Schedule, target: list[int]) -> bool:
    """Bring each instruction to its target slot, top down, by legal one-slot moves (of it, or of the one above it)."""
    for p, want in enumerate(target):
        cur = s.order.index(want)
        while cur > p:
            move = schedule.Move(cur, -1)
            if s.why_illegal(move) is not None:
                move = schedule.Move(cur - 1, +1)
                if s.why_illegal(move) is not None:
                    return False
            s = s.apply(move)
            cur -= 1
    return True


def test_the_checker_catches_a_model_without_the_guard_rule(kernels, monkeypatch) -> None:
    # the walks' checker must be able to fail on the guard rule: without it, walks bring guarded readers too close
    _, _, ins, pinned = kernels["gemm_mma_sync"]
    monkeypatch.setattr(schedule, "GUARD_CYCLES", 0)
    bad = []
    for seed in range(3):
        s0, s = _walk(ins, pinned, seed, 60)
        bad += _violations(s0, _deps(s0), s)
    assert any(v.startswith("latency") and "@" in v for v in bad)
