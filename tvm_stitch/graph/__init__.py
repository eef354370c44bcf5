"""Tensor dependency graph of a Relax module: nodes, access maps, op kinds, reuse."""

from .access import AccessMap, Dependence
from .classify import COMPUTE_MEMORY_THRESHOLD, OpKind
from .tdg import Node, Reuse, TensorDependencyGraph, TensorInfo, build_graph, dtype_bytes

__all__ = [
    "COMPUTE_MEMORY_THRESHOLD",
    "AccessMap",
    "Dependence",
    "Node",
    "OpKind",
    "Reuse",
    "TensorDependencyGraph",
    "TensorInfo",
    "build_graph",
    "dtype_bytes",
]
