"""CPU tests of the SASS tuner on real sm_90 cubins compiled by Triton (no GPU needed)."""

from __future__ import annotations

import io
import random

import pytest
from elftools.elf.elffile import ELFFile

from kfuse.sass import examples
from kfuse.sass.control import decode, encode
from kfuse.sass.cubin import CubinError, load_cubin
from kfuse.sass.disasm import Instr, disassemble
from kfuse.sass.emit import emit
from kfuse.sass.schedule import Move, Schedule, defs_uses
from kfuse.sass.search import random_walk


@pytest.fixture(scope="module")
def cubins() -> dict[str, object]:
    return {"add": examples.compile_add(), "gemm": examples.compile_matmul_leaky_relu(), "attention": examples.compile_attention()}


def _load(ck):
    cub = load_cubin(ck.asm["cubin"])
    return cub, ck.name, disassemble(cub, ck.name)


def _norm(t: str) -> str:
    return t.replace(".reuse", "")


@pytest.mark.parametrize("name", ["add", "gemm", "attention"])
def test_control_round_trip_every_word(cubins, name):
    cub, kname, ins = _load(cubins[name])
    for i in ins:
        c = decode(i.word)
        assert encode(i.word, c) == i.word
        # nvdisasm shows reuse flags as `.reuse` on operands: the decoded bits must agree
        assert bin(c.reuse).count("1") == i.operands.count(".reuse"), i.text()
        if i.base in ("LDG", "S2R", "LDS", "LDSM") and not i.operands.startswith("RZ"):
            assert c.wbar != 7, f"variable-latency {i.text()} sets no scoreboard"
    # changing a field changes only that field
    w = ins[0].word
    c2 = decode(w).with_(stall=3, wait=0b101010)
    assert decode(encode(w, c2)) == c2
    assert encode(w, c2)[:13] == w[:13]


def _ins(text: str, index: int = 0) -> Instr:
    pred = ""
    if text.startswith("@"):
        pred, text = text.split(" ", 1)
    op, _, rest = text.partition(" ")
    return Instr(index, 16 * index, pred, op, rest.replace(" ", ""), bytes(16), op in ("BRA", "EXIT"))


def test_dependency_analysis_snippets():
    d, u = defs_uses(_ins("IMAD.WIDE R2, R9, 0x2, R4"))
    assert d == {"R2", "R3"} and u == {"R9", "R4", "R5"}
    d, u = defs_uses(_ins("LDG.E.128 R4, desc[UR4][R2.64+0x10]"))
    assert d == {"R4", "R5", "R6", "R7"} and u == {"UR4", "UR5", "R2", "R3"}
    d, u = defs_uses(_ins("@!P0 STG.E.64 desc[UR4][R2.64], R6"))
    assert d == set() and u == {"P0", "UR4", "UR5", "R2", "R3", "R6", "R7"}
    d, u = defs_uses(_ins("ISETP.GE.AND P0, PT, R11, UR6, PT"))
    assert {"P0"} <= d and {"R11", "UR6"} <= u
    d, u = defs_uses(_ins("STS.128 [R9+UR7+0xc000], R24"))
    assert d == set() and {"R9", "UR7", "R24", "R27"} <= u
    d, u = defs_uses(_ins("P2R R16, PR, RZ, 0x40"))
    assert "R16" in d and "P3" in u


def test_illegal_moves_refused_on_snippet():
    seq = [
        _ins("LDG.E R4, desc[UR4][R2.64]", 0),
        _ins("IADD3 R5, R4, 0x1, RZ", 1),
        _ins("STG.E desc[UR4][R2.64], R5", 2),
        _ins("EXIT", 3),
        _ins("LDS R7, [R1]", 4),
        _ins("IADD3 R8, R9, 0x1, RZ", 5),
    ]
    s = Schedule.build(seq)
    assert "RAW" in s.why_illegal(Move(0, 1))  # the load feeds the add
    assert "RAW" in s.why_illegal(Move(2, -1))  # the store needs the add
    assert s.why_illegal(Move(4, -1)) is not None  # across EXIT / block start
    with pytest.raises(ValueError, match="illegal move"):
        s.apply(Move(0, 1))


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_every_legal_move_keeps_code_valid(cubins, name):
    cub, kname, ins = _load(cubins[name])
    s = Schedule.build(ins)
    moves = s.legal_moves()
    assert moves, "expected some legal moves"
    for m in moves:
        t = s.apply(m)
        i, j = m.pair
        a, b = s.nodes[i], s.nodes[j]
        # (dependencies are checked against an independent parse of the operands in test_sass_legality.py;
        # re-testing the model's own defs/uses here could not fail)
        assert a.block == b.block
        new = emit(cub, kname, t)
        got = [_norm(x.text()) for x in disassemble(new, kname)]
        want = [_norm(ins[k].text()) for k in t.order]
        assert got == want


@pytest.mark.parametrize("name", ["gemm", "attention"])
def test_random_walk_reemission(cubins, name):
    cub, kname, ins = _load(cubins[name])
    s = Schedule.build(ins)
    rng = random.Random(7)
    s = random_walk(s, 25, rng)  # stops early at a dead end (not every legal move can be undone)
    new = emit(cub, kname, s)
    ELFFile(io.BytesIO(new.data)).get_section_by_name(f".text.{kname}")  # parses with pyelftools
    dis = disassemble(new, kname)
    assert [_norm(x.text()) for x in dis] == [_norm(ins[k].text()) for k in s.order]
    assert sum(o != k for k, o in enumerate(s.order)) > 0
    # offset tables still point at the same instructions
    for attr, offs in new.kernel(kname).offset_tables():
        if attr.name == "EIATTR_EXIT_INSTR_OFFSETS":
            assert all(dis[o // 16].base == "EXIT" for o in offs)
    # control codes: only waits added to the instruction moving up and reuse flags cleared
    for pos, k in enumerate(s.order):
        c0, c1 = decode(ins[k].word), decode(dis[pos].word)
        assert (c0.stall, c0.wbar, c0.rbar, c0.yield_bit) == (c1.stall, c1.wbar, c1.rbar, c1.yield_bit)
        assert c1.wait & c0.wait == c0.wait


def test_bad_inputs(cubins, tmp_path):
    p = tmp_path / "x.cubin"
    p.write_bytes(b"not an elf at all")
    with pytest.raises(CubinError, match="not a cubin"):
        load_cubin(p)
    with pytest.raises(CubinError, match="cannot read"):
        load_cubin(tmp_path / "missing.cubin")
    old = (
        examples.compile_add.__wrapped__(arch=80)
        if hasattr(examples.compile_add, "__wrapped__")
        else examples.compile_sm90(
            examples.add_kernel, {"x_ptr": "*fp16", "y_ptr": "*fp16", "z_ptr": "*fp16", "n": "i32"}, {"BLOCK": 256}, arch=80
        )
    )
    with pytest.raises(CubinError, match="sm_80"):
        load_cubin(old.asm["cubin"])
    cub = load_cubin(cubins["add"].asm["cubin"])
    with pytest.raises(CubinError, match="not in"):
        cub.kernel("no_such_kernel")


# ---- search and fitness (no GPU: synthetic fitness functions on real schedules) ----------------
class _DriftingGpu:
    """A GPU whose clock slows every timed chunk by 1%, and which runs a kernel 6% faster when it
    follows a pause (the first of a pair), as the H200 did with heavy kernels. ``true`` holds each
    kernel's real time; the original and the candidates all take 0.1 ms unless planted."""

    def __init__(self, true: dict[bytes, float] | None = None) -> None:
        self.calls, self.last, self.true = 0, None, true or {}

    def chunk(self, data: bytes) -> float:
        self.calls += 1
        first = self.last != data and self.calls % 2 == 1
        self.last = data
        return self.true.get(data, 0.1) * 1.01**self.calls * (0.94 if first else 1.0)


class _DriftingEvaluator:
    def __init__(self, fail: bytes = b"", true: dict[bytes, float] | None = None) -> None:
        self.gpu, self.fail = _DriftingGpu(true), fail

    def check(self, data: bytes, samples: int) -> tuple[bool, int, str]:
        return (data != self.fail, samples, "")

    def time(self, data: bytes) -> float:
        return self.gpu.chunk(data)

    def time_pair(self, a: bytes, b: bytes) -> tuple[float, float, float]:
        from kfuse.sass.verify import abba_ratio

        return abba_ratio(lambda: self.gpu.chunk(a), lambda: self.gpu.chunk(b))


def test_abba_ratio_cancels_drift_and_the_first_runs_faster_bias() -> None:
    from kfuse.sass.verify import abba_ratio

    gpu = _DriftingGpu({b"fast": 0.095})
    _, _, same = abba_ratio(lambda: gpu.chunk(b"a"), lambda: gpu.chunk(b"b"))
    assert abs(same - 1.0) < 2e-4  # drift and order cancel (to second order in the 1% drift)
    _, _, r = abba_ratio(lambda: gpu.chunk(b"fast"), lambda: gpu.chunk(b"orig"))
    assert abs(r - 0.95) < 2e-3  # a real 5% gain is seen as 5%
    # what the session-5 pairing (candidate, then original) saw on the same GPU: a 6% "gain"
    gpu = _DriftingGpu()
    naive = [gpu.chunk(b"c") / gpu.chunk(b"orig") for _ in range(8)]
    assert max(naive) < 0.94


def test_paired_fitness_cancels_clock_drift() -> None:
    from kfuse.sass.api import make_fitness

    cands = [bytes([i]) for i in range(1, 20)]
    paired = make_fitness(_DriftingEvaluator(), lambda s: s, b"orig", 0.1, paired=True)
    unpaired = make_fitness(_DriftingEvaluator(), lambda s: s, b"orig", 0.1, paired=False)
    p = [paired(c) for c in cands]
    u = [unpaired(c) for c in cands]
    assert all(abs(x / 0.1 - 1) < 2e-4 for x in p)  # flat: no candidate is faster, none looks it
    assert u[-1] / u[0] > 1.15  # unpaired: a 19% spread from drift alone
    planted = make_fitness(_DriftingEvaluator(true={b"\x07": 0.09}), lambda s: s, b"orig", 0.1)
    assert abs(planted(b"\x07") / 0.1 - 0.9) < 2e-3
    bad = make_fitness(_DriftingEvaluator(fail=b"\x05"), lambda s: s, b"orig", 0.1)
    assert bad(b"\x05") is None and bad(b"\x06") is not None


def test_annealing_finds_a_planted_gain_and_memoises(cubins) -> None:
    """Fitness rewards moving instructions away from the original order (a planted 0.2% per
    displaced instruction, capped): annealing must find a schedule better than the start, every
    best schedule is reachable by legal moves, and repeated orders are not re-measured."""
    from kfuse.sass.search import SimulatedAnnealing

    cub, kname, ins = _load(cubins["gemm"])
    start = Schedule.build(ins)
    seen: list[tuple[int, ...]] = []

    def fitness(s: Schedule) -> float:
        seen.append(tuple(s.order))
        moved = sum(o != k for k, o in enumerate(s.order))
        return 1.0 - 0.002 * min(moved, 20)

    res = SimulatedAnnealing(iterations=60, seeds=(0, 1)).search(start, fitness, 1.0)
    assert res.best_ms < 0.99 and res.gain > 0.01
    assert len(res.trials) == 120 and len(seen) == len(set(seen))  # memo: no order timed twice
    replay = start
    for mv in res.best.applied:  # the best is the start plus legal moves, in order
        assert mv in replay.legal_moves()
        replay = replay.apply(mv)
    assert replay.order == res.best.order


def test_annealing_goes_on_from_the_best_after_a_dead_end() -> None:
    """Not every legal move can be undone, so a walk can reach a schedule with no legal move: the seed goes on from
    the best schedule so far (or the start) instead of ending early."""
    from kfuse.sass.search import SimulatedAnnealing

    class Chain:  # schedule k allows one move, to k + 1; schedule 3 allows none
        def __init__(self, k: int) -> None:
            self.k, self.order, self.applied = k, [k], list(range(k))

        def legal_moves(self) -> list[int]:
            return [self.k + 1] if self.k < 3 else []

        def apply(self, move: int) -> Chain:
            return Chain(move)

    start = Chain(0)
    res = SimulatedAnnealing(iterations=10, seeds=(0,)).search(start, lambda s: 1.0 - 0.01 * s.k, 1.0)  # type: ignore[arg-type]
    assert len(res.trials) == 10 and res.best.k == 3  # the dead end is the best: restarts from the start
    walls = Chain(3)
    assert SimulatedAnnealing(iterations=10, seeds=(0,)).search(walls, lambda s: 1.0, 1.0).trials == []  # type: ignore[arg-type]


def test_annealing_never_keeps_a_failed_candidate(cubins) -> None:
    from kfuse.sass.search import SimulatedAnnealing

    cub, kname, ins = _load(cubins["attention"])
    start = Schedule.build(ins)
    # every candidate "computes something else" except ones with an even number of moves, which
    # are slower: nothing beats the start, and the failures are recorded as such
    res = SimulatedAnnealing(iterations=30, seeds=(3,)).search(start, lambda s: None if len(s.applied) % 2 else 1.5, 1.0)
    assert res.best.order == start.order and res.best_ms == 1.0
    assert any(t.ms is None for t in res.trials) and not any(t.accepted and t.ms is None for t in res.trials)


def test_failed_candidates_record_what_they_displaced(cubins) -> None:
    """A candidate that computes something else leaves the instructions it moved in the record (offset, text, new
    position), so a GPU run's failures can be traced to the moves offline."""
    from kfuse.sass.api import displaced, make_fitness

    _, _, ins = _load(cubins["gemm"])
    start = Schedule.build(ins)
    moved = start.apply(start.legal_moves()[0])
    key = lambda s: repr(s.order).encode()  # noqa: E731
    failed: list[list[str]] = []
    fit = make_fitness(_DriftingEvaluator(fail=key(moved)), key, b"orig", 0.1, failed=failed)
    assert fit(start) is not None and failed == []
    assert fit(moved) is None and failed == [displaced(moved)]
    assert len(failed[0]) == 2 and all(" @" in d for d in failed[0])  # one swap displaces two instructions
    assert displaced(start) == []
