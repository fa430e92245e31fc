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


@pytest.fixture(scope="module")
def kernels() -> dict[str, tuple]:
    out = {}
    for name, ck in (("gemm", examples.compile_matmul_leaky_relu()), ("attention", examples.compile_attention())):
        cub = load_cubin(ck.asm["cubin"])
        out[name] = (cub, ck.name, disassemble(cub, ck.name), frozenset(cub.kernel(ck.name).pinned_offsets()))
    return out


def test_move_sets_are_named() -> None:
    assert move_set("memory") == schedule.DEFAULT_MOVABLE and move_set("all") > move_set("memory")
    assert not (MOVE_SETS["all"] & schedule.FENCES)  # nothing that orders memory or threads moves
    with pytest.raises(ValueError, match="unknown move set"):
        move_set("everything")


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_the_wider_set_has_many_more_legal_moves(kernels, name) -> None:
    _, _, ins, pinned = kernels[name]
    memory = len(Schedule.build(ins, move_set("memory"), pinned).legal_moves())
    wider = len(Schedule.build(ins, move_set("all"), pinned).legal_moves())
    assert memory > 0 and wider >= 5 * memory  # gemm 34 -> 240, attention 11 -> 383 (session 51)


def _late_reader(n: schedule.Node) -> bool:
    """Reads its sources after issue with no read scoreboard to say when (memory instructions and other
    variable-latency ones): a later writer of those sources relies on distance alone."""
    return n.ctrl.rbar == NO_BARRIER and (n.base in schedule.MEMORY_OPS or not n.fixed_latency)


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
        if a.fixed_latency:
            before, after = _cycles(s0, {i: i for i in range(len(s0.nodes))}, x, y), _cycles(s, pos, x, y)
            if after < min(before, HAZARD_CYCLES):
                bad.append(f"latency: {a.ins.text()} -> {s0.nodes[y].ins.text()} {before} -> {after} cycles")
        else:
            covered0 = any(s0.nodes[k].ctrl.waits_on(a.ctrl.wbar) for k in range(x + 1, y + 1))
            covered = any(s.nodes[k].ctrl.waits_on(a.ctrl.wbar) for k in range(px + 1, py + 1))
            if covered0 and not covered:
                bad.append(f"scoreboard: {a.ins.text()} -> {s0.nodes[y].ins.text()}")
    return bad


def _walk(ins, pinned, seed: int, steps: int) -> tuple[Schedule, Schedule]:
    s0 = s = Schedule.build(ins, move_set("all"), pinned)
    rng = random.Random(seed)
    for _ in range(steps):
        s = s.apply(rng.choice(s.legal_moves()))
    return s0, s


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_random_walks_keep_order_latency_and_scoreboards(kernels, name) -> None:
    _, _, ins, pinned = kernels[name]
    deps = None
    for seed in range(3):
        s0, s = _walk(ins, pinned, seed, 60)
        deps = deps if deps is not None else _deps(s0)
        assert sum(o != k for k, o in enumerate(s.order)) > 0
        assert not (bad := _violations(s0, deps, s)), bad[:5]
        assert any(s.nodes[k].base in schedule.ALU_MOVABLE and s.nodes[k].ins.index != k for k in range(len(s.nodes)))


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


@pytest.mark.parametrize("name", ["gemm", "attention"])
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
