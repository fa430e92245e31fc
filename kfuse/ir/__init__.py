"""Graph IR: typed tensors, nodes, graphs, the op registry and the reference executor."""

from kfuse.ir.graph import Graph, GraphBuilder, Node, TensorType
from kfuse.ir.interpret import reference_run
from kfuse.ir.ops import REGISTRY, OpDef, infer_type, run_reference

__all__ = ["Graph", "GraphBuilder", "Node", "TensorType", "reference_run", "REGISTRY", "OpDef", "infer_type", "run_reference"]
