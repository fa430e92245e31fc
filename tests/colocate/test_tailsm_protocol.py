"""The ``tailsm`` ticket protocol under adversarial interleavings.

The interpreter runs programs one after another, so it never shows two programs of one SM at once:
the case the per-SM cap and the staged tickets exist for. This test runs a step-for-step Python
mirror of ``tailsm_kernel`` (every atomic is one step; an LC or BE block takes a random number of
steps) under random schedules of all programs, and checks what a GPU launch relies on: the launch
ends (a wait that never ends would hang the device call), every LC and BE block runs exactly once,
no SM ever runs more than ``lc_cap`` LC blocks at once, and the counters are zero afterwards.
Keep it in step with ``tailsm_kernel`` in ``kfuse/colocate/fuser.py``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

from kfuse.colocate.fuser import tailsm_plan


class _Launch:
    def __init__(self, n_sm: int, n_lc: int, n_be: int, per_sm: int, rng: random.Random) -> None:
        self.n_sm, self.n_lc, self.n_be, self.nprog = n_sm, n_lc, n_be, n_sm * per_sm
        self.cap, self.chunk = tailsm_plan(n_lc, n_be, n_sm, per_sm)
        self.stage = n_sm  # the k-th LC program of an SM waits for k * stage tickets
        self.ctr = [0, 0, 0]
        self.lc_on_sm = [0] * n_sm
        self.lc_running = [0] * n_sm
        self.max_running = 0
        self.lc_done: Counter[int] = Counter()
        self.be_done: Counter[int] = Counter()
        self.rng = rng

    def _work(self) -> Iterator[None]:
        for _ in range(self.rng.randint(1, 4)):
            yield

    def program(self, pid: int) -> Iterator[None]:
        sm = pid % self.n_sm  # any placement: the mirror does not assume the hardware's
        here = self.lc_on_sm[sm]
        self.lc_on_sm[sm] += 1
        yield
        if here < self.cap:
            out = self.ctr[0]
            yield
            while out < here * self.stage:
                out = self.ctr[0]
                yield
            t = self.ctr[0]
            self.ctr[0] += 1
            yield
            while t < self.n_lc:
                self.lc_running[sm] += 1
                self.max_running = max(self.max_running, self.lc_running[sm])
                yield from self._work()
                self.lc_done[t] += 1
                self.lc_running[sm] -= 1
                t = self.ctr[0]
                self.ctr[0] += 1
                yield
        self.lc_on_sm[sm] -= 1
        yield
        busy = self.lc_on_sm[sm]
        yield
        while busy > 0:
            busy = self.lc_on_sm[sm]
            yield
        c = self.ctr[1]
        self.ctr[1] += self.chunk
        yield
        while c < self.n_be:
            nxt = self.ctr[1]
            self.ctr[1] += self.chunk
            yield
            for j in range(self.chunk):
                if c + j < self.n_be:
                    yield from self._work()
                    self.be_done[c + j] += 1
            c = nxt
        done = self.ctr[2]
        self.ctr[2] += 1
        yield
        if done == self.nprog - 1:
            self.ctr = [0, 0, 0]

    def run(self, max_steps: int = 200_000) -> int:
        live = [self.program(p) for p in range(self.nprog)]
        steps = 0
        while live:
            i = self.rng.randrange(len(live))
            try:
                next(live[i])
            except StopIteration:
                live.pop(i)
            steps += 1
            if steps > max_steps:
                raise AssertionError(f"no end after {max_steps} steps: ctr {self.ctr}, lc_on_sm {self.lc_on_sm}")
        return steps


@pytest.mark.parametrize("n_sm", [2, 3, 5])
@pytest.mark.parametrize("lc_per_sm", [0.0, 0.34, 1.0, 1.2, 2.0, 3.4])
@pytest.mark.parametrize("n_be", [0, 1, 7, 90])
def test_tailsm_protocol_ends_runs_every_block_once_and_keeps_the_cap(n_sm: int, lc_per_sm: float, n_be: int) -> None:
    n_lc = round(lc_per_sm * n_sm)
    for seed in range(25):
        launch = _Launch(n_sm, n_lc, n_be, per_sm=2, rng=random.Random(seed))
        launch.run()
        assert launch.lc_done == Counter(range(n_lc)), (seed, launch.lc_done)
        assert launch.be_done == Counter(range(n_be)), (seed, launch.be_done)
        assert launch.max_running <= launch.cap, (seed, launch.max_running, launch.cap)
        assert launch.ctr == [0, 0, 0] and launch.lc_on_sm == [0] * n_sm


def test_the_mirror_can_fail_without_the_cap() -> None:
    """With the cap and the staging lifted (the first, measured version), two LC blocks share an SM
    under some schedule: the cap check above is live."""
    seen = 0
    for seed in range(50):
        launch = _Launch(4, 4, 0, per_sm=2, rng=random.Random(seed))
        launch.cap, launch.stage = 2, 0
        launch.run()
        seen = max(seen, launch.max_running)
    assert seen == 2
