"""Shared-memory allocation along the dominance tree (FusionStitching 2019, Algorithm 4).

Requests are visited in topological order.  A request may take over a buffer whose current
owner is dead (its last reader ran before the request's op) and dominates the requesting op
in the pattern's dependence graph: then every path to the new op has passed the owner, so no
live value is overwritten.  Among such buffers the smallest big enough is reused; failing
that, the largest is grown; failing that, a new buffer is allocated.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SmemRequest:
    """A shared buffer wanted by the op at position ``at``, read until position ``last_use``."""

    name: str
    at: int
    size: int
    last_use: int


@dataclasses.dataclass
class Allocation:
    """Which buffer each request got, buffer sizes, requested vs allocated bytes."""

    buffer_of: dict
    sizes: list
    requested: int

    @property
    def total(self) -> int:
        return sum(self.sizes)


def dominators(preds: dict) -> dict:
    """Dominator sets of a DAG given ``preds[node] = [predecessors]`` (roots have none)."""
    order = _topological(preds)
    dom = {}
    for n in order:
        ps = preds.get(n, [])
        if not ps:
            dom[n] = {n}
        else:
            common = set.intersection(*(dom[p] for p in ps))
            dom[n] = common | {n}
    return dom


def _topological(preds):
    seen, order = set(), []

    def visit(n):
        if n in seen:
            return
        seen.add(n)
        for p in preds.get(n, []):
            visit(p)
        order.append(n)

    for n in list(preds):
        visit(n)
    return order


def allocate(requests, preds: dict | None = None) -> Allocation:
    """Assign buffers to ``requests`` (see the module docstring).

    Parameters
    ----------
    requests : list of SmemRequest
    preds : dict, optional
        ``preds[op position] = [positions of its producers]``.  Without it the ops form a
        chain (every op dominates the ones after it).
    """
    dom = dominators(preds) if preds is not None else None

    def dominates(a, b):
        return a <= b if dom is None else a in dom.get(b, {b})

    sizes: list = []
    owner: list = []
    buffer_of = {}
    for r in sorted(requests, key=lambda r: r.at):
        free = [i for i, o in enumerate(owner) if o.last_use < r.at and dominates(o.at, r.at)]
        fits = [i for i in free if sizes[i] >= r.size]
        if fits:
            i = min(fits, key=lambda i: sizes[i])
        elif free:
            i = max(free, key=lambda i: sizes[i])
            sizes[i] = r.size
        else:
            sizes.append(r.size)
            owner.append(r)
            buffer_of[r.name] = len(sizes) - 1
            continue
        owner[i] = r
        buffer_of[r.name] = i
    return Allocation(buffer_of, sizes, sum(r.size for r in requests))
