"""What the Nsight Compute probes share (``ncu_gemm_probe.py``, ``ncu_depthwise_probe.py``): the child side runs
each kernel call after a warm-up and a check, then once more between cudaProfilerStart / Stop, printing an
``ORDER`` line per profiled call; the parent side finds ``ncu`` and reads its raw CSV page back with those lines."""

from __future__ import annotations

import csv
import glob
import io
import shutil
from collections.abc import Callable
from typing import Any

Call = tuple[str, str, Callable[[], Any], Any]  # (case, label, launch, what to check or None)


def profile_calls(calls: list[Call], check: Callable[[Any], str]) -> None:
    """Warm every call up (3 launches) and print ``CHECK case | label | check(what)`` for those with something to
    check; then launch each once inside the profiled range, in order."""
    import torch

    for case, label, fn, what in calls:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        if what is not None:
            print(f"CHECK {case} | {label} | {check(what)}", flush=True)
    torch.cuda.cudart().cudaProfilerStart()
    for case, label, fn, _ in calls:
        print(f"ORDER {case} | {label}", flush=True)
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def find_ncu() -> str | None:
    return shutil.which("ncu") or next(iter(sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)), None)


def read_raw(stdout: str) -> tuple[list[list[str]], list[str], str, list[dict[str, str]]]:
    """(the ORDER lines as [case, label], the CHECK lines, the raw CSV page, its kernel rows without the units row)."""
    order = [ln.split("ORDER ", 1)[1].split(" | ") for ln in stdout.splitlines() if ln.startswith("ORDER ")]
    checks = [ln for ln in stdout.splitlines() if ln.startswith("CHECK ")]
    body = stdout[stdout.find('"ID"') :] if '"ID"' in stdout else ""
    rows = [x for x in csv.DictReader(io.StringIO(body)) if x.get("ID", "").strip().isdigit()] if body else []
    return order, checks, body, rows
