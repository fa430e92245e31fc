"""Every op's type rule agrees with its reference on random inputs."""

from __future__ import annotations

import pytest
import torch

import kfuse.compiler  # noqa: F401 - registers the ops that passes add
import kfuse.passes.layout  # noqa: F401 - to_nhwc
from kfuse.ir import ops
from kfuse.ir.graph import TensorType

F32, F16, I64, B = torch.float32, torch.float16, torch.int64, torch.bool


def rand(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if dtype == B:
        return torch.rand(shape) > 0.5
    if dtype == I64:
        return torch.randint(0, 7, shape)
    return (torch.rand(shape) * 2 + 0.1).to(dtype)  # positive: sqrt/log/pow stay finite


# (op, input (shape, dtype) list, attrs)
CASES = [
    *[
        (u, [((3, 5), F32)], {})
        for u in (
            "relu",
            "sigmoid",
            "tanh",
            "silu",
            "hardswish",
            "hardsigmoid",
            "neg",
            "abs",
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "erf",
            "sin",
            "cos",
            "reciprocal",
            "identity",
            "gelu",
            "gelu_tanh",
        )
    ],
    ("leaky_relu", [((4, 3), F16)], {"slope": 0.1}),
    ("clamp", [((4, 3), F32)], {"lo": 0.5, "hi": 1.5}),
    ("cast", [((4, 3), F32)], {"dtype": F16}),
    *[(b, [((2, 3, 4), F32), ((4,), F32)], {}) for b in ("add", "sub", "mul", "div", "maximum", "minimum", "pow")],
    *[(c, [((2, 3), F32), ((1, 3), F32)], {}) for c in ("eq", "ne", "lt", "le", "gt", "ge")],
    ("add", [((2, 3), F16), ((), F32)], {}),  # a 0-d fp32 constant does not promote fp16
    ("add", [((2, 3), I64), ((), F32)], {}),
    ("div", [((2, 3), I64), ((2, 3), I64)], {}),
    ("logical_and", [((2, 3), B), ((2, 3), B)], {}),
    ("logical_or", [((2, 3), B), ((1, 3), B)], {}),
    ("logical_not", [((2, 3), B)], {}),
    ("where", [((2, 3), B), ((2, 3), F16), ((), F16)], {}),
    ("matmul", [((2, 3, 5), F32), ((5, 7), F32)], {}),
    ("matmul", [((2, 4, 3, 5), F32), ((2, 4, 5, 6), F32)], {}),
    (
        "conv2d",
        [((2, 3, 9, 7), F32), ((4, 3, 3, 3), F32), ((4,), F32)],
        {"stride": (2, 1), "padding": (1, 0), "dilation": (1, 1), "groups": 1},
    ),
    ("batch_norm", [((2, 3, 4, 4), F32), ((3,), F32), ((3,), F32), ((3,), F32), ((3,), F32)], {"eps": 1e-5}),
    ("softmax", [((2, 5, 7), F32)], {"dim": 2}),
    ("log_softmax", [((2, 5, 7), F32)], {"dim": 1}),
    ("layer_norm", [((2, 5, 8), F32), ((8,), F32), ((8,), F32)], {"normalized_shape": (8,), "eps": 1e-5}),
    ("rms_norm", [((2, 5, 8), F32), ((8,), F32)], {"normalized_shape": (8,), "eps": 1e-6}),
    ("sdpa", [((2, 3, 5, 8), F32)] * 3, {"is_causal": True, "scale": None}),
    ("sdpa", [((2, 3, 5, 8), F32)] * 3 + [((2, 1, 5, 5), B)], {"is_causal": False, "scale": 0.3}),
    ("embedding", [((11, 6), F32), ((2, 5), I64)], {}),
    ("sum", [((2, 5, 7), F32)], {"dims": (1,), "keepdim": True}),
    ("mean", [((2, 5, 7), F32)], {"dims": (0, 2), "keepdim": False}),
    ("amax", [((2, 5, 7), F32)], {"dims": (2,), "keepdim": False}),
    ("var", [((2, 5, 7), F32)], {"dims": (2,), "correction": 0, "keepdim": True}),
    (
        "max_pool2d",
        [((2, 3, 9, 9), F32)],
        {"kernel_size": (3, 3), "stride": (2, 2), "padding": (1, 1), "dilation": (1, 1), "ceil_mode": False},
    ),
    ("avg_pool2d", [((2, 3, 9, 9), F32)], {"kernel_size": (2, 2), "stride": (2, 2), "padding": (0, 0), "ceil_mode": True}),
    ("adaptive_avg_pool2d", [((2, 3, 9, 7), F32)], {"output_size": (1, 1)}),
    ("group_norm", [((2, 6, 5, 7), F32), ((6,), F32), ((6,), F32)], {"groups": 3, "eps": 1e-5}),
    ("group_norm", [((2, 8, 9), F32), ((8,), F32), ((8,), F32)], {"groups": 2, "act": "silu"}),
    ("upsample2d", [((2, 3, 5, 7), F32)], {"mode": "bilinear", "size": (11, 13), "align_corners": False}),
    ("upsample2d", [((2, 3, 5, 7), F32)], {"mode": "nearest", "size": (10, 14), "scale_factors": (2.0, 2.0)}),
    ("upsample2d", [((1, 2, 3, 4), F32)], {"mode": "nearest", "size": (21, 9), "nearest_divide": True}),
    ("reshape", [((2, 3, 4), F32)], {"shape": (6, 4)}),
    ("permute", [((2, 3, 4), F32)], {"dims": (2, 0, 1)}),
    ("expand", [((1, 3, 1), F32)], {"shape": (2, 3, 4)}),
    ("slice", [((5, 9), F32)], {"dim": 1, "start": 1, "end": 8, "step": 3}),
    ("select", [((5, 9), F32)], {"dim": 0, "index": 4}),
    ("cat", [((2, 3), F32), ((2, 5), F32)], {"dim": 1}),
    ("contiguous", [((2, 3), F32)], {}),
    ("pad", [((2, 3, 4, 5), F32)], {"pads": (1, 2, 0, 3), "value": 0.5}),
    ("to_nhwc", [((2, 3, 4, 5), F32)], {"pad_c": 5}),
    ("cumsum", [((3, 5), I64)], {"dim": 1, "dtype": None}),  # an integer cumsum accumulates in int64
    ("cumsum", [((3, 5), F16)], {"dim": 0, "dtype": torch.float32}),
    ("gather", [((3, 8), F32), ((3, 4), I64)], {"dim": 1}),
    ("gather_rows", [((2, 4, 8), F32), ((4,), I64)], {"shape": (2, 2, 8)}),  # index values 0..6 of 8 rows
]


@pytest.mark.parametrize("op,inputs,attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_type_rule_matches_reference(op: str, inputs: list, attrs: dict) -> None:
    xs = [rand(s, d) for s, d in inputs]
    out = ops.run_reference(op, xs, attrs)
    t = ops.infer_type(op, [TensorType.of(x) for x in xs], attrs)
    assert (t.shape, t.dtype) == (tuple(out.shape), out.dtype), f"{op}: rule says {t}, reference gives {tuple(out.shape)} {out.dtype}"
    if t.layout == "channels_last":
        assert out.is_contiguous(memory_format=torch.channels_last)


def test_every_registered_op_is_covered() -> None:
    covered = {c[0] for c in CASES}
    internal = {"fallback", "getitem"}
    missing = {name for name, d in ops.REGISTRY.items() if d.kind != ops.FUSED and name not in internal} - covered
    assert not missing, f"ops without a type-rule test: {sorted(missing)}"


def test_bad_inputs_name_the_op() -> None:
    with pytest.raises(ValueError, match="matmul"):
        ops.infer_type("matmul", [TensorType((2, 3), F32), TensorType((4, 5), F32)], {})
    with pytest.raises(ValueError, match="takes 2 inputs"):
        ops.infer_type("add", [TensorType((2, 3), F32)], {})
    with pytest.raises(KeyError, match="unknown kfuse op"):
        ops.get("no_such_op")


def test_elementwise_ops_have_triton_expressions() -> None:
    for name, d in ops.REGISTRY.items():
        if d.kind == ops.ELEMENTWISE:
            assert d.triton, f"{name} has no Triton expression"
