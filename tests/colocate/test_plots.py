"""The experiment's PNGs: the LC latency CDF with the QoS line and the BE throughput as a gain over time sharing."""

from pathlib import Path

import matplotlib.image as mpimg
import pytest

from kfuse.colocate.experiment import gain, plot, run_experiment
from kfuse.colocate.sim import h200_like


@pytest.fixture(scope="module")
def result() -> dict:
    sim = h200_like({(1, 1): 0.3}, noise=0.0)
    return run_experiment(sim, ["sgemm", "lbm"], versions=[(1, 1)], policies=("lc_alone", "timeshare", "aker"), seconds=0.2,
                          min_queries=150, reps=3, log=lambda s: None)  # fmt: skip


def test_plots_write_both_pngs_per_lc(result: dict, tmp_path: Path) -> None:
    paths = plot(result, "sim-lc_with_a_long_name", tmp_path)
    assert [p.name for p in paths] == [
        "colocate_sim-lc_with_a_long_name_latency_cdf.png",
        "colocate_sim-lc_with_a_long_name_be_throughput.png",
    ]
    for p in paths:
        img = mpimg.imread(p)
        assert img.shape[0] > 300 and img.shape[1] > 500  # wide enough for the title and the legend beside the bars
        assert img[..., :3].std() > 0.05  # something drawn, not a blank canvas


def test_the_throughput_plot_shows_each_policys_gain_over_time_sharing(result: dict, tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen: list[str] = []
    real = plt.Axes.annotate

    def spy(self, text, *a, **k):  # type: ignore[no-untyped-def]
        seen.append(text)
        return real(self, text, *a, **k)

    plt.Axes.annotate = spy  # type: ignore[method-assign]
    try:
        plot(result, "sim", tmp_path)
    finally:
        plt.Axes.annotate = real  # type: ignore[method-assign]
    want = {f"{100 * gain(result, be, pol):+.1f}%" for be in ("sgemm", "lbm") for pol in ("timeshare", "aker")}
    assert want <= {t.split("\n")[0] for t in seen}
    assert "+0.0%" in {t.split("\n")[0] for t in seen}  # time sharing against itself


def test_kfuse_colocate_takes_the_issues_form_without_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kfuse colocate --lc ... --be ...` (the issue's command) runs the experiment, as `kfuse colocate run` does."""
    import json

    from kfuse.cli import main, with_default_subcommand

    assert with_default_subcommand(["colocate", "--lc", "x"]) == ["colocate", "run", "--lc", "x"]
    assert with_default_subcommand(["colocate", "--help"]) == ["colocate", "--help"]
    assert with_default_subcommand(["colocate", "run", "--lc", "x"]) == ["colocate", "run", "--lc", "x"]
    assert with_default_subcommand(["sass", "--help"]) == ["sass", "--help"]
    with pytest.raises(SystemExit) as e:
        main(["colocate", "--lc", "mlp-tiny", "--be", "histogram", "--backend", "sim", "--seconds", "0.05",
              "--policies", "lc_alone,timeshare,aker", "--out", str(tmp_path)])  # fmt: skip
    assert e.value.code == 0
    recs = json.loads((tmp_path / "colocate.json").read_text())
    assert {r["policy"] for r in recs} == {"lc_alone", "timeshare", "aker", "timeshare_rerun"}
    out = capsys.readouterr().out
    assert "| mlp-tiny+histogram | aker " in out and "mlp-tiny: best per pair, mean over 1 pairs" in out  # the summary
    assert (tmp_path / "colocate_mlp-tiny_be_throughput.png").stat().st_size > 0


def test_without_time_sharing_the_plot_says_no_gain_rather_than_zero(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = h200_like({(1, 1): 0.3}, noise=0.0)
    res = run_experiment(sim, ["sgemm"], versions=[(1, 1)], policies=("lc_alone", "aker"), seconds=0.2, min_queries=150, reps=3,
                         log=lambda s: None)  # fmt: skip
    seen: list[str] = []
    real = plt.Axes.annotate
    plt.Axes.annotate = lambda self, text, *a, **k: (seen.append(text), real(self, text, *a, **k))[1]  # type: ignore[method-assign]
    try:
        plot(res, "sim", tmp_path)
    finally:
        plt.Axes.annotate = real  # type: ignore[method-assign]
    assert [t.split("\n")[0] for t in seen] == ["n/a"]
