"""The exact fusion plan of a small :class:`~tvm_stitch.explore.fusion.FusionGraph` (FusionStitching
2019's integer program), to measure how far the explorer's plan is from the optimum.

Every legal pattern (weakly connected, :func:`~tvm_stitch.explore.fusion.illegal` says none) is
enumerated with its value; a binary variable per pattern, each op in at most one chosen pattern,
the total value maximized (``scipy.optimize.milp``, HiGHS). Cycles between chosen patterns are
cut lazily: where the solution's quotient graph has one, the fewest of its patterns that still
make it may not all be chosen, and the program is solved again.
"""

from __future__ import annotations

import numpy as np

from tvm_stitch.explore.fusion import (
    FusionGraph,
    Plan,
    cyclic,
    illegal,
    pattern,
    plan_value,
)
from tvm_stitch.hardware import HardwareModel

#: patterns enumerated at most (the graphs this is for have a few dozen ops)
MAX_PATTERNS = 200_000


def legal_patterns(graph: FusionGraph) -> list[frozenset]:
    """Every legal pattern of two or more stitchable ops that is weakly connected, each once
    (grown from its lowest op by neighbours above it)."""
    adjacent = {i: set() for i in range(len(graph)) if graph.stitchable(i)}
    for i, near in adjacent.items():
        for c in graph.consumers[i]:
            if c in adjacent:
                near.add(c)
                adjacent[c].add(i)
    found: list[frozenset] = []

    def grow(members: frozenset, extension: set, low: int) -> None:  # ESU: each set once
        if len(found) > MAX_PATTERNS:
            raise ValueError(f"more than {MAX_PATTERNS} patterns: too large a graph to solve")
        if len(members) > 1 and not illegal(graph, members):
            found.append(members)
        near = set(members).union(*(adjacent[m] for m in members))
        extension = set(extension)
        while extension:
            nxt = extension.pop()
            more = {n for n in adjacent[nxt] if n > low and n not in near}
            grow(members | {nxt}, extension | more, low)

    for low in sorted(adjacent):
        grow(frozenset([low]), {n for n in adjacent[low] if n > low}, low)
    return found


def optimum(graph: FusionGraph, hw: HardwareModel, max_rounds: int = 200) -> Plan:
    """The plan of the largest total value over :func:`legal_patterns`."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    pats = [p for p in (pattern(graph, m) for m in legal_patterns(graph))
            if plan_value(graph, p, hw) > 0]
    if not pats:
        return Plan((), 0.0)
    values = np.array([plan_value(graph, p, hw) for p in pats])
    cover = np.zeros((len(graph), len(pats)))
    for j, p in enumerate(pats):
        for i in p.members:
            cover[i, j] = 1
    rows, upper = [cover], [np.ones(len(graph))]
    for _ in range(max_rounds):
        result = milp(-values, integrality=np.ones(len(pats)), bounds=Bounds(0, 1),
                      constraints=[LinearConstraint(np.vstack(rows), -np.inf,
                                                    np.concatenate(upper))])
        if result.x is None:
            raise RuntimeError(f"the fusion program has no solution: {result.message}")
        chosen = [j for j in range(len(pats)) if result.x[j] > 0.5]
        if not cyclic(graph, [pats[j].members for j in chosen]):
            plan = tuple(sorted((pats[j] for j in chosen), key=lambda p: min(p.members)))
            return Plan(plan, float(values[chosen].sum()))
        core = list(chosen)  # the fewest chosen patterns that still make a cycle
        for j in list(core):
            rest = [k for k in core if k != j]
            if cyclic(graph, [pats[k].members for k in rest]):
                core = rest
        cut = np.zeros(len(pats))
        cut[core] = 1
        rows.append(cut[None, :])
        upper.append(np.array([len(core) - 1]))
    raise RuntimeError(f"the fusion program still had cycles after {max_rounds} rounds")
