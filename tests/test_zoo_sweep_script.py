"""benchmarks/zoo_sweep.py on the CPU (tiny configs, the interpreter): each architecture compiled and checked
against eager in a worker process, and a worker that dies mid-case recorded as crashed while the sweep goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("transformers")


@pytest.mark.interpreter
@pytest.mark.timeout(600)
def test_sweep_compiles_checks_and_survives_a_crashed_worker(tmp_path: Path) -> None:
    # convnext: its (B, H, W, C) MLP is a b2b chain with a 4-D output (written out of bounds before session 35);
    # mobilebert: aten.pad's string argument (an import failure before session 35)
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", ZOO_SWEEP_CRASH="distilbert")
    argv = [sys.executable, str(ROOT / "benchmarks/zoo_sweep.py"), "--smoke", "--only", "distilbert,convnext,mobilebert",
            "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = {r["case"]: r for r in json.loads((tmp_path / "zoo_sweep.json").read_text())}
    assert list(recs) == ["distilbert", "convnext", "mobilebert"]
    assert recs["distilbert"]["crashed"] and not recs["distilbert"]["compiled"]
    for name in ("convnext", "mobilebert"):
        r = recs[name]
        assert r["compiled"] and r["ok"] and r["max_rel_err"] < 1e-4 and r["ref_abs_max"] > 0, r
    assert "aten.pad.default" not in recs["mobilebert"]["fallback"]  # its constant pad is a kfuse op since session 37
    assert recs["convnext"]["b2b_fused"] >= 1  # the chain the fix is about did run fused


def test_the_explore_set_names_real_classes_and_is_smoke_only_without_widths() -> None:
    import transformers

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import zoo_sweep
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert len(zoo_sweep.EXPLORE) == 31 and not set(zoo_sweep.EXPLORE) & set(zoo_sweep.ARCHS)
    missing = [n for n, a in zoo_sweep.EXPLORE.items() if not (hasattr(transformers, a.config) and hasattr(transformers, a.model))]
    assert missing == []
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/zoo_sweep.py"), "--set", "explore", "--out", "/nonexistent"],
                          capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))  # fmt: skip
    refused = proc.stderr.split("no GPU widths for")[-1].split("(explore set")[0]
    assert proc.returncode != 0 and "--smoke" in proc.stderr and "electra" in refused and "xglm" not in refused
    with_widths = [n for n, a in {**zoo_sweep.EXPLORE, **zoo_sweep.EXPLORE2}.items() if a.checkpoint != "-"]
    assert sorted(with_widths) == sorted(zoo_sweep.GPU_WIDTHS)
    assert len(zoo_sweep.EXPLORE2) == 27 and not set(zoo_sweep.EXPLORE2) & (set(zoo_sweep.ARCHS) | set(zoo_sweep.EXPLORE))
    classes = [a.model.split(".")[0] for a in zoo_sweep.EXPLORE2.values()] + [a.config for a in zoo_sweep.EXPLORE2.values()]
    assert [c for c in classes if not hasattr(transformers, c)] == []


@pytest.mark.interpreter
@pytest.mark.timeout(600)
def test_explore_architectures_compile_without_fallback(tmp_path: Path) -> None:
    """Three of session 38's exploratory architectures, each with an op it used to leave to PyTorch: XGLM
    (binary max), SigLIP (unflatten), Swin-V2 (F.normalize's norm, clamp_min and expand_as, the 1-D pool)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, str(ROOT / "benchmarks/zoo_sweep.py"), "--smoke", "--only", "xglm,siglip-vision,swinv2", "--out", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = {r["case"]: r for r in json.loads((tmp_path / "zoo_sweep.json").read_text())}
    for name in ("xglm", "siglip-vision", "swinv2"):
        r = recs[name]
        assert r["compiled"] and r["ok"] and r["max_rel_err"] < 1e-4 and r["fallback"] == [], r


@pytest.mark.interpreter
@pytest.mark.timeout(600)
def test_explore2_architectures_run_their_new_kernels(tmp_path: Path) -> None:
    """Three of session 42's architectures: GPT-J (interleaved rotary: a stack that was a fallback, now one rotary
    kernel for Q and one for K a layer), Whisper's encoder (an audio input; conv1d + GELU in one conv kernel, the
    query's scale folded into the attention) and SqueezeBERT (grouped conv1d, now the conv template)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    names = "gptj,whisper-encoder,squeezebert"
    argv = [sys.executable, str(ROOT / "benchmarks/zoo_sweep.py"), "--smoke", "--only", names, "--out", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = {r["case"]: r for r in json.loads((tmp_path / "zoo_sweep.json").read_text())}
    for name in names.split(","):
        r = recs[name]
        assert r["compiled"] and r["ok"] and r["max_rel_err"] < 1e-4 and r["fallback"] == [], r
        assert "fallback" not in r["templates"], (name, r["templates"])
    assert recs["gptj"]["templates"]["rotary"] == 4
    assert recs["whisper-encoder"]["input"] == [2, 16, 32] and recs["whisper-encoder"]["templates"]["conv_epilogue"] == 2
    assert recs["squeezebert"]["templates"]["conv_epilogue"] >= 12


def test_diffusers_set_compiles_with_no_fallback(tmp_path: Path) -> None:
    """Stable Diffusion 1.5's UNet (one denoising step: latents, a timestep per image, text states) and its VAE
    decoder, tiny widths in the interpreter: compiled, checked against eager, no fallback op, every attention
    fused and the nearest upsampling a kernel."""
    pytest.importorskip("diffusers")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    argv = [sys.executable, str(ROOT / "benchmarks/zoo_sweep.py"), "--smoke", "--set", "diffusers", "--out", str(tmp_path)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = {r["case"]: r for r in json.loads((tmp_path / "zoo_sweep.json").read_text())}
    assert set(recs) == {"sd15-unet", "sd15-vae-decoder"}
    for r in recs.values():
        assert r["compiled"] and r["ok"] and r["max_rel_err"] < 1e-4 and r["fallback"] == [], r
        assert r["templates"]["resize"] >= 1 and r["templates"]["fused_attention"] >= 1, r["templates"]
    assert recs["sd15-unet"]["input"] == [2, 4, 8, 8]
