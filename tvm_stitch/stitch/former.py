"""Greedy former of FusionStitching patterns over memory-intensive regions of a Relax function.

Works on legalized functions (``call_tir`` bindings).  A binding is *stitchable* when every TIR
block of its PrimFunc is light or expensive elementwise, a broadcast, or a row reduction (over
trailing axes).  Bindings are visited in program order; a stitchable binding joins the group of
one of its producers when its output lives in the group's *row space* (the leading dimensions
every op of the pattern shares: a thread block owns whole rows, so reductions need no
inter-block communication) and joining keeps the group convex (no path leaves the group and
comes back).  Independent patterns over the same number of rows are packed into one kernel
(FusionStitching's kernel packing).  Groups without a row reduction, or of one op, are dissolved:
TVM's ``FuseOps`` handles those as well (a single op whose PrimFunc already has several blocks,
such as ``nn.layer_norm``, is kept: it gets a kernel plan too).  Every refusal is recorded.

A reduction over axes that are not the innermost starts a *column pattern* instead
(:mod:`tvm_stitch.stitch.columns`): the input-only elementwise ops it reads, the column
reductions over the same input and output spaces, and the elementwise ops on its output space
after them; a value over the input space computed from a reduced one is not joined.

Symbolic dims (:mod:`tvm_stitch.graph.specialize`) are read at the function's representative
point: a symbolic extent is sized there, and equal to another only when the two are the same
expression, so a row space of ``(batch, seq)`` is never taken for a static one.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import tvm
from tvm import relax

from tvm_stitch.config import check_explore
from tvm_stitch.graph.classify import OpKind
from tvm_stitch.graph.specialize import call_point, shape_at
from tvm_stitch.graph.tdg import dtype_bytes, prim_func_nodes

logger = logging.getLogger("tvm_stitch.stitch")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
STITCHABLE = {
    OpKind.LIGHT_ELEMWISE,
    OpKind.EXPENSIVE_ELEMWISE,
    OpKind.ROW_REDUCE,
    OpKind.BROADCAST,
}


@dataclasses.dataclass
class Group:
    """A fusion pattern: bindings (indices into one dataflow block) sharing a row space."""

    gid: int
    rows: tuple
    members: list = dataclasses.field(default_factory=list)
    kinds: list = dataclasses.field(default_factory=list)
    layout: list = dataclasses.field(default_factory=list)  # layout ops the output goes through
    #: a column pattern's (input shape, output shape): its reductions sweep non-innermost axes
    column: tuple | None = None
    #: a column pattern's members on the reduced side (its reductions and what follows them)
    reduced: set = dataclasses.field(default_factory=set)
    #: a packed kernel's patterns, each as it was before packing (:func:`_pack`)
    parts: list = dataclasses.field(default_factory=list)
    #: members it recomputes for itself, also members of the other patterns that read them
    #: (:func:`tvm_stitch.explore.fusion.recompute`): never an output of its kernel
    copies: list = dataclasses.field(default_factory=list)

    def add(self, index: int, kinds, reduced: bool) -> None:
        """Make binding ``index`` (blocks of ``kinds``) a member; ``reduced``: on a column
        pattern's reduced side."""
        self.members.append(index)
        self.kinds.extend(kinds)
        if reduced:
            self.reduced.add(index)

    @property
    def has_reduce(self) -> bool:
        """Whether the pattern reduces rows (column patterns: :attr:`column`)."""
        return OpKind.ROW_REDUCE in self.kinds


def callee_nodes(mod, binding, point=None) -> list | None:
    """The tensor-graph nodes (one per TIR block) of the PrimFunc a ``call_tir`` binding calls,
    or None when the binding is not a ``call_tir`` of a PrimFunc.  ``point``: where the
    function's symbolic dims are read (``{name: size}``)."""
    value = binding.value
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
        return None
    func = mod[value.args[0]]
    if not isinstance(func, tvm.tirx.PrimFunc):
        return None
    if point:
        point = call_point(func, value, point)
    return prim_func_nodes(func, value.args[0].name_hint, point)


def binding_kinds(mod, binding, nodes=None, point=None) -> tuple[list[OpKind] | None, str]:
    """Op kinds of a ``call_tir`` binding's blocks, or ``(None, why)`` if it cannot be stitched.

    ``nodes``: the binding's :func:`callee_nodes` when the caller has them already; ``point``:
    where symbolic dims are read."""
    value = binding.value
    if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
        return None, "not a call_tir"
    func = mod[value.args[0]]
    if not isinstance(func, tvm.tirx.PrimFunc):
        return None, "not a PrimFunc"
    if shape_at(binding.var.ty, point or {}) is None:
        return None, "dynamic or tuple output"
    if int(func.attrs.get("op_pattern", 0) if func.attrs else 0) == 8:
        return None, "opaque kernel"
    if nodes is None:
        nodes = callee_nodes(mod, binding, point)
    kinds = [n.kind for n in nodes]
    if not kinds:
        return None, "no analysable blocks"
    bad = sorted({k.value for k in kinds} - {k.value for k in STITCHABLE})
    if bad:
        return None, f"{value.args[0].name_hint} has {', '.join(bad)} blocks"
    return kinds, ""


def form_groups(mod: tvm.IRModule, block: relax.DataflowBlock,
                point=None, explore: str = "greedy", hw=None) -> tuple[list[Group], list]:
    """Fusion patterns of one dataflow block and the bindings refused, with reasons.

    ``point``: where the function's symbolic dims are read (``{name: size}``,
    :func:`~tvm_stitch.graph.specialize.representative`); without one, a binding of symbolic
    shape is not stitched. ``explore``: ``"greedy"``, the rule below; ``"search"``, the row
    patterns chosen by the fusion explorer (:func:`explored_groups`, scored for ``hw``, by
    default the default GPU), the column patterns the rule's.

    Returns
    -------
    (groups, refused)
        ``groups``: patterns with a row reduction and at least two TIR blocks, and column
        patterns (:attr:`Group.column`), members in program order; ``refused``: ``(var name,
        reason)`` for stitchable-looking bindings kept out.
    """
    point = point or {}
    if check_explore(explore) == "search":
        groups, refused = form_groups(mod, block, point)
        try:
            return explored_groups(mod, block, point, groups, hw), refused
        except Exception as err:  # noqa: BLE001 - the rule's patterns, the reason logged
            logger.warning("stitch: the fusion explorer failed, the greedy rule's patterns "
                           "kept: %s: %s", type(err).__name__, err)
            return groups, refused

    def _shape(ty):
        return shape_at(ty, point)

    bindings = list(block.bindings)
    producer: dict = {}  # var -> binding index
    group_of: dict[int, Group] = {}
    upstream: dict = {}  # var -> ids of groups it depends on (transitively)
    group_up: dict = {}  # group id -> ids of groups its members read (one kernel: all of it)
    groups: list[Group] = []
    leaves: dict[int, list] = {}  # elementwise bindings on inputs only, not yet in a pattern
    refused = []
    readers: dict = {}  # var -> the bindings reading it (calls, tuples, anything)
    column_readers: dict = {}  # var -> column patterns reducing it (read from outside them)
    for k, b in enumerate(bindings):
        for a in relax.analysis.free_vars(b.value):
            readers.setdefault(a, []).append(k)
    for i, binding in enumerate(bindings):
        var = binding.var
        producer[var] = i
        inputs = [a for a in _call_args(binding.value) if isinstance(a, relax.Var)]
        up = set()
        # every value read counts for dependences, tuples and their items included
        for a in relax.analysis.free_vars(binding.value):
            up |= upstream.get(a, set())
            if a in producer and producer[a] in group_of:
                up.add(group_of[producer[a]].gid)
        nodes = callee_nodes(mod, binding, point)
        kinds, why = binding_kinds(mod, binding, nodes, point)
        out = _shape(var.ty)
        chosen = None
        g = _layout_tail_of(binding, nodes, inputs, producer, group_of, readers, _shape)
        if g is not None:
            # a reshape/transpose of the pattern's result: the output is written through it
            g.members.append(i)
            g.layout.append(i)
            group_of[i] = g
            upstream[var] = up - {g.gid}
            group_up.setdefault(g.gid, set()).update(up - {g.gid})
            continue
        if kinds is None and not up and _input_transpose(binding, nodes, inputs, readers):
            # a transpose of a function input read only by one consumer: if that consumer is
            # stitched, the pattern reads the input through it (index propagation)
            leaves[i] = [OpKind.INJECTIVE]
            upstream[var] = up
            continue
        column = _column_kinds(nodes) if kinds is None and "column-reduce" in why else None
        if column is not None and out is not None:
            # a column reduction: joins the column pattern of the same spaces it reads from
            # (horizontal: the input read once), or starts one (two phases, :mod:`.columns`)
            sig = _column_signature(binding, inputs, _shape)
            # the pattern that computes an input, or one reducing the same input (x.max(0)
            # beside x.sum(0))
            candidates = [group_of.get(producer.get(a, -1)) for a in reversed(inputs)]
            candidates += [g for a in inputs for g in column_readers.get(a, ())]
            for g in candidates:
                if (
                    g is not None
                    and g.column == sig
                    and _convex(g, inputs, producer, group_of, upstream, group_up)
                ):
                    chosen = g
                    break
            if chosen is None:
                chosen = Group(len(groups), tuple(out), column=sig)
                groups.append(chosen)
            for a in inputs:
                if group_of.get(producer.get(a, -1)) is not chosen:
                    column_readers.setdefault(a, []).append(chosen)
            chosen.add(i, column, reduced=True)
            group_of[i] = chosen
            up.discard(chosen.gid)
            group_up.setdefault(chosen.gid, set()).update(up)
            _absorb_leaves(chosen, inputs, producer, leaves, group_of, bindings, readers)
            upstream[var] = up
            continue
        if kinds is None and (
            "column-reduce" in why or any(producer.get(a, -1) in group_of for a in inputs)
        ):
            refused.append((var.name, why))  # needs inter-block communication, or ends a pattern
        if kinds is not None:
            for a in reversed(inputs):
                g = group_of.get(producer.get(a, -1))
                if g is None or chosen is g:
                    continue
                if g.layout:
                    refused.append((var.name, "the pattern ends in a layout op"))
                    continue
                if g.column is not None and not _joins_columns(g, kinds, out, inputs, producer):
                    refused.append((var.name, f"output {out} is not a column pattern's {g.rows}"))
                    continue
                if g.column is None and out[: len(g.rows)] != g.rows:
                    refused.append((var.name, f"output {out} is not in the row space {g.rows}"))
                    continue
                if not _convex(g, inputs, producer, group_of, upstream, group_up):
                    refused.append((var.name, "joining would make the pattern non-convex"))
                    continue
                chosen = g
                break
            if chosen is None and OpKind.ROW_REDUCE not in kinds and not up:
                # elementwise on inputs only: joins the pattern of its first stitched consumer
                leaves[i] = kinds
                upstream[var] = up
                continue
            if chosen is None:
                rows = out[:-1] if OpKind.ROW_REDUCE not in kinds else _reduce_rows(binding, _shape)
                chosen = Group(len(groups), rows)
                groups.append(chosen)
            chosen.add(i, kinds, reduced=chosen.column is not None and tuple(out) == chosen.rows)
            group_of[i] = chosen
            up.discard(chosen.gid)
            group_up.setdefault(chosen.gid, set()).update(up)
            _absorb_leaves(chosen, inputs, producer, leaves, group_of, bindings, readers)
        upstream[var] = up
    for g in groups:
        _drop_trailing_reshapes(g, bindings, group_of)
    # a single op counts when its PrimFunc is itself a pattern (nn.layer_norm, nn.softmax)
    kept = [g for g in groups if g.has_reduce and len(g.kinds) > 1]
    columns = [g for g in groups if g.column is not None]
    for g in groups:
        if g not in kept and g not in columns and len(g.kinds) > 1:
            refused.append((bindings[g.members[0]].var.name, "pattern without a row reduction"))
    return _pack(kept, group_up) + columns, refused


def _convex(group, inputs, producer, group_of, upstream, group_up) -> bool:
    """Whether a binding reading ``inputs`` can join ``group`` with no path leaving the group
    and coming back (none of its inputs from outside depends on the group).  A value depends
    on the groups upstream of it and, when a group computes it, on everything that group reads
    now (a group is one kernel: a member joined later can make its earlier members' readers
    wait for another group)."""
    for b in inputs:
        owner = group_of.get(producer.get(b, -1))
        if owner is group:
            continue
        deps = set(upstream.get(b, set()))
        if owner is not None:
            deps |= group_up.get(owner.gid, set())
        if group.gid in _closure(deps, group_up):
            return False
    return True


def _tails_packable(h: Group, g: Group) -> bool:
    """The greedy rule's packing of layout tails: at most one of ``h`` and ``g`` is written
    through layout ops and those come after every member of the other, in program order (the
    rule as it was before packed patterns were planned apart; the explorer packs any)."""
    tails = [x for x in (h, g) if x.layout]
    if not tails:
        return True
    other = g if tails[0] is h else h
    if len(tails) > 1 or min(tails[0].layout) < max(other.members):
        logger.debug("stitch: patterns of %s and %s not packed: a layout tail would not end the "
                    "kernel", h.members, g.members)
        return False
    return True


def _closure(gids, group_up) -> set:
    """``gids`` and every group they depend on through ``group_up``, transitively."""
    seen, stack = set(gids), list(gids)
    while stack:
        for g in group_up.get(stack.pop(), ()):
            if g not in seen:
                seen.add(g)
                stack.append(g)
    return seen


def _column_kinds(nodes) -> list[OpKind] | None:
    """The op kinds of a binding that reduces columns (every block elementwise or a column
    reduction, one at least), else None."""
    kinds = [n.kind for n in nodes or ()]
    if OpKind.COLUMN_REDUCE not in kinds:
        return None
    allowed = STITCHABLE - {OpKind.ROW_REDUCE} | {OpKind.COLUMN_REDUCE}
    return kinds if all(k in allowed for k in kinds) else None


def _joins_columns(group, kinds, out, inputs, producer) -> bool:
    """Whether an elementwise binding joins a column pattern: on the reduced side (its output
    the pattern's output space), or before the reductions (the input space, reading none of
    the reduced side's values: a reduced value broadcast back needs every block's result)."""
    if OpKind.ROW_REDUCE in kinds:
        return False
    if tuple(out) == group.rows:
        return True
    return tuple(out) == group.column[0] and not any(
        producer.get(a, -1) in group.reduced for a in inputs
    )


def _column_signature(binding, inputs, _shape) -> tuple:
    """``(input shape, output shape)`` of a column reduction: reductions alike in both share
    one column pattern."""
    shapes = [_shape(a.ty) for a in inputs if _shape(a.ty) is not None]
    widest = max(shapes, key=math.prod, default=())
    return tuple(widest), tuple(_shape(binding.var.ty))


def _drop_trailing_reshapes(group, bindings, group_of) -> None:
    """A reshape at the end of a pattern stays out: TVM makes it a free view of the result."""
    while group.layout and "reshape" in bindings[group.layout[-1]].value.args[0].name_hint:
        i = group.layout.pop()
        group.members.remove(i)
        del group_of[i]


def _layout_tail_of(binding, nodes, inputs, producer, group_of, readers, _shape):
    """The pattern a reshape/transpose binding ends, or None.

    It qualifies when all its blocks (``nodes``) are injective with as many elements out as in,
    its one input is the result of a pattern with a row reduction (or of that pattern's last
    layout op) and nothing else reads that result, so the pattern's output can be written
    through it.
    """
    if not _layout_op(nodes, inputs):
        return None
    g = group_of.get(producer.get(inputs[0], -1))
    if g is None or not g.has_reduce or len(readers.get(inputs[0], ())) != 1:
        return None
    if g.layout and producer[inputs[0]] != g.layout[-1]:
        return None
    return g if _same_count(binding.var, inputs[0], _shape) else None


def _same_count(a, b, shape_of) -> bool:
    """Whether the values ``a`` and ``b`` have static shapes (``shape_of(ty)``, None where
    not) of as many elements."""
    sa, sb = shape_of(a.ty), shape_of(b.ty)
    return sa is not None and sb is not None and math.prod(sa) == math.prod(sb)


def _input_transpose(binding, nodes, inputs, readers) -> bool:
    """Whether ``binding`` is a transpose (every block a permutation of the axes) of one value,
    read by one binding only and not an output of the block (the caller checks that no pattern
    produced the value)."""
    if not _layout_op(nodes, inputs) or any(n.detail != "transpose" for n in nodes):
        return False
    # read elsewhere too, or an output of the block: it stays a kernel of its own
    return len(readers.get(binding.var, ())) == 1 and isinstance(binding.var, relax.DataflowVar)


def _layout_op(nodes, inputs) -> bool:
    """A ``call_tir`` of one input whose blocks are all injective (reshape, transpose)."""
    return bool(nodes) and len(inputs) == 1 and all(n.kind is OpKind.INJECTIVE for n in nodes)


def _pack(groups, group_up, gain=None) -> list[Group]:
    """Kernel packing: independent patterns share one kernel (no path between them, through
    any group). The greedy rule's: over the same number of rows, where one layout tail at most
    ends the kernel (:func:`_tails_packable`). Given ``gain`` (what packing a list of patterns
    saves: the explorer's), wherever packing one more adds to that: rows of any count, each
    pattern written through its own layout tail (:func:`~tvm_stitch.stitch.plan.
    candidate_plans` plans the packed patterns apart, :func:`~tvm_stitch.stitch.schedule.
    apply_plan` pads their row loops to the most)."""
    packed: list[Group] = []
    ids: dict[int, set] = {}
    for g in groups:
        deps = _closure(group_up.get(g.gid, set()), group_up)
        for h in packed:
            h_deps = _closure(set().union(*(group_up.get(x, set()) for x in ids[h.gid])),
                              group_up)
            parts = h.parts or [h]
            if gain is None:
                wanted = math.prod(g.rows) == math.prod(h.rows) and _tails_packable(h, g)
            else:  # not where both recompute an op: computed once, it would join them
                saved = 0.0 if set(h.copies) & set(g.copies) else gain([*parts, g]) - gain(parts)
                wanted = saved > 0
            if wanted and not deps & ids[h.gid] and g.gid not in h_deps:
                counts = [math.prod(x.rows) for x in (*parts, g)]
                if len(set(counts)) > 1:
                    logger.info("stitch: patterns of %s rows packed into one kernel (%.2f us "
                                "saved by the packing model)", counts, saved)
                h.parts = h.parts or [dataclasses.replace(h, members=list(h.members),
                                                          kinds=list(h.kinds),
                                                          layout=list(h.layout),
                                                          copies=list(h.copies))]
                h.parts.append(g)
                h.kinds.extend(g.kinds)
                h.members = sorted(h.members + g.members)
                h.layout = sorted(h.layout + g.layout)
                h.copies = sorted(h.copies + g.copies)
                ids[h.gid].add(g.gid)
                break
        else:
            packed.append(g)
            ids[g.gid] = {g.gid}
    return packed


def _absorb_leaves(group, inputs, producer, leaves, group_of, bindings, readers) -> None:
    """Pull the input-only elementwise producers of ``inputs`` (and theirs) into ``group``: a
    cast of the input, a mask's or a weight's cast are recomputed inside the pattern.  A leaf
    that a binding outside the pattern has read already stays out: that reader may feed the
    pattern (a reshape of the leaf normalized by it), and the pattern would both produce and
    wait for it."""
    stack = list(inputs)
    now = max(group.members)
    while stack:
        j = producer.get(stack.pop())
        if j is None or j not in leaves or j in group_of:
            continue
        if any(r < now and group_of.get(r) is not group for r in readers.get(bindings[j].var, ())):
            continue
        group.add(j, leaves.pop(j), reduced=False)
        group_of[j] = group
        stack.extend(a for a in _call_args(bindings[j].value) if isinstance(a, relax.Var))
    group.members.sort()


def _reduce_rows(binding, _shape) -> tuple:
    """The row space of a row reduction: its input's shape without the reduced trailing axes."""
    out = _shape(binding.var.ty)
    args = [a for a in _call_args(binding.value) if _shape(a.ty) is not None]
    widest = max((_shape(a.ty) for a in args), key=len, default=out)
    if tuple(widest) == tuple(out):  # several blocks ending in a full-size output (layer_norm)
        return tuple(out[:-1])
    rows = tuple(d for d, o in zip(widest, out) if d == o)
    return rows if rows else out[:-1]


def _call_args(value):
    if isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
        return list(value.args[1].fields)
    if isinstance(value, relax.Call):
        return list(value.args)
    return []


def explored_groups(mod, block, point, greedy: list[Group], hw=None) -> list[Group]:
    """The row patterns of the fusion explorer's plan (:mod:`tvm_stitch.explore.fusion`, scored
    for ``hw``, by default the default GPU) over ``block``, packed as the rule packs them, with
    ``greedy``'s column patterns (their members out of the explorer's graph) and the single
    bindings that are patterns by themselves (a legalized ``layer_norm``). Where a row
    pattern and a column pattern would wait for each other, ``greedy`` itself."""
    from tvm_stitch.explore.fusion import cyclic, packing_gain, pattern, recompute, row_space
    from tvm_stitch.explore.fusion import explore as search
    from tvm_stitch.hardware import HardwareModel

    hw = hw or HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
    columns = [g for g in greedy if g.column is not None]
    graph, kinds = block_graph(mod, block, point, {i for g in columns for i in g.members})
    plan = recompute(graph, search(graph, hw), hw)
    for i in plan.recomputed:
        logger.info("stitch: %s recomputed by each pattern that reads it", graph.vertices[i].name)
    groups = []
    for p in plan.patterns:
        g = Group(len(groups), row_space(graph, p.members - p.copies), copies=sorted(p.copies))
        for i in sorted(p.members):
            v = graph.vertices[i]
            if v.kind is OpKind.INJECTIVE and any(j in p.members for j in v.inputs):
                g.members.append(i)  # written through, as the rule's layout tails
                g.layout.append(i)
            else:
                g.add(i, kinds[i], reduced=False)
        groups.append(g)
    covered = {i for g in groups for i in g.members}
    for i, k in kinds.items():  # a PrimFunc that is a pattern itself
        if i not in covered and k and OpKind.ROW_REDUCE in k and len(k) > 1:
            g = Group(len(groups), row_space(graph, {i}))
            g.add(i, k, reduced=False)
            groups.append(g)
    bindings = list(block.bindings)
    group_of = {i: g for g in groups for i in g.members}
    for g in groups:
        _drop_trailing_reshapes(g, bindings, group_of)
    groups = [g for g in groups if len(g.members) > 1 or len(g.kinds) > 1]
    above = {}
    for g in groups:
        bits = 0
        for i in g.members:
            bits |= graph.above[i]
        above[g.gid] = bits
    # a copy is no dependence: each pattern that reads it computes it
    group_up = {g.gid: {h.gid for h in groups if h is not g and
                        any(above[g.gid] >> i & 1 for i in h.members if i not in h.copies)}
                for g in groups}
    def gain(parts):  # packing's, by the explorer's model
        return packing_gain([pattern(graph, set(g.members), set(g.copies)) for g in parts], hw)

    kept = _pack(groups, group_up, gain)
    if columns and cyclic(graph, [set(g.members) - set(g.copies) for g in (*kept, *columns)]):
        logger.info("stitch: the explorer's patterns and the column patterns would wait for "
                    "each other: the greedy rule's patterns kept")
        return greedy
    next_gid = max((g.gid for g in kept), default=-1) + 1
    for n, g in enumerate(columns):
        g.gid = next_gid + n
    return kept + columns


def block_graph(mod, block, point, opaque=frozenset()):
    """``(graph, kinds)``: ``block``'s bindings as a :class:`~tvm_stitch.explore.fusion.
    FusionGraph` (each binding a vertex; the ones in ``opaque``, and every binding that cannot
    be stitched, opaque) and each stitchable binding's block kinds."""
    from tvm_stitch.explore.fusion import FusionGraph, Vertex

    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    vertices, kinds = [], {}
    for i, b in enumerate(bindings):
        shape = shape_at(b.var.ty, point)
        dtype = getattr(b.var.ty, "dtype", None)
        size = math.prod(shape) * dtype_bytes(dtype) if shape and dtype else 0
        read = list(relax.analysis.free_vars(b.value))
        inputs = tuple(sorted({index[v] for v in read if v in index}))
        outside = []
        for v in read:
            if v in index:
                continue
            s = shape_at(v.ty, point) if hasattr(v, "ty") else None
            d = getattr(getattr(v, "ty", None), "dtype", None)
            if s is not None and d is not None:
                outside.append((v.name, math.prod(s) * dtype_bytes(d)))
        nodes = callee_nodes(mod, b, point)
        k, _ = binding_kinds(mod, b, nodes, point)
        args = [a for a in _call_args(b.value) if isinstance(a, relax.Var)]
        kind, rows, view = OpKind.OPAQUE, None, False
        if i in opaque or shape is None:
            pass
        elif k is not None:
            kinds[i] = k
            if OpKind.ROW_REDUCE in k:
                kind, rows = OpKind.ROW_REDUCE, tuple(_reduce_rows(b, lambda t: shape_at(t, point)))
            elif OpKind.EXPENSIVE_ELEMWISE in k:
                kind = OpKind.EXPENSIVE_ELEMWISE
            elif set(k) == {OpKind.BROADCAST}:
                kind = OpKind.BROADCAST
            else:
                kind = OpKind.LIGHT_ELEMWISE
        elif _layout_op(nodes, args) and _same_count(b.var, args[0],
                                                     lambda t: shape_at(t, point)):
            # a reshape joins as a tail only: read, it is a view; an op that drops or adds
            # elements (a slice, a constant take, a pad) joins no pattern, as in the rule
            kinds[i] = [OpKind.INJECTIVE]
            kind, view = OpKind.INJECTIVE, any(n.detail != "transpose" for n in nodes)
        vertices.append(Vertex(b.var.name, kind, tuple(shape or ()), size, inputs,
                               tuple(outside), not isinstance(b.var, relax.DataflowVar), rows,
                               view))
    return FusionGraph(vertices), kinds
