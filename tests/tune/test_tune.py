"""Tuner logic without a GPU: rules, database (round trip, resume, corrupt file), cost model,
search (valid configs only, evolutionary), tuner + compile with an injected timing function (the
correctness checks run each config in the interpreter on the CPU, compiled on a GPU)."""

import json
import sqlite3
import warnings
from dataclasses import replace

import pytest
import torch

from kfuse.kernels.conv import ConvConfig
from kfuse.kernels.gemm import GemmConfig
from kfuse.tune.cost_model import CostModel
from kfuse.tune.database import TuningDB
from kfuse.tune.hardware import DEFAULT, TABLE, lookup
from kfuse.tune.profiler import Profiler
from kfuse.tune.search import Budget, evolve, exhaustive, search, transfer_candidates
from kfuse.tune.space import (
    ConvProblem,
    GemmProblem,
    all_configs,
    config_from_dict,
    estimate_ms,
    features,
    hard_reject,
    is_valid,
    problem_from_dict,
    valid_configs,
)  # fmt: skip
from kfuse.tune.tuner import Tuner

BIG = GemmProblem(4096, 3072, 768)
CONV = ConvProblem(8, 64, 28, 28, 128, 3, 3, (1, 1), (1, 1))


def fake_ms(cfg, problem):
    """A deterministic synthetic landscape with a known optimum near 128x128x64, 4 stages."""
    import math

    t = estimate_ms(cfg, problem, DEFAULT)
    t *= 1 + 0.3 * abs(math.log2(cfg.block_m / 128)) + 0.2 * abs(math.log2(cfg.block_n / 128)) + 0.05 * abs(cfg.num_stages - 4)
    return t


# ---- hardware and rules -------------------------------------------------------------------
def test_hardware_table_and_lookup():
    assert lookup("NVIDIA H200").sm == 90 and lookup("NVIDIA A100-SXM4-40GB").num_sms == 108
    assert set(TABLE) == {"H100", "H200", "A100"}
    with pytest.raises(KeyError):
        lookup("GeForce 256")


def test_shared_memory_rule_rejects_with_reason():
    cfg = GemmConfig(256, 256, 128, 8, 8, 5)
    why = hard_reject(cfg, BIG, DEFAULT)
    assert why is not None and "shared memory" in why and str(DEFAULT.smem_per_block) in why
    a100 = TABLE["A100"]
    cfg2 = GemmConfig(128, 256, 64, 8, 8, 4)  # 196608 B: fits Hopper, not A100
    assert hard_reject(cfg2, BIG, DEFAULT) is None
    assert "shared memory" in hard_reject(cfg2, BIG, a100)


def test_other_rules():
    small = GemmProblem(8, 64, 4096)
    assert "BLOCK_M" in hard_reject(GemmConfig(128, 64, 64, 1, 4, 3), small, DEFAULT)
    assert "split-K" in hard_reject(GemmConfig(128, 128, 64, 8, 8, 3, split_k=4), BIG, DEFAULT)
    assert "persistent" in hard_reject(GemmConfig(128, 128, 64, 8, 8, 3, persistent=True), BIG, TABLE["A100"])
    assert "wgmma" in hard_reject(GemmConfig(32, 256, 64, 8, 8, 3), BIG, DEFAULT)
    assert "flat K" in hard_reject(ConvConfig(64, 64, 32, 8, 4, 3, True), CONV, DEFAULT)
    vs = valid_configs(BIG, DEFAULT)
    assert 0 < len(vs) < len(list(all_configs("gemm")))
    assert all(hard_reject(c, BIG, DEFAULT) is None for c in vs)


def test_tma_only_on_hopper_and_not_with_split_k():
    assert any(c.tma for c in valid_configs(BIG, DEFAULT))
    assert not any(c.tma for c in valid_configs(BIG, TABLE["A100"]))
    tma = GemmConfig(128, 128, 64, 8, 8, 3, tma=True)
    assert hard_reject(tma, BIG, DEFAULT) is None
    assert "Hopper" in hard_reject(tma, BIG, TABLE["A100"])
    small = GemmProblem(64, 64, 4096)  # split-K itself is valid here
    assert hard_reject(GemmConfig(64, 64, 64, 1, 4, 3, split_k=4), small, DEFAULT) is None
    assert "split-K" in hard_reject(GemmConfig(64, 64, 64, 1, 4, 3, split_k=4, tma=True), small, DEFAULT)
    assert hard_reject(GemmConfig(128, 128, 64, 8, 8, 3, persistent=True, tma=True), BIG, DEFAULT) is None
    # operands TMA cannot describe: the launch would run the pointer kernel, a duplicate config
    assert "column-major" in hard_reject(tma, GemmProblem(4096, 3072, 768, a_t=True), DEFAULT)
    assert "16-byte" in hard_reject(tma, GemmProblem(4096, 3070, 768), DEFAULT)
    assert hard_reject(tma, GemmProblem(4096, 3070, 768, b_t=True), DEFAULT) is None


WS = GemmConfig(64, 128, 64, 8, 4, 3, persistent=True, tma=True, warp_specialize=True)


def test_persistent_tma_warp_specialize_space():
    """persistent + tma (+ warp_specialize): the persistent TMA kernel, on sm_90 for many tiles."""
    assert hard_reject(WS, BIG, DEFAULT) is None  # valid when asked for explicitly...
    vs = valid_configs(BIG, DEFAULT)
    assert not any(c.warp_specialize for c in vs)  # ...but never searched (it hung the H200)
    assert any(c.persistent and c.tma and c.flatten for c in vs)
    assert not any(c.warp_specialize or c.flatten or c.epilogue_subtile for c in valid_configs(BIG, TABLE["A100"]))
    assert "Hopper" in hard_reject(WS, BIG, TABLE["A100"])  # sm_80
    assert "split-K" in hard_reject(replace(WS, split_k=2), GemmProblem(4096, 3072, 4096), DEFAULT)
    assert "tiles" in hard_reject(WS, GemmProblem(512, 768, 768), DEFAULT)  # 48 tiles <= 132 SMs
    # a hint without the kernel it belongs to, and what Triton 3.6 cannot build for sm_90
    for cfg, why in [
        (replace(WS, persistent=False), "persistent TMA kernel only"),
        (replace(WS, tma=False), "persistent TMA kernel only"),
        (GemmConfig(128, 128, 64, 8, 4, 3, flatten=True), "persistent TMA kernel only"),
        (replace(WS, num_warps=8), "num_warps=4"),
        (replace(WS, block_m=32), "BLOCK_M >= 64"),
        (replace(WS, flatten=True), "flattened loop"),
        (replace(WS, block_m=128), "deadlocks"),
        (replace(WS, epilogue_subtile=True), "split epilogue"),
        (replace(WS, block_n=256), "64x256"),
        (GemmConfig(128, 256, 64, 8, 8, 4, persistent=True, tma=True, epilogue_subtile=True), "shared memory"),
        (GemmConfig(128, 128, 64, 8, 8, 3, persistent=True, tma=True, epilogue_subtile=True), "big tiles"),
    ]:  # fmt: skip
        got = hard_reject(cfg, BIG, DEFAULT)
        assert got is not None and why in got, (cfg.describe(), got)
    big_tile = GemmConfig(128, 256, 64, 8, 8, 3, persistent=True, tma=True, flatten=True, epilogue_subtile=True)
    assert hard_reject(big_tile, BIG, DEFAULT) is None
    # all_configs only combines the hints with persistent + tma (and never with split-K)
    gemm = list(all_configs("gemm"))
    assert len(gemm) == len(set(gemm)) and all(c.persistent and c.tma and c.split_k == 1 for c in gemm if c.warp_specialize or c.flatten)
    assert len(valid_configs(BIG, DEFAULT)) < 4096  # below the search's enumerate limit


def test_persistent_tma_estimate_follows_the_h200_probe():
    """Flattened loop first (measured 5-15% over one TMA program per tile at K=768), warp
    specialisation of 64-row tiles last (measured 1.7-2x slower than the flattened loop)."""
    tma, flat = GemmConfig(128, 256, 64, 8, 8, 4, tma=True), GemmConfig(128, 256, 64, 8, 8, 4, persistent=True, tma=True, flatten=True)
    assert estimate_ms(flat, BIG, DEFAULT) < estimate_ms(tma, BIG, DEFAULT) < estimate_ms(replace(flat, flatten=False), BIG, DEFAULT)
    assert estimate_ms(WS, BIG, DEFAULT) > estimate_ms(replace(WS, warp_specialize=False, flatten=True), BIG, DEFAULT)
    # the overlap matters less with a long K: the flattened loop's edge shrinks

    def gain(p):
        return estimate_ms(flat, p, DEFAULT) / estimate_ms(tma, p, DEFAULT)

    assert gain(GemmProblem(4096, 3072, 8192)) > gain(BIG)
    f = features(WS, BIG, DEFAULT)
    assert len(f) == len(features(tma, BIG, DEFAULT)) == len(features(valid_configs(CONV, DEFAULT)[0], CONV, DEFAULT))


def test_tma_features_and_estimate():
    plain, tma = GemmConfig(128, 128, 64, 8, 8, 3), GemmConfig(128, 128, 64, 8, 8, 3, tma=True)
    f0, f1 = features(plain, BIG, DEFAULT), features(tma, BIG, DEFAULT)
    assert len(f0) == len(f1) == len(features(valid_configs(CONV, DEFAULT)[0], CONV, DEFAULT))
    assert [i for i, (x, y) in enumerate(zip(f0, f1, strict=True)) if x != y] == [len(BIG.features()) + 9, len(f0) - 1]
    assert estimate_ms(tma, BIG, DEFAULT) < estimate_ms(plain, BIG, DEFAULT)


def test_config_dict_without_tma_loads():
    old = {k: v for k, v in GemmConfig(128, 128, 64, 8, 8, 3).as_dict().items() if k != "tma"}
    assert config_from_dict("gemm", old) == GemmConfig(128, 128, 64, 8, 8, 3)
    cfg = GemmConfig(128, 256, 64, 8, 8, 3, tma=True)
    assert config_from_dict("gemm", json.loads(json.dumps(cfg.as_dict()))) == cfg


def test_problem_round_trip():
    for p in (BIG, CONV):
        assert problem_from_dict(json.loads(json.dumps(p.as_dict()))) == p


# ---- database -----------------------------------------------------------------------------
def test_db_round_trip_export_import(tmp_path):
    db = TuningDB(tmp_path / "a.sqlite")
    pj = json.dumps(BIG.as_dict())
    db.add("gpu", "gemm", BIG.signature(), pj, GemmConfig().as_dict(), 0.5)
    db.add("gpu", "gemm", BIG.signature(), pj, GemmConfig(128).as_dict(), 0.3)
    db.add("gpu", "gemm", BIG.signature(), pj, GemmConfig(256).as_dict(), None, "failed", "boom")
    best = db.best("gpu", "gemm", BIG.signature())
    assert best.time_ms == 0.3 and best.config["block_m"] == 128
    assert db.stats()["by_status"] == {"ok": 2, "failed": 1}
    n = db.export(tmp_path / "x.json")
    db2 = TuningDB(tmp_path / "b.sqlite")
    assert db2.import_(tmp_path / "x.json") == n == 3
    assert db2.best("gpu", "gemm", BIG.signature()).time_ms == 0.3
    assert db2.clear() == 3 and db2.stats()["records"] == 0
    with pytest.raises(ValueError, match="not a kfuse tuning export"):
        db2.import_(tmp_path / "a.sqlite")


def test_corrupt_database_is_set_aside(tmp_path):
    p = tmp_path / "t.sqlite"
    p.write_bytes(b"this is not sqlite" * 100)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        db = TuningDB(p)
    assert db.set_aside is not None and db.set_aside.exists()
    assert any("unusable" in str(x.message) for x in w)
    assert db.stats()["records"] == 0


def test_foreign_schema_is_set_aside(tmp_path):
    p = tmp_path / "t.sqlite"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    c.execute("INSERT INTO meta VALUES ('schema_version', '999')")
    c.commit()
    c.close()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        db = TuningDB(p)
    assert db.set_aside is not None


# ---- cost model and search ----------------------------------------------------------------
def test_cost_model_trains_and_ranks():
    probs = [GemmProblem(m, n, k) for m, n, k in [(4096, 3072, 768), (4096, 768, 3072), (2048, 2304, 768), (512, 768, 768)]]
    import random

    rng = random.Random(0)
    samples = []
    for p in probs[:3]:
        for c in rng.sample(valid_configs(p, DEFAULT), 60):
            samples.append((c, p, fake_ms(c, p)))
    model = CostModel(DEFAULT)
    assert model.fit(samples) and model.trained
    p = probs[3]
    cands = rng.sample(valid_configs(p, DEFAULT), 80)
    ranked = model.rank(cands, p)
    truth = sorted(cands, key=lambda c: fake_ms(c, p))
    # the model's top-10 holds a config within 10% of the true best
    assert min(fake_ms(c, p) for c in ranked[:10]) <= 1.10 * fake_ms(truth[0], p)


def test_untrained_model_uses_rules():
    m = CostModel(DEFAULT)
    assert not m.fit([]) and len(m.predict(valid_configs(CONV, DEFAULT)[:5], CONV)) == 5


def test_search_returns_valid_configs_and_beats_rules_alone():
    prof = Profiler(measure=fake_ms)
    res = search(BIG, DEFAULT, prof, None, CostModel(DEFAULT), Budget(top_k=12, rounds=2))
    assert res.best is not None and is_valid(res.best, BIG, DEFAULT)
    assert all(is_valid(m.config, BIG, DEFAULT) for m in res.measured)
    assert res.n_measured == 24 and res.considered == len(valid_configs(BIG, DEFAULT))
    ex = exhaustive(BIG, DEFAULT, prof, None, space=[c for c in valid_configs(BIG, DEFAULT) if c.group_m == 8 and c.split_k == 1][:200])
    assert ex.best_ms is not None


def test_evolutionary_search_valid_only():
    seeds = valid_configs(CONV, DEFAULT)[:10]
    out = evolve(seeds, CONV, DEFAULT, lambda cs: [fake_ms(c, CONV) for c in cs], population=32, generations=3)
    assert len(out) > len(seeds) and all(is_valid(c, CONV, DEFAULT) for c in out)
    res = search(CONV, DEFAULT, Profiler(measure=fake_ms), None, CostModel(DEFAULT), Budget(top_k=6, enumerate_limit=10, population=32))
    assert res.best is not None and is_valid(res.best, CONV, DEFAULT)


def test_transfer_from_neighbours():
    near = GemmProblem(4000, 3072, 768)
    far = GemmProblem(16, 64, 64)
    c1, c2 = GemmConfig(128, 128, 64, 8, 8, 4), GemmConfig(16, 64, 32, 1, 4, 3)
    got = transfer_candidates(BIG, [(far, c2), (near, c1)], DEFAULT, 1)
    assert got == [c1]


def test_failed_configs_never_chosen():
    def flaky(cfg, p):
        if cfg.block_m == 128:
            raise RuntimeError("compile error")
        return fake_ms(cfg, p)

    res = search(BIG, DEFAULT, Profiler(measure=flaky), None, CostModel(DEFAULT), Budget(top_k=10))
    assert res.best.block_m != 128
    assert any(m.status == "failed" for m in res.measured) or all(m.config.block_m != 128 for m in res.measured)


# ---- tuner: database hits, resume ---------------------------------------------------------
def test_tuner_db_hit_and_resume(tmp_path):
    db = TuningDB(tmp_path / "t.sqlite")
    calls = []

    def measure(cfg, p):
        calls.append(cfg)
        if len(calls) == 4 and not hasattr(measure, "done"):
            measure.done = True
            raise KeyboardInterrupt  # an interrupted run
        return fake_ms(cfg, p)

    t = Tuner("fast", db=db, hw=DEFAULT, measure=measure, progress=False, check=False)
    with pytest.raises(KeyboardInterrupt):
        t.choose([(BIG, None)])
    assert len(db.measured(DEFAULT.key(), "gemm", BIG.signature())) == 3  # committed as measured
    committed = set(calls[:3])
    calls.clear()
    t2 = Tuner("fast", db=db, hw=DEFAULT, measure=measure, progress=False, check=False)
    cfg = t2.choose([(BIG, None)])[BIG.signature()]
    budget = Budget.for_mode("fast")
    assert cfg is not None and len(calls) == budget.top_k + budget.transfer - 3  # only what was not measured yet
    assert not committed & set(calls) and len(set(calls)) == len(calls)  # nothing measured twice
    calls.clear()
    t3 = Tuner("fast", db=db, hw=DEFAULT, measure=measure, progress=False, check=False)
    assert t3.choose([(BIG, None)])[BIG.signature()] == cfg and not calls and t3.stats.from_db == 1


def test_tuner_checks_correctness_of_each_config(tmp_path, device):
    """With an injected timing and a small problem, each config also runs and is checked: in the
    interpreter on the CPU, compiled on a GPU (the tuner's device)."""
    p = GemmProblem(24, 40, 32, dtype="fp32", n_extras=1)
    space = [GemmConfig(16, 32, 32, 1, 4, 2), GemmConfig(32, 32, 32, 1, 4, 2)]
    t = Tuner("fast", db=TuningDB(tmp_path / "t.sqlite"), hw=DEFAULT, measure=fake_ms, device=device, progress=False)
    res = t.tune(p, space=space)
    assert res.best in space and all(m.status == "ok" for m in res.measured)


def test_a_config_that_writes_nothing_is_wrong(monkeypatch, device):
    """The runners reuse one output buffer across configs, so the check must poison it first:
    a config whose kernel writes nothing would otherwise be checked against the previous config's
    (correct) result, left in the buffer, and pass."""
    import kfuse.tune.profiler as prof

    p = GemmProblem(24, 40, 32, dtype="fp32", n_extras=1)
    good, silent = GemmConfig(16, 32, 32, 1, 4, 2), GemmConfig(32, 32, 32, 1, 4, 2)
    real = prof.launch
    monkeypatch.setattr(prof, "launch", lambda g, epi, cfg, **kw: None if cfg == silent and not kw else real(g, epi, cfg, **kw))
    got = Profiler(measure=fake_ms).profile(p, [good, silent], prof.make_runner(p, device))  # good first
    assert [m.status for m in got] == ["ok", "wrong"]


def test_a_conv_config_that_writes_nothing_is_wrong(monkeypatch, device):
    import kfuse.tune.profiler as prof

    p = ConvProblem(1, 5, 7, 6, 9, 3, 3, (1, 1), (1, 1), (1, 1), dtype="fp32")
    good, silent = ConvConfig(32, 16, 16, 1, 4, 2), ConvConfig(64, 16, 16, 1, 4, 2)
    real = prof.conv_epilogue

    def conv(x, w, bias, ex, epi, params, dtype, cfg, wp=None, warmup=False, out=None):
        if cfg == silent and out is not None:
            return out  # writes nothing
        return real(x, w, bias, ex, epi, params, dtype, cfg, wp, warmup=warmup, out=out)

    monkeypatch.setattr(prof, "conv_epilogue", conv)
    got = Profiler(measure=fake_ms).profile(p, [good, silent], prof.make_runner(p, device))
    assert [m.status for m in got] == ["ok", "wrong"]


def test_compile_with_tuning_uses_db(tmp_path, monkeypatch, device):
    import kfuse
    import kfuse.tune.tuner as tuner_mod

    monkeypatch.setenv("KFUSE_TUNE_DB", str(tmp_path / "t.sqlite"))
    # the tuned template on a GPU too, where the lowering would time it against cuBLAS and may keep
    # cuBLAS (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    m = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU()).to(device).eval()
    x = torch.randn(5, 16, device=device)
    made = []
    orig = tuner_mod.Tuner

    class FakeTuner(orig):
        def __init__(self, mode, **kw):
            super().__init__(mode, measure=fake_ms, hw=DEFAULT, check=False, **kw)
            made.append(self)

    monkeypatch.setattr(tuner_mod, "Tuner", FakeTuner)
    c = kfuse.compile(m, (x,), tune="fast")
    assert made[0].stats.tuned == 1 and made[0].stats.measured > 0
    torch.testing.assert_close(c(x), m(x), rtol=1e-4, atol=1e-4)
    c2 = kfuse.compile(m, (x,), tune="fast")
    assert made[1].stats.from_db == 1 and made[1].stats.measured == 0
    assert "gemm_epilogue" in {k["template"] for k in c2.report["kernels"]}


def test_tune_graph_tunes_the_unfused_stages_of_b2b_chains(tmp_path, device):
    """A b2b chain keeps its original GEMMs for the measured fused-vs-unfused decision; they are
    tuned with the rest, so the decision compares the fused kernel with a tuned unfused pair
    (session 14: the pair ran on untuned 128x128x64 tiles and on cuBLAS, never on the tuned
    kernel, in every b2b decision)."""
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.passes.fuse_b2b import fuse_b2b
    from kfuse.passes.fuse_epilogue import fuse_epilogues
    from kfuse.tune.tuner import tune_graph

    b = GraphBuilder("mlp")
    h = b.add_input("x", TensorType((300, 24), torch.float32))
    for k, n, act in ((24, 32, "relu"), (32, 16, None)):
        w, bias = b.add_constant(torch.randn(k, n, device=device)), b.add_constant(torch.randn(n, device=device))
        y = b.op("add", [b.op("matmul", [h, w]), bias])
        h = b.op(act, [y]) if act else y
    g = fuse_b2b(fuse_epilogues(b.build([h])))
    [chain] = [n for n in g.nodes if "unfused" in n.attrs]
    assert all("config" not in s.attrs for s in chain.attrs["unfused"])
    t = Tuner("fast", db=TuningDB(tmp_path / "t.sqlite"), hw=DEFAULT, measure=fake_ms, device=device, progress=False, check=False)
    tuned = tune_graph(g, tuner=t, verbose=False)
    [chain2] = [n for n in tuned.nodes if "unfused" in n.attrs]
    stages = chain2.attrs["unfused"]
    assert [s.name for s in stages] == [s.name for s in chain.attrs["unfused"]]
    assert all(isinstance(s.attrs.get("config"), GemmConfig) for s in stages)
    assert t.stats.problems == 2 and "config" not in chain2.attrs


def test_erf_gelu_problems_are_tuned_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """With KFUSE_EXACT_GELU=1 a GEMM whose epilogue holds GELU is another problem (the erf form's
    FP32 work changes the best schedule); without GELU, or under the default policy, the signature
    is the one the database has always used. The flag survives the database's round trip."""
    from kfuse.ir.graph import GraphBuilder, TensorType
    from kfuse.passes.fuse_epilogue import fuse_epilogues
    from kfuse.tune.tuner import problem_of

    def signatures() -> list[str]:
        b = GraphBuilder("two")
        x = b.add_input("x", TensorType((64, 32), torch.float16))
        y = b.op("add", [b.op("matmul", [x, b.add_constant(torch.randn(32, 48).half())]), b.add_constant(torch.randn(48).half())])
        z = b.op("relu", [b.op("matmul", [b.op("gelu", [y]), b.add_constant(torch.randn(48, 16).half())])])
        g = fuse_epilogues(b.build([z]))
        return [problem_of(n, g).signature() for n in g.nodes if n.op == "gemm_epilogue"]  # type: ignore[union-attr]

    monkeypatch.delenv("KFUSE_EXACT_GELU", raising=False)
    default = signatures()
    assert default == ["gemm b1 m64 n48 k32 fp16 NN e1", "gemm b1 m64 n16 k48 fp16 NN e0"]
    monkeypatch.setenv("KFUSE_EXACT_GELU", "1")
    assert signatures() == [default[0] + " erf-gelu", default[1]]  # only the GEMM whose epilogue has GELU
    p = GemmProblem(64, 48, 32, n_extras=1, erf_gelu=True)
    assert problem_from_dict(json.loads(json.dumps(p.as_dict()))) == p
