"""ONNX frontend: hand-built models (checked against onnx's ReferenceEvaluator on fresh inputs),
models exported from the zoo (checked against PyTorch), fallback nodes and load errors."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

import kfuse
from kfuse.frontend.onnx import OnnxLoadError, import_onnx, reference_evaluator
from kfuse.frontend.torch_export import FrontendError
from kfuse.ir.interpret import reference_run

F = TP.FLOAT


@pytest.fixture
def fp32_convs(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 convolutions computed in fp32 on a GPU too: cuDNN runs them in TF32 by default
    (``torch.backends.cudnn.allow_tf32``, ~3e-4 off), in PyTorch's reference and in what kfuse hands to
    cuDNN (grouped convs, a cuDNN candidate measured faster than the template)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)


def _rng() -> np.random.Generator:
    return np.random.default_rng()  # fresh values every run


def _w(name: str, *shape: int, scale: float = 0.5) -> onnx.TensorProto:
    return nh.from_array((_rng().standard_normal(shape) * scale).astype(np.float32), name)


def _i64(name: str, values: list[int] | int) -> onnx.TensorProto:
    return nh.from_array(np.array(values, dtype=np.int64), name)


def _model(nodes: list, inputs: list, outputs: list, inits: list, opset: int = 17) -> onnx.ModelProto:
    # outputs declared without a shape take the one ONNX shape inference finds
    g = helper.make_graph(nodes, "test", inputs, [], inits)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), strict_mode=True)
    types = {v.name: v for v in inferred.graph.value_info}
    outs = [o if o.type.tensor_type.HasField("shape") else types[o.name] for o in outputs]
    m = helper.make_model(helper.make_graph(nodes, "test", inputs, outs, inits), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _close(out: torch.Tensor, ref: np.ndarray | torch.Tensor, tol: float = 1e-4) -> None:
    ref_t = torch.as_tensor(np.asarray(ref)) if not isinstance(ref, torch.Tensor) else ref
    assert tuple(out.shape) == tuple(ref_t.shape)
    if not out.is_floating_point():
        assert torch.equal(out.cpu(), ref_t.cpu())
        return
    err = (out.cpu().double() - ref_t.cpu().double()).abs().max().item()
    assert err <= tol * max(1.0, ref_t.abs().max().item()), f"max abs err {err}"


def _check_vs_onnx(m: onnx.ModelProto, xs: list[torch.Tensor], tol: float = 1e-4, ev: object = None) -> kfuse.CompiledModel:
    """Compile on ``xs``, then compare with onnx's evaluator on the example and on fresh inputs of the same shape."""
    c = kfuse.compile(m, tuple(xs))
    assert c.report["max_rel_err"] <= tol
    ev = ev or ReferenceEvaluator(m)
    names = [i.name for i in m.graph.input if i.name not in {t.name for t in m.graph.initializer}]
    fresh = [torch.randn_like(x) if x.is_floating_point() else x for x in xs]
    for inputs in (xs, fresh):
        outs = c(*inputs)
        assert isinstance(outs, tuple)
        refs = ev.run(None, {n: x.cpu().numpy() for n, x in zip(names, inputs, strict=True)})
        for o, r in zip(outs, refs, strict=True):
            _close(o, r, tol)
    return c


# ---------------------------------------------------------------------------------------
# hand-built models
# ---------------------------------------------------------------------------------------
def _mlp() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["g"], alpha=0.5, beta=2.0),
        helper.make_node("Transpose", ["g"], ["gt"]),
        helper.make_node("Gemm", ["gt", "w3"], ["y"], transA=1),
    ]
    inits = [_w("w1", 13, 7), _w("b1", 13), _w("w2", 13, 5), _w("b2", 5), _w("w3", 5, 3)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["N", 7])], [helper.make_tensor_value_info("y", F, ["N", 3])], inits)


def test_mlp_gemm_relu(device: str) -> None:
    m = _mlp()
    c = _check_vs_onnx(m, [torch.randn(5, 7, device=device)])
    assert c.report["fallback_at_import"] == []
    counts = c.report["op_counts"]
    # three GEMMs: fused one by one, or as one back-to-back chain
    assert counts.get("gemm_epilogue", 0) + counts.get("matmul", 0) >= 3 or counts.get("b2b_chain", 0) >= 1
    # a new batch size resolves the symbolic dim "N" again
    x = torch.randn(3, 7, device=device)
    (y,) = c(x)
    _close(y, ReferenceEvaluator(m).run(None, {"x": x.cpu().numpy()})[0])


def test_import_onnx_graph_and_file(tmp_path: Path, device: str) -> None:
    m = _mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(m, str(path))
    x = torch.randn(4, 7, device=device)
    ref = ReferenceEvaluator(m).run(None, {"x": x.cpu().numpy()})[0]
    for src in (path, str(path), m.SerializeToString()):
        imp = import_onnx(src, (x,))
        assert [t.shape for _, t in imp.graph.inputs] == [(4, 7)]
        _close(reference_run(imp.graph, [x])[0], ref)
    c = kfuse.compile(str(path), (x,))
    assert c.name == "mlp"
    _close(c(x)[0], ref)
    with pytest.raises(FrontendError, match="symbolic"):
        import_onnx(m)  # "N" cannot be fixed without example inputs


def _convnet() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 1], kernel_shape=[3, 3]),
        helper.make_node("BatchNormalization", ["c1", "s", "bb", "mu", "var"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["p", "gw"], ["c2"], group=2, dilations=[2, 2], pads=[2, 2, 2, 2]),
        helper.make_node("HardSwish", ["c2"], ["hs"]),
        helper.make_node("AveragePool", ["hs"], ["ap"], kernel_shape=[2, 2], strides=[1, 1], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["ap", "pw", "pb"], ["c3"], auto_pad="VALID"),
        helper.make_node("GlobalAveragePool", ["c3"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["f"]),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1),
    ]
    var = nh.from_array((_rng().random(8) + 0.5).astype(np.float32), "var")
    inits = [_w("cw", 8, 3, 3, 3), _w("cb", 8), _w("s", 8), _w("bb", 8), _w("mu", 8), var, _w("gw", 6, 4, 3, 3)]
    inits += [_w("pw", 10, 6, 1, 1), _w("pb", 10), _w("fw", 4, 10), _w("fb", 4)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 13, 11])], [helper.make_tensor_value_info("y", F, [2, 4])], inits)


@pytest.mark.usefixtures("fp32_convs")
def test_conv_bn_relu_pool(device: str) -> None:
    c = _check_vs_onnx(_convnet(), [torch.randn(2, 3, 13, 11, device=device)])
    assert c.report["fallback_at_import"] == []


def _block(opset: int = 20) -> onnx.ModelProto:
    """A transformer-ish block: layernorm, attention with reshape/transpose/softmax, GELU, split/concat."""
    d, h = 16, 2
    nodes = [
        helper.make_node("LayerNormalization", ["x", "ln_s", "ln_b"], ["ln"], epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "wqkv"], ["qkv0"]),
        helper.make_node("Add", ["qkv0", "bqkv"], ["qkv"]),
        helper.make_node("Split", ["qkv", "split3"], ["q", "k", "v"], axis=-1),
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["bsz"], axis=0),
        helper.make_node("Unsqueeze", ["bsz", "axes0"], ["bsz1"]),
        helper.make_node("Concat", ["bsz1", "heads_shape"], ["qshape"], axis=0),
        helper.make_node("Reshape", ["q", "qshape"], ["q4"]),
        helper.make_node("Reshape", ["k", "kshape"], ["k4"]),  # 0 and -1 entries
        helper.make_node("Reshape", ["v", "kshape"], ["v4"]),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["qt", "kt"], ["s0"]),
        helper.make_node("Div", ["s0", "sqrt_d"], ["s1"]),
        helper.make_node("Where", ["mask", "s1", "neg_big"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "vt"], ["o4"]),
        helper.make_node("Transpose", ["o4"], ["o3"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o3", "oshape"], ["o"]),
        helper.make_node("Slice", ["o", "sl_st", "sl_en", "sl_ax", "sl_step"], ["o_even"]),
        helper.make_node("Slice", ["o", "sl_st1", "sl_en", "sl_ax", "sl_step"], ["o_odd"]),
        helper.make_node("Concat", ["o_odd", "o_even"], ["o2"], axis=-1),
        helper.make_node("Gelu", ["o2"], ["g"], approximate="tanh"),
        helper.make_node("Add", ["g", "x"], ["res"]),
        helper.make_node("ReduceMean", ["res", "axes_m1"], ["mu"], keepdims=1),
        helper.make_node("Sub", ["res", "mu"], ["y"]),
        helper.make_node("ReduceSum", ["y", "axes1"], ["ysum"], keepdims=0),
        helper.make_node("Squeeze", ["bsz1", "axes0"], ["bsz_again"]),
        helper.make_node("Expand", ["ysum", "exp_shape"], ["ysum_e"]),
        helper.make_node("Identity", ["ysum_e"], ["z"]),
    ]
    mask = np.tril(np.ones((5, 5), dtype=bool))
    inits = [
        _w("ln_s", d),
        _w("ln_b", d),
        _w("wqkv", d, 3 * d),
        _w("bqkv", 3 * d),
        _i64("split3", [d, d, d]),
        _i64("zero", 0),
        _i64("axes0", [0]),
        _i64("axes1", [1]),
        _i64("axes_m1", [-1]),
        _i64("heads_shape", [5, h, d // h]),
        _i64("kshape", [0, 0, h, -1]),
        nh.from_array(np.array(np.sqrt(d // h), dtype=np.float32), "sqrt_d"),
        nh.from_array(mask, "mask"),
        nh.from_array(np.array(-1e9, dtype=np.float32), "neg_big"),
        _i64("oshape", [0, 0, d]),
        _i64("sl_st", [0]),
        _i64("sl_st1", [1]),
        _i64("sl_en", [2**62]),
        _i64("sl_ax", [-1]),
        _i64("sl_step", [2]),
        _i64("exp_shape", [3, 1, d]),
    ]
    out = [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None)]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["B", 5, d])], out, inits, opset)


def test_transformer_block(device: str) -> None:
    c = _check_vs_onnx(_block(), [torch.randn(3, 5, 16, device=device)])
    assert c.report["fallback_at_import"] == []
    ops = c.report["op_counts"]
    assert "fallback" not in ops


def test_elementwise_ops(device: str) -> None:
    """One node per elementwise converter, all outputs compared."""
    x, y = "x", "y"
    specs = [
        ("Sigmoid", [x], {}),
        ("Tanh", [x], {}),
        ("Erf", [x], {}),
        ("Exp", [x], {}),
        ("Neg", [x], {}),
        ("Abs", [x], {}),
        ("Sqrt", ["ax"], {}),
        ("Log", ["ax"], {}),
        ("Reciprocal", ["ax"], {}),
        ("Gelu", [x], {}),
        ("HardSigmoid", [x], {}),
        ("HardSigmoid", [x], {"alpha": 1 / 6, "beta": 0.5}),
        ("LeakyRelu", [x], {"alpha": 0.2}),
        ("Clip", [x, "lo", "hi"], {}),
        ("Clip", [x, "", "hi"], {}),
        ("Clip", [x, y], {}),
        ("Pow", ["ax", "two"], {}),
        ("Pow", ["ax", "two_i"], {}),
        ("Max", [x, y], {}),
        ("Min", [x, y, "zero_f"], {}),
        ("Sub", [x, y], {}),
        ("Mul", [x, y], {}),
        ("Div", [x, "ax"], {}),
        ("Equal", ["xi", "yi"], {}),
        ("Less", [x, y], {}),
        ("Greater", [x, y], {}),
        ("Not", ["lt"], {}),
        ("And", ["lt", "gt"], {}),
        ("Or", ["lt", "gt"], {}),
        ("Where", ["lt", x, y], {}),
        ("Cast", ["lt"], {"to": TP.FLOAT}),
        ("Cast", ["xi"], {"to": TP.FLOAT}),
        ("Dropout", [x], {}),
        ("IsNaN", [x], {}),
    ]
    nodes = [
        helper.make_node("Abs", [x], ["ax0"]),
        helper.make_node("Add", ["ax0", "one"], ["ax"]),
        helper.make_node("Cast", [x], ["xi0"], to=TP.INT64),  # float -> int: left to onnx (fallback)
        helper.make_node("Identity", ["xi0"], ["xi"]),
        helper.make_node("Cast", [y], ["yi"], to=TP.INT64),
        helper.make_node("Less", [x, y], ["lt"]),
        helper.make_node("Greater", [x, y], ["gt"]),
    ]
    outs = []
    for i, (op, ins, attrs) in enumerate(specs):
        nodes.append(helper.make_node(op, ins, [f"o{i}"], **attrs))
        outs.append(helper.make_tensor_value_info(f"o{i}", TP.UNDEFINED, None))
    inits = [
        nh.from_array(np.array(1.0, np.float32), "one"),
        nh.from_array(np.array(-0.5, np.float32), "lo"),
        nh.from_array(np.array(0.7, np.float32), "hi"),
        nh.from_array(np.array(2.0, np.float32), "two"),
        nh.from_array(np.array(2, np.int64), "two_i"),
        nh.from_array(np.array(0.0, np.float32), "zero_f"),
    ]
    ins = [helper.make_tensor_value_info("x", F, [3, 1, 7]), helper.make_tensor_value_info("y", F, [4, 7])]
    m = _model(nodes, ins, outs, inits, opset=20)
    c = _check_vs_onnx(m, [torch.randn(3, 1, 7, device=device) * 3, torch.randn(4, 7, device=device) * 3])
    assert set(c.report["fallback_at_import"]) == {"onnx::Cast"}  # only the float -> int casts


def test_old_opset_variants(device: str) -> None:
    """Opset 11: axes as attributes, split as attribute, Softmax flattening at ``axis``."""
    nodes = [
        helper.make_node("Unsqueeze", ["x"], ["u"], axes=[1]),
        helper.make_node("Squeeze", ["u"], ["s"], axes=[1]),
        helper.make_node("Split", ["s"], ["a", "b"], axis=2, split=[3, 4]),
        helper.make_node("ReduceSum", ["a"], ["rs0"], axes=[2], keepdims=1),
        helper.make_node("ReduceMean", ["a"], ["rm"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["rs0", "rm"], ["rs"]),
        helper.make_node("Softmax", ["b"], ["sm"], axis=1),  # over dims 1 and 2 together
        helper.make_node("Mul", ["sm", "rs"], ["y"]),
        helper.make_node("Slice", ["y", "st", "en", "ax"], ["z"]),
        helper.make_node("Clip", ["z", "lo", ""], ["w"]),
    ]
    inits = [_i64("st", [1, -3]), _i64("en", [100, -1]), _i64("ax", [1, 2]), nh.from_array(np.array(-0.01, np.float32), "lo")]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 5, 7])], [helper.make_tensor_value_info("w", F, None)], inits, opset=11)
    # onnx.reference applies opset 13's Softmax rule to every version; kfuse's evaluator follows the spec
    c = _check_vs_onnx(m, [torch.randn(2, 5, 7, device=device)], ev=reference_evaluator(m))
    assert c.report["fallback_at_import"] == []


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_reference_evaluator_fixes(opset: int, op: str) -> None:
    """kfuse's reference evaluator (used for the report and fallbacks) against torch."""
    nodes = [helper.make_node(op, ["x"], ["y"], axis=1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, 4])], [helper.make_tensor_value_info("y", F, [2, 3, 4])], [], opset)
    x = torch.randn(2, 3, 4)
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    ref = fn(x.reshape(2, 12), 1).reshape(2, 3, 4) if opset < 13 else fn(x, 1)
    _close(torch.from_numpy(reference_evaluator(m).run(None, {"x": x.numpy()})[0]), ref, 1e-5)
    # GatherElements with more than 64 choices along the axis (onnx's own version fails there)
    nodes = [helper.make_node("GatherElements", ["d", "i"], ["y"], axis=1)]
    ins = [helper.make_tensor_value_info("d", F, [1, 100]), helper.make_tensor_value_info("i", TP.INT64, [1, 8])]
    m = _model(nodes, ins, [helper.make_tensor_value_info("y", F, [1, 8])], [], opset)
    d, i = torch.randn(1, 100), torch.randint(-100, 100, (1, 8))
    out = reference_evaluator(m).run(None, {"d": d.numpy(), "i": i.numpy()})[0]
    _close(torch.from_numpy(out), torch.gather(d, 1, i % 100))


def test_embedding_gather_and_kwargs(device: str) -> None:
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
        helper.make_node("Gather", ["e", "one"], ["tok1"], axis=1),  # scalar index -> select
        helper.make_node("Add", ["tok1", "bias"], ["y"]),
    ]
    inits = [_w("table", 11, 6), _i64("one", 1)]
    ins = [helper.make_tensor_value_info("ids", TP.INT64, [2, 4]), helper.make_tensor_value_info("bias", F, [6])]
    m = _model(nodes, ins, [helper.make_tensor_value_info("y", F, [2, 6])], inits)
    ids = torch.randint(0, 11, (2, 4), device=device)
    bias = torch.randn(6, device=device)
    c = kfuse.compile(m, (ids,), {"bias": bias})
    assert c.report["fallback_at_import"] == [] and "embedding" in c.report["op_counts"]
    ids2 = torch.randint(0, 11, (2, 4), device=device)
    ref = ReferenceEvaluator(m).run(None, {"ids": ids2.cpu().numpy(), "bias": bias.cpu().numpy()})[0]
    _close(c(ids2, bias=bias)[0], ref)


# ---------------------------------------------------------------------------------------
# fallback
# ---------------------------------------------------------------------------------------
def test_fallback_cumsum(device: str) -> None:
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("CumSum", ["h", "axis"], ["cs"], reverse=1),
        helper.make_node("Relu", ["cs"], ["y"]),
    ]
    inits = [_w("w", 5, 4), _i64("axis", 1)]
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 5])], [helper.make_tensor_value_info("y", F, [3, 4])], inits)
    c = _check_vs_onnx(m, [torch.randn(3, 5, device=device)])
    assert c.report["fallback"] == ["onnx::CumSum"]
    assert c.report["fallback_at_import"] == ["onnx::CumSum"]


def test_fallback_data_dependent_shape(device: str) -> None:
    """NonZero's output shape depends on values: fixed from the example, a different count is a clear error."""
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("NonZero", ["pos"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["y"]),
    ]
    zero = nh.from_array(np.array(0.0, np.float32), "zero")
    m = _model(nodes, [helper.make_tensor_value_info("x", F, [6])], [helper.make_tensor_value_info("y", TP.INT64, None)], [zero])
    x = torch.tensor([1.0, -1.0, 2.0, -3.0, 0.5, -0.5], device=device)
    c = kfuse.compile(m, (x,))
    assert c.report["fallback"] == ["onnx::NonZero"]
    _close(c(x)[0], ReferenceEvaluator(m).run(None, {"x": x.cpu().numpy()})[0])
    _close(c(-x)[0], ReferenceEvaluator(m).run(None, {"x": (-x).cpu().numpy()})[0])  # same count: fine
    with pytest.raises(RuntimeError, match="depends on input values"):
        c(x.abs())


# ---------------------------------------------------------------------------------------
# models exported from the zoo
# ---------------------------------------------------------------------------------------
def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[onnx.ModelProto, str]:
    try:
        prog = torch.onnx.export(model, args, kwargs=kwargs, dynamo=True, verbose=False)
        return prog.model_proto, "dynamo"
    except Exception:  # pragma: no cover - the TorchScript exporter as a second try
        f = io.BytesIO()
        torch.onnx.export(model, args, f, kwargs=kwargs, dynamo=False)
        return onnx.load_from_string(f.getvalue()), "torchscript"


def _as_list(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [v for v in out.values() if isinstance(v, torch.Tensor)]
    return [v for v in out if isinstance(v, torch.Tensor)]  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["mlp-tiny", "resnet-tiny", "bert-tiny"])
@pytest.mark.usefixtures("fp32_convs")
def test_zoo_export(name: str, device: str) -> None:
    import kfuse.models

    kw = {"batch": 2, "seq": 8} if name.startswith("bert") else {"batch": 2}
    model, args, kwargs = kfuse.models.build(name, device=device, **kw)
    model.eval()
    proto, exporter = _export(model, args, kwargs)
    assert exporter == "dynamo"
    # the frontend is under test here: the bigger models run ops through PyTorch (interpreted convs take minutes)
    backend = None if name == "mlp-tiny" or device != "cpu" else "torch"
    c = kfuse.compile(proto, args, kwargs, backend=backend)
    assert c.report["max_rel_err"] < 1e-4
    fresh = tuple(torch.randn_like(a) if a.is_floating_point() else a for a in args)
    if name.startswith("bert"):
        fresh = (torch.randint(0, 100, args[0].shape, device=device),)
    with torch.no_grad():
        ref = _as_list(model(*fresh, **kwargs))
    out = c(*fresh, **kwargs)
    out = out if isinstance(out, (list, tuple)) else [out]
    assert len(out) == len(ref) >= 1
    for o, r in zip(out, ref, strict=True):
        _close(o, r, 1e-4)


# ---------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------
def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(OnnxLoadError, match=r"^no such ONNX file: .*nope\.onnx$"):
        kfuse.compile(str(path), (torch.randn(2),))
    with pytest.raises(FrontendError, match="no such ONNX file"):
        import_onnx(path)


@pytest.mark.parametrize("content", [b"this is not an onnx model\n" * 5, bytes(range(256)) * 3, b""])
def test_corrupt_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(OnnxLoadError, match=r"bad\.onnx is not a valid ONNX model"):
        kfuse.compile(path, (torch.randn(2),))


def test_checker_failure() -> None:
    node = helper.make_node("Relu", ["undefined_value"], ["y"])
    g = helper.make_graph([node], "bad", [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OnnxLoadError, match="fails the ONNX checker"):
        kfuse.compile(m, (torch.randn(2),))


def test_wrong_inputs(device: str) -> None:
    m = _mlp()
    with pytest.raises(FrontendError, match=r"takes 1 inputs \(x\), got 2"):
        kfuse.compile(m, (torch.randn(2, 7, device=device), torch.randn(2, 7, device=device)))
    with pytest.raises(FrontendError, match="missing: x"):
        kfuse.compile(m, ())
    with pytest.raises(FrontendError, match="no input named 'z'"):
        kfuse.compile(m, (), {"z": torch.randn(2, 7, device=device)})
    with pytest.raises(FrontendError, match="float32 in the model, got a torch.float16"):
        kfuse.compile(m, (torch.randn(2, 7, dtype=torch.float16, device=device),))
    with pytest.raises(FrontendError, match="has dim 1 = 7"):
        kfuse.compile(m, (torch.randn(2, 6, device=device),))
    c = kfuse.compile(m, (torch.randn(2, 7, device=device),))
    with pytest.raises(TypeError, match="called with inputs structured as"):
        c(torch.randn(2, 7, device=device), torch.randn(2, 7, device=device))
