"""Session 28: which b2b tilings give wrong results (or fault) on the H200 at a few rows.

Session 28's first GPU run failed ``tests/kernels/test_b2b_tiny_gpu.py`` on its first tiling
("register m64 k64 n32 w4 s2", relative error 1.0-1.8 at M = 1, 2, 3 and 130) and hit an illegal
address compiling mlp-tiny. The test stops at the first bad tiling; this script runs every
candidate of a few chains, each tiling in its own process (a fault ends only that tiling's runs,
and the last line it logged names the row count), first with the weights preloaded (the suspected
workaround: the preloading tiling passed where its plain twin failed), then as listed.
Run 2 of session 28 (one process per chain) is in ``experiments/s28_b2b_tiny_diag_run2.json``.

    python benchmarks/experiments/b2b_tiny_diag.py OUT.json      # the driver
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

CHAINS = {  # name: (k0, widths, epilogues per stage: "gelu" / "relu" / "")
    "mlp_tiny_3": (64, [128, 128, 32], ["gelu", "relu", ""]),
    "two_128_32": (64, [128, 32], ["gelu", ""]),
    "two_128_128": (64, [128, 128], ["gelu", ""]),
    "plain_3": (64, [128, 128, 32], ["", "", ""]),
}
ROWS = [int(r) for r in os.environ.get("DIAG_ROWS", "1,3,130,4096").split(",")]
DEV = os.environ.get("DIAG_DEVICE", "cuda")  # "cpu": the interpreter (a check of this script)


def one_chain(name: str, index: int | None) -> None:
    import torch

    import kfuse  # noqa: F401 - sets the interpreter on a CPU machine
    from kfuse.kernels import b2b
    from kfuse.kernels.epilogue import Epilogue, EpilogueStep, Operand

    k0, widths, acts = CHAINS[name]
    dt = torch.float16

    def epi(act: str) -> tuple[Epilogue, int]:
        if not act:
            return Epilogue(), 0
        r = Operand("reg", 0)
        return Epilogue((EpilogueStep("add", (r, Operand("in", 0))), EpilogueStep(act, (Operand("reg", 1),))), 1), 1

    eps = [epi(a) for a in acts]
    chain = b2b.Chain(tuple(b2b.Stage(e, dt) for e, _ in eps))
    ks = [k0] + widths[:-1]

    def check(m: int, cfg: b2b.B2BConfig, ch: b2b.Chain = chain) -> float | str:
        torch.manual_seed(m)
        x = torch.randn(m, k0, device=DEV, dtype=dt)
        ws = [(torch.randn(n, k, device=DEV) / k**0.5).to(dt).t() for k, n in zip(ks, widths, strict=True)]
        ex = [[torch.randn(w, device=DEV, dtype=dt)] if n else [] for w, (_, n) in zip(widths, eps, strict=True)]
        ref = b2b.reference(ch, x.cpu(), [w.cpu() for w in ws], [None] * len(ws), [[e.cpu() for e in es] for es in ex]).double()
        out = torch.full((m, widths[-1]), float("nan"), device=DEV, dtype=dt)
        try:
            b2b.b2b_chain(ch, x, ws, [None] * len(ws), ex, cfg, out=out)
            torch.cuda.synchronize() if DEV == "cuda" else None
        except Exception as e:  # noqa: BLE001 - a compile error is a result here
            if "illegal" in str(e):
                raise
            return f"error: {type(e).__name__}: {str(e)[:120]}"
        got = out.cpu().double()
        if torch.isnan(got).any():
            return f"nan in {int(torch.isnan(got).sum())} of {got.numel()}"
        return round((got - ref).abs().max().item() / max(ref.abs().max().item(), 1e-6), 5)

    cands = list(dict.fromkeys([b2b.default_config(130, widths), *b2b.candidate_configs(130, widths, k0)]))
    if index is None:
        print(json.dumps({"n_configs": len(cands)}), flush=True)
        return
    base = cands[index]
    # the preloading form first: it is the suspected workaround, and a fault ends the process
    for variant, cfg in (("preload", replace(base, preload=True)), ("as listed", base)):
        for m in ROWS:
            print(json.dumps({"chain": name, "m": m, "config": base.describe(), "variant": variant, "start": True}), flush=True)
            err = check(m, cfg)
            print(json.dumps({"chain": name, "m": m, "config": base.describe(), "variant": variant, "err": err}), flush=True)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        one_chain(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
        return
    out_path = sys.argv[1] if len(sys.argv) > 1 else "b2b_tiny_diag.json"

    def run(args: list[str]) -> tuple[str, str, int]:
        p = subprocess.run([sys.executable, __file__, "--one", *args], capture_output=True, text=True, timeout=400)
        return p.stdout, p.stderr, p.returncode

    jobs = []
    for name in CHAINS:
        out, err, _ = run([name])
        n = json.loads(out.splitlines()[-1])["n_configs"]
        jobs += [[name, str(i)] for i in range(n)]
    rows = []
    # one process per (chain, tiling), four at a time: a fault ends only its own tiling's runs
    with ThreadPoolExecutor(4) as pool:
        for out, err, rc in pool.map(run, jobs):
            lines = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            done = {(r["m"], r["variant"]) for r in lines if "err" in r}
            for r in lines:
                if "start" in r and (r["m"], r["variant"]) not in done:
                    last = err.strip().splitlines()[-1][:160] if err.strip() else ""
                    r = {**r, "err": f"process ended here (rc {rc}): {last}"}
                    r.pop("start")
                if "start" not in r:
                    rows.append(r)
    with open(out_path, "w") as f:
        json.dump(rows, f, indent=1)
    bad = [r for r in rows if not (isinstance(r["err"], float) and r["err"] < 2e-2)]
    print(f"{len(rows)} runs, {len(bad)} bad")
    for r in bad:
        print(r["chain"], r["m"], r["config"], r["variant"], r["err"])


if __name__ == "__main__":
    main()
