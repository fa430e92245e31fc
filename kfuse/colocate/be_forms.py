"""A BE kernel's fastest sliceable form: the warps and the grid (persistent, or one program a block) of its PTB kernel.

Time sharing (the baseline every co-location policy is judged against) and every fused profile's load ratio x run
the BE kernel as PTB. If that form is slower than the kernel can run, each policy that runs the BE's blocks in
another form (a fused kernel on the LC's warps, the ``ws`` worker partition on its own) "gains" the difference without
any co-location. Session 66 found exactly that: histogram's PTB kernel on 4 warps took 0.78 ms, on 8 warps 0.37 ms
(H100), and Aker's histogram gains fell from +8..+37% to +1..+4%. So the baseline runs each BE kernel in the fastest
of its sliceable forms, each checked against the kernel's reference before it is timed: the PTB kernel on a persistent
grid of 2 / 4 / 8 programs an SM, or on one program a block (``programs_per_sm`` 0: the original kernel's launch,
which session 66 timed 12-24% faster than 4 programs an SM for mri-q, stencil7 and cutcp), on 4 or 8 warps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kfuse.colocate import ptb, workloads
from kfuse.colocate.workloads import Workload

WARPS = (4, 8)
PROGRAMS_PER_SM = (0, 2, 4, 8)  # 0: one program a block (any block range still runs alone: a slice)


@dataclass(frozen=True, order=True)
class BeForm:
    warps: int
    programs_per_sm: int  # 0: one program a block

    def __str__(self) -> str:
        return f"{'blocks' if self.programs_per_sm == 0 else f'ptb{self.programs_per_sm}'}_w{self.warps}"

    def grid(self, blocks: int, sms: int) -> int:
        """Programs for a launch of ``blocks`` blocks on ``sms`` SMs."""
        return max(1, blocks) if self.programs_per_sm == 0 else self.programs_per_sm * sms


def solo_forms(
    work: Workload, time_ms: Callable[[Callable[[], Any]], float], sms: int,
    warps: Sequence[int] = WARPS, per_sm: Sequence[int] = PROGRAMS_PER_SM,
) -> dict[BeForm, float | None]:  # fmt: skip
    """Each PTB form's time in ms; None where the form computed a wrong result or could not be launched (a layout
    the block function does not allow on that many warps). The kernel is left as it was."""
    k = work.kernel
    own = k.num_warps
    out: dict[BeForm, float | None] = {}
    try:
        for w in warps:
            k.num_warps = w
            for p in per_sm:
                form = BeForm(w, p)

                def run(grid: int = form.grid(k.n_blocks, sms)) -> None:
                    ptb.launch_ptb(k, 0, k.n_blocks, grid)

                try:
                    work.reset()  # poisoned outputs, so a form that skips blocks cannot pass
                    run()
                    if workloads.error(work) > max(work.tol, 1e-6):
                        out[form] = None
                        continue
                    out[form] = time_ms(run)
                except Exception:  # compile or launch failure: not a form this kernel has
                    out[form] = None
    finally:
        k.num_warps = own
    return out


def fastest(times: dict[BeForm, float | None]) -> BeForm:
    """The fastest right form (ties: fewer warps, then fewer programs; one a block counts as fewest)."""
    ok = {f: t for f, t in times.items() if t is not None}
    if not ok:
        raise ValueError("no PTB form of this kernel computed the right result")
    return min(ok, key=lambda f: (ok[f], f))


def choose(work: Workload, time_ms: Callable[[Callable[[], Any]], float], sms: int) -> tuple[BeForm, dict[BeForm, float | None]]:
    """Time ``work``'s forms, run it in the fastest right one from now on; (that form, every form's time)."""
    times = solo_forms(work, time_ms, sms)
    try:
        best = fastest(times)
    except ValueError as e:
        raise ValueError(f"BE kernel {work.name}: {e}") from None
    apply(work, best)
    return best, times


def apply(work: Workload, form: BeForm) -> None:
    """Run ``work``'s PTB kernel in ``form`` from now on (``CudaBackend`` reads the grid from the kernel's meta)."""
    work.kernel.num_warps = form.warps
    work.kernel.meta["be_programs_per_sm"] = form.programs_per_sm


def current(work: Workload, default: int) -> BeForm:
    """The form ``work``'s PTB kernel runs in: ``apply``'s, else its own warps on ``default`` programs an SM."""
    return BeForm(work.kernel.num_warps, int(work.kernel.meta.get("be_programs_per_sm", default)))


def grid(work: Workload, blocks: int, sms: int, default: int) -> int:
    """Programs for a launch of ``blocks`` of ``work``'s blocks on ``sms`` SMs, in its form (``default`` programs an
    SM where none was applied)."""
    return current(work, default).grid(blocks, sms)
