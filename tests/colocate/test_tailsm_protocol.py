"""The ``tailsm`` protocol under adversarial interleavings.

The interpreter runs programs one after another, so it never shows two programs of one SM at once: the
case the per-SM flags exist for. This test runs a step-for-step Python mirror of ``tailsm_kernel`` (every
atomic is one step; an LC or BE block takes a random number of steps) under random schedules of all
programs, and checks what a GPU launch relies on: the launch ends (a wait that never ends would hang the
device call), every LC and BE block runs exactly once, and the counters and flags are zero afterwards.
When every LC program has raised its flag before the BE programs look (on the GPU the LC programs have
the lower ids and are dispatched first), no BE block runs on an SM while an LC block runs there.
Keep it in step with ``tailsm_kernel`` in ``kfuse/colocate/fuser.py``.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator

import pytest

from kfuse.colocate import fuser
from kfuse.colocate.fuser import tailsm_plan

# the atomics of ``tailsm_kernel``, in source order, that ``_Launch.program`` mirrors step for step
MIRRORED_ATOMICS = [
    ("atomic_add", "lc_on_sm", "1"), ("atomic_add", "lc_on_sm", "-1"),  # LC: raise, lower the SM's flag
    ("atomic_add", "ctr + 1", "0"), ("atomic_add", "lc_on_sm", "0"),  # BE: read the ticket and the flag
    ("atomic_add", "ctr + 1", "0"), ("atomic_add", "lc_on_sm", "0"),  # ... again while waiting
    ("atomic_add", "ctr + 1", "be_chunk"), ("atomic_add", "ctr + 1", "be_chunk"),  # first and next tickets
    ("atomic_add", "ctr + 2", "1"), ("atomic_xchg", "ctr + 1", "0"), ("atomic_xchg", "ctr + 2", "0"),  # join, reset
]  # fmt: skip


def test_the_mirror_follows_the_kernels_atomics() -> None:
    """The mirror below is hand-written: if ``tailsm_kernel``'s atomics change, this fails until the
    mirror (and this list) are brought in step."""
    body = fuser._FUSED[fuser._FUSED.index("def tailsm_kernel") :]
    body = body.split("\n@triton.jit")[0]
    assert re.findall(r"tl\.(atomic_\w+)\(([^,]+), ([^,)]+)", body) == MIRRORED_ATOMICS


class _Launch:
    def __init__(self, n_sm: int, n_lc: int, n_be: int, per_sm: int, rng: random.Random, wait: bool = True) -> None:
        self.n_sm, self.n_lc, self.n_be, self.nprog = n_sm, n_lc, n_be, n_sm * per_sm
        self.lc_progs, self.join, self.chunk = tailsm_plan(n_lc, n_be, self.nprog)
        self.wait = wait  # False: the control without the flag wait
        self.ctr = [0, 0, 0]
        self.lc_on_sm = [0] * n_sm
        self.lc_running = [0] * n_sm
        self.be_beside_lc = 0  # BE blocks started while an LC block ran on the same SM
        self.lc_done: Counter[int] = Counter()
        self.be_done: Counter[int] = Counter()
        self.rng = rng

    def _work(self) -> Iterator[None]:
        for _ in range(self.rng.randint(1, 4)):
            yield

    def program(self, pid: int) -> Iterator[None]:
        sm = (pid * 7 + 3) % self.n_sm  # any placement: the mirror does not assume the hardware's
        if pid < self.lc_progs:
            self.lc_on_sm[sm] += 1
            yield
            for t in range(pid, self.n_lc, self.lc_progs):
                self.lc_running[sm] += 1
                yield from self._work()
                self.lc_done[t] += 1
                self.lc_running[sm] -= 1
            self.lc_on_sm[sm] -= 1
            yield
        if pid < self.lc_progs and not self.join:
            return
        c = self.ctr[1]
        yield
        busy = self.lc_on_sm[sm]
        yield
        while self.wait and busy > 0 and c < self.n_be:
            c = self.ctr[1]
            yield
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
                    self.be_beside_lc += self.lc_running[sm] > 0
                    yield from self._work()
                    self.be_done[c + j] += 1
            c = nxt
        n_join = self.nprog if self.join else self.nprog - self.lc_progs
        done = self.ctr[2]
        self.ctr[2] += 1
        yield
        if done == n_join - 1:
            self.ctr[1] = self.ctr[2] = 0

    def run(self, lc_first: bool = False, max_steps: int = 200_000) -> int:
        live = [self.program(p) for p in range(self.nprog)]
        steps = 0
        if lc_first:  # every LC program raises its flag before any other program moves
            for p in range(self.lc_progs):
                next(live[p])
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
def test_tailsm_protocol_ends_and_runs_every_block_once(n_sm: int, lc_per_sm: float, n_be: int) -> None:
    n_lc = round(lc_per_sm * n_sm)
    for seed in range(25):
        for lc_first in (False, True):
            launch = _Launch(n_sm, n_lc, n_be, per_sm=2, rng=random.Random(seed))
            launch.run(lc_first)
            assert launch.lc_done == Counter(range(n_lc)), (seed, launch.lc_done)
            assert launch.be_done == Counter(range(n_be)), (seed, launch.be_done)
            assert launch.ctr == [0, 0, 0] and launch.lc_on_sm == [0] * n_sm
            if lc_first:
                assert launch.be_beside_lc == 0, (seed, n_lc, n_be)


def test_the_exclusivity_check_is_live_without_the_wait() -> None:
    """Without the flag wait, BE blocks do start beside LC blocks under some schedule."""
    seen = 0
    for seed in range(50):
        launch = _Launch(4, 3, 40, per_sm=2, rng=random.Random(seed), wait=False)
        launch.run(lc_first=True)
        seen += launch.be_beside_lc
    assert seen > 0
