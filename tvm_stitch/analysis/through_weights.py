"""A normalization folded into the GEMMs that read it through their weights, not their ``A``.

A LayerNorm or RMSNorm in front of a GEMM is, per row ``m``, an affine function of the row's
values: ``y[m, k] = r(m)·g(k)·x[m, k] + Σ_i c_i(m)·h_i(k)`` — LayerNorm's ``r = rstd``,
``g = γ``, ``c = -μ·rstd`` with ``h = γ`` and ``c = 1`` with ``h = β``; RMSNorm has one term.
Its product with a weight ``B`` is then

    y·B = r(m) · (x · B') + Σ_i c_i(m) · v_i,     B' = diag(g)·B,  v_i = h_iᵀ·B

so the GEMM reads ``x`` itself (by TMA, in its pipelined loop) with the scaled weight ``B'``,
and applies the row factors in its epilogue with the column vectors ``v_i``.  ``B'`` and ``v_i``
depend on weights only: the pass binds their computation before the kernel, and
``relax.transform.LiftTransformParams`` moves it into ``<entry>_transform_params`` (run once).
The row factors are the normalization's statistics, summed from the moments the GEMM writing
``x`` leaves (the two-phase reduction of :mod:`.moments`) or recomputed from the row.

Recognised by what the prologue computes — a polynomial of degree one in ``x`` whose
coefficients split into a row part and a column part — never by op names.  Casts are
transparent: the kernel computes in float32 what the model rounded to its dtype in between.
"""

from __future__ import annotations

import dataclasses
import hashlib

from tvm import tirx

from tvm_stitch.graph import TensorInfo

from .elem import Const, Elem, Leaf, Op, Reduce, format_elem, leaves, outer_leaves, replace, walk
from .match import Segment, views
from .moments import depends
from .weights import weight_axis


class NotAffineError(ValueError):
    """The normalization cannot be folded through the weights (the message says why)."""


@dataclasses.dataclass(frozen=True)
class DerivedWeight:
    """A tensor computed from a weight ``B`` of a GEMM and a column factor ``g(k)``.

    Attributes
    ----------
    name : str
        The new tensor.
    kind : {"scaled", "colsum"}
        ``scaled``: ``B'[.., k, ..] = g(k)·B[.., k, ..]``, ``B``'s shape and dtype;
        ``colsum``: ``v[n] = Σ_k g(k)·B[k, n]`` in float32, one value per column of ``B``.
    weight : str
        ``B`` (a weight of the function).
    k_axis : int
        ``B``'s axis along ``k``.
    column : Elem
        ``g(k)``: constants and reads of one-dimensional weights at ``k``.
    k : tirx.Var
        The variable ``column`` uses for ``k``.
    shape : tuple of int
    dtype : str
    """

    name: str
    kind: str
    weight: str
    k_axis: int
    column: Elem
    k: object
    shape: tuple
    dtype: str


def _reads_outside_reductions(elem: Elem, tensor: str) -> bool:
    return any(leaf.tensor == tensor for leaf in outer_leaves(elem))


def _terms(e: Elem, x: Leaf) -> list[tuple[list, int]]:
    """``e`` as ``Σ Π factors · x^degree``, casts seen through: ``[(factors, degree)]``."""
    if isinstance(e, Leaf) and e.tensor == x.tensor:
        if e.key()[2] != x.key()[2]:
            raise NotAffineError(f"{x.tensor} is read at two positions")
        return [([], 1)]
    if not _reads_outside_reductions(e, x.tensor):
        return [([e], 0)]
    if isinstance(e, Op) and e.op == "cast":
        return _terms(e.args[0], x)
    if isinstance(e, Op) and e.op in ("add", "sub"):
        left, right = (_terms(a, x) for a in e.args)
        if e.op == "sub":
            right = [([Const(-1.0, "float32"), *f], d) for f, d in right]
        return left + right
    if isinstance(e, Op) and e.op == "neg":
        return [([Const(-1.0, "float32"), *f], d) for f, d in _terms(e.args[0], x)]
    if isinstance(e, Op) and e.op == "mul":
        return [(f1 + f2, d1 + d2) for f1, d1 in _terms(e.args[0], x)
                for f2, d2 in _terms(e.args[1], x)]
    if isinstance(e, Op) and e.op == "div" and not _reads_outside_reductions(e.args[1], x.tensor):
        inv = Op("div", (Const(1.0, "float32"), _f32(e.args[1])), "float32")
        return [([*f, inv], d) for f, d in _terms(e.args[0], x)]
    raise NotAffineError(f"{e.op if isinstance(e, Op) else type(e).__name__} of "
                         f"{x.tensor} is not a polynomial in it")


def _f32(e: Elem) -> Elem:
    if isinstance(e, Const):
        return Const(e.value, "float32")
    return e if e.dtype == "float32" else Op("cast", (e,), "float32")


def _product(factors: list) -> Elem:
    out = None
    for factor in factors:
        f = _f32(factor)
        if isinstance(f, Const) and f.value == 1.0:
            continue
        out = f if out is None else Op("mul", (out, f), "float32")
    return out if out is not None else Const(1.0, "float32")


def _sum(parts: list) -> Elem:
    out = parts[0]
    for p in parts[1:]:
        out = Op("add", (out, p), "float32")
    return out


def affine_parts(prologue: Elem, x: Leaf, k) -> tuple:
    """``(r, g, [(c_i, h_i)])`` with ``prologue = r·g·x + Σ_i c_i·h_i``: ``r`` and ``c_i`` free
    of ``k`` (row factors: statistics, constants), ``g`` and ``h_i`` depending on ``k`` only.

    Raises
    ------
    NotAffineError
        When the prologue is no such function of ``x`` (``x`` squared, inside a GELU, ...) or a
        coefficient varies with both the row and ``k``.
    """
    rows: dict = {}  # degree -> {row factor key: (row factor, [column factors])}
    for factors, degree in _terms(prologue, x):
        if degree > 1:
            raise NotAffineError(f"{x.tensor} appears squared")
        row, col = [], []
        for f in factors:
            if depends(f, k.name):
                if any(isinstance(e, Reduce) for e in walk(f)) or any(
                        not all(isinstance(i, tirx.IntImm) or i.same_as(k) for i in leaf.index)
                        for leaf in leaves(f)):
                    raise NotAffineError(f"{format_elem(f)} varies with the row and k")
                col.append(f)
            else:
                row.append(f)
        r = _product(row)
        group = rows.setdefault(degree, {})
        group.setdefault(r.key(), (r, []))[1].append(_product(col))
    linear = rows.get(1, {})
    if len(linear) != 1:
        raise NotAffineError(f"{len(linear)} different row factors multiply {x.tensor}")
    ((r, gs),) = linear.values()
    consts = [(c, _sum(hs)) for c, hs in rows.get(0, {}).values()]
    return r, _sum(gs), consts


def _digest(elem: Elem) -> str:
    return hashlib.sha1(repr(elem.key()).encode()).hexdigest()[:8]


def fold_through_weights(graph, match, weights) -> tuple:
    """``(match', [DerivedWeight])``: a GEMM whose ``A`` is a normalization (``prologue``)
    rewritten to read the normalization's input with scaled weights and finish it in its
    epilogue (the new tensors also appended to its ``derived``); raises
    :class:`NotAffineError` when it cannot.

    Parameters
    ----------
    graph : TensorDependencyGraph
        Receives the derived tensors (their names, shapes, dtypes).
    match : Match
        A finalized GEMM match with a prologue.
    weights : collection of str
        Graph tensors that are weights (parameters past ``num_input``).
    """
    a = match.accesses["a"]
    x = Leaf(a.tensor, tuple(a.index), graph.tensors[a.tensor].dtype)
    if x.dtype != match.dtype:
        raise NotAffineError(f"{x.tensor} is {x.dtype}, the products {match.dtype}")
    k = match.frame.vars["k"]
    r, g, consts = affine_parts(match.prologue, x, k)
    columns = [g, *(h for _, h in consts)]
    for leaf in (leaf for c in columns for leaf in leaves(c)):
        if leaf.tensor not in weights or len(graph.tensors[leaf.tensor].shape) != 1:
            raise NotAffineError(f"the column factor reads {leaf.tensor}, not a 1-D weight")
    derived, segments = [], []
    for si, seg in enumerate(match.segments):
        products, extra = [], {}
        for pi, (acc, b) in enumerate(seg.products):
            view = match.views[f"b{si}.{pi}"]
            n_axis = weight_axis(view, match.frame.extents["k"], seg.n)
            if b.tensor not in weights or n_axis is None:
                raise NotAffineError(f"{b.tensor} is not a whole 2-D weight")
            axis = 1 - n_axis  # B's axis along k
            info = graph.tensors[b.tensor]
            scaled = DerivedWeight(f"{b.tensor}__scaled_{_digest(g)}", "scaled", b.tensor, axis,
                                   g, k, tuple(info.shape), info.dtype)
            vectors = [DerivedWeight(f"{b.tensor}__colsum_{_digest(h)}", "colsum", b.tensor,
                                     axis, h, k, (info.shape[1 - axis],), "float32")
                       for _, h in consts]
            for d in (scaled, *vectors):
                derived.append(d)
                graph.tensors[d.name] = TensorInfo(d.name, d.shape, d.dtype, "global")
            products.append((acc, dataclasses.replace(b, tensor=scaled.name)))
            extra[acc] = vectors

        def finish(e, extra=extra):
            if not (isinstance(e, Leaf) and e.tensor in extra):
                return None
            n = e.index[-1]
            out = Op("mul", (r, e), "float32") if not (isinstance(r, Const) and r.value == 1) \
                else e
            for (c, _), v in zip(consts, extra[e.tensor]):
                out = Op("add", (out, Op("mul", (c, Leaf(v.name, (n,), "float32")), "float32")),
                         "float32")
            return out if e.dtype == "float32" else Op("cast", (out,), e.dtype)

        outputs = [dataclasses.replace(o, elem=replace(o.elem, finish)) for o in seg.outputs]
        segments.append(Segment(seg.n, products, outputs, seg.covered))
    new = dataclasses.replace(match, segments=segments, prologue=None,
                              accesses={**match.accesses, "a": a},
                              derived=(*match.derived, *derived))
    new.views = views(graph, new)
    return new, derived
