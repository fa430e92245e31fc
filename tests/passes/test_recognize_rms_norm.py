"""A written-out RMSNorm (Hugging Face's form: up-cast, square, last-dim mean, + eps, rsqrt, scale, cast back, weight)
becomes one ``rms_norm`` node (``kfuse.passes.recognize_rms_norm``) that computes what the chain did; look-alikes
that are not that norm, or whose pieces are read elsewhere, stay as they are."""

from __future__ import annotations

import pytest
import torch

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.passes.recognize_rms_norm import recognize_rms_norm

N = 37  # the normalised width (odd)
ROWS = (3, 5)
EPS = 1e-2  # large enough that a dropped or wrong eps shows in the small rows' values
SCALES = torch.tensor([1e-2, 0.3, 1.0, 7.0, 40.0])  # the rows' magnitudes: eps dominates the first, not the last


def _x(dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*ROWS, N, generator=g) * SCALES[None, :, None]
    return x.to(dtype)


def _weight(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100)
    return (torch.randn(shape, generator=g) + 0.1).to(dtype)


def _norm_graph(
    dtype: torch.dtype = torch.float16,
    *,
    up: bool | None = None,  # the fp32 up-cast (default: for a 16-bit input)
    down: bool | None = None,  # the cast back to the input's dtype (default: for a 16-bit input)
    square: str = "mul",  # "mul": xf * xf; "pow": pow(xf, 2.0); "fourth": pow(xf, 4.0)
    weight: str | None = "right",  # None, "left" (w * y) or "right" (y * w)
    weight_shape: tuple[int, ...] = (N,),
    mean_dim: int = -1,
    eps: str = "const",  # "const": a 0-d constant; "input": a graph input
    eps_shape: tuple[int, ...] = (),
    also_read: str | None = None,  # "rsqrt": another node reads it; "rsqrt_out": it is an output; "upcast": the fp32 copy is read too
    residual: bool = False,  # x also read by an add after the norm (a decoder's residual)
) -> tuple[Graph, list[torch.Tensor]]:
    up = dtype != torch.float32 if up is None else up
    down = dtype != torch.float32 if down is None else down
    b = GraphBuilder("rms")
    x = b.add_input("x", TensorType((*ROWS, N), dtype))
    inputs = [_x(dtype)]
    xf = b.op("cast", [x], {"dtype": torch.float32}, name="xf") if up else x
    if square == "mul":
        sq = b.op("mul", [xf, xf], name="sq")
    else:
        sq = b.op("pow", [xf, b.scalar(2.0 if square == "pow" else 4.0)], name="sq")
    mean = b.op("mean", [sq], {"dims": (mean_dim,), "keepdim": True, "dtype": None}, name="mean")
    if eps == "input":
        e = b.add_input("eps", TensorType((), torch.float32))
        inputs.append(torch.tensor(EPS))
    else:
        e = b.add_constant(torch.full(eps_shape, EPS), "eps_c")
    r = b.op("rsqrt", [b.op("add", [mean, e], name="var_eps")], name="r")
    y = b.op("mul", [xf, r], name="scaled")
    if down:
        y = b.op("cast", [y], {"dtype": dtype}, name="down")
    if weight is not None:
        w = b.add_constant(_weight(weight_shape, b.type_of(y).dtype), "w")
        y = b.op("mul", [w, y] if weight == "left" else [y, w], name="out")
    outputs = [y]
    if also_read == "rsqrt":
        outputs.append(b.op("mul", [r, b.scalar(3.0)], name="r_again"))
    elif also_read == "rsqrt_out":
        outputs.append(r)
    elif also_read == "upcast":
        outputs.append(b.op("sum", [xf], {"dims": (2,), "keepdim": False}, name="xf_sum"))
    if residual:
        outputs.append(b.op("add", [x, y], name="res"))
    return b.build(outputs), inputs


def _ops(g: Graph) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(n.name, n.op, n.inputs) for n in g.nodes]


def _assert_same_values(old: Graph, new: Graph, inputs: list[torch.Tensor], dtype: torch.dtype) -> None:
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # the template rounds once, the written form twice: 1-2 units in the last place
    for want, got, o in zip(reference_run(old, inputs), reference_run(new, inputs), old.outputs, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape, o
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, msg=lambda m, o=o: f"output {o}: {m}")


def _recognized(g: Graph) -> tuple[Graph, Node]:
    new = recognize_rms_norm(g)
    new.verify()
    norms = [n for n in new.nodes if n.op == "rms_norm"]
    assert len(norms) == 1, new
    return new, norms[0]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_hf_16_bit_form_with_casts_and_weight(dtype: torch.dtype) -> None:
    g, xs = _norm_graph(dtype, weight="right")
    new, norm = _recognized(g)
    assert [n.op for n in new.nodes] == ["rms_norm"]
    assert norm.name == g.outputs[0] and new.outputs == g.outputs
    assert norm.inputs == ("x", "w")  # the 16-bit input itself, not its fp32 copy
    assert tuple(norm.attrs["normalized_shape"]) == (N,)
    assert norm.attrs["eps"] == pytest.approx(EPS, rel=1e-6)
    assert norm.type == g.nodes[-1].type and norm.ttype.dtype == dtype
    assert set(new.constants) == {"w"}  # eps is an attribute now
    _assert_same_values(g, new, xs, dtype)


def test_fp32_pow_form_weight_on_the_left_x_read_by_the_residual_too() -> None:
    g, xs = _norm_graph(torch.float32, square="pow", weight="left", mean_dim=2, residual=True)
    new, norm = _recognized(g)
    assert [n.op for n in new.nodes] == ["rms_norm", "add"]  # the residual reads x, which stays
    assert norm.inputs == ("x", "w") and norm.attrs["eps"] == pytest.approx(EPS, rel=1e-6)
    assert tuple(norm.attrs["normalized_shape"]) == (N,)
    _assert_same_values(g, new, xs, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_no_weight(dtype: torch.dtype) -> None:
    g, xs = _norm_graph(dtype, weight=None)
    new, norm = _recognized(g)
    assert [n.op for n in new.nodes] == ["rms_norm"]
    assert norm.inputs == ("x",) and norm.name == g.outputs[0]
    assert norm.attrs["eps"] == pytest.approx(EPS, rel=1e-6)
    _assert_same_values(g, new, xs, dtype)


def test_a_norm_read_by_its_weight_multiply_and_elsewhere_keeps_the_weight_apart() -> None:
    """The cast-back value is read twice (the weight's multiply and an output): the norm without the weight is
    recognised, the multiply stays."""
    g, xs = _norm_graph(torch.float16, weight="right")
    b = GraphBuilder.from_graph(g, keep_nodes=True)
    g2 = b.build([*g.outputs, "down"])
    new, norm = _recognized(g2)
    assert norm.name == "down" and norm.inputs == ("x",)
    assert [n.op for n in new.nodes] == ["rms_norm", "mul"]
    _assert_same_values(g2, new, xs, torch.float16)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_hf_llama_rms_norm_imported(dtype: torch.dtype) -> None:
    """transformers' own LlamaRMSNorm through torch.export and the pipeline's stages up to this one."""
    transformers = pytest.importorskip("transformers")
    from kfuse.compiler import Options, default_pipeline, optimize
    from kfuse.frontend.torch_export import import_module

    norm_cls = transformers.models.llama.modeling_llama.LlamaRMSNorm
    m = norm_cls(N, eps=EPS).to(dtype).eval()
    with torch.no_grad():
        m.weight.copy_(_weight((N,), dtype))
    x = _x(dtype, seed=3)
    g = import_module(m, (x,)).graph
    assert "rsqrt" in [n.op for n in g.nodes]
    stages = []
    for name, fn in default_pipeline(Options()):
        stages.append((name, fn))
        if name == "recognize_rms_norm":
            break
    assert stages[-1][0] == "recognize_rms_norm"
    new = optimize(g, pipeline=stages).graph
    (node,) = new.nodes
    assert node.op == "rms_norm" and node.inputs[0] == g.input_names[0] and len(node.inputs) == 2
    assert node.attrs["eps"] == pytest.approx(EPS, rel=1e-6)
    with torch.no_grad():
        want = m(x)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(reference_run(new, [x])[0], want, rtol=tol, atol=tol)


NEGATIVE = {
    "mean_over_a_non_last_dim": dict(mean_dim=1),
    "rsqrt_read_by_another_node": dict(also_read="rsqrt"),
    "rsqrt_a_graph_output": dict(also_read="rsqrt_out"),
    "fp32_copy_read_elsewhere": dict(also_read="upcast"),
    "16_bit_chain_without_the_cast_back": dict(down=False, weight=None),
    "16_bit_chain_without_the_cast_back_fp32_weight": dict(down=False, weight="right"),
    "eps_not_a_constant": dict(eps="input"),
    "fourth_power_not_square": dict(square="fourth"),
}


@pytest.mark.parametrize("case", list(NEGATIVE))
def test_look_alikes_stay_unchanged(case: str) -> None:
    g, xs = _norm_graph(torch.float16, **NEGATIVE[case])
    new = recognize_rms_norm(g)
    new.verify()
    assert not any(n.op == "rms_norm" for n in new.nodes), new
    assert _ops(new) == _ops(g)
    assert new.outputs == g.outputs
    _assert_same_values(g, new, xs, torch.float16)


# A weight or eps constant with leading unit dims ([1, N], [1, 1, 1, N], eps [1, 1, 1, 1]) is not rms_norm's (F.rms_norm
# rejects a [1, N] weight, and a broadcast that raised the rank would change the output's shape): left as it is.
@pytest.mark.parametrize("shapes", [dict(weight_shape=(1, N)), dict(weight_shape=(1, 1, 1, N)), dict(weight=None, eps_shape=(1, 1, 1, 1))])
def test_constants_with_leading_unit_dims(shapes: dict) -> None:
    g, xs = _norm_graph(torch.float32, **shapes)
    new = recognize_rms_norm(g)
    out = reference_run(new, xs)[0]
    assert tuple(out.shape) == new.nodes[-1].ttype.shape == g.nodes[-1].ttype.shape
    _assert_same_values(g, new, xs, torch.float32)
