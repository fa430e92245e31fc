"""SIP-style SASS schedule tuning on the H200: Triton's schedule vs the best verified one found.

Kernels (fp16): tutorial-style fused attention at SIP's [1,4,16384,64] and a BERT-base shape [8,12,512,64];
GEMM + LeakyReLU at [512,512,2048] and two BERT-base GEMMs ([4096,768,768], [4096,3072,768]).
The whole run must fit one 300 s device call, so each search is time-boxed (--search-s) and uses fewer
annealing iterations than SIP's 1000 (see docs/sass.md); every accepted schedule is verified on
--samples random input sets (fresh random data, all outputs compared bitwise with Triton's schedule).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# the example kernels, their launch arguments and the GEMM tile grammar (``kfuse sass tune`` uses them too)
from kfuse.sass.examples import (  # noqa: E402
    MMA_FORMS,
    TUTORIAL_GEMM,
    GemmTile,
    attention_args,
    attention_launch,
    config_name,
    gemm_launch,
    mma_form,
    parse_gemm_config,
)


def attention_case(z: int, h: int, n: int, d: int, verify_zh: tuple[int, int, int]) -> tuple:
    ck, args, grid = attention_launch(z, h, n, d)
    vz, vh, vn = verify_zh
    return ck, args, grid, attention_args(vz, vh, vn, d), (vn // 128, vz * vh, 1), vz * vh, {}


def fastest_gemm_config(m: int, n: int, k: int, configs: list[GemmTile]) -> tuple[GemmTile, dict[str, float]]:
    """Triton's own best schedule among ``configs`` (the schedule SIP then starts from): each config checked against
    LeakyReLU(A B) in fp32 on poisoned output, then timed (``gpu_time_ms``)."""
    import torch

    from kfuse.bench.harness import gpu_time_ms, max_rel_err

    times: dict[str, float] = {}
    for cfg in configs:
        ck, args, grid = gemm_launch(m, n, k, cfg)
        a, b, c = args[:3]
        c.fill_(float("nan"))
        ck[grid](*args)
        err = max_rel_err(c, torch.nn.functional.leaky_relu(a.float() @ b.float(), 0.01))
        if not err <= 1e-2:  # an unwritten (NaN) output fails too
            raise RuntimeError(f"GEMM config {config_name(cfg)} computes a wrong result (max rel err {err})")
        times[config_name(cfg)] = gpu_time_ms(lambda ck=ck, args=args, grid=grid: ck[grid](*args), warmup=5, rep=20)
    best = min(configs, key=lambda c: times[config_name(c)])
    return best, times


def gemm_case(m: int, n: int, k: int, configs: list[GemmTile] | None = None) -> tuple:
    """The GEMM + LeakyReLU case on Triton's fastest of ``configs`` (default: the tutorial's 128 x 128 tile alone);
    its last element, what the record says of the choice."""
    configs = configs or [TUTORIAL_GEMM]
    cfg, times = (configs[0], {}) if len(configs) == 1 else fastest_gemm_config(m, n, k, configs)
    ck, args, grid = gemm_launch(m, n, k, cfg)
    return ck, args, grid, None, None, 1, {"triton_config": config_name(cfg), "config_times_ms": times}


def case_error(name: str, ck, args: list, grid: tuple) -> float:
    """The case's kernel against PyTorch in fp32 on poisoned output: max relative error (NaN when it wrote nothing)."""
    import torch

    from kfuse.bench.harness import max_rel_err

    out = args[3] if name.startswith("attention") else args[2]
    out.fill_(float("nan"))
    ck[grid](*args)
    if name.startswith("attention"):
        q, k, v = args[:3]  # one head at a time: SIP's 16384-token head is 1 GiB of fp32 scores
        ref = torch.empty_like(out, dtype=torch.float32)
        for z in range(q.shape[0]):
            for h in range(q.shape[1]):
                qh, kh, vh = (t[z, h].float() for t in (q, k, v))
                ref[z, h] = torch.softmax(qh @ kh.T * args[4], dim=-1) @ vh
    else:
        ref = torch.nn.functional.leaky_relu(args[0].float() @ args[1].float(), 0.01)
    return max_rel_err(out, ref)


def form_comparison(name: str, gemm_configs: list[GemmTile], ck, args: list, grid: tuple) -> dict:
    """With ``--mma-form mma-sync``: the kernel SIP starts from and the same case in Triton's default form (wgmma),
    each checked against PyTorch and timed, so the record says how the Ampere-style code compares."""
    from kfuse.bench.harness import gpu_time_ms

    with mma_form("wgmma"):
        ck_w, args_w, grid_w = CASES[name](gemm_configs)[:3]
    out = {}
    for form, (k_, a_, g_) in (("mma-sync", (ck, args, grid)), ("wgmma", (ck_w, args_w, grid_w))):
        err = case_error(name, k_, a_, g_)
        if not err <= 2e-2:
            raise RuntimeError(f"{name} in the {form} form computes a wrong result (max rel err {err})")
        out[form] = {"ms": gpu_time_ms(lambda k_=k_, a_=a_, g_=g_: k_[g_](*a_), warmup=5, rep=50), "max_rel_err": err}
    return out


CASES = {
    "attention_sip_1x4x16384x64": lambda cfgs: attention_case(1, 4, 16384, 64, (8, 16, 1024)),
    "attention_bert_8x12x512x64": lambda cfgs: attention_case(8, 12, 512, 64, (64, 12, 512)),
    "gemm_leaky_relu_512x512x2048": lambda cfgs: gemm_case(512, 512, 2048, cfgs),
    "gemm_leaky_relu_bert_4096x768x768": lambda cfgs: gemm_case(4096, 768, 768, cfgs),
    "gemm_leaky_relu_bert_4096x3072x768": lambda cfgs: gemm_case(4096, 3072, 768, cfgs),
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="sass.json", help="a JSON file, or a directory to write sass.json in")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--search-s", type=float, default=20.0, help="wall-clock budget of each search")
    p.add_argument("--iters", type=int, default=120, help="annealing iterations per seed")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--samples", type=int, default=100_000, help="random input sets to verify an accepted schedule")
    p.add_argument("--deadline-s", type=float, default=270.0, help="stop starting new work after this many seconds")
    p.add_argument("--moves", default="memory", help="move set: memory (SIP's) or all (memory and register arithmetic)")
    p.add_argument("--always-verify", action="store_true", help="verify the best candidate even when it is not faster")
    p.add_argument("--gemm-configs", default=config_name(TUTORIAL_GEMM),
                   help="GEMM + LeakyReLU tiles BMxBNxBKwWARPSsSTAGES, comma-separated: with several, Triton's fastest of "
                        "them (checked, timed) is the schedule SIP starts from")  # fmt: skip
    p.add_argument("--mma-form", default="wgmma", choices=MMA_FORMS,
                   help="Triton's tensor-core code to tune: wgmma (its default on sm_90) or mma-sync (Ampere's HMMA fed by "
                        "LDSM, the code SIP tuned on the A100; the record also times the default form)")  # fmt: skip
    a = p.parse_args()
    try:
        gemm_configs = [parse_gemm_config(x) for x in a.gemm_configs.split(",") if x.strip()]
    except ValueError as e:
        p.error(str(e))
    out_path = Path(a.out) / "sass.json" if Path(a.out).is_dir() else Path(a.out)

    import torch

    from kfuse import __version__
    from kfuse.sass.api import optimize_compiled_kernel
    from kfuse.sass.schedule import move_set
    from kfuse.sass.search import SimulatedAnnealing

    movable = move_set(a.moves)
    t_begin = time.time()
    gpu = torch.cuda.get_device_name()
    records = []
    for name in a.cases.split(","):
        left = a.deadline_s - (time.time() - t_begin)
        if left < 30:
            print(f"skipping {name}: deadline", flush=True)
            continue
        with mma_form(a.mma_form):
            ck, args, grid, vargs, vgrid, per, choice = CASES[name](gemm_configs)
        choice = {**choice, "mma_form": a.mma_form}
        if a.mma_form != "wgmma":
            choice["forms"] = form_comparison(name, gemm_configs, ck, args, grid)
            print(f"{name}: {choice['forms']}", flush=True)
        sa = SimulatedAnnealing(iterations=a.iters, seeds=tuple(int(s) for s in a.seeds.split(",")), max_seconds=min(a.search_s, left - 25))
        t0 = time.time()
        try:
            res = optimize_compiled_kernel(
                ck,
                args,
                grid,
                strategy=sa,
                samples=a.samples,
                verify_args=vargs,
                verify_grid=vgrid,
                samples_per_launch=per,
                use_cache=False,
                apply=False,
                always_verify=a.always_verify,
                min_gain=0.01,
                movable=movable,
                log=lambda m: print(m, flush=True),
            )
            err = None
        except Exception as e:  # keep the other cases
            res, err = None, f"{type(e).__name__}: {e}"
        rec = {
            "benchmark": "sass_sip",
            "case": name,
            "gpu": gpu,
            "command": " ".join(sys.argv),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "kfuse_version": __version__,
            **choice,
        }
        if res is None:
            rec.update(
                {"error": err, "triton_ms": None, "kfuse_ms": None, "verified_samples": 0, "moves_applied": 0, "search_s": time.time() - t0}
            )
        else:
            rec.update(
                {
                    "triton_ms": res.triton_ms,
                    "kfuse_ms": res.kfuse_ms if res.accepted else res.triton_ms,
                    "best_candidate_ms": res.kfuse_ms,
                    "accepted": res.accepted,
                    "reason": res.reason,
                    "verified_samples": res.verified_samples,
                    "moves_applied": res.moves_applied if res.accepted else 0,
                    "moves_in_best_candidate": res.moves_applied,
                    "search_s": round(res.search_s, 2),
                    "legal_moves_at_start": res.legal_moves_at_start,
                    "move_set": a.moves,
                    "tried": res.trial_summary(),
                    "search_base_ms": res.search_base_ms,  # the original's time the candidates' A B B A ratios scale
                    "verify_samples_per_launch": per,
                    "candidate_failures": res.failures[:20],
                    "failed_candidates_displaced": res.failed_candidates[:20],
                    "best_candidate_verified_samples": res.best_candidate_verified,
                    "search": {
                        "iterations_per_seed": a.iters,
                        "seeds": a.seeds,
                        "max_seconds": sa.max_seconds,
                        "T": 0.4,
                        "cooling": 0.003,
                        "fitness": "paired (candidate / original timed next to it)",
                    },
                }
            )
        records.append(rec)
        out_path.write_text(json.dumps(records, indent=1))
        print(json.dumps(rec), flush=True)
    print(f"\n{'case':40s} {'triton ms':>10s} {'kfuse ms':>10s} {'gain':>7s} {'verified':>9s} {'moves':>5s} {'tried':>5s} {'wrong':>5s}")
    for r in records:
        t, k = r.get("triton_ms"), r.get("kfuse_ms")
        g = f"{(1 - k / t) * 100:+.1f}%" if t and k else "n/a"
        tried, wrong = r.get("tried", {}).get("tried", 0), r.get("tried", {}).get("failed", 0)
        print(
            f"{r['case']:40s} {t or float('nan'):10.4f} {k or float('nan'):10.4f} {g:>7s} "
            f"{r['verified_samples']:9d} {r['moves_applied']:5d} {tried:5d} {wrong:5d}"
        )


if __name__ == "__main__":
    main()
