from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kfuse.cli import app

runner = CliRunner()


def test_models_lists_the_zoo() -> None:
    r = runner.invoke(app, ["models"])
    assert r.exit_code == 0 and "bert-base" in r.output and "resnet50" in r.output and "torchvision:NAME" in r.output


def test_compile_writes_report(tmp_path) -> None:
    path = tmp_path / "rep.json"
    r = runner.invoke(app, ["compile", "mlp-tiny", "--batch", "3", "--report", str(path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(path.read_text())
    assert rep["model"] == "mlp-tiny" and rep["kernels"] and rep["max_rel_err"] < 1e-4
    assert rep["command"].startswith("kfuse compile mlp-tiny")


def test_compile_library_choice(tmp_path) -> None:
    path = tmp_path / "rep.json"
    r = runner.invoke(app, ["compile", "bert-tiny", "--batch", "2", "--seq", "8", "--library", "always", "--report", str(path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(path.read_text())
    templates = {k["template"] for k in rep["kernels"]}
    assert {"library_gemm", "library_attention"} <= templates and "gemm_epilogue" not in templates, templates
    assert rep["max_rel_err"] < 1e-4
    r = runner.invoke(app, ["compile", "mlp-tiny", "--library", "sometimes"])
    assert r.exit_code != 0 and "sometimes" in r.output


def test_compile_without_b2b(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--no-b2b keeps mlp-tiny's chain as separate GEMMs, and the report's command says so."""
    # the chain fused by the rule on a GPU too, where the lowering would time it against its unfused GEMMs
    # and may keep those ("b2b_chain(unfused)"; the CPU never measures)
    monkeypatch.setenv("KFUSE_B2B_DECIDE", "rule")
    path = tmp_path / "rep.json"
    r = runner.invoke(app, ["compile", "mlp-tiny", "--batch", "3", "--no-b2b", "--report", str(path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(path.read_text())
    assert "b2b_chain" not in {k["template"] for k in rep["kernels"]} and not rep["b2b"]["fused"]
    assert "--no-b2b" in rep["command"] and rep["max_rel_err"] < 1e-4
    r = runner.invoke(app, ["compile", "mlp-tiny", "--batch", "3", "--report", str(path)])
    assert "b2b_chain" in {k["template"] for k in json.loads(path.read_text())["kernels"]}


def test_compile_unknown_model_is_a_clear_error() -> None:
    r = runner.invoke(app, ["compile", "no-such-model"])
    assert r.exit_code != 0 and "no-such-model" in r.output


def test_compile_missing_onnx_file() -> None:
    r = runner.invoke(app, ["compile", "/nope/model.onnx"])
    assert r.exit_code != 0 and "no such ONNX file" in r.output


@pytest.mark.parametrize("cmd", [[], ["compile"], ["demo"], ["bench"], ["models"], ["generate"]])
def test_help_on_every_command(cmd: list[str]) -> None:
    r = runner.invoke(app, cmd + ["--help"])
    assert r.exit_code == 0 and "Usage" in r.output


def test_help_on_every_subcommand() -> None:
    import typer.main

    group = typer.main.get_command(app)
    # every subsystem is mounted here (a failed import would silently drop its commands)
    assert {"compile", "demo", "tune-db", "sass", "sparse", "colocate"} <= set(group.commands)  # type: ignore[attr-defined]
    for name, sub in group.commands.items():  # type: ignore[attr-defined]
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        for subname in getattr(sub, "commands", {}):
            r = runner.invoke(app, [name, subname, "--help"])
            assert r.exit_code == 0, f"{name} {subname}"


def test_demo_runs_on_the_default_device() -> None:
    """The demo has no device option: the CPU (Triton interpreter, fp32) without a GPU, the GPU (fp16,
    with its speed table against PyTorch) where there is one."""
    r = runner.invoke(app, ["demo", "--model", "mlp-tiny", "--batch", "2"])
    assert r.exit_code == 0, r.output
    assert "PASS" in r.output


def test_compile_onnx_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    # kfuse's GEMM kernel on a GPU too, where the lowering would time it against cuBLAS and may keep
    # cuBLAS (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    w = numpy_helper.from_array(__import__("numpy").random.rand(8, 5).astype("float32"), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        [w],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    rep_path = tmp_path / "r.json"
    r = runner.invoke(app, ["compile", str(path), "--batch", "3", "--report", str(rep_path)])
    assert r.exit_code == 0, r.output
    rep = json.loads(rep_path.read_text())
    assert rep["max_rel_err"] < 1e-5 and any(k["template"] == "gemm_epilogue" for k in rep["kernels"])


def test_compile_a_local_hugging_face_checkpoint(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kfuse compile DIR`` on what save_pretrained wrote: a Llama (token ids) and a ViT (images)."""
    import torch
    import transformers

    # kfuse's attention kernel on a GPU too, where the lowering would time it against SDPA and may keep
    # SDPA (the CPU never measures)
    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    # ViT's fp32 patch convolution in fp32 on a GPU too: cuDNN runs it in TF32 by default, in PyTorch's
    # reference and in a cuDNN candidate kfuse may keep
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)

    llama = transformers.LlamaModel(
        transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
            max_position_embeddings=20,
        )
    )  # fmt: skip
    vit_cfg = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48, image_size=16, patch_size=8
    )
    vit = transformers.ViTModel(vit_cfg, add_pooling_layer=False)
    for name, model, extra, template in (("llama", llama, ["--seq", "40"], "rotary"), ("vit", vit, [], "fused_attention")):
        model.save_pretrained(tmp_path / name)
        path = tmp_path / f"{name}.json"
        r = runner.invoke(app, ["compile", str(tmp_path / name), "--batch", "2", *extra, "--report", str(path)])
        assert r.exit_code == 0, r.output
        rep = json.loads(path.read_text())
        assert rep["max_rel_err"] < 1e-4 and template in {k["template"] for k in rep["kernels"]}
        if name == "llama":  # --seq 40 is past the position table: clamped to it
            assert rep["inputs"][0]["type"] == "int64[2,20]", rep["inputs"]


def test_compile_a_directory_that_is_not_a_checkpoint(tmp_path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    r = runner.invoke(app, ["compile", str(tmp_path)])
    assert r.exit_code != 0 and "could not load" in r.output


def test_a_subsystem_that_fails_to_import_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import typer

    import kfuse.cli as cli

    real_import = builtins.__import__

    def failing(name, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name == "kfuse.sparse.cli":
            raise ImportError("no module named scipy (simulated)")
        return real_import(name, *a, **k)

    monkeypatch.setattr(cli, "app", typer.Typer(no_args_is_help=True))
    monkeypatch.setattr(builtins, "__import__", failing)
    cli._mount_subcommands()
    monkeypatch.setattr(builtins, "__import__", real_import)
    r = runner.invoke(cli.app, ["sparse", "solve"])
    assert r.exit_code == 2 and "kfuse sparse is unavailable: ImportError: no module named scipy" in r.output
    r = runner.invoke(cli.app, ["--help"])
    assert "unavailable here" in r.output and "sass" in r.output


def test_compile_pdl_choice(tmp_path) -> None:
    """--pdl off reaches the plan (the report's ``pdl``); an unknown choice is refused with its name."""
    path = tmp_path / "rep.json"
    r = runner.invoke(app, ["compile", "mlp-tiny", "--batch", "3", "--pdl", "off", "--report", str(path)])
    assert r.exit_code == 0, r.output
    assert json.loads(path.read_text())["pdl"] is False
    r = runner.invoke(app, ["compile", "mlp-tiny", "--pdl", "sometimes"])
    assert r.exit_code != 0 and "sometimes" in r.output


def test_compile_gather_rows_switch(tmp_path) -> None:
    """--no-gather-rows keeps a shifted-window token reordering (roll, window partition) as PyTorch copies; by
    default it is one gather folded into the LayerNorm. Through the CLI's ONNX loader, on an export."""
    import torch

    class Windows(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm, self.proj = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.roll(self.norm(x).view(1, 8, 8, 16), shifts=(-2, -2), dims=(1, 2))
            y = y.view(1, 2, 4, 2, 4, 16).permute(0, 1, 3, 2, 4, 5).reshape(4, 16, 16)
            return self.proj(y)

    onnx_path = tmp_path / "windows.onnx"
    torch.onnx.export(Windows().eval(), (torch.randn(1, 64, 16),), str(onnx_path), dynamo=False)
    path = tmp_path / "rep.json"
    for flags, gathered in (([], True), (["--no-gather-rows"], False)):
        r = runner.invoke(app, ["compile", str(onnx_path), "--report", str(path), *flags])
        assert r.exit_code == 0, r.output
        rep = json.loads(path.read_text())
        norms_with_gather = [k for k in rep["kernels"] if k["template"] == "fused_norm" and "gather_rows" in k["ops"]]
        assert bool(norms_with_gather) == gathered and rep["max_rel_err"] < 1e-4
        assert ("--no-gather-rows" in rep["command"]) == (not gathered)


def test_compile_input_scale_switch(tmp_path) -> None:
    """--no-input-scale leaves a squeeze-excitation's multiply as its own kernel; by default the 1x1 projection
    reads x * s through its input loads. Through the CLI's ONNX loader, on an export."""
    import torch

    class SE(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc, self.proj = torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 1), torch.nn.Conv2d(16, 8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.conv(x))
            return self.proj(y * torch.sigmoid(self.fc(y.mean((2, 3), keepdim=True))))

    onnx_path = tmp_path / "se.onnx"
    torch.onnx.export(SE().eval(), (torch.randn(2, 8, 6, 6),), str(onnx_path), dynamo=False)
    path = tmp_path / "rep.json"
    for flags, scaled in (([], True), (["--no-input-scale"], False)):
        r = runner.invoke(app, ["compile", str(onnx_path), "--report", str(path), "--no-b2b", *flags])
        assert r.exit_code == 0, r.output
        rep = json.loads(path.read_text())
        assert any(k["ops"][0] == "mul" and "conv2d" in k["ops"] for k in rep["kernels"]) == scaled, rep["kernels"]
        assert rep["max_rel_err"] < 1e-4 and ("--no-input-scale" in rep["command"]) == (not scaled)


def test_generate_a_local_causal_lm_checkpoint(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kfuse generate DIR``: a saved LlamaForCausalLM decoded with a static cache, kfuse's step checked against
    eager's, every cache write in place, the record written."""
    import torch
    import transformers

    monkeypatch.setenv("KFUSE_GEMM_LIBRARY", "never")
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
        max_position_embeddings=64,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "lm")
    out = tmp_path / "gen.json"
    argv = ["generate", str(tmp_path / "lm"), "--prompt", "5", "--cache", "36", "--new-tokens", "2", "--sides", "eager,kfuse", "--profile"]
    r = runner.invoke(app, [*argv, "--out", str(out)])
    assert r.exit_code == 0, r.output
    rec = json.loads(out.read_text())
    cpu = not torch.cuda.is_available()  # on a GPU: fp16, and the attention timed against the dense kernel
    assert rec["max_rel_err"] < (1e-4 if cpu else 2e-2)
    assert rec["generate_tokens_equal_to_eager"]["kfuse"] == 1.0 or not cpu
    templates = rec["kfuse_plan"]["kernels_by_template"]
    attention = templates.get("decode_attention", 0) + (0 if cpu else templates.get("fused_attention", 0))
    assert attention == 1, templates
    assert all(w["how"] == "in place" for w in rec["kfuse_plan"]["state_writes"])
    assert set(rec["kernel_profile"]) == (set() if cpu else {"kfuse"})  # kernel profiles need CUPTI: GPU only


def test_generate_refuses_a_cache_too_small() -> None:
    r = runner.invoke(app, ["generate", "llama-tiny", "--prompt", "30", "--cache", "32", "--new-tokens", "8"])
    assert r.exit_code != 0 and "do not fit" in r.output
