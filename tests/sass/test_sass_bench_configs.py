"""``benchmarks/sass_bench.py --gemm-configs``: SIP starting from Triton's fastest GEMM + LeakyReLU tile, not only the
tutorial's 128 x 128 (session 57: at [512, 512, 2048] that tile keeps 16 of 132 SMs busy). The parsing, and that the
configs a run would offer compile for sm_90 offline into the kernel SIP's move model reads (HGMMA, cp.async loads)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kfuse.sass import examples
from kfuse.sass.cubin import load_cubin
from kfuse.sass.disasm import instruction_texts

_spec = importlib.util.spec_from_file_location("sass_bench", Path(__file__).resolve().parents[2] / "benchmarks" / "sass_bench.py")
assert _spec is not None and _spec.loader is not None
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_gemm_configs_parse_and_refuse_what_cannot_run() -> None:
    assert bench.parse_gemm_config(" 64x128x64w4s4") == (64, 128, 64, 4, 4)
    assert bench.config_name(bench.TUTORIAL_GEMM) == "128x128x64w8s3"
    for bad, why in [("128x128x64", "BMxBNxBK"), ("96x128x64w4s3", "powers of two"), ("64x64x64w2s3", "4 or 8 warps"),
                     ("64x64x64w4s9", "1-6 stages"), ("8x64x64w4s3", ">= 16")]:  # fmt: skip
        with pytest.raises(ValueError, match=why):
            bench.parse_gemm_config(bad)


@pytest.mark.parametrize("cfg", ["64x64x64w4s4", "64x128x64w4s4"])
def test_a_smaller_tile_compiles_for_sm90_into_what_the_move_model_reads(cfg: str) -> None:
    bm, bn, bk, w, st = bench.parse_gemm_config(cfg)
    ck = examples.compile_matmul_leaky_relu(bm, bn, bk, 8, num_warps=w, num_stages=st)
    text = "\n".join(instruction_texts(load_cubin(ck.asm["cubin"]), ck.name))
    assert "HGMMA" in text and "LDGSTS" in text  # wgmma fed by a cp.async pipeline, as the 128 x 128 tile


def test_the_trial_summary_is_relative_to_the_time_the_search_scaled_from() -> None:
    """A candidate's time is the search's base time x its A B B A ratio to the original; re-timing an accepted best
    sets ``triton_ms`` from other chunks (sessions 59-61: 3-5% off), which must not shift what the search tried."""
    from kfuse.sass.api import SassResult
    from kfuse.sass.search import Trial

    base = 0.0404
    trials = [Trial(0, i, 1, base * r, True) for i, r in enumerate((0.99, 1.0, 1.01, 0.98))] + [Trial(0, 4, 2, None, False)]
    res = SassResult("k", "sha", True, "", triton_ms=0.0428, kfuse_ms=0.0421, trials=trials, search_base_ms=base)
    s = res.trial_summary()
    assert s["tried"] == 5 and s["failed"] == 1
    assert (
        s["rel_time_min"] == pytest.approx(0.98) and s["rel_time_median"] == pytest.approx(1.0) and s["rel_time_max"] == pytest.approx(1.01)
    )
    legacy = SassResult("k", "sha", False, "", triton_ms=base, trials=trials)  # a record without the search's base time
    assert legacy.trial_summary()["rel_time_median"] == pytest.approx(1.0)
