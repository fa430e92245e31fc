"""Make the tuning records kfuse ships for this GPU (``kfuse/tune/records/<gpu slug>.json``, ``kfuse.tune.shipped``):
compile common models with ``tune="fast"`` into an empty database, then export it. Run on the GPU the records are for;
copy the file into ``kfuse/tune/records/`` and commit it.

    PYTHONPATH=. python benchmarks/ship_records.py --out $OUT            # GPU: bert-base B8/B32, resnet50 B32/B64, ...
    PYTHONPATH=. python benchmarks/ship_records.py --out /tmp/x --models mlp-tiny:8 --smoke   # CPU wiring check
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

DEFAULT_MODELS = "bert-base:8x128,bert-base:32x128,resnet50:32,resnet50:64,gpt2-small:8x512,vit-b16:64"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated NAME:BATCH or NAME:BATCHxSEQ")
    ap.add_argument("--smoke", action="store_true", help="CPU: the interpreter, nothing measured (an empty export)")
    ap.add_argument("--deadline-s", type=float, default=0.0, help="stop compiling new models after this many seconds (0: no limit)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    db_path = out / "ship.sqlite"
    if db_path.exists():
        db_path.unlink()
    os.environ["KFUSE_TUNE_DB"] = str(db_path)  # an empty database: every record below is measured here
    os.environ["KFUSE_SHIPPED_RECORDS"] = "0"  # and none seeded from an earlier shipped file
    if a.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    import kfuse
    import kfuse.models
    from kfuse.tune import shipped
    from kfuse.tune.database import TuningDB
    from kfuse.tune.hardware import query

    gpu = torch.cuda.is_available() and not a.smoke
    device, dtype = ("cuda", torch.float16) if gpu else ("cpu", torch.float32)
    t0 = time.perf_counter()
    for spec in a.models.split(","):
        if a.deadline_s and time.perf_counter() - t0 > a.deadline_s:
            print(f"deadline: {spec} and the rest not compiled", flush=True)
            break
        name, _, size = spec.partition(":")
        batch, _, seq = size.partition("x")
        t = time.perf_counter()
        try:
            model, args, kwargs = kfuse.models.build(name, batch=int(batch or 1), seq=int(seq) if seq else None, dtype=dtype, device=device)
            kfuse.compile(model, args, kwargs, tune="fast")
            print(f"{spec:20s} compiled and tuned in {time.perf_counter() - t:6.1f} s", flush=True)
        except Exception as e:  # one model that fails leaves the others' records
            print(f"{spec:20s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
    db = TuningDB(db_path)
    name = query(device).key()
    f = out / f"{shipped.slug(name)}.json"
    n = db.export(f)
    print(f"{n} records for {name!r} -> {f} ({time.perf_counter() - t0:.1f} s)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
