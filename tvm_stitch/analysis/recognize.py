"""Recognition of MCFuser's kernel families on the tensor dependency graph.

Everything here reads what blocks compute — multiply-accumulate contractions, access maps, element
expressions composed through producers (:mod:`.elem`) — never op names, so the nn BERT, an
imported Hugging Face model and a hand-written attention give the same matches.

Families (one vocabulary, from recognition to template to tuning key):

``gemm``
    A contraction ``C[.., m, n] = Σ_k A[.., m, k] · B[.., k, n]`` with its epilogue: the chain of
    elementwise ops after it that nothing else reads (bias, GELU however written, SiLU, residual,
    casts, scaling), written in place through any reshape/transpose at its end.  Contractions that
    share ``A`` become one kernel: side by side in ``n`` when independent (Q, K, V — SOUFFLE's
    horizontal transformation), or computed together when one's epilogue reads the other's result
    at the same position (SwiGLU's gate × up); side by side only with as many products a band
    (Q, K, V beside gate × up: two kernels).
``attention``
    Two contractions with a row softmax between: ``O = softmax(g(Q·Kᵀ)) · V`` where ``g`` is any
    elementwise function of the score and of tensors indexed by (batch, head, query, key) — a
    scale, an additive or boolean mask, a causal mask folded to a constant or computed from
    indices.  K and V may be shared by several query heads.
``chain``
    Two contractions where the second reads the first's result through casts only.

Each match lists the graph nodes it replaces and every tensor it reads or writes as an access
``(tensor, index)`` over the kernel's coordinates; :func:`~.match.finalize` turns those into
strided views (offset, strides) once the coordinates are collapsed.  A candidate that does not
qualify is rejected with its reason (``rejected``); nothing is ever guessed.

This module drives recognition (:func:`recognize`) and tells attention from chains; each
family's recognizer is ``tvm_stitch/families/<family>/recognize.py``, and what they share is in
:mod:`.match` (the data, views) and :mod:`.regions` (policies, operands, epilogues).
"""

from __future__ import annotations

import logging

from tvm import ir, tirx

from tvm_stitch.families import FAMILIES
from tvm_stitch.families.attention.recognize import (
    attention,
    finalize_attention,
    match_softmax,
    safe_softmax,
)
from tvm_stitch.families.chain.recognize import chain
from tvm_stitch.families.gemm.recognize import fold_norms as fold_norms_into_gemms
from tvm_stitch.families.gemm.recognize import gemm, group_horizontal
from tvm_stitch.graph import OpKind, TensorDependencyGraph

from .elem import Composer, CompositionError, leaves
from .indexing import UnsupportedExprError, dtype_of, substitute
from .match import (
    Contraction,
    Frame,
    Match,
    NotRecognizedError,
    Recognition,
    contraction,
    finalize,
)
from .regions import epilogue_regions, region_policy

logger = logging.getLogger("tvm_stitch.recognize")



# -- entry point -----------------------------------------------------------------------------------
def recognize(graph: TensorDependencyGraph, families=FAMILIES, fold_norms=False,
              weights=None) -> Recognition:
    """Every kernel of ``families`` in ``graph``, each contraction in at most one match.

    Attention and chains are recognized first (they contain two contractions), then the remaining
    contractions as GEMMs; with ``fold_norms``, normalizations whose every reader is a GEMM are
    folded into those GEMMs (:func:`~.regions.norm_region`); GEMMs sharing their ``A`` operand
    are then grouped (horizontal fusion).  With ``weights`` (the graph tensors that are weights), a
    normalization a GEMM reads as ``A`` is folded through that GEMM's weights
    (:mod:`.through_weights`) or not at all.
    """
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown kernel families {sorted(unknown)}; known: {FAMILIES}")
    rejected: list[tuple[str, str]] = []
    products = [n for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE]
    contractions = {}
    for node in products:
        try:
            contractions[node.name] = contraction(node)
        except NotRecognizedError as err:
            rejected.append((node.name, str(err)))
    matches: list[Match] = []
    taken: set[str] = set()
    written: set[str] = set()  # tensors the accepted kernels write: later operands read them
    read: set[str] = set()  # tensors the accepted kernels read: later epilogues end there
    errors = (NotRecognizedError, CompositionError, UnsupportedExprError)
    for name, c in contractions.items():
        if "attention" not in families and "chain" not in families:
            break
        try:
            match = _two_products(graph, c, contractions, families, frozenset(written))
        except errors as err:
            rejected.append((name, str(err)))
            continue
        if match is None or taken & set(match.covered):
            continue
        taken.update(match.covered)
        written.update(o.tensor for o in match.all_outputs)
        read.update(v.tensor for r, v in match.views.items() if not str(r).startswith("out"))
        matches.append(match)
    if "gemm" in families:
        # a product computed as another's partner (gate × up) is not a kernel of its own: the
        # first in program order keeps both
        for name, c in contractions.items():
            if name in taken:
                continue
            try:
                match = gemm(graph, c, frozenset(written), frozenset(read))
            except errors as err:
                rejected.append((name, f"GEMM: {err}"))
                continue
            if taken & set(match.covered):
                rejected.append((name, "computed inside another GEMM kernel"))
                continue
            taken.update(match.covered)
            written.update(o.tensor for o in match.all_outputs)
            read.update(v.tensor for r, v in match.views.items() if not str(r).startswith("out"))
            matches.append(match)
        if fold_norms:
            matches = fold_norms_into_gemms(graph, contractions, matches, frozenset(written),
                                            frozenset(read), rejected, weights)
        matches = group_horizontal(graph, matches, rejected)
    for name, why in rejected:
        logger.info("recognize: %s not fused: %s", name, why)
    return Recognition(matches, rejected)


# -- attention and chains --------------------------------------------------------------------------
def _two_products(graph, c2: Contraction, contractions, families, stop) -> Match | None:
    """Attention or a GEMM chain ending in ``c2``, or None when ``c2``'s A is not computed by
    another product."""
    frame = Frame()
    dims = {}
    vmap = {}
    batch_names = _batch_names(len(c2.batch))
    for name, iv in zip(batch_names, c2.batch):
        vmap[iv.var] = frame.axis(name, int(iv.dom.extent))
        dims[name] = int(iv.dom.extent)
    if len(c2.m) != 1 or len(c2.n) != 1:
        return None  # several row or column axes: a GEMM, not the end of a chain
    vmap[c2.m[0].var] = frame.axis("m", int(c2.m[0].dom.extent))
    vmap[c2.k.var] = frame.axis("n", int(c2.k.dom.extent))
    vmap[c2.n[0].var] = frame.axis("d", int(c2.n[0].dom.extent))
    for iv in c2.node.block.iter_vars:
        if iv.var not in vmap:
            vmap[iv.var] = tirx.const(0, dtype_of(iv.var))
    composer = Composer(graph, frame.analyzer)
    a_index = tuple(frame.simplify(substitute(i, vmap)) for i in c2.a[1])
    inside = _between_products(graph, c2, contractions)
    region = composer.element(c2.a[0], a_index, region_policy(graph, stop, inside))
    firsts = {
        leaf.tensor
        for leaf in leaves(region)
        if graph.tensors[leaf.tensor].producer in contractions
    }
    if not firsts:
        return None
    if len(firsts) != 1:
        raise NotRecognizedError(f"A is computed from {len(firsts)} products")
    c1 = contractions[graph.tensors[firsts.pop()].producer]
    if c1 is c2:
        return None
    score = match_softmax(region, frame.vars["n"], graph)
    family = "attention" if score is not None else "chain"
    if family not in families:
        return None
    build = attention if score is not None else chain
    last = None
    for region in epilogue_regions(graph, c2.out, stop):
        try:
            sub = _copy_frame(frame)
            composer = Composer(graph, sub.analyzer)
            vmap_t = {
                k: (sub.vars[_name_of(frame, v)] if _name_of(frame, v) else v)
                for k, v in vmap.items()
            }
            region_t = composer.element(
                c2.a[0],
                tuple(sub.simplify(substitute(i, vmap_t)) for i in c2.a[1]),
                region_policy(graph, stop, inside),
            )
            inner = (match_softmax(region_t, sub.vars["n"], graph) if score is not None
                     else region_t)
            match = build(graph, sub, composer, c1, c2, inner, vmap_t, region, stop)
            match.zero_empty_rows = safe_softmax(region_t, sub.vars["n"], graph) is not None
            if match.family == "attention":
                finalize_attention(graph, match)
            else:
                finalize(graph, match)
            return match
        except (NotRecognizedError, CompositionError, UnsupportedExprError) as err:
            last = err
    raise NotRecognizedError(str(last))


def _between_products(graph, c2, contractions) -> frozenset:
    """The tensors computed on the way to ``c2``'s ``A`` from earlier products (or inputs) that
    nothing but that way reads: walking back from ``A`` through producers that are not
    products, the tensors whose every reader is ``c2`` or writes such a tensor.  PyTorch's safe
    softmax reads the logits twice — for the softmax and for its test of rows every key of
    which is masked — from kernels of their own; a mask every layer reads is not inside."""
    tensors, stack = set(), [c2.a[0]]
    while stack:
        t = stack.pop()
        node = graph.nodes.get(graph.tensors[t].producer or "")
        if t in tensors or node is None or node.name in contractions or node.block is None:
            continue
        tensors.add(t)
        stack.extend(m.tensor for m in node.inputs)
    inside, grown = set(), True
    while grown:
        grown = False
        for t in tensors - inside:
            if t not in graph.pinned and all(
                n.name == c2.node.name or n.output in inside for n in graph.consumers(t)
            ):
                inside.add(t)
                grown = True
    return frozenset(inside)


def _copy_frame(frame: Frame) -> Frame:
    """A frame with fresh variables named and bounded as ``frame``'s."""
    sub = Frame()
    for name, extent in frame.extents.items():
        sub.axis(name, extent)
    return sub


def _name_of(frame: Frame, var) -> str | None:
    for name, v in frame.vars.items():
        if isinstance(var, ir.expr.Var) and v.same_as(var):
            return name
    return None


def _batch_names(count: int) -> list[str]:
    return {0: [], 1: ["h"], 2: ["b0", "h"]}.get(count, [f"b{i}" for i in range(count - 1)] + ["h"])
