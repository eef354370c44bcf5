"""The ``gemm`` family (:mod:`tvm_stitch.analysis.recognize` describes the families): a
contraction with its epilogue (:func:`gemm`) and the products that epilogue reads computed in the
same kernel (SwiGLU's gate × up); normalizations folded into the GEMMs reading them
(:func:`fold_norms`), their statistics summed from row moments the GEMM writing the row leaves
(:func:`moment_chunk`); GEMMs sharing ``A`` grouped into one kernel of several bands
(:func:`group_horizontal`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math

from tvm import tirx

from tvm_stitch.analysis.elem import (
    Composer,
    CompositionError,
    Leaf,
    Reduce,
    data_movement,
    elementwise,
    format_elem,
    leaves,
    outer_leaves,
    reductions,
    replace,
)
from tvm_stitch.analysis.indexing import (
    Strided,
    UnsupportedExprError,
    as_int64,
    dtype_of,
    new_var,
    substitute,
)
from tvm_stitch.analysis.match import (
    Access,
    Contraction,
    Frame,
    Match,
    NotRecognizedError,
    Output,
    Segment,
    finalize,
    rebase,
    reoutput,
    vars_of,
    views,
)
from tvm_stitch.analysis.moments import expand_statistics
from tvm_stitch.analysis.regions import (
    calls_nodes,
    check_dtype,
    check_statistics,
    epilogue,
    epilogue_regions,
    float_cast,
    materialized,
    norm_region,
    operand,
    out_index_of,
    prologue_policy,
    row_names,
    strip_casts,
    uses,
)
from tvm_stitch.analysis.through_weights import NotAffineError, fold_through_weights
from tvm_stitch.graph import TensorInfo

logger = logging.getLogger("tvm_stitch.recognize")


#: the contractions a GEMM kernel holds (see :mod:`tvm_stitch.families`)
PRODUCTS = 1
#: a GEMM's frame merges its batch, row and column axes where every access allows
COLLAPSE = ("b", "m", "n")


def describe(match: Match) -> str:
    """E.g. ``gemm 128x(128+128+128)x128 float16, 3 bands``: rows x columns (of each band) x
    k, products per band, a normalized A."""
    ext = match.frame.extents
    batch = f"{ext['b']}x" if ext.get("b", 1) > 1 else ""
    widths = [str(seg.n) for seg in match.segments]
    n = widths[0] if len(widths) == 1 else f"({'+'.join(widths)})"
    text = f"gemm {batch}{ext['m']}x{n}x{ext['k']} {match.dtype}"
    if len(match.segments) > 1:
        text += f", {len(match.segments)} bands"
    if max(len(s.products) for s in match.segments) > 1:
        text += ", 2 products" + (" interleaved" if match.paired else "")
    if match.prologue is not None:
        text += ", normalized A"
    return text


def regroup(graph, contractions, matches, written, read, rejected, weights,
            fold) -> list[Match]:
    """After every GEMM is found: with ``fold``, normalizations folded into the GEMMs reading
    them (:func:`fold_norms`); GEMMs sharing their ``A`` grouped (:func:`group_horizontal`)."""
    if fold:
        matches = fold_norms(graph, contractions, matches, written, read, rejected, weights)
    return group_horizontal(graph, matches, rejected)


def _frame_for(c: Contraction) -> tuple[Frame, dict]:
    """A frame with one axis per spatial variable of ``c`` (``b0``.., ``m0``.., ``n0``..) and
    ``k``; returns it and the map from the block's variables to the frame's."""
    frame = Frame()
    vmap = {}
    for prefix, ivs in (("b", c.batch), ("m", c.m), ("n", c.n)):
        for i, iv in enumerate(ivs):
            vmap[iv.var] = frame.axis(f"{prefix}{i}", int(iv.dom.extent))
    vmap[c.k.var] = frame.axis("k", int(c.k.dom.extent))
    spatial = [iv for iv in c.node.block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    for iv in spatial:
        if iv.var not in vmap:  # unit axes indexing nothing
            vmap[iv.var] = tirx.const(0, dtype_of(iv.var))
    return frame, vmap


def _a_operand(graph, frame, composer, tensor, index, vmap, stop, fold) -> tuple:
    """``(Access, prologue)`` of a GEMM's ``A``: a view (prologue None), or with normalizations
    folded in (``fold``), the element computing it and its main read — the leaf that varies
    along the row and ``k``.  Its row statistics must not depend on ``k``."""
    if not fold:
        return operand(graph, frame, composer, tensor, index, vmap, "A", stop, casts=True), None
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)
    elem = strip_casts(composer.element(tensor, idx, prologue_policy(graph, stop, fold)))
    if isinstance(elem, Leaf):
        return Access(elem.tensor, elem.index), None
    check_statistics(elem, row_names(frame), "A")
    k = frame.vars["k"]
    outer = [leaf for leaf in outer_leaves(elem) if uses(leaf, k)
             and any(uses(leaf, frame.vars[a]) for a in frame.vars if a.startswith("m"))]
    if not outer:
        raise NotRecognizedError(f"A reads no tensor along its rows and k: {format_elem(elem)}")
    frame.adopt(elem)
    return Access(outer[0].tensor, outer[0].index), elem


def gemm(graph, c: Contraction, stop, read=frozenset(), fold=frozenset()) -> Match:
    """The GEMM kernel of ``c`` with the longest epilogue whose output is a strided view; the
    tensors of ``fold`` (normalizations folded into it) are computed, not read."""
    dtype = check_dtype(graph, c)
    last = None
    for region in epilogue_regions(graph, c.out, stop, read):
        frame, vmap = _frame_for(c)
        composer = Composer(graph, frame.analyzer)
        try:
            a, prologue = _a_operand(graph, frame, composer, *c.a, vmap, stop, fold)
            b = operand(graph, frame, composer, *c.b, vmap, "B", stop, casts=True)
            out_index = out_index_of(c, vmap)
            epi, others = epilogue(graph, frame, composer, c, out_index, region, stop, fold)
            products = [(c.out, b)]
            covered = [c.node.name, *calls_nodes(graph, epi.covered_calls)]
            mine = (a.key(), prologue.key() if prologue is not None else None)
            for other, leaf in others:
                try:
                    b2 = _partner(graph, frame, composer, c, other, leaf, out_index, mine, stop,
                                  fold)
                except (NotRecognizedError, CompositionError, UnsupportedExprError) as err:
                    logger.info(
                        "recognize: %s read from memory by %s's epilogue: %s",
                        other.node.name,
                        c.node.name,
                        err,
                    )
                    continue
                products.append((other.out, b2))
                covered.append(other.node.name)
            epi.output.accumulators = tuple(p for p, _ in products)
            n = math.prod(frame.extents[x] for x in frame.extents if x.startswith("n"))
            segment = Segment(n, products, [epi.output], covered)
            match = Match(
                "gemm",
                frame,
                {"a": a},
                dtype,
                list(covered),
                segments=[segment],
                acc_dtype=c.acc_dtype,
                prologue=prologue,
            )
            finalize(graph, match)
            return match
        except (NotRecognizedError, CompositionError, UnsupportedExprError) as err:
            last = err
    raise NotRecognizedError(str(last))


def _partner(graph, frame, composer, c, other: Contraction, leaf, out_index, a, stop,
             fold=frozenset()):
    """Another product read by ``c``'s epilogue at the same position, computed in the same
    kernel: it must share ``A``, shapes and dtypes, and have no other reader."""
    if materialized(graph, other.out):
        raise NotRecognizedError(f"{other.node.name}'s result is read elsewhere")
    if not frame.same(leaf.index, out_index):
        raise NotRecognizedError(f"{other.node.name} is read at another position")
    shapes = [(len(x.batch), len(x.m), len(x.n), int(x.k.dom.extent)) for x in (c, other)]
    if shapes[0] != shapes[1] or graph.tensors[other.out].shape != graph.tensors[c.out].shape:
        raise NotRecognizedError(f"{other.node.name} has another shape")
    # the partner's variables, in the same roles, are this frame's axes
    names = {}
    for prefix, mine, theirs in (
        ("b", c.batch, other.batch),
        ("m", c.m, other.m),
        ("n", c.n, other.n),
    ):
        for i, (_, iv) in enumerate(zip(mine, theirs)):
            names[iv.var] = frame.vars[f"{prefix}{i}"]
    names[other.k.var] = frame.vars["k"]
    for iv in other.node.block.iter_vars:
        if iv.var not in names:
            names[iv.var] = tirx.const(0, dtype_of(iv.var))
    if check_dtype(graph, other) != check_dtype(graph, c) or other.acc_dtype != c.acc_dtype:
        raise NotRecognizedError(f"{other.node.name} has other dtypes")
    a2, prologue = _a_operand(graph, frame, composer, *other.a, names, stop, fold)
    if a != (a2.key(), prologue.key() if prologue is not None else None):
        raise NotRecognizedError(f"{other.node.name} reads another A")
    return operand(graph, frame, composer, *other.b, names, "the partner's B", stop, casts=True)


# -- normalizations folded in ----------------------------------------------------------------------
def fold_norms(graph, contractions, matches, written, read, rejected,
                weights=None) -> list[Match]:
    """Normalizations (any elementwise function of row statistics: LayerNorm, RMSNorm, however
    written) whose every reader is a GEMM kernel stop being kernels of their own: each reader
    recomputes them — as ``A``'s prologue or inside its epilogue (SOUFFLE's schedule
    propagation with a two-phase reduction: statistics first, then the product).  With
    ``weights``, a reader's ``A`` prologue becomes scaled weights and an epilogue
    (:func:`~tvm_stitch.analysis.through_weights.fold_through_weights`); a normalization that
    cannot be folded so stays a kernel."""
    gemms = {m.covered[0]: m for m in matches if m.family == "gemm"}
    readers: dict[str, list[str]] = {}
    for name, m in gemms.items():
        tensors = {m.accesses["a"].tensor}
        for seg in m.segments:
            for o in seg.outputs:
                tensors.update(x.tensor for x in leaves(o.elem) if x.tensor not in o.accumulators)
        for t in tensors:
            readers.setdefault(t, []).append(name)
    folds: dict[str, frozenset] = {}
    pending: dict[str, list] = {}  # producer -> moments it writes
    errors = (NotRecognizedError, CompositionError, UnsupportedExprError)
    for tensor, names in readers.items():
        if tensor in graph.pinned or tensor in written:
            continue
        try:
            region = norm_region(graph, tensor, written)
        except NotRecognizedError as err:
            rejected.append((tensor, f"normalization not folded: {err}"))
            continue
        if region is None:
            continue
        calls = {graph.nodes[n].call for name in names for n in gemms[name].covered}
        outside = _other_readers(graph, tensor, calls)
        if outside:
            rejected.append((tensor, f"normalization not folded: also read by {outside}"))
            continue
        trial = {}
        try:
            for name in names:
                fold = folds.get(name, frozenset()) | region
                own = {o.tensor for o in gemms[name].all_outputs}
                match = gemm(graph, contractions[name], written - own, read, fold)
                if tensor in {v.tensor for v in match.views.values()}:
                    raise NotRecognizedError(f"{name} still reads it")
                trial[name] = (match, fold)
        except errors as err:
            rejected.append((tensor, f"normalization not folded: {err}"))
            continue
        spec = None
        try:
            rewritten, spec = _moments_from_producer(graph, gemms, {n: m for n, (m, _) in
                                                                   trial.items()})
            trial = {n: (rewritten[n], f) for n, (_, f) in trial.items()}
            how = f"statistics from {spec[0]}'s moments"
        except (ValueError, *errors) as err:
            how = f"statistics recomputed by each reader ({err})"
        if weights is not None and any(m.prologue is not None for m, _ in trial.values()):
            try:
                trial = {n: (_through_weights(graph, m, weights), f)
                         for n, (m, f) in trial.items()}
            except (NotAffineError, *errors) as err:
                rejected.append((tensor, f"normalization not folded through the weights: {err}"))
                continue
            how += "; A read as it is, the normalization through the weights"
        if spec is not None:
            pending.setdefault(spec[0], []).extend(spec[1])
        for name, (match, fold) in trial.items():
            gemms[name], folds[name] = match, fold
        logger.info("recognize: %s folded into %s; %s", tensor, ", ".join(names), how)
    for name, specs in pending.items():
        _add_moments(graph, gemms[name], specs)
    return [gemms.get(m.covered[0], m) if m.family == "gemm" else m for m in matches]


def _through_weights(graph, match: Match, weights) -> Match:
    return match if match.prologue is None else fold_through_weights(graph, match, weights)[0]


#: the narrowest and the widest column chunks a producer sums a row moment over
MOMENT_CHUNKS = (16, 128)


#: output tiles of 64 rows and one chunk of columns a producer keeps at least (two waves of
#: an H100's 132 SMs), so the chunk does not take the narrow tiles few rows need away
MOMENT_PROGRAMS = 256


def moment_chunk(rows: int, width: int) -> int:
    """Columns per piece of a row moment its producer writes: the widest power of two of
    :data:`MOMENT_CHUNKS` leaving :data:`MOMENT_PROGRAMS` tiles of 64 rows and one chunk.

    The producer's column tiles must be whole chunks; every output tile of a reader loads its
    rows' ``width / chunk`` pieces of each moment. At 4096 rows of 768: 6 pieces a row (with
    16-column chunks 48, and a LayerNorm's two moments as many bytes as a quarter of the
    reader's row of ``A``); at 128 rows: 48 (the producer's best tiles there are 16 or 32
    columns wide)."""
    chunk, widest = MOMENT_CHUNKS
    while chunk < widest and -(-rows // 64) * -(-width // (2 * chunk)) >= MOMENT_PROGRAMS:
        chunk *= 2
    return chunk


def _moments_from_producer(graph, gemms, readers: dict) -> tuple[dict, tuple]:
    """Readers of a folded normalization that read its statistics as moments summed by the
    GEMM writing the normalized row (the first phase of the two-phase reduction), instead of
    re-reading the row: ``(readers rewritten, (producer, [(moment tensor, monomial, x,
    chunk)]))`` (:func:`moment_chunk` columns a piece).
    Raises when a statistic is no polynomial in the row (a softmax's max), or the row is not
    written by one GEMM kernel as rows of a 2-D layout."""
    expanded = {}
    for name, m in readers.items():
        pro = expand_statistics(m.prologue) if m.prologue is not None else None
        outs = [[expand_statistics(o.elem) for o in seg.outputs] for seg in m.segments]
        expanded[name] = (pro, outs)
    elems = [e for pro, outs in expanded.values() for e in [pro, *(x for s in outs for x in s)]]
    moments = {r.key(): r for r in reductions(*elems)}
    if not moments:
        raise ValueError("no statistics")
    rows = set()
    for r in moments.values():
        if r.dtype != "float32":
            raise ValueError(f"a statistic accumulates in {r.dtype}")
        for leaf in leaves(r.body):
            if str(leaf.index[-1]) != r.var.name or any(
                r.var.name in vars_of((i,)) for i in leaf.index[:-1]
            ):
                raise ValueError("a statistic reads its row along another axis than the last")
            rows.add(leaf.tensor)
    if len(rows) != 1:
        raise ValueError(f"statistics of {len(rows)} tensors")
    x = rows.pop()
    producer = next((n for n, m in gemms.items() if x in {o.tensor for o in m.all_outputs}), None)
    if producer is None:
        raise ValueError(f"{x} is not written by a GEMM kernel")
    p = gemms[producer]
    shape = graph.tensors[x].shape
    width, count = shape[-1], math.prod(shape[:-1])
    if len(p.segments) != 1 or set(p.frame.extents) - {"m", "n", "k"}:
        raise ValueError(f"{producer} has bands or a batch axis")
    (oi,) = [i for i, o in enumerate(p.segments[0].outputs) if o.tensor == x]
    view = p.views[f"out0.{oi}"]
    if (view.offset, dict(view.strides).get("m"), dict(view.strides).get("n")) != (0, width, 1) \
            or p.frame.extents["n"] != width:
        raise ValueError(f"{producer} does not write {x} as rows")
    chunk = moment_chunk(count, width)
    chunks = -(-width // chunk)
    tensors, specs = {}, []
    for key, r in moments.items():
        # named by what it sums: two normalizations of one row share its moments
        digest = hashlib.sha1(repr(r.key()).encode()).hexdigest()[:8]
        tensors[key] = name = f"{x}.moment_{digest}"
        specs.append((name, r.body, x, chunk))
    rewritten = {}
    for name, m in readers.items():
        new = dataclasses.replace(m, segments=[
            Segment(s.n, s.products, list(s.outputs), s.covered) for s in m.segments
        ])
        frame = new.frame
        j = new_var(f"j{len(frame.reductions)}")
        frame.reduction(j, chunks)

        def fn(e, frame=frame, j=j):
            if not isinstance(e, Reduce):
                return None
            leaf = leaves(e.body)[0]
            row = sum((as_int64(i) * math.prod(shape[d + 1:-1]) for d, i in
                       enumerate(leaf.index[:-1])), tirx.const(0, "int64"))
            read = Leaf(tensors[e.key()], (frame.simplify(row), j), "float32")
            return Reduce("sum", read, j, chunks, 0.0, "float32")

        pro, outs = expanded[name]
        new.prologue = replace(pro, fn) if pro is not None else None
        for seg, elems in zip(new.segments, outs):
            seg.outputs = [dataclasses.replace(o, elem=replace(e, fn))
                           for o, e in zip(seg.outputs, elems)]
        rewritten[name] = new
    for name in tensors.values():
        graph.tensors[name] = TensorInfo(name, (count, chunks), "float32", "global")
    for m in rewritten.values():
        m.views = views(graph, m)
    return rewritten, (producer, specs)


def _add_moments(graph, p: Match, specs) -> None:
    """The producer's outputs of row moments: each monomial of the written row, summed over
    chunks of columns (:func:`moment_chunk`)."""
    seg = p.segments[0]
    written = {o.tensor for o in seg.outputs}
    for tensor, mono, x, chunk in specs:
        if tensor in written:  # another normalization of the same row reads it too
            continue
        written.add(tensor)
        out = next(o for o in seg.outputs if o.tensor == x)
        elem = replace(mono, lambda e, out=out: out.elem if isinstance(e, Leaf) and
                       e.tensor == out.tensor else None)
        access = Access(tensor, (p.frame.vars["m"], p.frame.vars["n"]))
        seg.outputs.append(Output(tensor, access, elem, out.accumulators, chunk))
        info = graph.tensors[tensor]
        p.views[f"out0.{len(seg.outputs) - 1}"] = Strided(
            tensor, info.shape, "float32", 0, (("m", info.shape[1]),))


def _other_readers(graph, tensor, calls) -> str | None:
    """A reader of ``tensor`` outside ``calls``, seen through data movement (views read by
    those calls), or None."""
    stack = [tensor]
    while stack:
        t = stack.pop()
        if t != tensor and t in graph.pinned:
            return "the function's result"
        for node in graph.consumers(t):
            if node.call in calls:
                continue
            if data_movement(node) or (elementwise(node) and float_cast(node)):
                stack.append(node.output)
                continue
            return node.call
    return None


# -- horizontal grouping ---------------------------------------------------------------------------
def group_horizontal(graph, matches: list[Match], rejected) -> list[Match]:
    """GEMMs reading the same ``A`` at the same shape, none depending on another, become one
    kernel with a band of columns each (SOUFFLE's horizontal transformation); the bands of a
    kernel compute as many products each (:func:`_by_products`)."""
    groups: dict = {}
    order = []
    for m in matches:
        # a kernel writing a row's moments keeps its one band (its pieces index the row)
        if m.family != "gemm" or len(m.segments) != 1 or any(o.chunk for o in m.all_outputs):
            order.append(m)
            continue
        key = (
            m.accesses["a"].key(),
            m.prologue.key() if m.prologue is not None else None,
            tuple((a, e) for a, e in m.frame.extents.items() if not a.startswith("n")),
            m.dtype,
            m.acc_dtype,
            tuple(a for a in m.frame.extents if a.startswith("n")),
        )
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(m)
    out = []
    for item in order:
        if isinstance(item, Match):
            out.append(item)
            continue
        for group in (g for same in _by_products(groups[item])
                      for g in _independent(graph, same, rejected)):
            if len(group) == 1:
                out.append(group[0])
                continue
            merged = _merge(group)
            try:
                finalize(graph, merged)
            except NotRecognizedError as err:
                rejected.append((merged.covered[0], f"not grouped: {err}"))
                out.extend(group)
                continue
            out.append(merged)
    return out


def _by_products(members: list[Match]) -> list[list[Match]]:
    """Split GEMMs reading one ``A`` by how many products their band computes, in order of
    first appearance: a kernel's bands share one product loop, so Q/K/V (one product a band)
    and gate × up (two) beside them become two kernels, each still reading ``A``."""
    split: dict[int, list[Match]] = {}
    for m in members:
        split.setdefault(len(m.segments[0].products), []).append(m)
    if len(split) > 1:
        kernels = [", ".join(" × ".join(m.segments[0].accumulators) for m in same)
                   for same in split.values()]
        logger.info("recognize: GEMMs reading %s grouped apart, one kernel per number of "
                    "products a band (a kernel's bands share one product loop): %s",
                    members[0].accesses["a"].tensor, "; ".join(kernels))
    return list(split.values())


def _independent(graph, members, rejected) -> list[list[Match]]:
    """Split ``members`` into groups with no data dependence between any two."""
    groups: list[list[Match]] = []
    for m in members:
        for g in groups:
            if not any(_depends(graph, m, o) or _depends(graph, o, m) for o in g):
                g.append(m)
                break
        else:
            groups.append([m])
    return groups


def _depends(graph, a: Match, b: Match) -> bool:
    """Whether ``b`` reads (transitively) something ``a`` writes."""
    return any(graph.reaches(x, y) for x in a.covered for y in b.covered)


def _merge(group: list[Match]) -> Match:
    first = group[0]
    segments, covered = [], []
    frame = first.frame
    for i, m in enumerate(group):
        # the members' frames name their axes alike: re-express each segment over the first's,
        # with a column axis of its own (``n@i``: the segments' widths differ)
        vmap = {m.frame.vars[a]: frame.vars[a] for a in m.frame.vars if a != "n"}
        if i:
            vmap[m.frame.vars["n"]] = frame.axis(f"n@{i}", m.frame.extents["n"])
        seg = m.segments[0]
        for var, extent in m.frame.reductions.values():
            frame.reduction(var, extent)
        products = [(p, rebase(acc, vmap, first.frame)) for p, acc in seg.products]
        outputs = [reoutput(o, vmap, first.frame) for o in seg.outputs]
        segments.append(Segment(seg.n, products, outputs, seg.covered))
        covered.extend(m.covered)
    return Match(
        "gemm",
        first.frame,
        dict(first.accesses),
        first.dtype,
        covered,
        segments=segments,
        acc_dtype=first.acc_dtype,
        prologue=first.prologue,
        derived=tuple(d for m in group for d in m.derived),
    )
