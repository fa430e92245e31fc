"""be_forms: each PTB form of a BE kernel is checked against its reference before it is timed, the fastest right one
is chosen, and the backend runs the kernel in it (issue 8, session 66's fair baseline)."""

from __future__ import annotations

import itertools

import pytest

from kfuse.colocate import be_forms, ptb, workloads
from kfuse.colocate.be_forms import BeForm
from kfuse.colocate.cuda_backend import CudaBackend


def _timer(values: list[float]):
    """A timer that runs the form once (so a broken launch fails here too) and returns the next of ``values``."""
    it = iter(values)

    def time_ms(fn):
        fn()
        return next(it)

    return time_ms


def test_every_form_is_checked_and_the_fastest_right_one_wins() -> None:
    w = workloads.make("histogram", small=True)
    own = w.kernel.num_warps
    # forms in order: (4, 2), (4, 4), (8, 2), (8, 4); the 8-warp grid of 2 an SM is fastest
    times = be_forms.solo_forms(w, _timer([0.9, 0.8, 0.5, 0.7]), ptb.num_sms("cpu"), warps=(4, 8), per_sm=(2, 4))
    assert times == {BeForm(4, 2): 0.9, BeForm(4, 4): 0.8, BeForm(8, 2): 0.5, BeForm(8, 4): 0.7}
    assert be_forms.fastest(times) == BeForm(8, 2)
    assert w.kernel.num_warps == own  # timing leaves the kernel as it was


def test_a_form_that_skips_blocks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A form whose launch leaves half the blocks out is wrong on the poisoned output, however fast."""
    w = workloads.make("stencil7", small=True)
    real = ptb.launch_ptb

    def lossy(k, start=0, end=None, grid=None):
        end = k.n_blocks if end is None else end
        if grid == 2 * ptb.num_sms("cpu"):
            end = start + (end - start) // 2
        return real(k, start, end, grid)

    monkeypatch.setattr(be_forms.ptb, "launch_ptb", lossy)
    times = be_forms.solo_forms(w, _timer([0.1, 0.9]), ptb.num_sms("cpu"), warps=(4,), per_sm=(2, 4))
    assert times[BeForm(4, 2)] is None
    assert be_forms.fastest(times) == BeForm(4, 4)


def test_a_form_that_cannot_launch_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    w = workloads.make("histogram", small=True)
    real = ptb.launch_ptb

    def picky(k, start=0, end=None, grid=None):
        if k.num_warps == 8:
            raise RuntimeError("layout needs more lanes")
        return real(k, start, end, grid)

    monkeypatch.setattr(be_forms.ptb, "launch_ptb", picky)
    times = be_forms.solo_forms(w, _timer([0.5]), ptb.num_sms("cpu"), warps=(8, 4), per_sm=(4,))
    assert times == {BeForm(8, 4): None, BeForm(4, 4): 0.5}
    assert w.kernel.num_warps == workloads.make("histogram", small=True).kernel.num_warps


def test_no_right_form_is_an_error() -> None:
    with pytest.raises(ValueError, match="no PTB form"):
        be_forms.fastest({BeForm(4, 4): None})


def test_choose_names_the_kernel_with_no_right_form(monkeypatch: pytest.MonkeyPatch) -> None:
    w = workloads.make("histogram", small=True)
    monkeypatch.setattr(be_forms.workloads, "error", lambda work: 1.0)  # every form wrong
    with pytest.raises(ValueError, match="BE kernel histogram: no PTB form"):
        be_forms.choose(w, _timer([]), ptb.num_sms("cpu"))
    assert "be_programs_per_sm" not in w.kernel.meta  # nothing applied


def test_ties_go_to_fewer_warps_and_programs() -> None:
    times = dict(zip(itertools.product((8, 4), (4, 2)), (1.0, 1.0, 1.0, 1.0), strict=True))
    assert be_forms.fastest({BeForm(*f): t for f, t in times.items()}) == BeForm(4, 2)


def test_the_backend_runs_the_applied_form() -> None:
    w = workloads.make("histogram", small=True)
    other = workloads.make("stencil7", small=True)
    be_forms.apply(w, BeForm(8, 2))
    backend = CudaBackend([], {"histogram": w, "stencil7": other}, be_programs_per_sm=4)
    sms = ptb.num_sms("cpu")
    assert w.kernel.num_warps == 8
    assert backend._be_grid("histogram", 100) == 2 * sms
    assert backend._be_grid("histogram", 100, 3) == 6
    assert backend._be_grid("stencil7", 100) == 4 * sms  # no form applied: the backend's grid
    w.reset()
    backend.run_be("histogram", 0, w.kernel.n_blocks)
    assert workloads.error(w) == 0.0


def test_cli_refuses_an_unknown_form(tmp_path) -> None:
    from typer.testing import CliRunner

    from kfuse.cli import app

    args = ["colocate", "run", "--lc", "mlp-tiny", "--backend", "sim", "--be-form", "slowest", "--out", str(tmp_path)]
    bad = CliRunner().invoke(app, args)
    assert bad.exit_code != 0 and "--be-form" in bad.output


def test_one_program_a_block_is_a_form_of_its_own() -> None:
    """programs_per_sm 0 launches one program a block (the original kernel's launch, sliceable): right, chosen when
    fastest, and the backend sizes each launch's grid to its blocks."""
    assert str(BeForm(4, 0)) == "blocks_w4" and BeForm(4, 0).grid(10, 4) == 10 and BeForm(8, 2).grid(10, 4) == 8
    w = workloads.make("cutcp", small=True)
    times = be_forms.solo_forms(w, _timer([0.3, 0.5]), ptb.num_sms("cpu"), warps=(4,), per_sm=(0, 4))
    assert be_forms.fastest(times) == BeForm(4, 0)
    be_forms.apply(w, BeForm(4, 0))
    backend = CudaBackend([], {"cutcp": w}, be_programs_per_sm=4)
    assert backend._be_grid("cutcp", 3) == 3 and backend._be_grid("cutcp", 0) == 1
    w.reset()
    half = w.kernel.n_blocks // 2
    backend.run_be("cutcp", 0, half)  # two slices of the one-a-block form make the whole output
    backend.run_be("cutcp", half, w.kernel.n_blocks)
    assert workloads.error(w) <= w.tol
