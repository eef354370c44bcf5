"""FusionStitching's fusion explorer (2021, §5): fusion plans searched, not grown greedily.

The plan space is a :class:`FusionGraph`: the ops of a dataflow block in program order, each
with its kind, output shape and bytes, the ops it reads and the outside tensors it reads. A
*pattern* is a set of stitchable ops that becomes one kernel: legal (:func:`illegal`) when its
ops share one row space (a thread block owns whole rows: reductions need no inter-block
communication), a layout op sits only at its edge (read through, or written through) and no
path leaves it and comes back (convex). A *plan* is a set of disjoint patterns whose quotient
graph has no cycle.

- **Score** (the *delta-evaluator*, :class:`Pattern`): ``f(P) = T_mem + T_calls - T_penalty``
  in µs — the bytes that no longer go through DRAM (intermediates kept on chip, tensors read by
  several members read once) at the device's bandwidth, the launches saved, and the penalty of
  the kernel plan the code generator would build: rows re-read from L2 by every reduction after
  the first (one pass per reduction, :func:`tvm_stitch.stitch.plan.evaluate`'s model) and lost
  parallelism where the pattern has fewer rows than the device has SMs. It reads the
  pattern's ops and their neighbours alone, without a kernel plan. When one op joins or
  leaves a pattern (:func:`moved`), the bytes change by that op's neighbourhood alone; a local
  move (:func:`refine`) rescores only the two patterns it changes that way.
- **Approximate dynamic programming** (:func:`candidate_patterns`): in post-order, the top ``k``
  patterns whose first op is each vertex — the vertex with combinations of its consumers'
  candidates, consumers taken in groups (*PatternReduction*).
- **Beam search** (:func:`explore`): vertices in program order, each of the ``width`` partial
  plans extended by each candidate pattern of the vertex that overlaps none of its patterns and
  makes no cycle (:func:`cyclic`); each plan then improved by local moves (:func:`refine`).
- :func:`greedy` is the former's rule (:mod:`tvm_stitch.stitch.former`) on the same graph, for
  comparison; :mod:`tvm_stitch.explore.ilp` solves the same space exactly on small graphs.

Patterns without a row reduction score nothing in a plan: TVM's ``FuseOps`` fuses those.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter

from tvm_stitch.graph.classify import OpKind
from tvm_stitch.hardware import HardwareModel

#: ops a pattern computes (a layout op joins only at its edge)
STITCHABLE = frozenset({OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.ROW_REDUCE,
                        OpKind.BROADCAST, OpKind.INJECTIVE})
#: candidate patterns kept per vertex, and partial plans kept by the beam (the paper's 3)
TOP_K = 3
BEAM_WIDTH = 3
#: consumers enumerated together by PatternReduction
GROUP = 2


@dataclasses.dataclass(frozen=True)
class Vertex:
    """One op of the plan space.

    Attributes
    ----------
    name : str
    kind : OpKind
        What it computes (:class:`~tvm_stitch.graph.classify.OpKind`); ``INJECTIVE`` is a
        layout op (reshape, transpose).
    shape : tuple of int
        Its output's shape.
    out_bytes : int
        Its output's size.
    inputs : tuple of int
        The vertices it reads (earlier in program order).
    reads : tuple of (str, int)
        Tensors from outside the graph it reads, with their sizes.
    output : bool
        Whether its value is read outside the graph (a function output).
    rows : tuple of int, optional
        A row reduction's row space: its input's shape without the reduced trailing axes.
    view : bool
        A layout op that moves no data (a reshape): it joins a pattern only as its tail.
    """

    name: str
    kind: OpKind
    shape: tuple
    out_bytes: int
    inputs: tuple = ()
    reads: tuple = ()
    output: bool = False
    rows: tuple | None = None
    view: bool = False


class FusionGraph:
    """Vertices in program order (each reads only earlier ones), their consumers and, as
    bitsets, what each reaches."""

    def __init__(self, vertices: list[Vertex]):
        self.vertices = list(vertices)
        self.consumers: list[list[int]] = [[] for _ in self.vertices]
        for i, v in enumerate(self.vertices):
            for j in v.inputs:
                if not 0 <= j < i:
                    raise ValueError(f"{v.name} reads vertex {j}, not an earlier one")
                if i not in self.consumers[j]:
                    self.consumers[j].append(i)
        self.reach = [0] * len(self.vertices)  # strict descendants
        for i in reversed(range(len(self.vertices))):
            for c in self.consumers[i]:
                self.reach[i] |= (1 << c) | self.reach[c]
        self.tensor_readers: dict[tuple, list[int]] = {}  # an outside tensor's readers
        for i, v in enumerate(self.vertices):
            for key in set(v.reads):
                self.tensor_readers.setdefault(key, []).append(i)
        self.above = [0] * len(self.vertices)  # strict ancestors
        for i, v in enumerate(self.vertices):
            for j in v.inputs:
                self.above[i] |= (1 << j) | self.above[j]

    def __len__(self) -> int:
        return len(self.vertices)

    def stitchable(self, i: int) -> bool:
        return self.vertices[i].kind in STITCHABLE


def _bits(members) -> int:
    return sum(1 << i for i in members)


def illegal(graph: FusionGraph, members, copies=frozenset()) -> str | None:
    """Why ``members`` cannot be one kernel, or None when they can. ``copies``: members the
    pattern recomputes for itself (:func:`recompute`), read by no op outside it."""
    members = frozenset(members)
    vs = graph.vertices
    if not all(graph.stitchable(i) for i in members):
        return "an op that is not memory-intensive"
    rows = row_space(graph, members)
    if rows is None:
        return "reductions over different row spaces"
    leaves = set()  # ops fed by outside tensors and leaves only: recomputed where read (a
    for i in sorted(members):  # mask's cast and broadcast), of any shape
        if vs[i].kind in (OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.BROADCAST) \
                and all(j in leaves for j in vs[i].inputs if j in members):
            leaves.add(i)
    for i in members:
        v = vs[i]
        inside_in = [j for j in v.inputs if j in members]
        inside_out = [c for c in graph.consumers[i] if c in members]
        if v.kind is OpKind.INJECTIVE:
            # a chain of layout ops may end the pattern (a head split after a LayerNorm:
            # reshape, then transpose), but no op computes on a layout op's output inside it
            if inside_in and any(vs[c].kind is not OpKind.INJECTIVE for c in inside_out):
                return f"{v.name}: a layout op inside a pattern"
            if inside_in and (len(graph.consumers[v.inputs[0]]) != 1 or vs[v.inputs[0]].output):
                # the value is also read elsewhere (or returned): the pattern writes it, not
                # through v
                return f"{v.name}: writes through a value read elsewhere too"
            if v.view and not inside_in:
                return f"{v.name}: a reshape read by a pattern stays a view"
            continue  # read through (no input inside), or written through (no reader)
        if i in leaves:
            continue
        if tuple(v.shape[: len(rows)]) != rows:
            return f"{v.name}: output {v.shape} is not in the row space {rows}"
    bits = _bits(members)
    leaving = 0
    for i in members - frozenset(copies):
        leaving |= graph.reach[i]
    leaving &= ~bits
    while leaving:
        low = leaving & -leaving
        u = low.bit_length() - 1
        if graph.reach[u] & bits:
            return f"a path leaves the pattern through {vs[u].name} and comes back"
        leaving ^= low
    return None


def convex_closure(graph: FusionGraph, members) -> frozenset:
    """``members`` with every op on a path between two of them (the smallest convex set)."""
    bits = _bits(members)
    down = up = 0
    for i in members:
        down |= graph.reach[i]
        up |= graph.above[i]
    between = down & up & ~bits
    return frozenset(members) | frozenset(i for i in range(len(graph)) if between >> i & 1)


def connected(graph: FusionGraph, members) -> bool:
    """Whether ``members`` are weakly connected (a pattern; independent ones are packed)."""
    members = set(members)
    start = min(members)
    seen, stack = {start}, [start]
    while stack:
        i = stack.pop()
        for j in (*graph.vertices[i].inputs, *graph.consumers[i]):
            if j in members and j not in seen:
                seen.add(j)
                stack.append(j)
    return seen == members


def row_space(graph: FusionGraph, members) -> tuple | None:
    """The rows the pattern's blocks own: its reductions' (all the same, else None), or the
    leading dims of its first op that is not a layout op."""
    vs = graph.vertices
    reductions = {vs[i].rows for i in members if vs[i].kind is OpKind.ROW_REDUCE}
    if len(reductions) > 1:
        return None
    if reductions:
        return tuple(next(iter(reductions)))
    computing = sorted(i for i in members if vs[i].kind is not OpKind.INJECTIVE)
    first = vs[computing[0]] if computing else vs[min(members)]
    return tuple(first.shape[:-1])


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A pattern and its score's aggregates (:func:`pattern`, :func:`score`; :func:`moved`
    changes them by one op)."""

    members: frozenset
    saved_bytes: int  # DRAM bytes a kernel of the members does not move, against one per op
    io_bytes: int  # what the kernel reads and writes
    reductions: int
    widest: int  # the widest tensor a member writes or reads from outside
    rows: int  # rows of its row space (:func:`row_space`; 1 where it has none)
    copies: frozenset = frozenset()  # members it recomputes for itself (:func:`recompute`)

    @property
    def has_reduce(self) -> bool:
        return self.reductions > 0

    @property
    def row_bytes(self) -> int:
        """The widest row the kernel streams (per reduction pass)."""
        return self.widest // self.rows


def pattern(graph: FusionGraph, members, copies=frozenset()) -> Pattern:
    """The aggregates of ``members`` (any set; legality is :func:`illegal`'s), from scratch;
    the ``copies`` among them are computed for the pattern's readers alone, never written."""
    members, copies = frozenset(members), frozenset(copies)
    vs = graph.vertices
    saved, io = 0, 0
    outside = Counter()  # tensors from outside the pattern, by how many members read them
    for i in members:
        v = vs[i]
        readers = sum(1 for c in graph.consumers[i] if c in members)
        leaves = i not in copies and (v.output or readers < len(graph.consumers[i]))
        s, m = _member_bytes(v.out_bytes, readers, leaves)
        saved, io = saved + s, io + m
        for key in set(v.reads):
            outside[key] += 1
        for j in set(v.inputs):
            if j not in members:
                outside[("vertex", j), vs[j].out_bytes] += 1
    for (_, size), n in outside.items():
        s, m = _outside_bytes(size, n)
        saved, io = saved + s, io + m
    reductions = sum(vs[i].kind is OpKind.ROW_REDUCE for i in members)
    n_rows = max(1, math.prod(row_space(graph, members) or ()))
    widest = max((_width(vs[i]) for i in members), default=0)
    return Pattern(members, saved, io, reductions, widest, n_rows, copies)


def moved(graph: FusionGraph, p: Pattern, i: int, join: bool = True) -> Pattern:
    """``p`` with op ``i`` joined (``join``) or left: the delta-evaluator's step. The bytes
    change by ``i``'s neighbourhood alone — ``i`` itself, the ops it reads (a member gains or
    loses a reader on chip, and may stop or start writing its output), the outside tensors it
    reads — so the change costs the degrees of ``i`` and its inputs, not the pattern's size;
    the row space and the widest row come from the members' kinds and widths (nothing is
    planned)."""
    if (i in p.members) == join:
        raise ValueError(f"op {i} is {'already' if join else 'not'} in the pattern")
    if p.copies:
        raise ValueError("a pattern with recomputed ops is rescored from scratch")
    before = p.members.__contains__
    after = ((lambda x: x == i or x in p.members) if join
             else (lambda x: x != i and x in p.members))
    saved0, io0 = _around(graph, before, i)
    saved1, io1 = _around(graph, after, i)
    members = p.members | {i} if join else p.members - {i}
    vs = graph.vertices
    step = 1 if join else -1
    reductions = p.reductions + step * (vs[i].kind is OpKind.ROW_REDUCE)
    width = _width(vs[i])
    if join:
        widest = max(p.widest, width)
    elif width < p.widest:
        widest = p.widest
    else:  # it was the widest: the others' widest
        widest = max((_width(vs[j]) for j in members), default=0)
    n_rows = max(1, math.prod(row_space(graph, members) or ())) if members else 1
    return Pattern(members, p.saved_bytes + saved1 - saved0, p.io_bytes + io1 - io0,
                   reductions, widest, n_rows)


def _around(graph: FusionGraph, inside, i: int) -> tuple[int, int]:
    """The saved and moved bytes, as :func:`pattern` counts them, of the terms op ``i``'s
    membership can change, for the pattern of the ops ``inside`` holds: ``i`` and each op it
    reads (a member's output, or a tensor the pattern reads from outside), and the outside
    tensors ``i`` reads."""
    vs = graph.vertices
    terms = []
    for j in {i, *vs[i].inputs}:
        readers = sum(1 for c in graph.consumers[j] if inside(c))
        if inside(j):
            leaves = vs[j].output or readers < len(graph.consumers[j])
            terms.append(_member_bytes(vs[j].out_bytes, readers, leaves))
        else:
            terms.append(_outside_bytes(vs[j].out_bytes, readers))
    for key in set(vs[i].reads):
        terms.append(_outside_bytes(key[1], sum(1 for c in graph.tensor_readers[key]
                                                if inside(c))))
    return sum(s for s, _ in terms), sum(m for _, m in terms)


def _member_bytes(size: int, readers: int, leaves: bool) -> tuple[int, int]:
    """``(saved, moved)`` bytes of a member's output of ``size`` bytes: read on chip by its
    ``readers`` in the pattern, and never written unless it ``leaves`` the pattern."""
    return size * readers + (size if readers and not leaves else 0), size if leaves else 0


def _outside_bytes(size: int, readers: int) -> tuple[int, int]:
    """``(saved, moved)`` bytes of a tensor from outside the pattern that ``readers`` members
    read: read once."""
    return (size * (readers - 1), size) if readers else (0, 0)


def _width(v: Vertex) -> int:
    return max(v.out_bytes, *(size for _, size in v.reads), 0)


def score(graph: FusionGraph, p: Pattern, hw: HardwareModel) -> float:
    """``f(P)`` in µs: DRAM time saved plus launches saved minus the kernel plan's penalty."""
    t_mem = p.saved_bytes / hw.mem_bandwidth
    t_calls = (len(p.members) - 1) * hw.launch_overhead
    return (t_mem + t_calls) * 1e6 - penalty(p, hw)


def _share(rows: int, hw: HardwareModel) -> float:
    """The share of the device a kernel of ``rows`` thread-block rows fills (1 from one row an
    SM on)."""
    return min(1.0, rows / hw.num_sms)


def penalty(p: Pattern, hw: HardwareModel) -> float:
    """The kernel plan's penalty in µs: every reduction after the first re-reads the row from
    L2 (one pass per reduction), and with fewer rows than SMs the kernel's traffic runs on
    that share of the device."""
    reread = max(0, p.reductions - 1) * p.row_bytes * p.rows / (hw.mem_bandwidth *
                                                                   hw.l2_bandwidth_ratio)
    share = _share(p.rows, hw)
    lost = p.io_bytes / hw.mem_bandwidth * (1 / share - 1) if len(p.members) > 1 else 0.0
    return (reread + lost) * 1e6


def plan_value(graph: FusionGraph, p: Pattern, hw: HardwareModel) -> float:
    """What a pattern adds to a plan: its score where it reduces rows (a stitched kernel),
    else nothing (``FuseOps`` fuses elementwise ops without it)."""
    return score(graph, p, hw) if p.has_reduce and len(p.members) > 1 else 0.0


def candidate_patterns(graph: FusionGraph, hw: HardwareModel, k: int = TOP_K,
                       group: int = GROUP) -> list[list[Pattern]]:
    """Per vertex, the top ``k`` legal patterns whose first op it is (approximate dynamic
    programming in post-order, FusionStitching's PatternReduction): the vertex alone, and with
    every combination of its consumers' candidates, consumers taken ``group`` at a time; each
    group's candidates then grown by the other groups' and by the candidates of later ops that
    feed its members, where that adds to their score. A combination that a path leaves and
    re-enters takes the ops on that path (:func:`convex_closure`), where they can join."""
    found: list[list[Pattern]] = [[] for _ in range(len(graph))]
    for i in reversed(range(len(graph))):
        if not graph.stitchable(i):
            continue
        base = frozenset([i])
        consumers = [c for c in graph.consumers[i] if found[c]]
        pool: dict[frozenset, Pattern] = {base: pattern(graph, base)}
        tops = []
        for g in range(0, len(consumers), group):
            local = {}
            for combo in itertools.product(*([None, *found[c]] for c in consumers[g:g + group])):
                members = convex_closure(graph, base.union(*(p.members for p in combo
                                                             if p is not None)))
                if members in local or members in pool or illegal(graph, members):
                    continue
                local[members] = pattern(graph, members)
            top = _top(graph, local.values(), hw, k)
            pool.update((p.members, p) for p in top)
            tops.extend(top)
        for seed in tops:  # the groups' candidates together: each grown by the others, and
            current = seed  # by those of ops later in program order that feed its members
            # (known: post-order), where that adds to its score
            feeding = {j for m in seed.members for j in graph.vertices[m].inputs
                       if j > i and j not in seed.members}
            for other in [*tops, *(p for j in sorted(feeding) for p in found[j])]:
                members = convex_closure(graph, current.members | other.members)
                if members != current.members and not illegal(graph, members):
                    grown = pattern(graph, members)
                    if score(graph, grown, hw) > score(graph, current, hw):
                        current = grown
            pool[current.members] = current
        found[i] = _top(graph, pool.values(), hw, k)
    return found


def _top(graph, patterns, hw, k) -> list[Pattern]:
    return sorted(patterns, key=lambda p: (-score(graph, p, hw), sorted(p.members)))[:k]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Patterns (each a kernel) and the plan's value: their total :func:`plan_value`, disjoint
    but for the ops each recomputes (``recomputed``, :func:`recompute`: with the gain of that)."""

    patterns: tuple
    value: float
    recomputed: tuple = ()

    def kernels(self, graph: FusionGraph) -> int:
        """Kernels of the plan's stitched patterns, plus one per other stitchable op (an upper
        bound: ``FuseOps`` joins elementwise ones)."""
        covered = set().union(*(p.members for p in self.patterns)) if self.patterns else set()
        return len(self.patterns) + sum(1 for i in range(len(graph))
                                        if graph.stitchable(i) and i not in covered)


def explore(graph: FusionGraph, hw: HardwareModel, width: int = BEAM_WIDTH,
            k: int = TOP_K) -> Plan:
    """The best plan the beam search assembles from :func:`candidate_patterns`, each of its
    ``width`` plans and the greedy rule's improved by :func:`refine`."""
    candidates = candidate_patterns(graph, hw, k)
    beams = [(0.0, 0, ())]  # (value, covered bits, patterns)
    for v in range(len(graph)):
        grown = []
        for value, covered, pats in beams:
            grown.append((value, covered, pats))
            if covered >> v & 1:
                continue
            for p in candidates[v]:
                gain = plan_value(graph, p, hw)
                bits = _bits(p.members)
                if gain <= 0 or bits & covered or cyclic(graph, [q.members for q in (*pats, p)]):
                    continue
                grown.append((value + gain, covered | bits, (*pats, p)))
        unique = {}
        for value, covered, pats in sorted(grown, key=lambda b: -b[0]):
            unique.setdefault(frozenset(p.members for p in pats), (value, covered, pats))
        ranked = list(unique.values())
        # the best plan that leaves ``v`` to a later op's pattern stays too: a pattern that
        # takes ``v`` early may keep a better one from forming
        waiting = next((b for b in ranked if not b[1] >> v & 1), None)
        beams = ranked[:width] + ([waiting] if waiting and waiting not in ranked[:width] else [])
    # each plan of the beam, and the greedy rule's, refined by local moves: the best
    starts = [[p.members for p in pats] for _, _, pats in beams]
    starts.append([p.members for p in greedy(graph, hw).patterns])
    plans = [refine(graph, start, hw) for start in starts]
    return max(plans, key=lambda plan: plan.value)


def refine(graph: FusionGraph, groups, hw: HardwareModel) -> Plan:
    """``groups`` improved by local moves, each scored by the change of the two patterns it
    touches (the delta-evaluator's use): an op moved to a neighbouring pattern, or two
    neighbouring patterns (an op alone is one) merged, while some move adds to the plan's
    value. Patterns that do not reduce count a thousandth of their score meanwhile, so that
    one can grow into a pattern that does; they are dissolved at the end."""
    owner = {}
    pats: dict[int, frozenset] = {}
    for n, members in enumerate(groups):
        pats[n] = frozenset(members)
        owner.update(dict.fromkeys(members, n))
    fresh = itertools.count(len(pats))
    for i in range(len(graph)):
        if graph.stitchable(i) and i not in owner:
            n = next(fresh)
            pats[n] = frozenset([i])
            owner[i] = n
    aggregates: dict[frozenset, Pattern] = {}  # each pattern's, once computed

    def aggregate(members: frozenset, base: Pattern | None = None, op: int | None = None):
        if members not in aggregates:  # one op more or less than ``base``: its delta alone
            aggregates[members] = (pattern(graph, members) if base is None
                                   else moved(graph, base, op, op in members))
        return aggregates[members]

    def worth(members: frozenset) -> float:
        if len(members) < 2:
            return 0.0
        p = aggregate(members)
        value = score(graph, p, hw)
        return value if p.has_reduce else value / 1000

    def tried(changes: dict) -> float | None:  # the gain of replacing patterns, or None
        before = sum(worth(pats[n]) for n in changes)
        after = 0.0
        for members in changes.values():
            if members and len(members) > 1 and (illegal(graph, members)
                                                 or not connected(graph, members)):
                return None
            after += worth(members) if members else 0.0
        if after <= before + 1e-9:
            return None
        trial = [m for m in {**pats, **changes}.values() if m and len(m) > 1]
        return None if cyclic(graph, trial) else after - before

    improved = True
    while improved:
        improved = False
        for i in range(len(graph)):
            if i not in owner:
                continue
            near = {owner[j] for j in (*graph.vertices[i].inputs, *graph.consumers[i])
                    if j in owner} - {owner[i]}
            a = owner[i]
            for b in sorted(near):
                # the op's move: each side's aggregates by the delta-evaluator
                left, joined = pats[a] - {i}, pats[b] | {i}
                aggregate(left, aggregate(pats[a]), i)
                aggregate(joined, aggregate(pats[b]), i)
                moves = [{a: left, b: joined}, {a: pats[a] | pats[b], b: None}]
                for change in moves:
                    if tried(change) is None:
                        continue
                    for n, members in change.items():
                        if members:
                            pats[n] = members
                            owner.update(dict.fromkeys(members, n))
                        else:
                            del pats[n]
                    improved = True
                    break
                if improved or owner[i] != a:
                    break
    kept = [aggregate(m) for m in pats.values() if len(m) > 1]
    kept = sorted((p for p in kept if plan_value(graph, p, hw) > 0), key=lambda p: min(p.members))
    return Plan(tuple(kept), sum(plan_value(graph, p, hw) for p in kept))


def packing_gain(parts, hw: HardwareModel) -> float:
    """What packing independent patterns into one kernel saves, in µs (FusionStitching's
    kernel packing, here beyond equal row counts): the launches of all but one, and the time
    of running them one after another against together. Alone, each pattern's traffic runs on
    the share of the device its rows fill; packed, the kernel's thread blocks take the most
    rows of any part (the parts with fewer leave the rest idle), so it takes the longest part's
    time, or the traffic of all at the share the most rows fill, whichever is more. It grows
    with every part that fills the device less than the others (a wide part and a narrow one
    run side by side), and it is never less than the launches saved: by this model every
    independent pair gains. The kernel plan's penalties (registers and shared memory of the
    parts together) are the latency-evaluator's, when the packed kernel is planned, and a
    packed kernel no plan schedules is formed again as its parts."""
    def alone(p):
        return p.io_bytes / hw.mem_bandwidth / _share(p.rows, hw)

    parts = list(parts)
    if len(parts) < 2:
        return 0.0
    rows = max(p.rows for p in parts)
    together = sum(p.io_bytes for p in parts) / hw.mem_bandwidth / _share(rows, hw)
    packed = max(together, *(alone(p) for p in parts))
    return (sum(alone(p) for p in parts) - packed + (len(parts) - 1) * hw.launch_overhead) * 1e6


#: ops a pattern may recompute instead of reading them (cheap, on outside tensors alone)
RECOMPUTABLE = frozenset({OpKind.LIGHT_ELEMWISE, OpKind.BROADCAST})


def recompute(graph: FusionGraph, plan: Plan, hw: HardwareModel) -> Plan:
    """``plan`` with each cheap op on outside tensors alone (a mask's broadcast, an input's
    cast: :data:`RECOMPUTABLE`, no input in the graph) recomputed by every pattern that reads
    it, where all of its readers are in patterns and that adds to the plan's value
    (FusionStitching's recomputation). Its output is then written by no one: each pattern
    reads the op's inputs instead (once, with its own reads of them) and the op's own kernel,
    or its write by the pattern that held it, goes. The gain is counted in bytes moved and
    launches, with each changed pattern's penalty rescored (:func:`penalty`); a pattern that
    cannot take the op (:func:`illegal`) keeps the plan as it is. A copy adds no edge between
    kernels (it reads nothing from the graph), so the plan stays free of cycles."""
    pats = list(plan.patterns)
    value = plan.value
    done = []
    for i, v in enumerate(graph.vertices):
        if v.kind not in RECOMPUTABLE or v.inputs or v.output or not graph.consumers[i]:
            continue
        readers = [next((n for n, p in enumerate(pats) if c in p.members), None)
                   for c in graph.consumers[i]]
        if None in readers or (len(set(readers)) == 1 and i in pats[readers[0]].members):
            continue  # read outside every pattern (written anyway), or by its own pattern only
        trial = {}
        for n in sorted(set(readers)):
            members, copies = pats[n].members | {i}, pats[n].copies | {i}
            if illegal(graph, members, copies):
                break
            trial[n] = pattern(graph, members, copies)
        else:
            gain = sum((pats[n].io_bytes - p.io_bytes) / hw.mem_bandwidth * 1e6
                       - (penalty(p, hw) - penalty(pats[n], hw)) for n, p in trial.items())
            if not any(i in p.members for p in pats):  # its own kernel goes
                io = v.out_bytes + sum(size for _, size in set(v.reads))
                gain += (io / hw.mem_bandwidth + hw.launch_overhead) * 1e6
            if gain > 0:
                for n, p in trial.items():
                    pats[n] = p
                value += gain
                done.append(i)
    return Plan(tuple(pats), value, (*plan.recomputed, *done)) if done else plan


def greedy(graph: FusionGraph, hw: HardwareModel) -> Plan:
    """The former's greedy rule on ``graph``: in program order, an op joins the pattern of its
    last producer it can join (row space, convexity), else starts one; a layout op joins only
    as the tail of a pattern that reduces, or as the transpose of an outside tensor that one
    op reads; patterns without a row reduction are dissolved."""
    group_of: dict[int, set] = {}
    groups: list[set] = []
    vs = graph.vertices
    for i in range(len(graph)):
        if not graph.stitchable(i):
            continue
        chosen = None
        if vs[i].kind is OpKind.INJECTIVE:  # a layout op: the tail of a pattern that reduces
            g = group_of.get(vs[i].inputs[0]) if len(vs[i].inputs) == 1 else None
            reduces = g is not None and any(vs[j].kind is OpKind.ROW_REDUCE for j in g)
            if reduces and not illegal(graph, g | {i}):
                chosen = g
            elif vs[i].inputs or len(graph.consumers[i]) != 1:  # else read through, an input's
                continue
        for j in () if chosen is not None else reversed(vs[i].inputs):
            g = group_of.get(j)
            if g is not None and not illegal(graph, g | {i}):
                chosen = g
                break
        if chosen is None:
            chosen = set()
            groups.append(chosen)
        chosen.add(i)
        group_of[i] = chosen
    pats = [p for p in (pattern(graph, g) for g in groups)
            if p.has_reduce and len(p.members) > 1]
    return Plan(tuple(pats), sum(plan_value(graph, p, hw) for p in pats))


def cyclic(graph: FusionGraph, groups) -> bool:
    """Whether the quotient graph of ``groups`` (sets of ops, each one node; other ops their
    own) has a cycle: those kernels would wait for each other."""
    owner = {}
    for n, members in enumerate(groups):
        for i in members:
            owner[i] = n
    nodes = {i: ("p", owner[i]) if i in owner else ("v", i) for i in range(len(graph))}
    edges: dict = {}
    for i in range(len(graph)):
        for c in graph.consumers[i]:
            a, b = nodes[i], nodes[c]
            if a != b:
                edges.setdefault(a, set()).add(b)
    state: dict = {}  # 1: on the current path, 2: done
    for start in set(nodes.values()):
        if start in state:
            continue
        state[start] = 1
        stack = [(start, iter(edges.get(start, ())))]
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return True
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(edges.get(nxt, ()))))
    return False
