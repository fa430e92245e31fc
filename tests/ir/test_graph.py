from __future__ import annotations

import pytest
import torch

from kfuse.ir import GraphBuilder, TensorType, reference_run
from kfuse.ir.graph import Graph, Node


def small_graph() -> tuple[Graph, torch.Tensor]:
    b = GraphBuilder("g")
    x = b.add_input("x", TensorType((3, 4), torch.float32))
    w = torch.randn(4, 5)
    wn = b.add_constant(w)
    y = b.op("matmul", [x, wn])
    z = b.op("relu", [y])
    return b.build([z]), w


def test_build_print_and_run() -> None:
    g, w = small_graph()
    assert len(g) == 2 and g.input_names == ("x",)
    text = str(g)
    assert "matmul" in text and "float32[3,5]" in text
    x = torch.randn(3, 4)
    (out,) = reference_run(g, [x])
    torch.testing.assert_close(out, torch.relu(x @ w))


def test_verify_catches_undefined_values() -> None:
    g, _ = small_graph()
    bad = g.replace(nodes=(Node("r", "relu", ("nowhere",), TensorType((1,), torch.float32)),), outputs=("r",))
    with pytest.raises(ValueError, match="undefined value 'nowhere'"):
        bad.verify()
    b = GraphBuilder()
    with pytest.raises(ValueError, match="undefined value 'missing'"):
        b.add_node(Node("r", "relu", ("missing",), TensorType((1,), torch.float32)))
    assert b.nodes == []


def test_builder_op_rejects_undefined_input() -> None:
    b = GraphBuilder()
    with pytest.raises(ValueError, match="undefined value 'missing'"):
        b.op("relu", ["missing"])
    assert b.nodes == []


def test_reference_run_checks_input_count() -> None:
    g, _ = small_graph()
    with pytest.raises(ValueError, match="takes 1 inputs"):
        reference_run(g, [])


def test_users_and_op_counts() -> None:
    g, _ = small_graph()
    users = g.users()
    assert [n.op for n in users["x"]] == ["matmul"]
    assert g.op_counts() == {"matmul": 1, "relu": 1}
