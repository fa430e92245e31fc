"""``kfuse colocate pairs`` (``kfuse.colocate.pairs``, also ``benchmarks/colocate_pairs.py``): issue 8's per-pair
table from co-location records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kfuse.colocate import pairs as _pairs


def _module():  # noqa: ANN202
    return _pairs


def _rec(case: str, policy: str, gain: float | None, p99: float = 4.0, qos: float = 7.0, gpu: str = "H100") -> dict:
    return {"benchmark": "colocate", "case": case, "policy": policy, "gpu": gpu, "be_gain_vs_timesharing": gain,
            "p99_ms": p99, "qos_ms": qos, "violations": 0 if p99 <= qos else 5}  # fmt: skip


def test_the_best_policy_keeps_qos_the_latest_file_wins_and_the_mean_is_per_lc(tmp_path: Path) -> None:
    m = _module()
    old = [_rec("bert-base+lbm", "timeshare", 0.0), _rec("bert-base+lbm", "partition", 0.02)]
    new = [
        _rec("bert-base", "lc_alone", None),
        _rec("bert-base+lbm", "timeshare", 0.0),
        _rec("bert-base+lbm", "partition", 0.06),
        _rec("bert-base+lbm", "streams", 0.50, p99=9.0),  # faster, but past QoS: never the best
        _rec("bert-base+histogram", "auto", 0.35),
        _rec("resnet50+mriq", "streams", 0.10, p99=9.0),
    ]
    (tmp_path / "colocate_s1.json").write_text(json.dumps(old))
    (tmp_path / "colocate_s2.json").write_text(json.dumps({"records": new}))
    table = m.pairs(m.load([str(tmp_path / "colocate_s2.json"), str(tmp_path / "colocate_s1.json")]))
    assert table[("H100, LC: PTB stand-in GEMMs", "bert-base+lbm")]["partition"]["be_gain_vs_timesharing"] == 0.06  # the later file's
    text = m.markdown(table)
    assert "| bert-base+lbm | partition +6.0%, streams +50.0% (QoS missed) | partition +6.0% |" in text
    assert "| resnet50+mriq | streams +10.0% (QoS missed) | none keeps QoS |" in text
    assert "bert-base: best per pair, mean over 2 pairs: +20.5%" in text
    assert "resnet50" not in text.split("bert-base: best per pair")[1]  # no pair kept QoS: no mean for it


def test_the_compiled_lc_and_the_stand_in_are_separate_tables(tmp_path: Path) -> None:
    m = _module()
    stand_in = [_rec("bert-base+histogram", "auto", 0.35), _rec("bert-base+histogram", "partition", 0.10)]
    plan = [{**_rec("bert-base+histogram", "partition", 0.03), "lc_gemms": "plan"}]
    (tmp_path / "colocate_s53.json").write_text(json.dumps(stand_in))
    (tmp_path / "colocate_s54.json").write_text(json.dumps(plan))
    table = m.pairs(m.load([str(tmp_path / "colocate_s53.json"), str(tmp_path / "colocate_s54.json")]))
    # the later file does not overwrite the stand-in's partition, and the stand-in's auto is not the compiled LC's best
    assert table[("H100, LC: PTB stand-in GEMMs", "bert-base+histogram")]["partition"]["be_gain_vs_timesharing"] == 0.10
    assert set(table[("H100, LC: as kfuse compiles it", "bert-base+histogram")]) == {"partition"}
    text = m.markdown(table)
    compiled = text.split("### H100, LC: as kfuse compiles it")[1].split("###")[0]
    assert "partition +3.0%" in compiled and "auto" not in compiled and "mean over 1 pairs: +3.0%" in compiled
    out = m.plot_pairs(table, tmp_path / "p.png", "as kfuse")
    assert out.stat().st_size > 0


def test_a_tuned_lc_and_its_sliceable_forms_are_separate_tables(tmp_path: Path) -> None:
    """Session 55: the LC compiled with tuning (``lc_tune``) and the PTB form of its own GEMMs (``plan-ptb2``) are
    other LCs than the untuned compiled one: each its own table, none overwriting another's policy."""
    m = _module()
    recs = [{**_rec("bert-base+histogram", "partition", 0.0), "lc_gemms": "plan", "lc_tune": "fast"},
            {**_rec("bert-base+histogram", "partition", 0.03), "lc_gemms": "plan", "lc_tune": "none"},
            {**_rec("bert-base+histogram", "aker", 0.06), "lc_gemms": "plan-ptb2", "lc_tune": "fast"}]  # fmt: skip
    (tmp_path / "colocate_s55.json").write_text(json.dumps(recs))
    table = m.pairs(m.load([str(tmp_path / "colocate_s55.json")]))
    assert table[("H100, LC: as kfuse compiles it, tuned", "bert-base+histogram")]["partition"]["be_gain_vs_timesharing"] == 0.0
    assert table[("H100, LC: as kfuse compiles it", "bert-base+histogram")]["partition"]["be_gain_vs_timesharing"] == 0.03
    assert set(table[("H100, LC: kfuse's own GEMM tiles, sliceable, two an SM, tuned", "bert-base+histogram")]) == {"aker"}


def test_the_pairs_plot_draws_every_pair_of_one_gpu(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    m = _module()
    recs = [_rec("bert-base+lbm", "partition", 0.06), _rec("bert-base+lbm", "streams", 0.5, p99=9.0),
            _rec("resnet50+mriq", "backfill", 0.02), _rec("bert-base+lbm", "aker", 0.4, gpu="H200")]  # fmt: skip
    (tmp_path / "colocate.json").write_text(json.dumps(recs))
    table = m.pairs(m.load([str(tmp_path / "colocate.json")]))
    out = m.plot_pairs(table, tmp_path / "pairs.png", "h100")
    img = mpimg.imread(out)
    assert img.shape[1] >= 600 and img[..., :3].std() > 0.05
    try:
        m.plot_pairs(table, tmp_path / "none.png", "A100")
    except SystemExit as e:
        assert "no records for a GPU matching 'A100'" in str(e) and "H100" in str(e)
    else:
        raise AssertionError("a GPU with no records must say so")


def test_cli_pairs_prints_the_table_and_says_what_is_wrong(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kfuse.cli import app

    recs = [_rec("bert-base+lbm", "timeshare", 0.0), _rec("bert-base+lbm", "partition", 0.06)]
    f = tmp_path / "colocate.json"
    f.write_text(json.dumps(recs))
    r = CliRunner().invoke(app, ["colocate", "pairs", str(f), "--png", str(tmp_path / "p.png")])
    assert r.exit_code == 0, r.output
    assert "| bert-base+lbm | partition +6.0% | partition +6.0% |" in r.output and (tmp_path / "p.png").stat().st_size > 0
    assert "bert-base: best per pair, mean over 1 pairs: +6.0%" in r.output
    bad = CliRunner().invoke(app, ["colocate", "pairs", str(tmp_path / "none.json")])
    assert bad.exit_code != 0 and "no such file" in bad.output
    (tmp_path / "empty.json").write_text("[]")
    empty = CliRunner().invoke(app, ["colocate", "pairs", str(tmp_path / "empty.json")])
    assert empty.exit_code != 0 and "no LC x BE records" in empty.output


def test_the_benchmark_script_still_runs_on_the_committed_records() -> None:
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "colocate_pairs.py")], capture_output=True, text=True, cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": ""}, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "### NVIDIA H100 80GB HBM3" in out.stdout and "best per pair, mean over" in out.stdout
