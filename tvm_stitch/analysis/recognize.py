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
``(tensor, index)`` over the kernel's coordinates; :func:`finalize` turns those into strided views
(offset, strides) once the coordinates are collapsed.  A candidate that does not qualify is
rejected with its reason (``rejected``); nothing is ever guessed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math

import tvm
from tvm import ir, sym, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.graph import Node, OpKind, TensorDependencyGraph, TensorInfo
from tvm_stitch.graph.access import vars_in
from tvm_stitch.graph.tdg import dtype_bytes

from .elem import (
    Composer,
    CompositionError,
    Const,
    Elem,
    Leaf,
    Op,
    Policy,
    Reduce,
    data_movement,
    elementwise,
    format_elem,
    leaves,
    outer_leaves,
    reductions,
    replace,
    walk,
)
from .indexing import (
    HALF,
    Strided,
    UnsupportedExprError,
    as_int64,
    bind,
    dtype_of,
    new_var,
    strided,
    substitute,
)
from .moments import expand_statistics
from .through_weights import NotAffineError, fold_through_weights

logger = logging.getLogger("tvm_stitch.recognize")

FAMILIES = ("attention", "chain", "gemm")
_FLOATS = ("float16", "bfloat16", "float32")


class NotRecognizedError(ValueError):
    """A candidate that is not one of the families (the message says why)."""


# -- coordinates -----------------------------------------------------------------------------------
class Frame:
    """The coordinate variables of one kernel (named axes with extents) and an analyzer."""

    def __init__(self):
        self.vars: dict[str, object] = {}
        self.extents: dict[str, int] = {}
        self.reductions: dict[str, tuple] = {}  # name -> (Var, extent) of row statistics
        self.analyzer = sym.Analyzer()

    def axis(self, name: str, extent: int):
        var = new_var(name)
        bind(self.analyzer, var, extent)
        self.vars[name], self.extents[name] = var, int(extent)
        return var

    def simplify(self, expr):
        return self.analyzer.simplify(expr)

    def adopt(self, elem) -> None:
        """Know the reduction variables of ``elem`` (a row statistic's leaves are indexed by
        them); bound here too, since a merged kernel's frame did not create them."""
        for e in walk(elem):
            if isinstance(e, Reduce):
                self.reduction(e.var, e.extent)

    def reduction(self, var, extent: int) -> None:
        if var.name not in self.reductions:
            self.reductions[var.name] = (var, extent)
            bind(self.analyzer, var, extent)

    def same(self, a, b) -> bool:
        """Whether two indices are equal at every coordinate."""
        diffs = [self.simplify(as_int64(x) - as_int64(y)) for x, y in zip(a, b)]
        return len(a) == len(b) and all(
            isinstance(d, P.IntImm) and int(d.value) == 0 for d in diffs
        )


@dataclasses.dataclass(frozen=True)
class Access:
    """``tensor[index]`` with the index over a frame's coordinates."""

    tensor: str
    index: tuple

    def key(self):
        return (self.tensor, tuple(str(i) for i in self.index))


# -- contractions ----------------------------------------------------------------------------------
@dataclasses.dataclass
class Contraction:
    """A multiply-accumulate block ``out[s] += cast(A[ia]) · cast(B[ib])`` over one axis.

    ``batch``/``m``/``n`` are the block's spatial variables (in output order) indexing both
    operands / only ``A`` / only ``B``; variables of extent 1 indexing neither are dropped.
    """

    node: Node
    a: tuple  # (tensor, index over the block's variables)
    b: tuple
    batch: list
    m: list
    n: list
    k: object  # the reduction IterVar
    acc_dtype: str
    operand_dtype: str  # what the operands are cast to before multiplying

    @property
    def out(self) -> str:
        return self.node.output


def contraction(node: Node) -> Contraction:
    """The :class:`Contraction` of a compute-intensive node, or :class:`NotRecognizedError`."""
    block = node.block
    if block is None or node.kind is not OpKind.COMPUTE_INTENSIVE:
        raise NotRecognizedError(f"{node.name} is not a contraction")
    store = block.body
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reduce) != 1:
        raise NotRecognizedError(f"{node.name} reduces over {len(reduce)} axes")
    if len(store.indices) != len(spatial) or not all(
        i.same_as(iv.var) for i, iv in zip(store.indices, spatial)
    ):
        raise NotRecognizedError(f"{node.name} does not write its own coordinates")
    value = store.value
    if not isinstance(value, P.Add):
        raise NotRecognizedError(f"{node.name} is not a multiply-accumulate")
    acc, prod = value.a, value.b
    if not (isinstance(acc, ir.expr.TensorLoad) and acc.source.same_as(store.buffer)):
        acc, prod = prod, acc
    if not (isinstance(acc, ir.expr.TensorLoad) and acc.source.same_as(store.buffer)):
        raise NotRecognizedError(f"{node.name} does not accumulate into its output")
    if not isinstance(prod, P.Mul):
        raise NotRecognizedError(f"{node.name} accumulates something else than a product")
    loads, casts = [], set()
    for operand in (prod.a, prod.b):
        side = operand
        if isinstance(side, P.Cast):
            casts.add(dtype_of(side))
            side = side.value
        if not isinstance(side, ir.expr.TensorLoad):
            raise NotRecognizedError(f"{node.name} multiplies computed values, not loads")
        tensor = node.tensor_of.get(side.source)
        if tensor is None:
            raise NotRecognizedError(f"{node.name} reads an unknown buffer")
        loads.append((tensor, tuple(side.indices), dtype_of(side)))
    if len(casts) > 1 or len({d for _, _, d in loads}) != 1:
        raise NotRecognizedError(f"{node.name} multiplies mixed dtypes")
    uses = [_vars_of(index) for _, index, _ in loads]
    k = reduce[0]
    if not all(k.var.name in u for u in uses):
        raise NotRecognizedError(f"{node.name}: the reduction does not index both operands")
    batch, only = [], [[], []]
    for iv in spatial:
        inside = [iv.var.name in u for u in uses]
        if all(inside):
            batch.append(iv)
        elif inside[0]:
            only[0].append(iv)
        elif inside[1]:
            only[1].append(iv)
        elif int(iv.dom.extent) != 1:
            raise NotRecognizedError(f"{node.name}: output axis {iv.var.name} indexes no operand")
    if not only[0] or not only[1]:
        raise NotRecognizedError(f"{node.name} is not a matrix product (no row or column axis)")
    first = next(iv for iv in spatial if iv in only[0] or iv in only[1])
    ia, ib = (0, 1) if first in only[0] else (1, 0)
    return Contraction(
        node=node,
        a=loads[ia][:2],
        b=loads[ib][:2],
        batch=batch,
        m=only[ia],
        n=only[ib],
        k=k,
        acc_dtype=str(store.buffer.dtype),
        operand_dtype=casts.pop() if casts else loads[0][2],
    )


def _vars_of(index) -> set[str]:
    """Names of the variables an index uses."""
    return {v.name for i in index for v in vars_in(i)}


# -- matches ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class Output:
    """A tensor the kernel writes: ``tensor`` (a graph tensor, one Relax binding) at ``access``,
    holding ``elem`` over the frame, in which leaves of the ``accumulators`` tensors stand for
    the kernel's accumulators (the products' results) at the current position.  With
    ``chunk``, the tensor holds the sums of ``elem`` over each ``chunk`` columns of a row (a
    row's moments in pieces, for the readers of a folded normalization)."""

    tensor: str
    access: Access
    elem: Elem
    accumulators: tuple = ()
    chunk: int = 0


@dataclasses.dataclass
class Segment:
    """A band of ``n`` columns of a GEMM kernel: the products computed together in it (sharing
    ``A``) and the outputs written from their accumulators."""

    n: int
    products: list  # [(contraction node name, Access of B over (batch, k, n))]
    outputs: list[Output]
    covered: list[str]

    @property
    def accumulators(self) -> list[str]:
        """Graph tensors standing for the accumulators (the products' outputs), in order."""
        return [name for name, _ in self.products]


@dataclasses.dataclass
class Match:
    """A recognized kernel (see the module docstring for the families).

    Attributes
    ----------
    family : str
    frame : Frame
        Kernel coordinates: ``b`` (batch), ``m``, ``n``, ``k`` for ``gemm``; ``b``, ``h``,
        ``m``, ``n``, ``k``, ``d`` for ``attention`` and ``chain``.
    accesses : dict
        Role -> :class:`Access` of each operand read in place (``a``; ``q``/``k``/``v``; ...).
    segments : list of Segment
        ``gemm`` only.
    score : Elem or None
        ``attention``: the logits ``g(s)`` over (b, h, m, n); the leaf of ``score_tensor`` is
        the product ``Q·Kᵀ``.
    outputs : list of Output
        ``attention``/``chain``: the written tensors (one).
    covered : list of str
        Graph nodes the kernel replaces.
    group : int
        ``attention``: query heads per K/V head.
    causal : int or None
        ``attention``: the logits are masked exactly where ``key > query + causal`` (found on a
        mask folded to a constant), so key blocks past the diagonal can be skipped.
    prologue : Elem or None
        ``gemm``: ``A``'s element over (b, m, k) when the kernel computes ``A`` instead of
        reading it — a normalization folded into its consumer (SOUFFLE's schedule propagation):
        row statistics (reductions over the row, free of ``k``) and elementwise ops on the
        tensors it reads.  ``accesses["a"]`` is then its main read.
    derived : tuple of DerivedWeight
        ``gemm``: tensors computed from weights that the kernel reads (a normalization folded
        through its weights, :mod:`.through_weights`); the pass binds them before the kernel.
    zero_empty_rows : bool
        ``attention``: a row whose logits are all ``-inf`` (every key masked) gives zeros, not
        NaN (PyTorch's safe softmax, which ``scaled_dot_product_attention`` computes).
    """

    family: str
    frame: Frame
    accesses: dict
    dtype: str
    covered: list
    segments: list = dataclasses.field(default_factory=list)
    outputs: list = dataclasses.field(default_factory=list)
    score: Elem | None = None
    score_tensor: str | None = None
    acc_dtype: str = "float32"
    group: int = 1
    causal: int | None = None
    views: dict = dataclasses.field(default_factory=dict)
    extras: dict = dataclasses.field(default_factory=dict)  # leaf key -> Strided
    prologue: Elem | None = None
    derived: tuple = ()
    zero_empty_rows: bool = False

    @property
    def statistics(self) -> list[Reduce]:
        """The row statistics the kernel computes (prologue and outputs), inner ones first."""
        return reductions(self.prologue, *(o.elem for o in self.all_outputs))

    @property
    def all_outputs(self) -> list[Output]:
        return [o for s in self.segments for o in s.outputs] + list(self.outputs)

    @property
    def shape(self) -> dict:
        return dict(self.frame.extents)

    def describe(self, outputs: bool = False) -> str:
        """What the kernel computes, e.g. ``gemm 128x(128+128+128)x128 float16, 3 bands`` or
        ``attention 1x12x128x128 d64 float16, causal``; ``outputs`` adds the tensors written."""
        ext = self.frame.extents
        batch = f"{ext['b']}x" if ext.get("b", 1) > 1 else ""
        if self.family == "gemm":
            widths = [str(seg.n) for seg in self.segments]
            n = widths[0] if len(widths) == 1 else f"({'+'.join(widths)})"
            text = f"gemm {batch}{ext['m']}x{n}x{ext['k']} {self.dtype}"
            if len(self.segments) > 1:
                text += f", {len(self.segments)} bands"
            if max(len(s.products) for s in self.segments) > 1:
                text += ", 2 products"
            if self.prologue is not None:
                text += ", normalized A"
        else:
            heads = f"{ext.get('b', 1)}x{ext.get('h', 1)}x"
            dims = f"{heads}{ext['m']}x{ext['n']} d{ext['k']}"
            if ext["d"] != ext["k"]:
                dims += f"/{ext['d']}"
            text = f"{self.family} {dims} {self.dtype}"
            if self.group > 1:
                text += f", {self.group} heads per K/V head"
            if self.causal is not None:
                text += ", causal" + (f"{self.causal:+d}" if self.causal else "")
        if outputs:
            text += " -> " + ", ".join(o.tensor for o in self.all_outputs)
        return text


@dataclasses.dataclass
class Recognition:
    """What :func:`recognize` found: matches, and candidates rejected with reasons."""

    matches: list[Match]
    rejected: list[tuple[str, str]]


# -- policies --------------------------------------------------------------------------------------
def _materialized(graph: TensorDependencyGraph, tensor: str) -> bool:
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
        return data_movement(node) or (casts and elementwise(node) and _float_cast(node)
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
    call: unlike :func:`_materialized`, which counts calls through data movement)."""
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
        return data_movement(node) or (elementwise(node) and not _materialized(graph, node.output))

    return Policy(inline=inline, reductions=bool(fold))


def _prologue_policy(graph, stop, fold) -> Policy:
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
        if t != tensor and (t in stop or _materialized(graph, t)):
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


def _region_policy(graph, stop=frozenset(), inside=frozenset()) -> Policy:
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
            return not _materialized(graph, node.output)
        return base.inline(node)

    return Policy(inline=inline, reductions=True)


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


# -- entry point -----------------------------------------------------------------------------------
def recognize(graph: TensorDependencyGraph, families=FAMILIES, fold_norms=False,
              weights=None) -> Recognition:
    """Every kernel of ``families`` in ``graph``, each contraction in at most one match.

    Attention and chains are recognized first (they contain two contractions), then the remaining
    contractions as GEMMs; with ``fold_norms``, normalizations whose every reader is a GEMM are
    folded into those GEMMs (:func:`norm_region`); GEMMs sharing their ``A`` operand are then
    grouped (horizontal fusion).  With ``weights`` (the graph tensors that are weights), a
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
                match = _gemm(graph, c, frozenset(written), frozenset(read))
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
            matches = _fold_norms(graph, contractions, matches, frozenset(written),
                                  frozenset(read), rejected, weights)
        matches = _group_horizontal(graph, matches, rejected)
    for name, why in rejected:
        logger.info("recognize: %s not fused: %s", name, why)
    return Recognition(matches, rejected)


# -- GEMM ------------------------------------------------------------------------------------------
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


def _operand(graph, frame, composer, tensor, index, vmap, what, stop=frozenset(),
             casts=False) -> Access:
    """The base tensor an operand is read from, seen through data movement (and, with
    ``casts``, through float conversions, which the kernel then makes in registers)."""
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)
    elem = composer.element(tensor, idx, _views_policy(graph, stop, casts))
    if casts:
        elem = _strip_casts(elem)
    if not isinstance(elem, Leaf):
        raise NotRecognizedError(f"{what} is not a view of a tensor: {format_elem(elem)}")
    return Access(elem.tensor, elem.index)


def _scaled_operand(graph, frame, composer, tensor, index, vmap, what, stop,
                    widen=False) -> tuple:
    """``(Access, factor)``: an operand read in place through data movement and products with
    scalar constants (with ``widen``, also through a float32 copy of a 16-bit tensor), and the
    product of those constants (``scaled_dot_product_attention`` decomposes to ``Q·√c`` and
    ``K·√c``)."""
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)

    def inline(node):
        return node.output not in stop and (
            data_movement(node) or _scalar_product(node) or (widen and _widening(node)))

    elem = composer.element(tensor, idx, Policy(inline=inline))
    factor = 1.0
    while isinstance(elem, Op) and elem.op in ("mul", "cast"):
        if elem.op == "cast":  # a widening (the only casts inlined): it changes no value
            elem = elem.args[0]
            continue
        consts = [a for a in elem.args if isinstance(a, Const)]
        if len(consts) != 1:
            break
        factor *= consts[0].value
        elem = next(a for a in elem.args if a is not consts[0])
    if not isinstance(elem, Leaf):
        raise NotRecognizedError(f"{what} is not a view of a tensor: {format_elem(elem)}")
    return Access(elem.tensor, elem.index), factor


def _scalar_product(node) -> bool:
    """A block that only multiplies one element by a constant of its own type."""
    value = node.block.body.value if elementwise(node) else None
    if not isinstance(value, P.Mul):
        return False
    args = (value.a, value.b)
    return (sum(isinstance(x, ir.expr.TensorLoad) for x in args) == 1
            and sum(isinstance(x, P.FloatImm) for x in args) == 1)


def _a_operand(graph, frame, composer, tensor, index, vmap, stop, fold) -> tuple:
    """``(Access, prologue)`` of a GEMM's ``A``: a view (prologue None), or with normalizations
    folded in (``fold``), the element computing it and its main read — the leaf that varies
    along the row and ``k``.  Its row statistics must not depend on ``k``."""
    if not fold:
        return _operand(graph, frame, composer, tensor, index, vmap, "A", stop, casts=True), None
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)
    elem = _strip_casts(composer.element(tensor, idx, _prologue_policy(graph, stop, fold)))
    if isinstance(elem, Leaf):
        return Access(elem.tensor, elem.index), None
    _check_statistics(elem, _row_names(frame), "A")
    k = frame.vars["k"]
    outer = [leaf for leaf in outer_leaves(elem) if _uses(leaf, k)
             and any(_uses(leaf, frame.vars[a]) for a in frame.vars if a.startswith("m"))]
    if not outer:
        raise NotRecognizedError(f"A reads no tensor along its rows and k: {format_elem(elem)}")
    frame.adopt(elem)
    return Access(outer[0].tensor, outer[0].index), elem


def _row_names(frame) -> set:
    return {v.name for a, v in frame.vars.items() if a[:1] in "bm"}


def _check_statistics(elem: Elem, rows: set, what: str) -> None:
    """Every reduction in ``elem`` is a row statistic: indexed by the row (and batch)
    coordinates (``rows``: names) and its own variables only."""
    for e in walk(elem):
        if not isinstance(e, Reduce):
            continue
        inner = {x.var.name for x in walk(e) if isinstance(x, Reduce)}
        for leaf in leaves(e):
            for name in _vars_of(leaf.index) - rows - inner:
                raise NotRecognizedError(f"{what}: a reduction varies along {name}, not only rows")


def _widened_operand(graph, frame, composer, tensor, index, vmap, dtype, stop) -> Access:
    """An operand that is a float32 cast of a view of a ``dtype`` tensor: that tensor's view."""
    access = _operand(graph, frame, composer, tensor, index, vmap, "V", stop, casts=True)
    if graph.tensors[access.tensor].dtype != dtype:
        raise NotRecognizedError(f"V is not a widened {dtype} view")
    return access


def _widening(node) -> bool:
    """A block that only converts a 16-bit float element to float32 (exactly)."""
    return (elementwise(node) and _float_cast(node)
            and dtype_of(node.block.body.value) == "float32"
            and dtype_of(node.block.body.value.value) in HALF)


def _float_cast(node) -> bool:
    """A block that only converts one float element to another float type."""
    value = node.block.body.value if node.block is not None else None
    return (
        isinstance(value, P.Cast)
        and isinstance(value.value, ir.expr.TensorLoad)
        and "float" in dtype_of(value)
        and "float" in dtype_of(value.value)
    )


def _out_index(c: Contraction, vmap) -> tuple:
    """The product's output index over the frame."""
    return tuple(substitute(i, vmap) for i in c.node.block.body.indices)


def _gemm(graph, c: Contraction, stop, read=frozenset(), fold=frozenset()) -> Match:
    """The GEMM kernel of ``c`` with the longest epilogue whose output is a strided view; the
    tensors of ``fold`` (normalizations folded into it) are computed, not read."""
    dtype = _check_dtype(graph, c)
    last = None
    for region in epilogue_regions(graph, c.out, stop, read):
        frame, vmap = _frame_for(c)
        composer = Composer(graph, frame.analyzer)
        try:
            a, prologue = _a_operand(graph, frame, composer, *c.a, vmap, stop, fold)
            b = _operand(graph, frame, composer, *c.b, vmap, "B", stop, casts=True)
            out_index = _out_index(c, vmap)
            epi, others = _epilogue(graph, frame, composer, c, out_index, region, stop, fold)
            products = [(c.out, b)]
            covered = [c.node.name, *_calls_nodes(graph, epi.covered_calls)]
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


def _fold_norms(graph, contractions, matches, written, read, rejected,
                weights=None) -> list[Match]:
    """Normalizations (any elementwise function of row statistics: LayerNorm, RMSNorm, however
    written) whose every reader is a GEMM kernel stop being kernels of their own: each reader
    recomputes them — as ``A``'s prologue or inside its epilogue (SOUFFLE's schedule
    propagation with a two-phase reduction: statistics first, then the product).  With
    ``weights``, a reader's ``A`` prologue becomes scaled weights and an epilogue
    (:func:`~.through_weights.fold_through_weights`); a normalization that cannot be folded
    so stays a kernel."""
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
                match = _gemm(graph, contractions[name], written - own, read, fold)
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
                r.var.name in _vars_of((i,)) for i in leaf.index[:-1]
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
        m.views = _views(graph, m)
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
            if data_movement(node) or (elementwise(node) and _float_cast(node)):
                stack.append(node.output)
                continue
            return node.call
    return None


def _check_dtype(graph, c: Contraction) -> str:
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


def _calls_nodes(graph, calls) -> list[str]:
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


def _epilogue(graph, frame, composer, c: Contraction, out_index, region, stop, fold=frozenset()):
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
    elem = _reindex(elem, inverse, frame)
    if fold:
        _check_statistics(elem, _row_names(frame), "the epilogue")
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


def _partner(graph, frame, composer, c, other: Contraction, leaf, out_index, a, stop,
             fold=frozenset()):
    """Another product read by ``c``'s epilogue at the same position, computed in the same
    kernel: it must share ``A``, shapes and dtypes, and have no other reader."""
    if _materialized(graph, other.out):
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
    if _check_dtype(graph, other) != _check_dtype(graph, c) or other.acc_dtype != c.acc_dtype:
        raise NotRecognizedError(f"{other.node.name} has other dtypes")
    a2, prologue = _a_operand(graph, frame, composer, *other.a, names, stop, fold)
    if a != (a2.key(), prologue.key() if prologue is not None else None):
        raise NotRecognizedError(f"{other.node.name} reads another A")
    return _operand(graph, frame, composer, *other.b, names, "the partner's B", stop, casts=True)


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


def _reindex(elem: Elem, vmap: dict, frame: Frame) -> Elem:
    """``elem`` with the variables of ``vmap`` substituted in every index."""
    from .elem import Iter

    def fn(e):
        if isinstance(e, Leaf):
            index = tuple(frame.simplify(substitute(i, vmap)) for i in e.index)
            return Leaf(e.tensor, index, e.dtype)
        if isinstance(e, Iter):
            return Iter(frame.simplify(substitute(e.expr, vmap)), e.dtype)
        return None

    return replace(elem, fn)


def _group_horizontal(graph, matches: list[Match], rejected) -> list[Match]:
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
        products = [(p, _rebase(acc, vmap, first.frame)) for p, acc in seg.products]
        outputs = [_reoutput(o, vmap, first.frame) for o in seg.outputs]
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


def _rebase(access: Access, vmap, frame) -> Access:
    return Access(access.tensor, tuple(frame.simplify(substitute(i, vmap)) for i in access.index))


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
    region = composer.element(c2.a[0], a_index, _region_policy(graph, stop, inside))
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
    score = _match_softmax(region, frame.vars["n"], graph)
    family = "attention" if score is not None else "chain"
    if family not in families:
        return None
    build = _attention if score is not None else _chain
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
                _region_policy(graph, stop, inside),
            )
            inner = (_match_softmax(region_t, sub.vars["n"], graph) if score is not None
                     else region_t)
            match = build(graph, sub, composer, c1, c2, inner, vmap_t, region, stop)
            match.zero_empty_rows = _safe_softmax(region_t, sub.vars["n"], graph) is not None
            finalize(graph, match)
            return match
        except (NotRecognizedError, CompositionError, UnsupportedExprError) as err:
            last = err
    raise NotRecognizedError(str(last))


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


def _strip_casts(e: Elem) -> Elem:
    while isinstance(e, Op) and e.op == "cast":
        e = e.args[0]
    return e


def _match_softmax(e: Elem, n_var, graph=None) -> Elem | None:
    """``g`` when ``e == softmax_n(g)`` (any casts around it; max-subtracted or not), else None.

    ``softmax_n(g) = exp(g - max_r g[n:=r]) / Σ_r exp(g - max_r g[n:=r])``; a division by the sum
    or a product with its reciprocal.  A softmax whose rows of ``-inf`` logits give zeros
    instead of NaN (PyTorch's safe softmax, :func:`_safe_softmax`) is one too.
    """
    safe = _safe_softmax(e, n_var, graph)
    e = _strip_casts(safe if safe is not None else e)
    if not isinstance(e, Op):
        return None
    if e.op == "div":
        num, den = e.args
    elif e.op == "mul":
        inv = [
            a
            for a in e.args
            if isinstance(a, Op)
            and a.op == "div"
            and isinstance(a.args[0], Const)
            and a.args[0].value == 1
        ]
        if len(inv) != 1:
            return None
        num = e.args[1] if e.args[0] is inv[0] else e.args[0]
        den = inv[0].args[1]
    else:
        return None
    den = _strip_casts(den)
    num = _strip_casts(num)
    if not (isinstance(den, Reduce) and den.op == "sum"):
        return None
    if not _same_over(num, n_var, den.body, den.var):
        return None
    if not (isinstance(num, Op) and num.op == "exp"):
        return None
    inner = _strip_casts(num.args[0])
    if isinstance(inner, Op) and inner.op == "sub":
        g, mx = inner.args
        mx = _strip_casts(mx)
        if isinstance(mx, Reduce) and mx.op == "max" and _same_over(g, n_var, mx.body, mx.var):
            return g
    return num.args[0]


def _safe_softmax(e: Elem, n_var, graph=None) -> Elem | None:
    """``s`` when ``e`` is ``select(all_n(g == -inf), 0, s)`` (or the select the other way round
    on the negated test) and ``s == softmax_n(g)``: the softmax with rows that have no finite
    logit set to zero — what ``scaled_dot_product_attention`` decomposes to since PyTorch 2.5.
    None otherwise (the zero may be a constant tensor of zeros of ``graph``)."""
    e = _strip_casts(e)
    if not (isinstance(e, Op) and e.op == "select"):
        return None
    cond, yes, no = e.args
    for zero, s, empty in ((yes, no, True), (no, yes, False)):
        if not _zero(graph, _strip_casts(zero)):
            continue
        g = _match_softmax(s, n_var, graph)
        if g is not None and _all_minus_inf(cond, g, n_var) is empty:
            return s
    return None


def _zero(graph, e: Elem) -> bool:
    """``e`` is zero: a constant, or a read of a constant tensor of zeros."""
    if isinstance(e, Const):
        return e.value == 0
    value = graph.values.get(e.tensor) if graph is not None and isinstance(e, Leaf) else None
    if not isinstance(value, ir.expr.Constant):
        return False
    return not value.value.numpy().any()


def _boolean(e: Elem) -> tuple[Elem, bool]:
    """``(x, positive)``: ``e`` is ``x`` (``positive``) or ``not x``, through logical nots and
    casts between booleans and integers (which keep a truth value)."""
    positive = True
    while isinstance(e, Op):
        if e.op == "cast" and _integral(e.dtype) and _integral(e.args[0].dtype):
            e = e.args[0]
        elif e.op == "not":
            positive, e = not positive, e.args[0]
        elif e.op in ("lt", "ne") and _zero(None, e.args[0]) and _integral(e.args[1].dtype):
            e = e.args[1]  # 0 < x, 0 != x: x's truth (TVM's select on a boolean cast)
        elif e.op in ("gt", "ne") and _zero(None, e.args[1]) and _integral(e.args[0].dtype):
            e = e.args[0]
        else:
            break
    return e, positive


def _integral(dtype: str) -> bool:
    return dtype == "bool" or dtype.startswith(("int", "uint"))


def _all_minus_inf(cond: Elem, g: Elem, n_var) -> bool | None:
    """True where ``cond`` is ``all_n(g == -inf)`` (a row of the logits ``g`` with no finite
    value), False where it is the negation, None where it is neither (or not recognized).

    The test is a ``max`` (any) or ``min`` (all) over the key axis of ``g == -inf`` or
    ``g != -inf``, with nots and boolean casts anywhere; ``g`` may be widened first."""
    red, outer = _boolean(cond)
    if not (isinstance(red, Reduce) and red.op in ("max", "min")):
        return None
    test, inner = _boolean(red.body)
    if not (isinstance(test, Op) and test.op in ("eq", "ne")):
        return None
    a, b = (_strip_casts(x) for x in test.args)
    if isinstance(a, Const):
        a, b = b, a
    if not (isinstance(b, Const) and b.value == float("-inf")):
        return None
    if not _same_over(_strip_casts(g), n_var, a, red.var):
        return None
    is_inf = (test.op == "eq") == inner  # the reduced predicate is "g == -inf"
    if red.op == "min" and is_inf:  # all(g == -inf)
        return outer
    if red.op == "max" and not is_inf:  # any(g != -inf) = not all(g == -inf)
        return not outer
    return None


def _same_over(a: Elem, a_var, b: Elem, b_var) -> bool:
    """``a`` (over ``a_var``) and ``b`` (over ``b_var``) compute the same function."""
    return a.key({a_var.name: "_j"}) == b.key({b_var.name: "_j"})


def _half_attention(graph, frame, composer, c1, c2, vmap1, vmap2, stop):
    """``(dtype, Q, K)`` where a float32 attention multiplies float32 copies of Q, K and V of
    one 16-bit ``dtype`` (PyTorch's math kernel in a float16 export on the CPU): the kernel
    reads the 16-bit tensors (the same products, accumulated in float32); else None (mixed
    dtypes, or a V that is no such copy: the float32 attention as written)."""
    try:
        q = _scaled_operand(graph, frame, composer, *c1.a, vmap1, "Q", stop, widen=True)
        k = _scaled_operand(graph, frame, composer, *c1.b, vmap1, "K", stop, widen=True)
        read = {graph.tensors[x.tensor].dtype for x, _ in (q, k)}
        if len(read) != 1 or not read <= set(HALF):
            return None
        dtype = read.pop()
        _widened_operand(graph, frame, composer, *c2.b, vmap2, dtype, stop)
    except NotRecognizedError:
        return None
    return dtype, q, k


def _attention(graph, frame, composer, c1, c2, score, vmap2, region, stop) -> Match:
    dtype = _check_dtype(graph, c1)
    s_leaves = [leaf for leaf in leaves(score) if leaf.tensor == c1.out]
    if len({leaf.key() for leaf in s_leaves}) != 1:
        raise NotRecognizedError("the logits read Q·Kᵀ at several positions")
    s_index = s_leaves[0].index
    if len(c1.m) != 1 or len(c1.n) != 1:
        raise NotRecognizedError("Q·Kᵀ has several row or column axes")
    # Q·Kᵀ's coordinates as expressions of the frame
    out1 = c1.node.block.body.indices
    vmap1 = {}
    for var, expr in zip(out1, s_index):
        vmap1[var] = expr
    if not (
        _is(vmap1.get(c1.m[0].var), frame.vars["m"])
        and _is(vmap1.get(c1.n[0].var), frame.vars["n"])
    ):
        raise NotRecognizedError("the softmax does not run along Q·Kᵀ's key axis")
    dk = int(c1.k.dom.extent)
    vmap1[c1.k.var] = frame.axis("k", dk)
    q, q_scale = _scaled_operand(graph, frame, composer, *c1.a, vmap1, "Q", stop)
    k, k_scale = _scaled_operand(graph, frame, composer, *c1.b, vmap1, "K", stop)
    if dtype == "float32":
        half = _half_attention(graph, frame, composer, c1, c2, vmap1, vmap2, stop)
        if half is not None:
            dtype, (q, q_scale), (k, k_scale) = half
    widened = _check_dtype(graph, c2) != dtype
    if widened and _check_dtype(graph, c2) != "float32":
        raise NotRecognizedError("the two products have different dtypes")
    if q_scale * k_scale != 1:
        # (c·Q)·(c'·K)ᵀ = c·c'·(Q·Kᵀ): the constants join the logits, Q and K are read in place
        score = replace(score, lambda e: (
            Op("mul", (e, Const(q_scale * k_scale, e.dtype)), e.dtype)
            if isinstance(e, Leaf) and e.tensor == c1.out else None))
    if widened:
        # P·V in float32 on a widened copy of V (TVM's import of a float16 attention): V is read
        # at its own precision and the product runs in it, as FlashAttention does
        v = _widened_operand(graph, frame, composer, *c2.b, vmap2, dtype, stop)
    else:
        v = _operand(graph, frame, composer, *c2.b, vmap2, "V", stop)
    bad = [x for x in leaves(score) if x.tensor != c1.out and _uses(x, frame.vars.get("d"))]
    if bad:
        raise NotRecognizedError("the logits depend on the head dimension")
    output, covered = _pair_output(graph, frame, composer, c1, c2, vmap2, region, stop)
    match = Match(
        "attention",
        frame,
        {"q": q, "k": k, "v": v},
        dtype,
        covered,
        outputs=[output],
        score=score,
        score_tensor=c1.out,
        acc_dtype=c2.acc_dtype,
    )
    return match


def _pair_output(graph, frame, composer, c1, c2, vmap2, region, stop):
    """The output of a kernel computing ``c1`` then ``c2`` (its epilogue ``region`` after
    ``c2``), and the graph nodes the kernel replaces."""
    epi, others = _epilogue(graph, frame, composer, c2, _out_index(c2, vmap2), region, stop)
    if others:
        raise NotRecognizedError("the output's epilogue reads another product")
    epi.output.accumulators = (c2.out,)
    covered = [c1.node.name, c2.node.name, *_region_nodes(graph, c1, c2)]
    return epi.output, covered + _calls_nodes(graph, epi.covered_calls)


def _is(expr, var) -> bool:
    return isinstance(expr, ir.expr.Var) and expr.same_as(var)


def _uses(leaf: Leaf, var) -> bool:
    return var is not None and any(var.name in _vars_of((i,)) for i in leaf.index)


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


def _chain(graph, frame, composer, c1, c2, between, vmap2, region, stop) -> Match:
    dtype = _check_dtype(graph, c2)
    inner = _strip_casts(between)
    if not isinstance(inner, Leaf) or inner.tensor != c1.out:
        raise NotRecognizedError(f"between the products: {format_elem(between)}")
    if len(c1.m) != 1 or len(c1.n) != 1:
        raise NotRecognizedError("the first product has several row or column axes")
    vmap1 = dict(zip(c1.node.block.body.indices, inner.index))
    if not (
        _is(vmap1.get(c1.m[0].var), frame.vars["m"])
        and _is(vmap1.get(c1.n[0].var), frame.vars["n"])
    ):
        raise NotRecognizedError("the second product does not contract the first's columns")
    vmap1[c1.k.var] = frame.axis("k", int(c1.k.dom.extent))
    a = _operand(graph, frame, composer, *c1.a, vmap1, "A", stop)
    b = _operand(graph, frame, composer, *c1.b, vmap1, "B", stop)
    d = _operand(graph, frame, composer, *c2.b, vmap2, "D", stop)
    output, covered = _pair_output(graph, frame, composer, c1, c2, vmap2, region, stop)
    return Match(
        "chain",
        frame,
        {"a": a, "b": b, "d": d},
        dtype,
        covered,
        outputs=[output],
        score_tensor=c1.out,
        acc_dtype=c2.acc_dtype,
    )


# -- views -----------------------------------------------------------------------------------------
def finalize(graph, match: Match) -> None:
    """Collapse the frame's axes and derive every access's strided view (in place).

    GEMM frames merge their batch, row and column axes into one each where every access allows
    it (``b``, ``m``, ``n``); attention keeps (b, h) but merges extra batch axes.
    """
    for prefix in ("b", "m", "n") if match.family == "gemm" else ("b",):
        _collapse(graph, match, prefix)
    _rename_single(match)
    if match.family == "attention":
        _attention_finalize(graph, match)
        return
    match.views = _views(graph, match)


def _views(graph, match: Match) -> dict:
    """Every access of ``match`` as a strided view over its frame, or NotRecognizedError."""
    views = {}
    for role, access in _all_accesses(match).items():
        view = _view(graph, access, dict(match.frame.vars), match.frame)
        if view is None:
            raise NotRecognizedError(f"{role} ({access.tensor}) is not a strided view")
        views[role] = view
    return views


def _attention_finalize(graph, match: Match) -> None:
    """Views of an attention; a flattened (batch · heads) axis is split back when the accesses
    need it, and K/V may be shared by groups of query heads."""
    try:
        _attention_views(graph, match)
        _triangles_to_indices(graph, match)
        match.causal = causal_offset(graph, match)
        return
    except NotRecognizedError as err:
        first = err
    frame = match.frame
    if "h" not in frame.vars or "b" in frame.vars:
        raise first
    extent = frame.extents["h"]
    for heads in range(2, extent):
        if extent % heads:
            continue
        b, h = new_var("b"), new_var("h")
        bind(frame.analyzer, b, extent // heads)
        bind(frame.analyzer, h, heads)
        trial = _substituted(match, {frame.vars["h"]: b * heads + h})
        if trial is None:
            continue
        trial.frame = Frame()
        trial.frame.analyzer = frame.analyzer
        trial.frame.vars = {"b": b, **{a: (h if a == "h" else v) for a, v in frame.vars.items()}}
        trial.frame.extents = {"b": extent // heads, **frame.extents, "h": heads}
        trial.views, trial.group = {}, 1
        try:
            _attention_views(graph, trial)
        except NotRecognizedError:
            continue
        _apply(match, trial)
        match.frame, match.views, match.group = trial.frame, trial.views, trial.group
        _triangles_to_indices(graph, match)
        match.causal = causal_offset(graph, match)
        return
    raise first


#: logits at or below this (or -inf) add nothing to a softmax: float16's lowest finite value,
#: what float16 models mask with (``finfo(float16).min``; float32 ones use float32's, far below);
#: ``exp(-65504 - max)`` underflows to 0 exactly in every float format
MASKED = -65504.0


def _constant_grid(graph, match, leaf):
    """The values of a constant read by the logits over (query, key), or None."""
    import numpy as np

    value = graph.values.get(leaf.tensor)
    view = match.views.get(("x", leaf.key()))
    if not isinstance(value, ir.expr.Constant) or view is None:
        return None
    if any(s and a not in ("m", "n") for a, s in view.strides):
        return None
    data = value.value.numpy().reshape(-1)
    rows = np.arange(match.frame.extents["m"])[:, None]
    cols = np.arange(match.frame.extents["n"])[None, :]
    stride = view.stride
    return data[view.offset + stride.get("m", 0) * rows + stride.get("n", 0) * cols]


def _triangles_to_indices(graph, match) -> None:
    """A constant the logits read that takes one value above a diagonal (``key > query + c``)
    and another elsewhere — a folded causal mask — becomes that comparison of the indices:
    exactly the same values, and no tensor to read."""
    import numpy as np

    from .elem import Const, Iter

    frame = match.frame
    for leaf in leaves(match.score):
        grid = _constant_grid(graph, match, leaf)
        if grid is None or grid.size < 2:
            continue
        above, below = grid[0, -1], grid[0, 0]
        first = np.flatnonzero(grid[0] != below)
        if not len(first) or (grid == above).all():
            continue
        c = int(first[0]) - 1
        rows, cols = np.indices(grid.shape)
        upper = cols > rows + c
        if not (np.all(grid[upper] == above) and np.all(grid[~upper] == below)):
            continue
        m, n = frame.vars["m"], frame.vars["n"]
        cond = Iter(frame.simplify(n > m + c), "bool")
        value = Op("select", (cond, Const(above.item(), leaf.dtype), Const(below.item(),
                                                                            leaf.dtype)),
                   leaf.dtype)
        key = leaf.key()
        match.score = replace(match.score, lambda e, key=key, value=value:
                              value if isinstance(e, Leaf) and e.key() == key else None)
        match.views.pop(("x", key), None)


def causal_offset(graph, match) -> int | None:
    """``c`` when the attention's logits are masked exactly where ``key > query + c``.

    Decided on the values, not the spelling: every read of the logits besides ``Q·Kᵀ`` must be
    a constant (a mask folded at compile time) indexed by (query, key); the logits are
    evaluated with the product at 0, and the masked set (``-inf`` or below :data:`MASKED`) must
    be the strict upper triangle shifted by ``c``.  Otherwise None.
    """
    import numpy as np

    from .elem import evaluate

    ext = match.frame.extents
    m, n = ext["m"], ext["n"]
    grids = {}
    for leaf in leaves(match.score):
        if leaf.tensor == match.score_tensor:
            continue
        grid = _constant_grid(graph, match, leaf)
        if grid is None:
            return None
        grids[leaf.key()] = grid
    rows, cols = np.arange(m)[:, None], np.arange(n)[None, :]

    def read(leaf):
        if leaf.tensor == match.score_tensor:
            return np.zeros((m, n), "float32")
        return grids[leaf.key()]

    coords = {v.name: 0 for v in match.frame.vars.values()}
    coords.update({match.frame.vars["m"].name: rows, match.frame.vars["n"].name: cols})
    try:
        logits = np.broadcast_to(evaluate(match.score, coords, read), (m, n)).astype("float64")
    except (CompositionError, IndexError, ValueError, TypeError):
        return None
    masked = np.isneginf(logits) | (logits <= MASKED)
    if not masked.any() or masked[:, 0].any():
        return None
    offset = int(np.argmax(masked[0])) - 1 if masked[0].any() else n - 1
    if not np.array_equal(masked, cols > rows + offset):
        return None
    return offset


def visible_logits(match) -> Elem | None:
    """The logits of a causal attention over the keys every query sees (``key <= query +
    causal``): each index comparison of (query, key) that is constant over that region becomes
    its value and the selects on it fold away, so key blocks left of the diagonal are computed
    without the mask (FlashAttention's split of the causal loop).  None when the attention is
    not causal or no comparison folds.
    """
    import numpy as np

    from .elem import Iter, evaluate

    if match.causal is None or match.score is None:
        return None
    ext, names = match.frame.extents, {a: v.name for a, v in match.frame.vars.items()}
    rows, cols = np.arange(ext["m"])[:, None], np.arange(ext["n"])[None, :]
    seen = cols <= rows + match.causal
    coords = {names["m"]: rows, names["n"]: cols}

    def fold(e):
        if isinstance(e, Iter):
            if not {v.name for v in vars_in(e.expr)} <= set(coords):
                return None
            try:
                values = np.broadcast_to(evaluate(e, coords, None), seen.shape)[seen]
            except (CompositionError, TypeError, ValueError):
                return None
            if values.size and (values == values[0]).all():
                return Const(values[0].item(), e.dtype)
            return None
        if isinstance(e, Op):
            args = tuple(replace(a, fold) for a in e.args)
            if e.op == "select" and isinstance(args[0], Const):
                return args[1] if args[0].value else args[2]
            if e.op in ("add", "sub") and isinstance(args[1], Const) and args[1].value == 0 \
                    and args[0].dtype == e.dtype:
                return args[0]
            if e.op == "add" and isinstance(args[0], Const) and args[0].value == 0 \
                    and args[1].dtype == e.dtype:
                return args[1]
            return Op(e.op, args, e.dtype)
        return None

    visible = replace(match.score, fold)
    return None if visible.key() == match.score.key() else visible


def _all_accesses(match: Match) -> dict:
    out = dict(match.accesses)
    for si, seg in enumerate(match.segments):
        for pi, (_, b) in enumerate(seg.products):
            out[f"b{si}.{pi}"] = b
        for oi, o in enumerate(seg.outputs):
            out[f"out{si}.{oi}"] = o.access
            _extras(match, o.elem, out, skip=set(o.accumulators))
    for oi, o in enumerate(match.outputs):
        out[f"out{oi}"] = o.access
        _extras(match, o.elem, out, skip=set(o.accumulators))
    if match.score is not None:
        _extras(match, match.score, out, skip={match.score_tensor})
    if match.prologue is not None:
        _extras(match, match.prologue, out, skip=set())
    return out


def _extras(match, elem, out, skip) -> None:
    """Reads of element expressions, under the role ``("x", leaf key)``."""
    for leaf in leaves(elem):
        if leaf.tensor in skip:
            continue
        out.setdefault(("x", leaf.key()), Access(leaf.tensor, leaf.index))


def _view(graph, access: Access, axes, frame) -> Strided | None:
    info = graph.tensors[access.tensor]
    used = _vars_of(access.index)
    # a row statistic's reads vary along its reduction variable too
    axes = {**axes, **{n: v for n, (v, _) in frame.reductions.items() if n in used}}
    return strided(access.tensor, info.shape, info.dtype, access.index, axes, frame.analyzer)


def _attention_views(graph, match) -> None:
    """Every access by strides; K and V may be shared by groups of query heads (GQA)."""
    frame = match.frame
    axes = dict(frame.vars)
    heads = frame.extents.get("h", 1)
    views = {}
    for role, access in _all_accesses(match).items():
        view = _view(graph, access, axes, frame)
        if view is None and role in ("k", "v") and "h" in frame.vars:
            for group in range(2, heads + 1):
                if heads % group == 0 and match.group in (1, group):
                    view = _grouped(graph, access, frame, group)
                    if view is not None:
                        match.group = group
                        break
        if view is None:
            raise NotRecognizedError(f"{role} ({access.tensor}) is not a strided view")
        views[role] = view
    if match.group > 1 and any(views[r].stride.get("h", 0) == 0 and heads > 1 for r in ("q",)):
        raise NotRecognizedError("Q does not vary with the head")
    match.views = views


def _grouped(graph, access, frame, group) -> Strided | None:
    """``access`` as a view over (…, h // group, …): each K/V head serves ``group`` query heads."""
    h = frame.vars["h"]
    hk, r = new_var("hk"), new_var("hr")
    bind(frame.analyzer, hk, frame.extents["h"] // group)
    bind(frame.analyzer, r, group)
    index = tuple(frame.simplify(substitute(i, {h: hk * group + r})) for i in access.index)
    axes = {a: (hk if a == "h" else v) for a, v in frame.vars.items()}
    axes["hr"] = r
    info = graph.tensors[access.tensor]
    view = strided(access.tensor, info.shape, info.dtype, index, axes, frame.analyzer)
    if view is None or view.stride.get("hr", 0) != 0:
        return None
    return dataclasses.replace(view, strides=tuple((a, s) for a, s in view.strides if a != "hr"))


def _collapse(graph, match: Match, prefix: str) -> None:
    """Merge the frame's axes ``<prefix>0, <prefix>1, ...`` into one where every access allows
    (its flat offset stays affine in the merged axis)."""
    frame = match.frame
    names = [a for a in frame.vars if a[:1] == prefix and a[1:].isdigit()]
    while len(names) > 1:
        outer, inner = names[0], names[1]
        e_in = frame.extents[inner]
        merged = new_var(f"{outer}_")
        bind(frame.analyzer, merged, frame.extents[outer] * e_in)
        vmap = {
            frame.vars[outer]: tirx.floordiv(merged, e_in),
            frame.vars[inner]: tirx.floormod(merged, e_in),
        }
        trial = _substituted(match, vmap)
        if trial is None:
            return
        axes = {a: (merged if a == outer else v) for a, v in frame.vars.items() if a != inner}
        if any(_view(graph, acc, axes, frame) is None for acc in _all_accesses(trial).values()):
            return
        _apply(match, trial)
        extents = {a: e for a, e in frame.extents.items() if a != inner}
        extents[outer] *= e_in
        frame.vars, frame.extents = axes, extents
        names = [a for a in frame.vars if a[:1] == prefix and a[1:].isdigit()]


def _substituted(match: Match, vmap) -> Match | None:
    frame = match.frame
    try:
        trial = dataclasses.replace(
            match,
            accesses={r: _rebase(a, vmap, frame) for r, a in match.accesses.items()},
            segments=[
                Segment(
                    s.n,
                    [(p, _rebase(a, vmap, frame)) for p, a in s.products],
                    [_reoutput(o, vmap, frame) for o in s.outputs],
                    s.covered,
                )
                for s in match.segments
            ],
            outputs=[_reoutput(o, vmap, frame) for o in match.outputs],
            score=_reindex(match.score, vmap, frame) if match.score is not None else None,
            prologue=(
                _reindex(match.prologue, vmap, frame) if match.prologue is not None else None
            ),
        )
    except UnsupportedExprError:
        return None
    return trial


def _reoutput(o: Output, vmap, frame) -> Output:
    return dataclasses.replace(
        o, access=_rebase(o.access, vmap, frame), elem=_reindex(o.elem, vmap, frame)
    )


def _apply(match: Match, trial: Match) -> None:
    match.accesses, match.segments = trial.accesses, trial.segments
    match.outputs, match.score = trial.outputs, trial.score
    match.prologue = trial.prologue


def _rename_single(match: Match) -> None:
    """``b0``/``m0``/``n0`` left alone after collapsing are called ``b``/``m``/``n``."""
    frame = match.frame
    renamed_vars, renamed_ext = {}, {}
    for a, v in frame.vars.items():
        name = a[0] if a[:1] in "bmn" and a[1:].isdigit() else a
        if name in renamed_vars:
            raise NotRecognizedError(f"several {name} axes cannot be merged")
        renamed_vars[name], renamed_ext[name] = v, frame.extents[a]
    frame.vars, frame.extents = renamed_vars, renamed_ext
