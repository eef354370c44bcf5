"""Reordering a dataflow block after a rewrite: dependences first, program order otherwise."""

from __future__ import annotations

import heapq


def topological(deps: dict, priority: dict) -> list:
    """The keys of ``deps`` (key -> keys it depends on) so that each comes after what it depends
    on; among the keys ready at a time, the lowest ``priority`` first (a binding's position keeps
    the original order wherever the dependences allow).

    Raises
    ------
    RuntimeError
        When the dependences form a cycle.
    """
    users = {k: [] for k in deps}
    for k, needed in deps.items():
        for d in needed:
            users[d].append(k)
    pending = {k: len(needed) for k, needed in deps.items()}
    ready = [(priority[k], k) for k, n in pending.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for u in users[k]:
            pending[u] -= 1
            if pending[u] == 0:
                heapq.heappush(ready, (priority[u], u))
    if len(order) != len(deps):
        raise RuntimeError("the rewritten block's dependences form a cycle")
    return order
