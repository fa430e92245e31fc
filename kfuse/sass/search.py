"""Search over schedules: simulated annealing as in SIP, behind a small pluggable interface."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from .schedule import Schedule

# measured time in ms of a candidate, or None when it crashed, hung or computed something else
Fitness = Callable[[Schedule], float | None]


@dataclass
class Trial:
    seed: int
    iteration: int
    moves: int
    ms: float | None  # None: the candidate failed
    accepted: bool


@dataclass
class SearchResult:
    best: Schedule
    best_ms: float
    start_ms: float
    trials: list[Trial] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def gain(self) -> float:
        return 1.0 - self.best_ms / self.start_ms


class Strategy(Protocol):
    def search(
        self, start: Schedule, fitness: Fitness, start_ms: float, progress: Callable[[int, int, float], None] | None = None
    ) -> SearchResult: ...


@dataclass
class SimulatedAnnealing:
    """SIP's annealing: one random legal move per step; worse schedules are accepted with probability
    exp(-slowdown% / T); T starts at `temperature` and is multiplied by (1 - cooling) every step."""

    iterations: int = 1000
    temperature: float = 0.4
    cooling: float = 0.003
    seeds: tuple[int, ...] = (0, 1, 2)
    max_seconds: float | None = None

    def search(
        self, start: Schedule, fitness: Fitness, start_ms: float, progress: Callable[[int, int, float], None] | None = None
    ) -> SearchResult:
        t_start = time.time()
        best, best_ms = start, start_ms
        trials: list[Trial] = []
        memo: dict[tuple[int, ...], float | None] = {tuple(start.order): start_ms}
        total = self.iterations * len(self.seeds)
        done = 0
        for seed in self.seeds:
            rng = random.Random(seed)
            cur, cur_ms, temp = start, start_ms, self.temperature
            for it in range(self.iterations):
                if self.max_seconds is not None and time.time() - t_start > self.max_seconds:
                    return SearchResult(best, best_ms, start_ms, trials, time.time() - t_start)
                moves = cur.legal_moves()
                if not moves:  # a dead end (not every legal move can be undone): go on from the best so far, or the start
                    restart = next(((s, ms, m) for s, ms in ((best, best_ms), (start, start_ms)) if (m := s.legal_moves())), None)
                    if restart is None:
                        break
                    cur, cur_ms, moves = restart
                cand = cur.apply(rng.choice(moves))
                key = tuple(cand.order)
                if key not in memo:
                    memo[key] = fitness(cand)
                ms = memo[key]
                accepted = False
                if ms is not None:
                    delta = (ms - cur_ms) / cur_ms * 100.0
                    accepted = delta <= 0 or rng.random() < math.exp(-delta / max(temp, 1e-6))
                    if accepted:
                        cur, cur_ms = cand, ms
                    if ms < best_ms:
                        best, best_ms = cand, ms
                trials.append(Trial(seed, it, len(cand.applied), ms, accepted))
                temp *= 1.0 - self.cooling
                done += 1
                if progress is not None:
                    progress(done, total, best_ms)
        return SearchResult(best, best_ms, start_ms, trials, time.time() - t_start)


def random_walk(start: Schedule, steps: int, rng: random.Random) -> Schedule:
    """``start`` after up to ``steps`` random legal moves (fewer where none is left)."""
    cand = start
    for _ in range(steps):
        moves = cand.legal_moves()
        if not moves:
            break
        cand = cand.apply(rng.choice(moves))
    return cand


@dataclass
class RandomWalk:
    """Baseline strategy: apply `steps` random legal moves, keep the best of `samples` walks."""

    samples: int = 50
    steps: int = 10
    seed: int = 0

    def search(
        self, start: Schedule, fitness: Fitness, start_ms: float, progress: Callable[[int, int, float], None] | None = None
    ) -> SearchResult:
        t0 = time.time()
        rng = random.Random(self.seed)
        best, best_ms, trials = start, start_ms, []
        for k in range(self.samples):
            cand = random_walk(start, self.steps, rng)
            ms = fitness(cand)
            if ms is not None and ms < best_ms:
                best, best_ms = cand, ms
            trials.append(Trial(self.seed, k, len(cand.applied), ms, ms is not None and ms <= best_ms))
            if progress is not None:
                progress(k + 1, self.samples, best_ms)
        return SearchResult(best, best_ms, start_ms, trials, time.time() - t0)


STRATEGIES: dict[str, type] = {"anneal": SimulatedAnnealing, "random": RandomWalk}
