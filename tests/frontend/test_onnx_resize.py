"""ONNX ``Resize`` and ``Einsum`` imported as kfuse ops, checked against onnx's ReferenceEvaluator on fresh
inputs; the variants PyTorch's upsampling does not compute fall back to the evaluator."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

import kfuse


def _model(nodes: list, x_shapes: dict[str, tuple[int, ...]], inits: list) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info(n, TP.FLOAT, s) for n, s in x_shapes.items()]
    out = helper.make_tensor_value_info("y", TP.FLOAT, None)
    g = helper.make_graph(nodes, "t", inputs, [out], inits)
    m = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]), strict_mode=True)
    shaped = next(v for v in (*m.graph.output, *m.graph.value_info) if v.name == "y" and v.type.tensor_type.HasField("shape"))
    g = helper.make_graph(nodes, "t", inputs, [shaped], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(m)
    return m


def _resize(attrs: dict, shape: tuple[int, ...], scales: list[float] | None, sizes: list[int] | None) -> onnx.ModelProto:
    inits = [nh.from_array(np.array([], np.float32), "roi"), nh.from_array(np.array(scales or [], np.float32), "scales")]
    ins = ["x", "roi", "scales"]
    if sizes is not None:
        inits.append(nh.from_array(np.array(sizes, np.int64), "sizes"))
        ins.append("sizes")
    nodes = [helper.make_node("Resize", ins, ["r"], **attrs), helper.make_node("Relu", ["r"], ["y"])]
    return _model(nodes, {"x": shape}, inits)


def _check(m: onnx.ModelProto, xs: dict[str, tuple[int, ...]]) -> kfuse.CompiledModel:
    example = tuple(torch.randn(s) for s in xs.values())
    c = kfuse.compile(m, example)
    ev = ReferenceEvaluator(m)
    for inputs in (example, tuple(torch.randn_like(x) for x in example)):
        ref = ev.run(None, {n: x.numpy() for n, x in zip(xs, inputs, strict=True)})[0]
        torch.testing.assert_close(c(*inputs)[0], torch.from_numpy(ref), rtol=1e-5, atol=1e-5)
    return c


LINEAR = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"}
NEAREST = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
CASES = [
    (LINEAR, (2, 3, 5, 7), [1, 1, 2, 3], None),
    (LINEAR, (2, 3, 9, 8), None, [2, 3, 4, 5]),  # down
    ({**LINEAR, "coordinate_transformation_mode": "pytorch_half_pixel"}, (2, 3, 5, 7), None, [2, 3, 11, 4]),
    ({**LINEAR, "coordinate_transformation_mode": "align_corners"}, (2, 3, 5, 7), None, [2, 3, 11, 13]),
    (NEAREST, (2, 3, 5, 7), [1, 1, 2, 2], None),
    (NEAREST, (1, 2, 3, 4), None, [1, 2, 21, 9]),  # 1-in-7 rows: floor(dst / 7), where dst * (1 / 7) would round down
    (NEAREST, (1, 2, 3, 4), [1, 1, 1.5, 2.5], None),
]


@pytest.mark.parametrize("attrs,shape,scales,sizes", CASES)
def test_resize_matches_the_reference_evaluator(attrs, shape, scales, sizes) -> None:
    c = _check(_resize(attrs, shape, scales, sizes), {"x": shape})
    assert c.report["fallback_at_import"] == []


@pytest.mark.parametrize("attrs", [{"mode": "nearest"}, {"mode": "cubic"}, {**LINEAR, "coordinate_transformation_mode": "asymmetric"}])
def test_other_resize_variants_fall_back(attrs) -> None:
    c = _check(_resize(attrs, (1, 2, 3, 4), [1, 1, 2, 2], None), {"x": (1, 2, 3, 4)})
    assert c.report["fallback_at_import"] == ["onnx::Resize"]


def test_einsum_imports_as_a_batched_matmul() -> None:
    nodes = [helper.make_node("Einsum", ["a", "b"], ["s"], equation="bhid,bhjd->bhij"), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    c = _check(_model(nodes, {"a": (2, 3, 5, 8), "b": (2, 3, 7, 8)}, []), {"a": (2, 3, 5, 8), "b": (2, 3, 7, 8)})
    assert c.report["fallback_at_import"] == []
    assert "matmul" in c.report["op_counts"] or any("matmul" in k["ops"] for k in c.report["kernels"])


def test_what_torch_onnx_export_writes_imports_natively() -> None:
    """Both exporters write bilinear as linear / half_pixel and nearest as asymmetric / floor."""
    import io

    class _Seg(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = torch.nn.Conv2d(3, 8, 3, 2, 1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.relu(self.c(x))
            up = torch.nn.functional.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)
            return up, torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")

    torch.manual_seed(0)
    m, x = _Seg().eval(), torch.randn(2, 3, 17, 13)
    buf = io.BytesIO()
    torch.onnx.export(m, (x,), buf, dynamo=False)
    c = kfuse.compile(onnx.load_from_string(buf.getvalue()), (x,))
    assert c.report["fallback_at_import"] == []
    for got, want in zip(c(x), m(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
