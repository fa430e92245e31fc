"""ONNX converter semantics against the ONNX spec, computed independently with numpy/torch
(not with onnx's reference evaluator, which kfuse also uses for fallbacks and for the compile check)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper
from onnx import numpy_helper as nh

import kfuse
from kfuse.frontend.onnx import import_onnx, reference_evaluator
from kfuse.ir.interpret import reference_run

F = TP.FLOAT


def _model(nodes: list, inputs: list, out: str, inits: list, opset: int = 17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "t", inputs, [], inits)
    inferred = onnx.shape_inference.infer_shapes(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), strict_mode=True)
    outs = [v for v in inferred.graph.value_info if v.name == out]
    m = helper.make_model(helper.make_graph(nodes, "t", inputs, outs, inits), opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _run_all(m: onnx.ModelProto, xs: list[np.ndarray], expected: np.ndarray) -> None:
    """The imported graph, onnx's evaluator as kfuse patches it, and the compiled model all match ``expected``."""
    ts = [torch.from_numpy(x) for x in xs]
    imp = import_onnx(m, tuple(ts))
    got = reference_run(imp.graph, ts)[0]
    assert tuple(got.shape) == expected.shape
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-5)
    names = [i.name for i in m.graph.input]
    ref = reference_evaluator(m).run(None, dict(zip(names, xs, strict=True)))[0]
    assert ref.shape == expected.shape
    np.testing.assert_allclose(ref, expected, rtol=1e-5, atol=1e-5)
    c = kfuse.compile(m, tuple(ts), backend="torch")
    (y,) = c(*ts)
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# Gather on an initializer with runtime indices (the embedding path): negative indices
# count from the end (was: IndexError in the reference, out-of-bounds reads when compiled)
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("idx_type", [TP.INT64, TP.INT32])
def test_gather_embedding_negative_indices(idx_type: int) -> None:
    w = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    m = _model(
        [helper.make_node("Gather", ["w", "i"], ["y"])],
        [helper.make_tensor_value_info("i", idx_type, [2, 3])],
        "y",
        [nh.from_array(w, "w")],
    )
    idx = np.array([[0, -1, 2], [-6, 5, -3]], dtype=helper.tensor_dtype_to_np_dtype(idx_type))
    _run_all(m, [idx], np.take(w, idx, axis=0))
    imp = import_onnx(m, (torch.from_numpy(idx),))
    assert imp.fallbacks == ()
    assert any(n.op == "embedding" for n in imp.graph.nodes)


# ---------------------------------------------------------------------------------------
# MaxPool / AveragePool pads: ONNX lays them out (x1_begin, x2_begin, x1_end, x2_end).
# onnx's evaluator (kfuse's fallback and compile check) read them as (top, bottom, left, right)
# for stride 1 and got the ceil_mode output size wrong.
# ---------------------------------------------------------------------------------------
def _np_pool(x: np.ndarray, mode: str, k: int, s: int, begin: tuple[int, int], end: tuple[int, int], include_pad: bool) -> np.ndarray:
    """Direct loop over the spec's windows (floor mode)."""
    n, c, h, w = x.shape
    oh = (h + begin[0] + end[0] - k) // s + 1
    ow = (w + begin[1] + end[1] - k) // s + 1
    out = np.zeros((n, c, oh, ow), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s - begin[0], j * s - begin[1]
            rows = [r for r in range(r0, r0 + k) if 0 <= r < h]
            cols = [q for q in range(c0, c0 + k) if 0 <= q < w]
            win = x[:, :, rows][:, :, :, cols]
            if mode == "max":
                out[:, :, i, j] = win.max(axis=(2, 3))
            else:
                out[:, :, i, j] = win.sum(axis=(2, 3)) / (k * k if include_pad else len(rows) * len(cols))
    return out.astype(np.float32)


@pytest.mark.parametrize(
    ("op", "pads", "include_pad"),
    [
        ("MaxPool", [0, 0, 1, 1], False),  # asymmetric: falls back to the (patched) evaluator
        ("MaxPool", [1, 0, 1, 0], False),  # symmetric per dim, differs across dims: converted
        ("AveragePool", [0, 0, 1, 1], False),
        ("AveragePool", [0, 0, 1, 1], True),
        ("AveragePool", [1, 0, 1, 0], True),
    ],
)
def test_pool_pads_layout(op: str, pads: list[int], include_pad: bool) -> None:
    x = np.random.default_rng(1).standard_normal((1, 2, 7, 8)).astype(np.float32)
    kw = {"count_include_pad": int(include_pad)} if op == "AveragePool" else {}
    m = _model(
        [helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], pads=pads, **kw)],
        [helper.make_tensor_value_info("x", F, [1, 2, 7, 8])],
        "y",
        [],
    )
    mode = "max" if op == "MaxPool" else "avg"
    _run_all(m, [x], _np_pool(x, mode, 3, 1, (pads[0], pads[1]), (pads[2], pads[3]), include_pad))


def test_maxpool_ceil_mode_output_size() -> None:
    # spec: ceil((7 + 2 - 2) / 1) + 1 = 8 (the evaluator made it 10)
    x = np.random.default_rng(2).standard_normal((1, 1, 7, 7)).astype(np.float32)
    m = _model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)],
        [helper.make_tensor_value_info("x", F, [1, 1, 7, 7])],
        "y",
        [],
        opset=19,
    )
    expected = torch.nn.functional.max_pool2d(torch.from_numpy(x), 2, 1, 1, ceil_mode=True).numpy()
    assert expected.shape == (1, 1, 8, 8)
    _run_all(m, [x], expected)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER"])
def test_pool_auto_pad_same(auto_pad: str) -> None:
    x = np.random.default_rng(3).standard_normal((1, 2, 6, 7)).astype(np.float32)
    m = _model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], auto_pad=auto_pad)],
        [helper.make_tensor_value_info("x", F, [1, 2, 6, 7])],
        "y",
        [],
    )
    # stride 1, kernel 2: one pad row/col, at the end (UPPER) or the beginning (LOWER)
    b, e = ((0, 0), (1, 1)) if auto_pad == "SAME_UPPER" else ((1, 1), (0, 0))
    _run_all(m, [x], _np_pool(x, "max", 2, 1, b, e, False))


# ---------------------------------------------------------------------------------------
# GatherElements (negative indices count from the end) and CumSum (RoBERTa's position ids)
# ---------------------------------------------------------------------------------------
def test_gather_elements_with_negative_indices() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    idx = np.array([[0, -1, 4], [2, -5, 1], [3, 3, -2]], dtype=np.int64)
    m = _model(
        [helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
        [helper.make_tensor_value_info("x", F, [3, 5]), helper.make_tensor_value_info("i", TP.INT64, [3, 3])],
        "y",
        [],
    )
    _run_all(m, [x, idx], np.take_along_axis(x, np.where(idx < 0, idx + 5, idx), axis=1))
    assert import_onnx(m, (torch.from_numpy(x), torch.from_numpy(idx))).fallbacks == ()


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_cumsum_along_a_constant_axis(axis: int) -> None:
    x = np.random.default_rng(1).standard_normal((4, 7)).astype(np.float32)
    m = _model(
        [helper.make_node("CumSum", ["x", "axis"], ["y"])],
        [helper.make_tensor_value_info("x", F, [4, 7])],
        "y",
        [nh.from_array(np.array(axis, dtype=np.int64), "axis")],
    )
    _run_all(m, [x], np.cumsum(x, axis=axis))
    assert import_onnx(m, (torch.from_numpy(x),)).fallbacks == ()
