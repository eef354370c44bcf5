"""What the families' recognizers share beyond the data of :mod:`.match`: the policies deciding
which producers a kernel recomputes and which tensors it reads, operands read in place, the
epilogue regions after a product and the output a kernel writes at their end, and the
normalization a GEMM may recompute (:func:`norm_region`).
"""

from __future__ import annotations

import dataclasses
import logging
import math

import tvm
from tvm import ir, sym, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.graph import OpKind, TensorDependencyGraph
from tvm_stitch.graph.tdg import dtype_bytes

from .elem import (
    Elem,
    Leaf,
    Op,
    Policy,
    Reduce,
    data_movement,
    elementwise,
    format_elem,
    leaves,
    walk,
)
from .indexing import bind, dtype_of, new_var, substitute
from .match import (
    Access,
    Contraction,
    NotRecognizedError,
    Output,
    contraction,
    reindex,
    vars_of,
)

logger = logging.getLogger("tvm_stitch.recognize")

_FLOATS = ("float16", "bfloat16", "float32")


# -- policies --------------------------------------------------------------------------------------
def materialized(graph: TensorDependencyGraph, tensor: str) -> bool:
    """A tensor other kernels or the function itself need: read it rather than recompute it.

    Readers count through data movement, which kernels see through: BERT's additive padding
    mask, ``(1 - mask) * -10000`` reshaped to ``[batch, 1, 1, seq]``, is read by every
    layer's attention; recomputed in each, it cost an int-to-half conversion per logit
    (BERT-base 8 × 512's attention kernel 26.4 µs, 24.3 reading the mask; H100, 2026-11-26).
    """
    if graph.tensors[tensor].scope == "local":
        return False
    calls, stack, seen = set(), [tensor], set()
    while stack:
        t = stack.pop()
        if t in graph.pinned:
            return True
        for node in graph.consumers(t):
            if not data_movement(node):
                calls.add(node.call)
            elif node.output not in seen:
                seen.add(node.output)
                stack.append(node.output)
    return len(calls) > 1


def _views_policy(graph, stop=frozenset(), casts=False) -> Policy:
    """Operands read in place: data movement is seen through (and float casts with ``casts``,
    but for a narrowing of a computed tensor nothing else reads, which its producer writes
    narrow instead), never past a tensor another kernel writes (``stop``)."""

    def inline(node):
        if node.output in stop:
            return False
        return data_movement(node) or (casts and elementwise(node) and float_cast(node)
                                       and not _narrows_for_itself(graph, node))

    return Policy(inline=inline)


def _narrows_for_itself(graph, node) -> bool:
    """A cast to a narrower float of a tensor that another op computes and only this cast
    reads: read through, the product would load the wide tensor (twice the bytes, converted in
    its loop) where the producer can write the narrow one (a bfloat16 model's LayerNorm, run in
    float32 between casts, before a GEMM)."""
    sources = {m.tensor for m in node.inputs}
    if len(sources) != 1:
        return False
    (source,) = sources
    narrower = tvm.DataType(graph.tensors[node.output].dtype).bits < tvm.DataType(
        graph.tensors[source].dtype).bits
    if not narrower or _materialized_besides(graph, source, node):
        return False
    # computed: not an input (or a weight) seen through data movement, which the product
    # reads through the cast rather than after a cast kernel of its own
    t = source
    while graph.tensors[t].producer is not None:
        producer = graph.nodes[graph.tensors[t].producer]
        if not data_movement(producer):
            return True
        inputs = {m.tensor for m in producer.inputs}
        if len(inputs) != 1:
            return True
        (t,) = inputs
    return False


def _materialized_besides(graph, tensor: str, reader) -> bool:
    """Whether ``tensor`` is pinned or read by a node other than ``reader`` (any node, in any
    call: unlike :func:`materialized`, which counts calls through data movement)."""
    return tensor in graph.pinned or any(n.name != reader.name for n in graph.consumers(tensor))


def _epilogue_policy(graph, stop=frozenset(), inside=frozenset(), fold=frozenset()) -> Policy:
    """Epilogues and logits: data movement is seen through; elementwise producers that nothing
    else reads (or that lie ``inside`` the epilogue region) are recomputed in the kernel;
    materialized tensors are read, but for the normalizations folded into it (``fold``: the
    tensors of their regions, row statistics included)."""

    def inline(node):
        if node.output in stop:
            return False
        if node.output in fold:
            return True
        if node.output in inside:
            return elementwise(node)
        return data_movement(node) or (elementwise(node) and not materialized(graph, node.output))

    return Policy(inline=inline, reductions=bool(fold))


def prologue_policy(graph, stop, fold) -> Policy:
    """``A`` of a GEMM a normalization is folded into: views, float casts and the tensors of the
    folded regions (``fold``) are computed in the kernel."""
    views = _views_policy(graph, stop, casts=True)

    def inline(node):
        return node.output not in stop and (node.output in fold or views.inline(node))

    return Policy(inline=inline, reductions=True)


def norm_region(graph: TensorDependencyGraph, tensor: str, stop=frozenset()) -> frozenset | None:
    """The tensors a kernel recomputes to fold ``tensor`` into it — the normalization (or any
    elementwise function of row statistics) that writes it, back to the tensors it reads — or
    None when ``tensor`` is not computed from a row reduction.

    The region grows through elementwise, data-movement and row-reduction producers and stops
    at tensors other kernels write (``stop``) or others read (materialized), which stay reads.
    A column reduction on the way raises :class:`NotRecognizedError` (its statistics would
    vary along ``k``).
    """
    first = graph.nodes.get(graph.tensors[tensor].producer or "")
    if first is None or not elementwise(first):
        return None
    region, stack, reduces = set(), [tensor], 0
    while stack:
        t = stack.pop()
        if t in region:
            continue
        node = graph.nodes.get(graph.tensors[t].producer or "")
        if t != tensor and (t in stop or materialized(graph, t)):
            continue
        if node is None or node.block is None:
            continue
        if node.kind is OpKind.ROW_REDUCE:
            reduces += 1
        elif node.kind is OpKind.COLUMN_REDUCE:
            raise NotRecognizedError(f"{t} reduces along the columns, not the rows")
        elif not elementwise(node):
            continue
        region.add(t)
        stack.extend(m.tensor for m in node.inputs)
    return frozenset(region) if reduces else None


def region_policy(graph, stop=frozenset(), inside=frozenset()) -> Policy:
    """Between two products: like the epilogue, and row reductions (a softmax) too; tensors
    ``inside`` the region (read by nothing else) are recomputed however many of its nodes read
    them."""
    base = _epilogue_policy(graph, stop)

    def inline(node):
        if node.output in stop:
            return False
        if node.output in inside:
            return node.kind is OpKind.ROW_REDUCE or elementwise(node) or data_movement(node)
        if node.kind is OpKind.ROW_REDUCE:
            return not materialized(graph, node.output)
        return base.inline(node)

    return Policy(inline=inline, reductions=True)


# -- operands --------------------------------------------------------------------------------------
def operand(graph, frame, composer, tensor, index, vmap, what, stop=frozenset(),
             casts=False) -> Access:
    """The base tensor an operand is read from, seen through data movement (and, with
    ``casts``, through float conversions, which the kernel then makes in registers)."""
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)
    elem = composer.element(tensor, idx, _views_policy(graph, stop, casts))
    if casts:
        elem = strip_casts(elem)
    if not isinstance(elem, Leaf):
        raise NotRecognizedError(f"{what} is not a view of a tensor: {format_elem(elem)}")
    return Access(elem.tensor, elem.index)


def strip_casts(e: Elem) -> Elem:
    while isinstance(e, Op) and e.op == "cast":
        e = e.args[0]
    return e


def row_names(frame) -> set:
    return {v.name for a, v in frame.vars.items() if a[:1] in "bm"}


def check_statistics(elem: Elem, rows: set, what: str) -> None:
    """Every reduction in ``elem`` is a row statistic: indexed by the row (and batch)
    coordinates (``rows``: names) and its own variables only."""
    for e in walk(elem):
        if not isinstance(e, Reduce):
            continue
        inner = {x.var.name for x in walk(e) if isinstance(x, Reduce)}
        for leaf in leaves(e):
            for name in vars_of(leaf.index) - rows - inner:
                raise NotRecognizedError(f"{what}: a reduction varies along {name}, not only rows")


def float_cast(node) -> bool:
    """A block that only converts one float element to another float type."""
    value = node.block.body.value if node.block is not None else None
    return (
        isinstance(value, P.Cast)
        and isinstance(value.value, ir.expr.TensorLoad)
        and "float" in dtype_of(value)
        and "float" in dtype_of(value.value)
    )


def uses(leaf: Leaf, var) -> bool:
    return var is not None and any(var.name in vars_of((i,)) for i in leaf.index)


def is_var(expr, var) -> bool:
    return isinstance(expr, ir.expr.Var) and expr.same_as(var)


def out_index_of(c: Contraction, vmap) -> tuple:
    """The product's output index over the frame."""
    return tuple(substitute(i, vmap) for i in c.node.block.body.indices)


# -- epilogues -------------------------------------------------------------------------------------
def check_dtype(graph, c: Contraction) -> str:
    dtypes = {graph.tensors[c.a[0]].dtype, graph.tensors[c.b[0]].dtype}
    if len(dtypes) != 1 or next(iter(dtypes)) not in _FLOATS:
        raise NotRecognizedError(f"operand dtypes {sorted(dtypes)}")
    if c.acc_dtype not in ("float32", *dtypes):
        raise NotRecognizedError(f"accumulates in {c.acc_dtype}")
    return next(iter(dtypes))


@dataclasses.dataclass
class _Epilogue:
    output: Output
    covered_calls: list


def calls_nodes(graph, calls) -> list[str]:
    return [n.name for n in graph.nodes.values() if n.call in calls]


@dataclasses.dataclass(frozen=True)
class EpilogueRegion:
    """Elementwise calls after a product that the kernel can compute: they end in ``end`` (the
    tensor the kernel writes) and everything between (``interior``) is read only on the way."""

    end: str
    calls: tuple
    interior: frozenset


def epilogue_regions(graph, tensor: str, stop=frozenset(), read=frozenset(), limit=24) -> list:
    """Candidate epilogues after ``tensor`` (a product's result), largest first; the empty one
    (``end == tensor``) last.

    A region grows through calls whose blocks are all elementwise or data movement and which
    write one tensor of as many elements; it may end at ``T`` when every tensor between
    ``tensor`` and ``T`` is read only by calls on the way to ``T`` and nothing else needs it.
    Tensors other kernels write (``stop``) are never in a region; tensors other kernels read
    (``read``) may end one, not lie inside it.
    """
    numel = math.prod(graph.tensors[tensor].shape)
    calls_of: dict = {}
    for node in graph.nodes.values():
        calls_of.setdefault(node.call, []).append(node)
    order, outputs, seen = [], {}, {tensor}
    frontier = [tensor]
    while frontier and len(order) < limit:
        cur = frontier.pop(0)
        for call in dict.fromkeys(n.call for n in graph.consumers(cur)):
            nodes = calls_of[call]
            if call in outputs or not all(elementwise(n) for n in nodes):
                continue
            outs = {n.output for n in nodes if graph.tensors[n.output].scope != "local"}
            if len(outs) != 1:
                continue
            out = outs.pop()
            if out in stop or math.prod(graph.tensors[out].shape) != numel:
                continue
            outputs[call] = out
            order.append(call)
            if out not in seen and out not in read:
                seen.add(out)
                frontier.append(out)
    regions = []
    producer_call = {out: call for call, out in outputs.items()}
    for call in reversed(order):
        end = outputs[call]
        inside = _between(graph, tensor, end, producer_call, calls_of)
        if inside is None:
            continue
        interior = frozenset(t for t in inside if t != end) | {tensor}
        if any(t in graph.pinned or t in read for t in interior):
            continue
        width = _float_width(graph.tensors[end].dtype)
        narrower = (_float_width(graph.tensors[t].dtype) for t in interior - {tensor})
        if width and any(0 < w < width for w in narrower):
            # a region ending by widening a narrower value writes more bytes than the value:
            # it ends before, and the readers widen it in registers
            logger.debug("recognize: epilogue after %s does not end at %s (a widening cast)",
                         tensor, end)
            continue
        calls = tuple(c for c in order if outputs[c] in inside)
        readers_ok = all({n.call for n in graph.consumers(t)} <= set(calls) for t in interior)
        if readers_ok:
            regions.append(EpilogueRegion(end, calls, interior))
    regions.sort(key=lambda r: -len(r.calls))
    regions.append(EpilogueRegion(tensor, (), frozenset()))
    return regions


def _float_width(dtype: str) -> int:
    """Bytes of a floating-point element (:func:`~tvm_stitch.graph.tdg.dtype_bytes`), 0 for any
    other dtype."""
    return dtype_bytes(dtype) if str(dtype).startswith(("float", "bfloat")) else 0


def _between(graph, start, end, producer_call, calls_of) -> set | None:
    """Region tensors on paths from ``start`` to ``end`` (``end`` included), or None when
    ``end`` does not depend on ``start`` through the region."""
    back, stack = {end}, [end]
    while stack:
        call = producer_call.get(stack.pop())
        if call is None:
            continue
        for node in calls_of[call]:
            for m in node.inputs:
                src = m.tensor
                if src not in back and (src == start or src in producer_call):
                    back.add(src)
                    stack.append(src)
    return back - {start} if start in back else None


def epilogue(graph, frame, composer, c: Contraction, out_index, region, stop, fold=frozenset()):
    """The epilogue ``region`` after ``c`` as an output, and the other products it reads
    (``[(Contraction, Leaf)]``: candidates for computing them in the same kernel)."""
    output, others = _write_back(graph, frame, composer, c, out_index, region, stop, fold)
    return _Epilogue(output, list(region.calls)), others


def _write_back(graph, frame, composer, c, out_index, region, stop, fold=frozenset()):
    """The end of ``region`` (after ``c``) as an :class:`Output` over ``c``'s frame."""
    end = region.end
    info = graph.tensors[end]
    ys = [new_var(f"y{i}") for i in range(len(info.shape))]
    for y, d in zip(ys, info.shape):
        bind(frame.analyzer, y, d)
    # the region's calls, its last one included, are the kernel's to compute
    inside = region.interior | ({end} if region.calls else set())
    elem = composer.element(end, tuple(ys), _epilogue_policy(graph, stop, inside, fold))
    mine = [leaf for leaf in leaves(elem) if leaf.tensor == c.out]
    if len({leaf.key() for leaf in mine}) != 1:
        raise NotRecognizedError(f"the epilogue reads the product {len(mine)} ways")
    forward = mine[0].index  # product coordinates as functions of the output's
    inverse = _invert(forward, ys, info.shape, out_index, frame)
    elem = reindex(elem, inverse, frame)
    if fold:
        check_statistics(elem, row_names(frame), "the epilogue")
        frame.adopt(elem)
    access = Access(end, tuple(frame.simplify(substitute(y, inverse)) for y in ys))
    others = []
    for leaf in leaves(elem):
        if leaf.tensor == c.out:
            if not frame.same(leaf.index, out_index):
                raise NotRecognizedError("the epilogue reads the product at another position")
            continue
        producer = graph.nodes.get(graph.tensors[leaf.tensor].producer or "")
        if producer is not None and producer.kind is OpKind.COMPUTE_INTENSIVE:
            try:
                others.append((contraction(producer), leaf))
            except NotRecognizedError:
                pass
    return Output(end, access, elem, (c.out,)), others


def _invert(forward, ys, shape, out_index, frame) -> dict:
    """``{y: expression of the frame}`` inverting ``out_index == forward(ys)`` (a bijection of
    the output's coordinates onto the product's)."""
    dom = {y: _range(d) for y, d in zip(ys, shape)}
    found = sym.detect_iter_map(list(forward), dom, check_level="bijective")
    if len(found.indices) != len(forward):
        raise NotRecognizedError("the output is not a permutation of the product's elements")
    # the frame's coordinates that the product's output index uses, as the map's outputs
    outs = []
    for index in out_index:
        i = frame.simplify(index)
        if isinstance(i, ir.expr.Var):
            outs.append(i)
        elif isinstance(i, P.IntImm) and int(i.value) == 0:
            outs.append(tirx.const(0, "int64"))
        else:
            raise NotRecognizedError(f"the product's output index {i} is not a coordinate")
    placeholders = [o if isinstance(o, ir.expr.Var) else new_var("unit") for o in outs]
    inverse = sym.inverse_affine_iter_map(found.indices, placeholders)
    result = {}
    for y in ys:
        expr = next((v for k, v in inverse.items() if k.same_as(y)), None)
        if expr is None:
            expr = tirx.const(0, "int64")  # a unit axis of the output
        result[y] = frame.simplify(expr)
    return result


def _range(extent):
    import tvm

    return tvm.ir.Range.from_min_extent(0, int(extent))


# -- two products ----------------------------------------------------------------------------------
def pair_output(graph, frame, composer, c1, c2, vmap2, region, stop):
    """The output of a kernel computing ``c1`` then ``c2`` (its epilogue ``region`` after
    ``c2``), and the graph nodes the kernel replaces."""
    epi, others = epilogue(graph, frame, composer, c2, out_index_of(c2, vmap2), region, stop)
    if others:
        raise NotRecognizedError("the output's epilogue reads another product")
    epi.output.accumulators = (c2.out,)
    covered = [c1.node.name, c2.node.name, *_region_nodes(graph, c1, c2)]
    return epi.output, covered + calls_nodes(graph, epi.covered_calls)


def _region_nodes(graph, c1, c2) -> list[str]:
    """Nodes on paths from ``c1``'s output to ``c2`` (the softmax and what feeds it)."""
    out, stack, seen = [], [c1.out], set()
    while stack:
        tensor = stack.pop()
        for node in graph.consumers(tensor):
            if node.name in seen or node.name == c2.node.name:
                continue
            seen.add(node.name)
            if graph.reaches(node.name, c2.node.name):
                out.append(node.name)
                stack.append(node.output)
    return out
