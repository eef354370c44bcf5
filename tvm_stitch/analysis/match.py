"""What every kernel family's recognition speaks: a kernel's coordinates (:class:`Frame`), the
accesses it makes, the contractions it computes (:func:`contraction`), the :class:`Match` a
family's recognizer returns, and :func:`finalize`, which collapses the coordinates and turns the
accesses into strided views (offset, strides).

The families are recognized in :mod:`tvm_stitch.families` (``<family>/recognize.py``), driven
by :func:`tvm_stitch.analysis.recognize.recognize`.
"""

from __future__ import annotations

import dataclasses

from tvm import ir, sym, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.graph import Node, OpKind
from tvm_stitch.graph.access import vars_in

from .elem import Elem, Iter, Leaf, Reduce, leaves, reductions, replace, walk
from .indexing import (
    Strided,
    UnsupportedExprError,
    as_int64,
    bind,
    dtype_of,
    new_var,
    strided,
    substitute,
)


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
    uses = [vars_of(index) for _, index, _ in loads]
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


def vars_of(index) -> set[str]:
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
    """A recognized kernel (:mod:`tvm_stitch.analysis.recognize` describes the families).

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
        ``attention``: the logits are masked where ``key > query + causal`` (found on a mask
        folded to a constant), so key blocks past the diagonal can be skipped.
    window : int or None
        ``attention``: the logits are also masked where ``key < query + window`` (a sliding
        window's lower limit); with ``causal``, exactly outside ``window <= key - query <=
        causal`` (:func:`~tvm_stitch.families.attention.recognize.mask_band`), so key blocks
        before the window are skipped too.
    runtime_band : tuple of (int or None) or None
        ``attention``: ``(lo, hi)`` outside which the logits are masked whatever a mask read
        at run time holds (a causal mask and a padding mask in one,
        :func:`~tvm_stitch.families.attention.recognize.runtime_band`): the key blocks outside
        are skipped unless a row of the block sees no key at run time.
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
    paired : bool
        ``gemm``: the two products of its band read the even and odd rows (of a Linear weight;
        else columns) of one tensor, gate and up interleaved
        (:func:`~tvm_stitch.analysis.weights.pair_weights`): the kernel computes one product
        of twice the columns and splits it after the product loop.
    runtime : tuple of str
        Axes whose extent is known only at run time (a symbolic dim's,
        :mod:`tvm_stitch.codegen.runtime`): the printers give no form sized by them (TMA
        descriptors, split-K workspaces, warp-specialized rings).
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
    window: int | None = None
    runtime_band: tuple | None = None
    views: dict = dataclasses.field(default_factory=dict)
    extras: dict = dataclasses.field(default_factory=dict)  # leaf key -> Strided
    prologue: Elem | None = None
    derived: tuple = ()
    zero_empty_rows: bool = False
    paired: bool = False
    runtime: tuple = ()

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
        from tvm_stitch.families import part  # the registry: data only

        text = part(self.family, "recognize").describe(self)
        if outputs:
            text += " -> " + ", ".join(o.tensor for o in self.all_outputs)
        return text


@dataclasses.dataclass
class Recognition:
    """What :func:`~tvm_stitch.analysis.recognize.recognize` found: matches, and candidates
    rejected with reasons."""

    matches: list[Match]
    rejected: list[tuple[str, str]]


# -- views -----------------------------------------------------------------------------------------
def finalize(graph, match: Match) -> None:
    """Collapse the frame's axes and derive every access's strided view (in place).

    The frame's axes the family names (its ``COLLAPSE``: a GEMM's batch, row and column axes,
    by default the batch axes) merge into one each where every access allows
    (:func:`collapse_frame`); attention derives its views itself
    (:func:`~tvm_stitch.families.attention.recognize.finalize_attention`).
    """
    collapse_frame(graph, match)
    match.views = views(graph, match)


def pair_description(match: Match) -> str:
    """What a kernel of two products computes, e.g. ``attention 1x12x128x128 d64 float16,
    causal``: batch x heads x rows x keys, head dims, shared K/V heads, a causal mask."""
    ext = match.frame.extents
    heads = f"{ext.get('b', 1)}x{ext.get('h', 1)}x"
    dims = f"{heads}{ext['m']}x{ext['n']} d{ext['k']}"
    if ext["d"] != ext["k"]:
        dims += f"/{ext['d']}"
    text = f"{match.family} {dims} {match.dtype}"
    if match.group > 1:
        text += f", {match.group} heads per K/V head"
    if match.window is not None:
        text += f", keys from query{match.window:+d}"
    if match.causal is not None:
        text += ", causal" + (f"{match.causal:+d}" if match.causal else "")
    if match.runtime_band is not None:
        lo, hi = match.runtime_band
        text += ", run-time mask, keys" + (f" from query{lo:+d}" if lo is not None else "") + (
            f" to query{hi:+d}" if hi is not None else "")
    return text


def collapse_frame(graph, match: Match) -> None:
    """Merge the frame's axes where every access allows (the family's ``COLLAPSE``, e.g. a
    GEMM's batch, row and column axes; by default its batch axes) and name the single ones
    ``b``/``m``/``n``."""
    from tvm_stitch.families import part  # the registry: data only

    for prefix in getattr(part(match.family, "recognize"), "COLLAPSE", ("b",)):
        _collapse(graph, match, prefix)
    _rename_single(match)


def views(graph, match: Match) -> dict:
    """Every access of ``match`` as a strided view over its frame, or NotRecognizedError."""
    views = {}
    for role, access in all_accesses(match).items():
        view = view_of(graph, access, dict(match.frame.vars), match.frame)
        if view is None:
            raise NotRecognizedError(f"{role} ({access.tensor}) is not a strided view")
        views[role] = view
    return views


def all_accesses(match: Match) -> dict:
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


def view_of(graph, access: Access, axes, frame) -> Strided | None:
    info = graph.tensors[access.tensor]
    used = vars_of(access.index)
    # a row statistic's reads vary along its reduction variable too
    axes = {**axes, **{n: v for n, (v, _) in frame.reductions.items() if n in used}}
    return strided(access.tensor, info.shape, info.dtype, access.index, axes, frame.analyzer)


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
        trial = substituted(match, vmap)
        if trial is None:
            return
        axes = {a: (merged if a == outer else v) for a, v in frame.vars.items() if a != inner}
        if any(view_of(graph, acc, axes, frame) is None for acc in all_accesses(trial).values()):
            return
        apply(match, trial)
        extents = {a: e for a, e in frame.extents.items() if a != inner}
        extents[outer] *= e_in
        frame.vars, frame.extents = axes, extents
        names = [a for a in frame.vars if a[:1] == prefix and a[1:].isdigit()]


def substituted(match: Match, vmap) -> Match | None:
    frame = match.frame
    try:
        trial = dataclasses.replace(
            match,
            accesses={r: rebase(a, vmap, frame) for r, a in match.accesses.items()},
            segments=[
                Segment(
                    s.n,
                    [(p, rebase(a, vmap, frame)) for p, a in s.products],
                    [reoutput(o, vmap, frame) for o in s.outputs],
                    s.covered,
                )
                for s in match.segments
            ],
            outputs=[reoutput(o, vmap, frame) for o in match.outputs],
            score=reindex(match.score, vmap, frame) if match.score is not None else None,
            prologue=(
                reindex(match.prologue, vmap, frame) if match.prologue is not None else None
            ),
        )
    except UnsupportedExprError:
        return None
    return trial


def reoutput(o: Output, vmap, frame) -> Output:
    return dataclasses.replace(
        o, access=rebase(o.access, vmap, frame), elem=reindex(o.elem, vmap, frame)
    )


def apply(match: Match, trial: Match) -> None:
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


def rebase(access: Access, vmap, frame) -> Access:
    return Access(access.tensor, tuple(frame.simplify(substitute(i, vmap)) for i in access.index))


def reindex(elem: Elem, vmap: dict, frame: Frame) -> Elem:
    """``elem`` with the variables of ``vmap`` substituted in every index."""

    def fn(e):
        if isinstance(e, Leaf):
            index = tuple(frame.simplify(substitute(i, vmap)) for i in e.index)
            return Leaf(e.tensor, index, e.dtype)
        if isinstance(e, Iter):
            return Iter(frame.simplify(substitute(e.expr, vmap)), e.dtype)
        return None

    return replace(elem, fn)
