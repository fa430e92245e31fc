"""Split recorded wrong SIP candidates into their independent parts and verify each part alone (issue 7).

``sass_move_bisect.py`` verifies single moves; a hole that needs two moves together escapes it. This script takes the
wrong candidates a search recorded (``failed_candidates_displaced``: each displaced instruction with its new slot),
rebuilds each order from the original schedule by legal moves (the same greedy walk the tests use), checks that the
rebuilt candidate is still wrong, then cuts its permutation into independent segments (a segment ends at slot p when
slots 0..p hold exactly instructions 0..p) and verifies each segment alone, then every segment but one. A segment
wrong alone holds the hole; its original and permuted instructions, with control codes, go into the report.

    PYTHONPATH=.:.whl/pyelftools-0.32-py3-none-any.whl python benchmarks/experiments/sass_candidate_bisect.py \\
        --case gemm_leaky_relu_512x512x2048 --config 128x128x64w8s3 --mma-form mma-sync \\
        --record benchmarks/results/h100/sass_s62_mma_sync_v3.json --out $OUT/cand
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any


def recorded_orders(record_path: str, case: str, n_instructions: int) -> list[list[int]]:
    """Each recorded wrong candidate as a full order of original instruction indices."""
    recs = json.loads(Path(record_path).read_text())
    rec = next(r for r in (recs if isinstance(recs, list) else [recs]) if r.get("case") == case)
    out = []
    for cand in rec.get("failed_candidates_displaced", []):
        moved = {int(m.group(1), 16) // 16: int(m.group(2)) for m in (re.match(r"0x([0-9a-f]+) .* @(\d+)$", x) for x in cand) if m}
        out.append(sorted(range(n_instructions), key=lambda i: moved.get(i, i)))
    return out


def segments(order: list[int]) -> list[tuple[int, int]]:
    """(start, end) slot ranges, end exclusive, that the permutation maps onto themselves and does not leave alone."""
    out, start, high = [], 0, -1
    for p, i in enumerate(order):
        high = max(high, i)
        if high == p:
            if any(order[k] != k for k in range(start, p + 1)):
                out.append((start, p + 1))
            start = p + 1
    return out


def with_segments(order: list[int], chosen: list[tuple[int, int]]) -> list[int]:
    """The identity order with only the chosen segments permuted as in `order`."""
    out = list(range(len(order)))
    for a, b in chosen:
        out[a:b] = order[a:b]
    return out


def replay(start: Any, target: list[int]) -> Any | None:
    """Reach `target` from `start` by legal one-slot moves, top down; None where a move on the way is refused."""
    from kfuse.sass.schedule import Move

    s = start
    for p, want in enumerate(target):
        cur = s.order.index(want)
        while cur > p:
            move = Move(cur, -1)
            if s.why_illegal(move) is not None:
                move = Move(cur - 1, +1)
                if s.why_illegal(move) is not None:
                    return None
            s = s.apply(move)
            cur -= 1
    return s


def describe(start: Any, sched: Any, seg: tuple[int, int]) -> dict[str, list[str]]:
    a, b = seg
    row = lambda n: f"{n.ins.offset:#06x} {n.ctrl.render()} {n.ins.text()}"  # noqa: E731
    return {"original": [row(start.nodes[k]) for k in range(a, b)], "candidate": [row(sched.nodes[k]) for k in range(a, b)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", default="gemm_leaky_relu_512x512x2048")
    ap.add_argument("--config", default="128x128x64w8s3", help="the GEMM tile (sass_bench.py --gemm-configs form)")
    ap.add_argument("--record", required=True, help="a sass.json with failed_candidates_displaced for --case")
    ap.add_argument("--moves", default="memory", help="move set the search used (kfuse.sass.schedule.move_set)")
    ap.add_argument("--candidates", type=int, default=4, help="how many recorded candidates to split (fewest displaced first)")
    ap.add_argument("--samples", type=int, default=512, help="random input sets each schedule is verified on")
    ap.add_argument("--mma-form", default="wgmma", help="wgmma or mma-sync (kfuse.sass.examples.mma_form)")
    ap.add_argument("--out", default="", help="folder for candidate_bisect.json")
    ap.add_argument("--dry-run", action="store_true", help="rebuild and split the candidates only (no GPU)")
    ap.add_argument("--without-guard", action="store_true", help="rebuild without the guard-latency rule (greedy paths)")
    a = ap.parse_args()

    from sass_move_bisect import compile_case, switch_off

    from kfuse.sass.emit import emit
    from kfuse.sass.verify import Evaluator

    if a.without_guard:  # the recorded wrong candidates are out of the shipped model's reach
        switch_off({"guard_latency"})
    ck, spec, cub, start = compile_case(a.case, a.config, a.mma_form, a.moves, a.dry_run)
    kname = ck.name
    orders = recorded_orders(a.record, a.case, len(start.nodes))
    orders.sort(key=lambda o: sum(i != k for k, i in enumerate(o)))
    orders = orders[: a.candidates]

    plans = []  # (candidate, label, segments, schedule)
    for c, order in enumerate(orders):
        segs = segments(order)
        plans.append((c, "all", segs, replay(start, order)))
        for s in segs:
            plans.append((c, "alone", [s], replay(start, with_segments(order, [s]))))
        for s in segs:
            rest = [t for t in segs if t != s]
            plans.append((c, "all_but", [s], replay(start, with_segments(order, rest))))
        print(f"candidate {c}: {sum(i != k for k, i in enumerate(order))} displaced in {len(segs)} segments: {segs}", flush=True)
    unreachable = [p for p in plans if p[3] is None]
    print(f"{len(plans)} schedules to verify, {len(unreachable)} not reachable by the greedy walk", flush=True)
    if a.dry_run:
        return

    results: list[dict[str, Any]] = []
    t0 = time.time()
    with Evaluator(spec, timeout_s=60) as ev:
        for c, label, segs, sched in plans:
            if sched is None:
                results.append({"candidate": c, "label": label, "segments": segs, "reachable": False})
                continue
            ok, done, why = ev.check(emit(cub, kname, sched).data, a.samples)
            rec = {"candidate": c, "label": label, "segments": segs, "reachable": True, "ok": ok, "samples": done, "why": why}
            if label == "alone" and not ok:
                rec["instructions"] = describe(start, sched, segs[0])
                print(f"WRONG ALONE candidate {c} segment {segs[0]}: {why}", flush=True)
                for line in rec["instructions"]["candidate"]:
                    print("    " + line, flush=True)
            elif label == "all":
                print(f"candidate {c} rebuilt: {'right (not reproduced)' if ok else 'wrong (reproduced): ' + why}", flush=True)
            results.append(rec)
    wrong_alone = [r for r in results if r["label"] == "alone" and r.get("ok") is False]
    print(
        f"\n{len(results)} schedules verified on {a.samples} input sets each in {time.time() - t0:.0f} s; "
        f"{len(wrong_alone)} segments wrong alone"
    )
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        report = {"case": a.case, "config": a.config, "mma_form": a.mma_form, "kernel": kname, "results": results}
        (Path(a.out) / "candidate_bisect.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
