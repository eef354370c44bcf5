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

from tvm_stitch.families import FAMILIES, REGISTRY, runtime_extents
from tvm_stitch.families import check as check_families
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
)
from .regions import epilogue_regions, region_policy

logger = logging.getLogger("tvm_stitch.recognize")



# -- entry point -----------------------------------------------------------------------------------
def recognize(graph: TensorDependencyGraph, families=FAMILIES, fold_norms=False,
              weights=None, runtime=False) -> Recognition:
    """Every kernel of ``families`` in ``graph``, each contraction in at most one match.

    Families of two products (attention, chains) are recognized first, each contraction asking
    the registry's two-product families in order which claims it; then the remaining
    contractions by the one-product families (GEMMs), each family regrouping its matches after
    (the GEMMs: with ``fold_norms``, normalizations whose every reader is a GEMM are folded into
    those GEMMs, :func:`~.regions.norm_region`; GEMMs sharing their ``A`` operand are grouped,
    SOUFFLE's horizontal fusion).  With ``weights`` (the graph tensors that are weights), a
    normalization a GEMM reads as ``A`` is folded through that GEMM's weights
    (:mod:`.through_weights`) or not at all.  The families' contract is in
    :mod:`tvm_stitch.families`.

    Nodes of symbolic shape (read at the graph's point) are matched only with ``runtime``,
    and only by families whose kernels take extents at run time (``RUNTIME_EXTENTS``,
    :mod:`tvm_stitch.codegen.runtime`): a kernel printed with the point's sizes would be wrong
    at any other shape.
    """
    families = check_families(families)
    rejected: list[tuple[str, str]] = []
    products = [n for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE]
    if not runtime:
        rejected += [(n.name, _SYMBOLIC) for n in products if n.symbolic]
        products = [n for n in products if not n.symbolic]
    contractions = {}
    for node in products:
        try:
            contractions[node.name] = contraction(node)
        except NotRecognizedError as err:
            rejected.append((node.name, str(err)))
    found = _Found()
    errors = (NotRecognizedError, CompositionError, UnsupportedExprError)
    pairs = [f.name for f in REGISTRY.values() if _recognizer(f.name).PRODUCTS == 2]
    for name, c in contractions.items():
        if not set(pairs) & set(families):
            break
        try:
            match = _two_products(graph, c, contractions, pairs, families,
                                  frozenset(found.written))
        except errors as err:
            rejected.append((name, str(err)))
            continue
        if match is not None and not found.taken & set(match.covered):
            found.add(match)
    for family in (f for f in REGISTRY if f in families):
        rec = _recognizer(family)
        if rec.PRODUCTS != 1:
            continue
        build = getattr(rec, family)
        # a product computed as another's partner (gate × up) is not a kernel of its own: the
        # first in program order keeps both
        for name, c in contractions.items():
            if name in found.taken:
                continue
            try:
                match = build(graph, c, frozenset(found.written), frozenset(found.read))
            except errors as err:
                rejected.append((name, f"{family}: {err}"))
                continue
            if found.taken & set(match.covered):
                rejected.append((name, f"computed inside another {family} kernel"))
                continue
            found.add(match)
        if hasattr(rec, "regroup"):
            regrouped = rec.regroup(graph, contractions, found.matches, frozenset(found.written),
                                    frozenset(found.read), rejected, weights, fold_norms)
            found = _Found()
            for match in regrouped:
                found.add(match)
    matches = []
    for match in found.matches:  # an epilogue of symbolic shape: the same
        symbolic = [n for n in match.covered if n in graph.nodes and graph.nodes[n].symbolic]
        if symbolic and not (runtime and runtime_extents(match.family)):
            rejected.append((symbolic[0], _SYMBOLIC))
        else:
            matches.append(match)
    for name, why in rejected:
        logger.info("recognize: %s not fused: %s", name, why)
    return Recognition(matches, rejected)


_SYMBOLIC = "symbolic extents: the family's kernels take none at run time, left to TVM"



def _recognizer(family: str):
    return REGISTRY[family].module("recognize")


class _Found:
    """The accepted kernels, the contractions they cover, the tensors they write (later
    operands read them) and read (later epilogues end there)."""

    def __init__(self):
        self.matches: list[Match] = []
        self.taken: set[str] = set()
        self.written: set[str] = set()
        self.read: set[str] = set()

    def add(self, match: Match) -> None:
        self.taken.update(match.covered)
        self.written.update(o.tensor for o in match.all_outputs)
        self.read.update(v.tensor for r, v in match.views.items()
                         if not str(r).startswith("out"))
        self.matches.append(match)


# -- attention and chains --------------------------------------------------------------------------
def _two_products(graph, c2: Contraction, contractions, pairs, families, stop) -> Match | None:
    """A kernel of two products ending in ``c2`` (of the first of the two-product families
    ``pairs`` that claims it), or None when ``c2``'s A is not computed by another product or
    the family claiming it is not among ``families``."""
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
    family = next((f for f in pairs
                   if _recognizer(f).claim(region, frame.vars["n"], graph) is not None), None)
    if family not in families:
        return None
    rec = _recognizer(family)
    build = getattr(rec, family)
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
            inner = rec.claim(region_t, sub.vars["n"], graph)
            match = build(graph, sub, composer, c1, c2, inner, vmap_t, region, stop)
            if hasattr(rec, "zero_empty_rows"):
                match.zero_empty_rows = rec.zero_empty_rows(region_t, sub.vars["n"], graph)
            rec.finalize(graph, match)
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
