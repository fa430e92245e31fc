"""pytest plugin: append each failing test's id and the last lines of its report to a file as soon as it
fails, so a run cut short by a time limit keeps what it found.  Use: ``pytest -p tests.failure_log``
with ``KFUSE_FAILURE_LOG=path`` (the device's runs end at a hard limit; pytest's own summary comes last).
With ``KFUSE_DONE_LOG=path`` it also appends the id of every test that finished (passed, failed or
skipped), so a cut run's remainder can be run next (``benchmarks/run_suite_gpu.sh`` writes ``not_run.txt``)."""

from __future__ import annotations

import os

import pytest


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    done = os.environ.get("KFUSE_DONE_LOG")
    if done and report.when == "teardown" and not os.environ.get("PYTEST_XDIST_WORKER"):  # every test has one
        with open(done, "a") as f:
            f.write(report.nodeid + "\n")
    path = os.environ.get("KFUSE_FAILURE_LOG")
    # under pytest-xdist the controller receives every worker's reports: log there only, once a failure
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    text = str(report.longrepr) if report.longrepr is not None else ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    tail = "\n    ".join(lines[-6:])
    with open(path, "a") as f:
        f.write(f"{report.nodeid} [{report.when}]\n    {tail}\n")
