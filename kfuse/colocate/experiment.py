"""One co-location experiment: profile, pick versions, find the load, run every policy, plot.

Used by ``kfuse colocate run`` and ``benchmarks/colocate_bench.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kfuse.colocate import predictor
from kfuse.colocate.fuser import DEFAULT_VERSIONS, any_kernel
from kfuse.colocate.scheduler import (
    FILL_SHARES,
    POLICIES,
    Backend,
    Profile,
    build_profile,
    extra_budget,
    fusion_plans,
    max_lc_rate,
    measured_max_lc_rate,
    measured_solo_ms,
    merge_runs,
    p99_gap,
    partition_ceiling,
    poisson_arrivals,
    run_policy,
)
from kfuse.colocate.scheduler import version_name as _vname


def overlap_rates(backend: Backend, prof: Profile, be: str, top: int = 3) -> list[dict[str, Any]]:
    """Measured overlap (T_lc + T_be - T_fused) / (T_lc + T_be) of the chosen version at its opportune
    ratio, for the ``top`` longest fusible LC kernels."""
    out = []
    reps: dict[str, int] = {}
    for i, k in enumerate(prof.lc):
        if (k.key, be) in prof.chosen and k.key not in reps:
            reps[k.key] = i
    for key, i in sorted(reps.items(), key=lambda kv: -prof.lc_ms[kv[1]])[:top]:
        sel = prof.chosen[(key, be)]
        t_lc = backend.run_lc(i)
        n = min(prof.be_blocks[be], max(1, int(prof.be[be].blocks_for(max(sel.opportune_ratio, 0.5) * t_lc))))
        t_be = backend.run_be(be, 0, n)
        t_f = backend.run_fused(i, be, 0, n, sel.version)
        out.append({"lc_kernel": prof.lc[i].name, "key": key, "version": _vname(sel.version), "t_lc_ms": t_lc, "t_be_ms": t_be,
                    "t_fused_ms": t_f, "overlap": (t_lc + t_be - t_f) / (t_lc + t_be)})  # fmt: skip
    return out


def measured_overlaps(prof: Profile) -> dict[str, dict[str, float]]:
    """Per (LC shape, BE) and version: the best overlap any profiled launch measured (what a GPU run
    reads to see which layout, ratio or tail fill pays; selection uses the one nearest x*)."""
    out: dict[str, dict[str, float]] = {}
    for (key, be), per_v in prof.samples.items():
        out[f"{key}|{be}"] = {_vname(v): max(((1.0 + x - y) / (1.0 + x) for x, y in pts), default=math.nan) for v, pts in per_v.items()}
    return out


def run_experiment(
    backend: Backend, be_names: Sequence[str], qos_ms: float | None = None, qos_factor: float = 5.0, load: float = 0.8,
    seconds: float = 2.0, min_queries: int = 100, max_queries: int = 2000, versions: Sequence[Any] = DEFAULT_VERSIONS,
    policies: Sequence[str] = POLICIES, seed: int = 0, reps: int = 2, min_fuse_ms: float = 0.0,
    log: Callable[[str], None] = print, fit_ratios: Sequence[float] | None = None, max_fuse_keys: int | None = None,
    calibrate: bool = False, warmup_queries: int = 0, control: bool = True, sequences: int = 1,
    aim: str = "priced", aims: Sequence[str] = (), knee_samples: int = 0, span_fill: bool = False,
    lc_alone_retries: int = 2, lc_calibration: dict[str, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Profile, then serve the same Poisson arrivals under every policy for every BE kernel.
    ``sequences``: that many arrival sequences (seeds ``seed``, ``seed + 1``, ...), every policy
    on each; a run's result is their merge (``merge_runs``: pooled p99 and violations, each
    sequence's p99 and BE throughput kept, so a gain can be paired sequence by sequence).
    ``aim``: where Aker aims its fused slices (``predictor.AIM_RULES``; "priced": E solved per BE kernel
    from the allowance, ``Profile.price_aims``). ``aims``: other rules to run Aker with too, on the same
    profile and arrivals, recorded as policy ``aker_<rule>`` (an A/B of where the slices are aimed).
    ``knee_samples``: extra profile samples inside each fused curve's first wave step (``scheduler.knee_blocks``).
    ``span_fill``: the whole-query partitions are also profiled with backfills of BE blocks on the query's own SMs at
    low priority (``scheduler.FILL_SHARES``), which the ``backfill`` and ``auto`` plans may then choose (``partition``
    keeps to the slices: the two run side by side on the same profile and arrivals).
    ``lc_alone_retries``: LC alone is run again (at most that often) while it violates QoS, and the run with fewer
    violations kept: the allowance every BE policy gets is sized from its tail (``p99_gap``).
    ``lc_calibration``: with ``calibrate``, a dict shared by the experiments of one LC: the first fills it with the
    measured solo latency and max LC-alone rate, the others reuse them (one LC's QoS, rate and arrivals for all its BE
    kernels, and no second rate search)."""
    if sequences < 1:
        raise ValueError(f"sequences must be >= 1, got {sequences}")
    bad = [r for r in (aim, *aims) if r not in predictor.AIM_RULES]
    if bad:
        raise ValueError(f"unknown aim rule(s) {bad}: choose from {predictor.AIM_RULES}")
    log(f"profiling {len(backend.lc_kernels())} LC kernels with BE {', '.join(be_names)} ...")
    kw = {"fit_ratios": fit_ratios} if fit_ratios else {}
    # an SM-partition version (green<S>) also profiles whole-query partitions of S SMs for the ``partition`` policy
    span_sms = sorted({v.r2 for v in versions if any_kernel(v)})
    prof = build_profile(backend, be_names, versions, reps=reps, min_fuse_ms=min_fuse_ms, log=log, max_fuse_keys=max_fuse_keys,
                         knee_samples=knee_samples, span_sms=span_sms, fill_shares=FILL_SHARES if span_fill else (), **kw)  # fmt: skip
    # the partition policy needs profiled spans; auto both spans and a chosen fusion (else it is partition or aker)
    policies = [p for p in policies if (p != "partition" or prof.spans) and (p != "backfill" or prof.filled_spans)
                and (p != "auto" or (prof.spans and prof.chosen))]  # fmt: skip
    solo_profile = prof.lc_total
    reuse = calibrate and lc_calibration is not None and "solo_ms" in lc_calibration
    if calibrate:  # the solo latency as the policies' clock measures it; LC kernel times scaled to match
        solo_measured = lc_calibration["solo_ms"] if reuse else measured_solo_ms(backend, prof)  # type: ignore[index]
        if solo_measured > solo_profile:
            scale = solo_measured / solo_profile
            prof.rescale_lc(scale)
            log(f"solo query {solo_measured:.3f} ms {'(the LC calibration reused)' if reuse else 'measured alone'} vs "
                f"{solo_profile:.3f} ms of median kernel times: LC kernel times x{scale:.3f}")  # fmt: skip
    solo = prof.lc_total
    qos = qos_ms if qos_ms else qos_factor * solo
    max_rate = replay_rate = max_lc_rate(prof, qos)
    if reuse:  # the LC's rate search is the LC's alone: measured once for all its BE kernels (~40 s a search on the H100)
        max_rate = lc_calibration["max_rate"]  # type: ignore[index]
        log(f"max LC-alone rate {max_rate:.1f}/s, the LC calibration reused (replay estimate {replay_rate:.1f}/s)")
    elif calibrate:  # the replay estimate assumes median kernel times; real launches vary
        max_rate = measured_max_lc_rate(backend, prof, qos, replay_rate)
        log(f"max LC-alone rate: replay estimate {replay_rate:.1f}/s, measured {max_rate:.1f}/s")
        if lc_calibration is not None:
            lc_calibration.update(solo_ms=solo, max_rate=max_rate)
    rate = load * max_rate
    n = int(min(max_queries, max(min_queries, seconds * rate)))
    seqs = [poisson_arrivals(rate, n, seed + s) for s in range(sequences)]
    arrivals = seqs[0]
    extra = extra_uncalibrated = extra_budget(prof, qos, rate)
    log(f"solo {solo:.3f} ms, QoS {qos:.3f} ms, max LC-alone rate {max_rate:.1f}/s, load {load} -> {rate:.1f}/s, "
        f"{n} queries, BE allowance {extra:.3f} ms/query")  # fmt: skip
    # what a partition could add at most at this load (``partition_ceiling``), to read its measured gain against
    # (only for partitions the GPU has: a smoke run's green32 on the interpreter's few SMs has none)
    ceilings = {s: partition_ceiling(rate, solo, s, backend.sms) for s in span_sms if prof.spans and backend.sms and s < backend.sms}
    for s, c in ceilings.items():
        log(f"partition ceiling with {s} of {backend.sms} SMs at this load: {c:+.1%} over time sharing")
    lc_alone, gap, lc_alone_reruns = None, 0.0, 0
    if "lc_alone" in policies:
        alone = [run_policy(backend, prof, "lc_alone", a, [], qos) for a in seqs]
        lc_alone = merge_runs(alone)
        log(f"  lc_alone           p99 {lc_alone.p99:8.3f} ms  violations {lc_alone.violations}{_per_seq(lc_alone)}")
        # LC alone met QoS at this load when its rate was measured (or the replay says it does), so a violation here is
        # a one-off host stall (H100, session 53: one 11 ms stall took the p99 to 15 ms and the allowance to zero)
        for _ in range(lc_alone_retries if lc_alone.violations else 0):
            again = [run_policy(backend, prof, "lc_alone", a, [], qos) for a in seqs]
            retried = merge_runs(again)
            log(f"  lc_alone again     p99 {retried.p99:8.3f} ms  violations {retried.violations} (a stall, not the load)")
            lc_alone_reruns += 1
            if retried.violations < lc_alone.violations:
                alone, lc_alone = again, retried
            if not lc_alone.violations:
                break
        # the allowance again, with the measured tail: replayed medians understate it
        gap = p99_gap(prof, alone, seqs, qos)
        if gap > 0.0:
            extra = extra_budget(prof, qos, rate, p99_gap_ms=gap)
            log(f"  LC-alone p99 {gap:.3f} ms above its replay: BE allowance {extra_uncalibrated:.3f} -> {extra:.3f} ms/query")
    out: dict[str, Any] = {
        "solo_ms": solo, "solo_profile_ms": solo_profile, "qos_ms": qos, "max_rate": max_rate, "rate": rate, "queries": n,
        "sequences": sequences, "partition_ceiling": ceilings,
        "extra_per_query_ms": extra,
        "extra_uncalibrated_ms": extra_uncalibrated, "p99_gap_ms": gap, "lc_alone_reruns": lc_alone_reruns,
        "lc_calibration_reused": reuse,
        "predictor_heldout": prof.heldout, "chosen": {f"{k[0]}|{k[1]}": {"version": _vname(s.version), "opportune_ratio": s.opportune_ratio,
                                                                      "reduction": s.reduction, "measured": s.measured}
                                                   for k, s in prof.chosen.items()},
        "runs": {}, "overlap": {}, "measured_overlap": measured_overlaps(prof),
        "aims": {},  # "be|policy" -> the aim rule of an Aker run and, priced, its E
        # what the next GPU run needs to see why a fusion is (not) accepted: BE launch-cost fits, the plan per shape
        # with a whole query's allowance (reason, blocks, pessimistic extra vs time-sharing saving, error bound), samples
        "be_fit": {b: {"a_ms": m.a, "b_ms_per_block": m.b, "blocks": prof.be_blocks[b], "kernel_ms": m.predict(prof.be_blocks[b])}
                   for b, m in prof.be.items()},
        "plans": {b: fusion_plans(prof, b, min(extra, qos)) for b in be_names},
        "samples": {f"{k}|{b}": {_vname(v): [[round(x, 4), round(y, 4)] for x, y in pts] for v, pts in per_v.items()}
                    for (k, b), per_v in prof.samples.items()},
        "error_bounds": {f"{k}|{b}": {_vname(v): m.error_bound for v, m in ms.items()} for (k, b), ms in prof.fused.items()},
    }  # fmt: skip
    if lc_alone is not None:
        out["runs"][("-", "lc_alone")] = lc_alone
    for be in be_names:
        try:
            out["overlap"][be] = overlap_rates(backend, prof, be)
        except Exception as e:  # a measurement that fails is reported, the runs go on
            log(f"  overlap {be}: {type(e).__name__}: {e}")
        for pol in policies:
            if pol == "lc_alone":
                continue
            if warmup_queries:  # untimed: kernels a policy launches first (JIT compiles) must not stall its clock
                run_policy(backend, prof, pol, arrivals[:warmup_queries], [be], qos, extra_per_query_ms=extra)
            if pol in ("aker", "auto"):  # auto's fused queries are aimed as Aker's are
                r, out["aims"][f"{be}|{pol}"] = _aker_aimed(backend, prof, aim, seqs, be, qos, extra, log, policy=pol)
            else:
                r = merge_runs([run_policy(backend, prof, pol, a, [be], qos, extra_per_query_ms=extra) for a in seqs])
            out["runs"][(be, pol)] = r
            _log_run(log, be, pol, r)
            if pol == "aker":
                for rule in aims:
                    r, out["aims"][f"{be}|aker_{rule}"] = _aker_aimed(backend, prof, rule, seqs, be, qos, extra, log)
                    out["runs"][(be, f"aker_{rule}")] = r
                    _log_run(log, be, f"aker_{rule}"[:9], r)
        if control and "timeshare" in policies and "aker" in policies:
            # time sharing again, after Aker: the run-to-run drift of launch times on this GPU (a policy's gain must beat it)
            r = merge_runs([run_policy(backend, prof, "timeshare", a, [be], qos, extra_per_query_ms=extra) for a in seqs])
            out["runs"][(be, "timeshare_rerun")] = r
            _log_run(log, be, "ts_rerun", r)
    out["profile"] = prof
    return out


def _aker_aimed(
    backend: Backend, prof: Profile, rule: str, seqs: Sequence[Sequence[float]], be: str, qos: float, extra: float,
    log: Callable[[str], None] = print, policy: str = "aker",
) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """Aker (or ``policy`` auto) with its fused slices aimed by ``rule``, and the aim (rule, and E where priced); the profile's
    selections and the rule are restored after."""
    saved = predictor.OPPORTUNE_RULE
    how: dict[str, Any] = {"rule": rule}
    try:
        if rule == "priced":
            how["price"] = prof.price_aims(be, extra)
        else:
            predictor.OPPORTUNE_RULE = rule
            prof.choose()  # selections carry the aim (opportune ratio) of their version
        how["chosen"] = {k: {"version": _vname(sel.version), "aim": sel.opportune_ratio} for (k, b), sel in prof.chosen.items() if b == be}
        if rule == "priced":
            aims = {f"{k} {c['version']}": round(c["aim"], 2) for k, c in how["chosen"].items()}
            log(f"  {be:10s} priced    allowance {extra:.3f} ms/query -> E = {how['price']:g}; aims {aims}")
        return merge_runs([run_policy(backend, prof, policy, a, [be], qos, extra_per_query_ms=extra) for a in seqs]), how
    finally:
        predictor.OPPORTUNE_RULE = saved
        prof.unprice(be)


def _per_seq(r: Any) -> str:
    """Each arrival sequence's p99, where there are several."""
    ps = r.p99_per_sequence
    return f"  (p99 per sequence: {', '.join(f'{p:.3f}' for p in ps)})" if len(ps) > 1 else ""


def _log_run(log: Callable[[str], None], be: str, pol: str, r: Any) -> None:
    d = r.summary()
    log(f"  {be:10s} {pol:9s} p99 {r.p99:8.3f} ms  violations {r.violations:3d}  BE {r.be_throughput:9.2f}/s  "
        f"fused {r.fused_launches} (gain {r.fused_gain_ms:.2f} ms) slices {r.be_slices} refits {r.refits}{_per_seq(r)}")  # fmt: skip
    if pol == "lc_alone":
        return
    dec = f", decisions {d['decisions']}" + (" (delegated to time sharing)" if r.delegated else "") if pol in ("aker", "auto") else ""
    log(f"  {'':10s} {'':9s} LC {d['lc_ms_per_query']:.3f} ms/query, BE {d['be_ms_per_launch'] * 1e3:.1f} us/launch "
        f"({r.be_query_launches} in queries, {r.be_idle_launches} idle), host {r.host_ms:.0f} ms{dec}")  # fmt: skip
    for key, f in d["fused_by_key"].items():  # where the run's slices landed against the profile's curve
        e = d["online_error_by_key"].get(key, {})
        err = f", error median {e['median']:.1%} p90 {e['p90']:.1%} max {e['max']:.0%}" if e.get("n") else ""
        log(f"  {'':10s} {'':9s} fused {key}: {f['launches']} launches, x {f['mean_x']:.2f}, T_fused/T_lc predicted "
            f"{f['mean_predicted_y']:.3f} measured {f['mean_y']:.3f} (means), gain {f['gain_ms']:.2f} ms{err}")  # fmt: skip


def gain(res: dict[str, Any], be: str, policy: str = "aker") -> float:
    ts = res["runs"].get((be, "timeshare"))
    r = res["runs"].get((be, policy))
    if ts is None or r is None or ts.be_throughput <= 0:
        return math.nan
    return r.be_throughput / ts.be_throughput - 1.0


def plot(res: dict[str, Any], lc_name: str, out_dir: str | Path) -> list[Path]:
    """LC latency CDF per BE kernel (with the QoS line) and BE throughput per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bes = sorted({be for be, _ in res["runs"] if be != "-"})
    paths = []
    fig, axes = plt.subplots(1, max(1, len(bes)), figsize=(4.5 * max(1, len(bes)), 3.6), squeeze=False)
    for ax, be in zip(axes[0], bes or ["-"], strict=False):
        for (b, pol), r in res["runs"].items():
            if b in (be, "-") and r.latencies_ms:
                lat = np.sort(r.latencies_ms)
                ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=pol)
        ax.axvline(res["qos_ms"], color="k", ls="--", lw=1, label="QoS")
        ax.set_title(f"{lc_name} + {be}")
        ax.set_xlabel("LC latency (ms)")
        ax.set_ylabel("CDF")
        ax.legend(fontsize=7)
    fig.tight_layout()
    p = out_dir / f"colocate_{lc_name}_latency_cdf.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    pols = [p for p in POLICIES if p != "lc_alone" and any((be, p) in res["runs"] for be in bes)] or ["timeshare"]
    # the gain over time sharing is the number a reader wants (the target is on it): bars of it, each labelled,
    # the absolute BE/s in the labels; a policy that missed QoS hatched
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 + 0.45 * len(pols) * max(1, len(bes))), 3.8))
    w = 0.8 / len(pols)
    for j, pol in enumerate(pols):
        xs = np.arange(len(bes)) + j * w
        runs = [res["runs"].get((be, pol)) for be in bes]
        gains = [100.0 * gain(res, be, pol) if r is not None else math.nan for be, r in zip(bes, runs, strict=True)]
        ys = [0.0 if math.isnan(g) else g for g in gains]  # no time sharing run to compare with: no bar, a label
        bars = ax.bar(xs, ys, w, label=pol)
        for bar, r, g in zip(bars, runs, gains, strict=True):
            if r is None:
                continue
            if r.violations:
                bar.set_hatch("//")
            label = "n/a" if math.isnan(g) else f"{g:+.1f}%"
            ax.annotate(f"{label}\n{r.be_throughput:.0f}/s", (bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 0.0)),
                        ha="center", va="bottom", fontsize=6)  # fmt: skip
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(bes)) + w * (len(pols) - 1) / 2, bes)
    ax.set_ylabel("BE throughput vs time sharing (%)")
    ax.set_title(f"BE throughput, LC = {lc_name}\n(QoS {res['qos_ms']:.2f} ms; hatched: QoS missed)", fontsize=9)
    ax.margins(y=0.25)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    p = out_dir / f"colocate_{lc_name}_be_throughput.png"
    fig.savefig(p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def _paired_gains(r: Any, ts: Any) -> list[float] | None:
    """BE throughput over time sharing's, sequence by sequence (same arrivals, so paired)."""
    if ts is None or len(r.be_throughput_per_sequence) != len(ts.be_throughput_per_sequence):
        return None
    return [a / b - 1.0 if b > 0 else math.nan for a, b in zip(r.be_throughput_per_sequence, ts.be_throughput_per_sequence, strict=True)]


def records(res: dict[str, Any], lc_name: str, command: str) -> list[dict[str, Any]]:
    """One record per LC x BE pair and policy (the issue's fields)."""
    import datetime

    from kfuse.bench.harness import gpu_name

    out = []
    for (be, pol), r in res["runs"].items():
        ts = res["runs"].get((be, "timeshare"))
        rec = {
            "benchmark": "colocate", "case": f"{lc_name}+{be}" if be != "-" else lc_name, "policy": pol, "gpu": gpu_name(),
            "command": command, "date": datetime.date.today().isoformat(), "qos_ms": res["qos_ms"], "p99_ms": r.p99,
            "violations": r.violations, "queries": len(r.latencies_ms), "be_throughput": r.be_throughput,
            "be_gain_vs_timesharing": (r.be_throughput / ts.be_throughput - 1.0) if ts and ts.be_throughput > 0 else None,
            "solo_ms": res["solo_ms"], "solo_profile_ms": res.get("solo_profile_ms"), "rate_per_s": res["rate"],
            "max_rate_per_s": res["max_rate"],
            "fused_launches": r.fused_launches, "fused_gain_ms": r.fused_gain_ms, "be_slices": r.be_slices, "refits": r.refits,
            "online_error": r.summary()["online_error"], "overlap": res["overlap"].get(be),
            **{k: r.summary()[k] for k in ("decisions", "fused_by_key", "delegated", "lc_ms", "lc_launches", "lc_ms_per_query", "be_ms",
                                           "be_ms_per_launch", "be_query_launches", "be_idle_launches", "fused_ms", "host_ms",
                                           "elapsed_ms", "be_units")},
            "aim": res.get("aims", {}).get(f"{be}|{pol}"),
            "partition_ceiling": res.get("partition_ceiling") if pol in ("partition", "backfill", "auto") else None,
            # the BE allowance every policy had, and what sized it (a stalled LC-alone run shrinks it to nothing)
            "be_allowance_ms": res.get("extra_per_query_ms"), "lc_alone_p99_gap_ms": res.get("p99_gap_ms"),
            "lc_alone_reruns": res.get("lc_alone_reruns", 0), "lc_calibration_reused": res.get("lc_calibration_reused", False),
            "sequences": res.get("sequences", 1), "p99_per_sequence_ms": list(r.p99_per_sequence),
            "be_gain_per_sequence": _paired_gains(r, ts),
            "latencies_ms": [round(x, 4) for x in r.latencies_ms],
        }  # fmt: skip
        out.append(rec)
    return out
