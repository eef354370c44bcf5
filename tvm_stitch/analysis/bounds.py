"""Symbolic dims with their ranges: what a shape expression is once the ranges are known.

A Relax function whose shapes hold symbolic dims may say their ranges in TVM's own attributes,
``tir_var_lower_bound`` and ``tir_var_upper_bound`` (TVM's ``from_exported_program`` writes them
from ``torch.export``'s ``Dim`` ranges).  Shape inference does not read them, so slices of fixed
tables leave ``min(seq, 512)`` where ``seq`` ≤ 512 is ``seq`` (BERT's position ids), and
``min(1, seq)`` where ``seq`` ≥ 2 is 1 (GPT-2's mask): shapes then stop matching and TVM 0.27
cannot build the module.  :func:`bounded_analyzer` knows the ranges; :func:`simplified`,
:func:`slice_in_bounds` and :func:`positive_axes` are what
:class:`~tvm_stitch.passes.BoundSymbolicShapes` asks.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, sym, tirx

from tvm_stitch.graph.specialize import shape_vars, var_ranges

from .indexing import dtype_of

__all__ = ["bounded_analyzer", "positive_axes", "shape_vars", "simplified", "slice_in_bounds",
           "var_ranges"]


def bounded_analyzer(func: relax.Function):
    """An analyzer that knows the ranges of ``func``'s symbolic dims, or None when its
    attributes give none."""
    ranges = var_ranges(func)
    dims = shape_vars(func)
    known = {n: r for n, r in ranges.items() if n in dims and r[0] <= r[1]}
    if not known:
        return None
    analyzer = sym.Analyzer()
    for name, (lo, hi) in known.items():
        analyzer.bind(dims[name], tvm.ir.Range.from_min_extent(lo, hi - lo + 1))
    return analyzer


def _integer(expr) -> bool:
    """An integer expression (TVM 0.27 puts them in Relax tuples and shapes directly)."""
    if isinstance(expr, (relax.Tuple, relax.ShapeExpr, relax.Call)):
        return False
    try:
        return dtype_of(expr).startswith(("int", "uint"))
    except AttributeError:
        return False


def simplified(expr, analyzer):
    """``expr`` (a shape, an integer, or a tuple of them) with its integer expressions
    simplified under the ranges; ``expr`` itself when nothing simplifies."""
    if isinstance(expr, relax.ShapeExpr):
        values = [analyzer.simplify(v) for v in expr.values]
        changed = not all(tvm_ffi.structural_equal(a, b) for a, b in zip(values, expr.values))
        return relax.ShapeExpr(values) if changed else expr
    if isinstance(expr, relax.Tuple):
        fields = [simplified(f, analyzer) for f in expr.fields]
        return relax.Tuple(fields) if any(not a.same_as(b) for a, b in
                                          zip(fields, expr.fields)) else expr
    if _integer(expr):
        value = analyzer.simplify(expr)
        return expr if tvm_ffi.structural_equal(value, expr) else value
    return expr


def _fields(expr) -> list | None:
    if not isinstance(expr, relax.Tuple) or not all(_integer(f) for f in expr.fields):
        return None
    return list(expr.fields)


def positive_axes(call: relax.Call):
    """A ``strided_slice``'s axes counted from the front (TVM 0.27 legalizes a slice of
    symbolic bounds with a negative axis to an out-of-range one), or None when they are
    already, or the input's rank is unknown."""
    axes, ndim = _fields(call.args[1]), getattr(call.args[0].ty, "ndim", -1)
    if axes is None or ndim < 0 or not all(isinstance(a, tirx.IntImm) for a in axes):
        return None
    if all(int(a) >= 0 for a in axes):
        return None
    return relax.Tuple([tirx.const(int(a) + ndim if int(a) < 0 else int(a), "int64")
                        for a in axes])


def slice_in_bounds(call: relax.Call, analyzer) -> bool:
    """Whether a ``strided_slice`` provably stays inside its input on every axis it slices
    (unit strides, ``0 ≤ begin ≤ end ≤ extent`` under the ranges): its output's extents are
    then ``end - begin``, as ``assume_inbound`` lets shape inference say."""
    data, axes, begin, end = call.args[:4]
    strides = _fields(call.args[4]) if len(call.args) > 4 else None
    axes, begin, end = _fields(axes), _fields(begin), _fields(end)
    ty = data.ty
    if None in (axes, begin, end) or not isinstance(ty, relax.TensorType) or not isinstance(
            ty.shape, relax.ShapeExpr):
        return False
    extents = ty.shape.values
    for i, given in enumerate(axes):
        if not isinstance(given, tirx.IntImm):
            return False
        axis = int(given) + len(extents) if int(given) < 0 else int(given)
        if strides is not None and not (isinstance(strides[i], tirx.IntImm)
                                        and int(strides[i]) == 1):
            return False
        b, e, n = begin[i], end[i], extents[axis]
        if not (analyzer.can_prove(b >= 0) and analyzer.can_prove(b <= e)
                and analyzer.can_prove(e <= n)):
            return False
    return True
