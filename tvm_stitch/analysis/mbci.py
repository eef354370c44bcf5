"""Memory-bound compute-intensive (MBCI) chains in a tensor dependency graph (MCFuser §II-A).

A chain is a sequence of compute-intensive nodes (GEMM/BMM) where each one's output reaches the
next one's input through memory-intensive nodes only (casts, scaling, masks, a softmax), plus the
element-wise epilogue after the last product.  One GEMM with its epilogue is a chain of length
one; attention is two products with a softmax between.

A product is memory-bound at tile level when

    φ = 2·T_M·T_N·K / (2·T_M·T_N + T_M·K + T_N·K)

(FLOPs per element a ``T_M × T_N`` output tile moves through its K loop) is below the device's
ridge point P/W expressed per element.  The paper evaluates φ with 256-wide tiles; so do we.
"""

from __future__ import annotations

import dataclasses

from tvm_stitch.graph import Node, OpKind, TensorDependencyGraph
from tvm_stitch.graph.tdg import dtype_bytes
from tvm_stitch.hardware import HardwareModel

TILE = 256


def tile_ratio(m: int, n: int, k: int, tile: int = TILE) -> float:
    """φ of a ``m × n × k`` product with ``tile × tile`` output tiles (clipped to the shape)."""
    tm, tn = min(tile, m), min(tile, n)
    return 2 * tm * tn * k / (2 * tm * tn + tm * k + tn * k)


def gemm_dims(node: Node) -> tuple[int, int, int, int]:
    """``(batch, M, N, K)`` of a compute-intensive node from its iteration space."""
    spatial = [e for _, e in node.spatial]
    k = 1
    for _, e in node.reduction:
        k *= e
    m, n = (spatial[-2], spatial[-1]) if len(spatial) >= 2 else (1, spatial[-1])
    batch = 1
    for e in spatial[:-2]:
        batch *= e
    return batch, m, n, k


@dataclasses.dataclass
class MBCIChain:
    """A chain of products and what lies between and after them.

    Attributes
    ----------
    products : list of str
        Compute-intensive nodes, in order.
    between : list of str
        Memory-intensive nodes between consecutive products.
    epilogue : list of str
        Element-wise nodes after the last product that only it feeds.
    kind : str
        ``gemm`` (one product), ``gemm-chain`` or ``attention`` (a row reduction between).
    phi : list of float
        φ of each product.
    ridge : float
        The device's P/W in FLOP per element.
    """

    products: list[str]
    between: list[str]
    epilogue: list[str]
    kind: str
    phi: list[float]
    ridge: float

    @property
    def memory_bound(self) -> bool:
        return min(self.phi) < self.ridge


_EPILOGUE = (OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.BROADCAST)
_BETWEEN = (*_EPILOGUE, OpKind.ROW_REDUCE)


def find_chains(graph: TensorDependencyGraph, hw: HardwareModel) -> list[MBCIChain]:
    """Every product of ``graph`` in exactly one chain, longest chains first by position."""
    products = [n for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE]
    taken: set[str] = set()
    chains = []
    for start in products:
        if start.name in taken:
            continue
        members, between = [start], []
        while True:
            nxt, path = _next_product(graph, members[-1])
            if nxt is None or nxt.name in taken:
                break
            members.append(nxt)
            between.extend(path)
        taken.update(n.name for n in members)
        epilogue = _epilogue(graph, members[-1])
        kind = (
            "gemm"
            if len(members) == 1
            else (
                "attention"
                if any(graph.nodes[b].kind is OpKind.ROW_REDUCE for b in between)
                else "gemm-chain"
            )
        )
        in_dtype = graph.tensors[start.inputs[0].tensor].dtype
        ridge = hw.ridge_point(in_dtype) * dtype_bytes(in_dtype)  # FLOP per element
        phi = [tile_ratio(*gemm_dims(n)[1:]) for n in members]
        chains.append(MBCIChain([n.name for n in members], between, epilogue, kind, phi, ridge))
    return chains


def _next_product(graph, node, limit: int = 16):
    """The one product that ``node``'s output flows into through a closed region of
    memory-intensive nodes (a softmax's diamond included), with that region; else ``(None, [])``.

    Layout changes end a chain: MCFuser fuses products whose intermediate keeps its layout.
    """
    region, frontier, found = [], [node], set()
    seen = {node.name}
    while frontier:
        cur = frontier.pop()
        succ = graph.successors(cur)
        if not succ:
            return None, []  # the intermediate is an output of the model
        for nxt in succ:
            if nxt.kind is OpKind.COMPUTE_INTENSIVE:
                found.add(nxt.name)
            elif nxt.kind in _BETWEEN and nxt.name not in seen:
                seen.add(nxt.name)
                region.append(nxt.name)
                frontier.append(nxt)
                if len(region) > limit:
                    return None, []
            elif nxt.kind not in _BETWEEN:
                return None, []
    if len(found) != 1:
        return None, []
    return graph.nodes[found.pop()], sorted(region, key=list(graph.nodes).index)


def _epilogue(graph, node) -> list[str]:
    out, cur = [], node
    while True:
        succ = graph.successors(cur)
        if len(succ) != 1 or succ[0].kind not in _EPILOGUE:
            return out
        cur = succ[0]
        out.append(cur.name)
