"""The wider move set (``MOVE_SETS["all"]``: memory instructions and register arithmetic) on the real sm_90 GEMM +
LeakyReLU and attention cubins: many more legal moves than SIP's memory-only set, and random walks of them keep
three invariants checked here from the original schedule, not from the model's own verdicts: no two dependent
instructions change order, no fixed-latency result reaches a reader sooner than before (unless >= HAZARD_CYCLES
later), and every reader of a variable-latency result still waits on its scoreboard."""

from __future__ import annotations

import random

import pytest

from kfuse.sass import examples, schedule
from kfuse.sass.control import NO_BARRIER
from kfuse.sass.cubin import load_cubin
from kfuse.sass.disasm import disassemble
from kfuse.sass.emit import emit
from kfuse.sass.schedule import HAZARD_CYCLES, MOVE_SETS, Schedule, move_set
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


MEMORY_GAP = 4  # the fewest cycles ptxas leaves between an LDS and its neighbouring memory instruction


def _lds_gaps(s: Schedule) -> dict[tuple[int, int], int]:
    """Cycles between consecutive memory instructions of each block where one is a plain LDS, by original indices."""
    out, last = {}, None
    for p, n in enumerate(s.nodes):
        if last is not None and n.block != s.nodes[last].block:
            last = None
        if n.base in schedule.MEMORY_OPS and n.base not in ("LDC", "ULDC") and n.ins.pred != "@!PT":
            if last is not None and "LDS" in (n.base, s.nodes[last].base):
                out[tuple(sorted((s.nodes[last].ins.index, n.ins.index)))] = sum(s.nodes[k].ctrl.stall for k in range(last, p))
            last = p
    return out


def _violations(s0: Schedule, deps: list[tuple[int, int, str]], s: Schedule) -> list[str]:
    pos = {idx: p for p, idx in enumerate(s.order)}
    before = _lds_gaps(s0)
    bad = [f"LDS {pair} {c} cycles from memory" for pair, c in _lds_gaps(s).items() if c < min(before.get(pair, MEMORY_GAP), MEMORY_GAP)]
    bad += [f"LDS moved: {n.ins.text()}" for p, n in enumerate(s.nodes) if n.base == "LDS" and n.ins.pred != "@!PT" and n.ins.index != p]
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
            if after < min(before, MMA_CYCLES if a.base in ("HMMA", "IMMA") else HAZARD_CYCLES):
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
        op, _, rest = text.partition(" ")
        ctrl = Control(
            stall=kw.get("stall", 1), yield_bit=0, wbar=kw.get("wbar", NO_BARRIER), rbar=NO_BARRIER, wait=kw.get("wait", 0), reuse=0
        )
        out.append(Instr(k, 16 * k, "", op, rest.replace(" ", ""), encode(bytes(16), ctrl), False))
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
    # a broader spacing rule all move an epilogue LDS; version 4 keeps plain LDS in place and puts every one out of reach
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
    # session 63's bisects on an H100: single moves (1-8 slots) verified alone on the mma-sync GEMM, first of the
    # instructions every recorded wrong candidate displaced (sass_s63_bisect.json), then of every move a model without
    # spacing rules allows (sass_s63_spacing_bisect.json). The 5 wrong ones all move an epilogue LDS.128 to 2-3 cycles
    # from another; LDGSTS, LDSM and STG at 1-3 cycles computed right. Version 4 refuses every wrong one and keeps most
    # of the right ones (it refuses every LDS move, the right ones too)
    import json
    from pathlib import Path

    _, _, ins, pinned = kernels["gemm_mma_sync"]
    s0 = Schedule.build(ins, move_set("memory"), pinned)
    at = {n.ins.offset: p for p, n in enumerate(s0.nodes)}
    verdicts = []
    for name in ("sass_s63_bisect.json", "sass_s63_spacing_bisect.json"):
        record = json.loads((Path(__file__).resolve().parents[2] / "benchmarks/results/h100" / name).read_text())
        for r in record["results"]:
            step = -1 if r["direction"] == "up" else 1
            s, legal = s0, True
            for k in range(r["steps"]):
                move = schedule.Move(at[int(r["offset"], 16)] + k * step, step)
                if s.why_illegal(move) is not None:
                    legal = False
                    break
                s = s.apply(move)
            verdicts.append((r["ok"], legal, r["text"].split()[0]))
    wrong = [v for v in verdicts if not v[0]]
    assert len(wrong) == 5 and all(not legal and op == "LDS.128" for _, legal, op in wrong)
    right = [v for v in verdicts if v[0]]
    assert all(legal for _, legal, op in right if op != "LDS.128") and sum(legal for _, legal, _ in right) >= 60


def test_an_lds_keeps_its_place_and_its_spacing() -> None:
    s = _seq(("LDS.128 R8, [R30+UR5]", {"wbar": 1}), ("FMUL R60, R60, R61", {}), ("FMUL R63, R63, R62", {}),
             ("FSETP.GE.AND P1, PT, R76, RZ, PT", {}), ("LDG.E.128 R12, desc[UR4][R20.64]", {"wbar": 2}),
             ("FMUL R62, R62, R61", {}), ("STG.E.128 desc[UR4][R22.64], R40", {}))  # fmt: skip
    assert "keeps its place" in s.why_illegal(schedule.Move(0, 1))
    assert "keeps its place" in s.why_illegal(schedule.Move(1, -1))  # passing it moves it too
    assert "3 cycles apart" in s.why_illegal(schedule.Move(4, -1))  # an LDG 4 -> 3 cycles after the LDS
    assert s.why_illegal(schedule.Move(4, 1)) is None  # further away is fine
    assert s.why_illegal(schedule.Move(6, -1)) is None  # the STG may come 1 cycle after the LDG: no LDS in the pair


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
