"""Find which single SASS moves the legality model allows but the GPU computes wrong (issue 7).

Session 59's SIP run on GEMM + LeakyReLU [512, 512, 2048] with the 128 x 64 tile (an LDGSTS pipeline, an STS-staged
epilogue) found 955 of 3,000 candidates wrong, every one caught by verification and never chosen; the 20 recorded wrong
candidates share ~30 displaced instructions (``sass_s59_fastest_tile.json``, ``failed_candidates_displaced``). Here each
legal move of the kernel's schedule (or only those of the instructions named by ``--from-record``) is applied **alone**
to the original schedule (and the same instruction ``--steps`` slots on, where legal), emitted, and verified on
``--samples`` random input sets in the worker process that may die. A move that fails alone is a hole in
``kfuse.sass.schedule``'s legality model; the report names it with its control codes and neighbours, which is what the
model's fix needs. It tests the moves of session 59's model (``bar_settle`` off) and marks each with today's verdict.
Session 60 (H100, ``sass_s60_bisect.json``): of 46 schedules exactly one was wrong, the epilogue STS moved to 3 cycles
after its BAR.SYNC, the move the barrier-settle rule now refuses.

    PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl python benchmarks/experiments/sass_move_bisect.py \\
        --case gemm_leaky_relu_512x512x2048 --config 128x64x64w4s4 \\
        --from-record benchmarks/results/h100/sass_s59_fastest_tile.json --out $OUT/bisect
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ (sass_bench's cases)


def displaced_offsets(record_path: str, case: str) -> set[int]:
    """The instruction offsets displaced in every recorded wrong candidate of ``case`` (their intersection)."""
    recs = json.loads(Path(record_path).read_text())
    rec = next(r for r in (recs if isinstance(recs, list) else [recs]) if r.get("case") == case)
    sets = [{int(m.split()[0], 16) for m in cand} for cand in rec.get("failed_candidates_displaced", [])]
    if not sets:
        raise SystemExit(f"{record_path}: no failed_candidates_displaced for {case}")
    return set.intersection(*sets)


RULES = ("bar_settle", "guard_latency")


def switch_off(rules: set[str]) -> None:
    """Switch module-level legality rules off for this process (bar_settle is per schedule): ``guard_latency`` lets a
    guarded instruction come as close to its predicate's setter as any reader (HAZARD_CYCLES)."""
    from kfuse.sass import schedule

    if "guard_latency" in rules:
        schedule.GUARD_CYCLES = 0


def compile_case(case: str, config: str, form: str, moves: str, dry_run: bool) -> tuple[Any, tuple | None, Any, Any]:
    """(compiled kernel, launch spec or None on a dry run, cubin, start schedule) of a sass_bench case in `form`; a dry
    run compiles the GEMM alone (no GPU)."""
    import sass_bench  # noqa: E402  (benchmarks/sass_bench.py: the cases and their verification problems)

    from kfuse.sass.api import launch_spec
    from kfuse.sass.cubin import load_cubin
    from kfuse.sass.disasm import disassemble
    from kfuse.sass.examples import compile_matmul_leaky_relu, mma_form
    from kfuse.sass.schedule import Schedule, move_set

    with mma_form(form):
        if dry_run:
            bm, bn, bk, w, st = sass_bench.parse_gemm_config(config)
            ck, spec = compile_matmul_leaky_relu(bm, bn, bk, 8, num_warps=w, num_stages=st), None
        else:
            ck, args, grid, vargs, vgrid, per, _choice = sass_bench.CASES[case]([sass_bench.parse_gemm_config(config)])
            spec = launch_spec(ck, args, grid, vargs, vgrid, per)
    cub = load_cubin(bytes(ck.asm["cubin"]))
    start = Schedule.build(disassemble(cub, ck.name), move_set(moves), frozenset(cub.kernel(ck.name).pinned_offsets()))
    return ck, spec, cub, start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="gemm_leaky_relu_512x512x2048")
    ap.add_argument("--config", default="128x64x64w4s4", help="the GEMM tile (sass_bench.py --gemm-configs form)")
    ap.add_argument("--from-record", default="", help="a sass.json: test only moves of the instructions all its wrong candidates displaced")
    ap.add_argument("--moves", default="memory", help="move set (kfuse.sass.schedule.move_set)")
    ap.add_argument("--samples", type=int, default=64, help="random input sets a move is verified on")
    ap.add_argument("--steps", type=int, default=2, help="each instruction also this many slots in its direction (where legal)")
    ap.add_argument("--out", default="", help="folder for bisect.json")
    ap.add_argument("--dry-run", action="store_true", help="list the moves it would test (GEMM cases; no GPU)")
    ap.add_argument("--mma-form", default="wgmma", help="Triton's tensor-core code: wgmma or mma-sync (kfuse.sass.examples.mma_form)")
    ap.add_argument("--without", default="bar_settle", help="rules switched off for the moves tested: bar_settle, guard_latency")
    a = ap.parse_args()
    off = {r for r in a.without.split(",") if r}
    if off - set(RULES):
        raise SystemExit(f"--without: unknown rules {sorted(off - set(RULES))}")

    from kfuse.sass import schedule
    from kfuse.sass.emit import emit
    from kfuse.sass.schedule import Move, Schedule
    from kfuse.sass.verify import Evaluator

    guard = schedule.GUARD_CYCLES
    switch_off(off)  # for the tested model; back on for today's verdicts

    def verdict_today(sched: Schedule, mv: Move) -> str | None:
        saved, schedule.GUARD_CYCLES = schedule.GUARD_CYCLES, guard
        settle, sched.bar_settle = sched.bar_settle, True
        try:
            return sched.why_illegal(mv)
        finally:
            schedule.GUARD_CYCLES, sched.bar_settle = saved, settle

    ck, spec, cub, start = compile_case(a.case, a.config, a.mma_form, a.moves, a.dry_run)
    kname = ck.name
    # the model as session 59 had it (no barrier-settle rule), so the moves the rule now refuses are tested too: the
    # report says for each whether today's model refuses it (the prediction: exactly the wrong ones)
    start.bar_settle = "bar_settle" not in off
    today = start.copy()
    today.bar_settle = True
    wanted = displaced_offsets(a.from_record, a.case) if a.from_record else None
    moves = [m for m in start.legal_moves() if wanted is None or start.nodes[m.index].ins.offset in wanted]
    verdicts = {mv: verdict_today(today, mv) for mv in moves}
    moves.sort(key=lambda mv: verdicts[mv] is None)  # the moves today's model refuses first
    print(f"{kname}: {len(start.nodes)} instructions, {len(start.legal_moves())} legal moves, testing {len(moves)}", flush=True)
    if a.dry_run:
        for mv in moves:
            n = start.nodes[mv.index]
            why = verdicts[mv] or ""
            print(f"  {n.ins.offset:#06x} {'up' if mv.direction < 0 else 'down':4s} {n.ctrl.render()} {n.ins.text()}  {why}")
        return
    results: list[dict[str, Any]] = []

    def save(rows: list[dict[str, Any]]) -> None:
        if a.out:
            Path(a.out).mkdir(parents=True, exist_ok=True)
            report = {"case": a.case, "config": a.config, "mma_form": a.mma_form, "without": sorted(off), "kernel": kname, "results": rows}
            (Path(a.out) / "bisect.json").write_text(json.dumps(report, indent=1))

    t0 = time.time()
    with Evaluator(spec, timeout_s=60) as ev:
        for mv in moves:
            moved, other = start.nodes[mv.index], start.nodes[mv.index + mv.direction]
            sched = start.apply(mv)
            refused_now = verdicts[mv]
            for step in range(1, a.steps + 1):
                if step > 1:  # the same instruction one slot further, where the model allows it
                    nxt = Move(mv.index + (step - 1) * mv.direction, mv.direction)
                    if sched.why_illegal(nxt) is not None:
                        break
                    refused_now = refused_now or verdict_today(sched, nxt)  # today's model on the whole path
                    sched = sched.apply(nxt)
                ok, done, why = ev.check(emit(cub, kname, sched).data, a.samples)
                rec = {"offset": f"{moved.ins.offset:#x}", "text": moved.ins.text(), "ctrl": moved.ctrl.render(),
                       "direction": "up" if mv.direction < 0 else "down", "steps": step, "past": other.ins.text(),
                       "past_ctrl": other.ctrl.render(), "ok": ok, "samples": done, "why": why,
                       "refused_now": refused_now}  # fmt: skip
                results.append(rec)
                save(results)  # as it goes: a run cut off by its time limit keeps what it verified
                if not ok:
                    where = f"{rec['offset']} {rec['direction']} x{step} {rec['ctrl']} {rec['text']}"
                    print(f"WRONG  {where}  (first past {rec['past_ctrl']} {rec['past']}): {why}; today: {refused_now}", flush=True)
    bad = [r for r in results if not r["ok"]]
    caught = [r for r in bad if r["refused_now"]]
    refused_ok = [r for r in results if r["ok"] and r["refused_now"] and r["steps"] == 1]
    print(
        f"\n{len(results)} schedules (one instruction 1-{a.steps} slots) verified on {a.samples} input sets each in "
        f"{time.time() - t0:.0f} s: {len(bad)} wrong, {len(caught)} of them refused by today's model; "
        f"{len(refused_ok)} single moves it refuses computed right"
    )
    save(results)


if __name__ == "__main__":
    main()
