"""Symbolic extents analysed at one point of their ranges (issue 48).

A Relax function may keep dims symbolic (``R.Tensor(("batch", "seq", 768))``) and say their
ranges in TVM's own attributes, ``tir_var_lower_bound`` / ``tir_var_upper_bound``
(``from_exported_program`` writes them from ``torch.export``'s ``Dim`` ranges).  The tensor
graph, the recognizers and the kernel plans count elements, rows and bytes; they read such a
function at its **representative point**, every dim at its upper bound — the largest rows a plan
must keep on chip, as TensorRT's optimisation profiles plan at a given shape — and what they
decide is applied to the symbolic functions themselves: ``FuseTIR`` merges the symbolic
PrimFuncs, schedules split symbolic loops with guards, and TVM checks every step.

Sizes are read at the point; **equalities** of extents never are: :class:`Extent` compares two
symbolic extents by their simplified expressions, so ``seq`` at 512 is not taken for a static
512 (a row space of ``(batch, seq)`` never matches one of ``(batch, 512)``).

A dim with no range (a data-dependent size) has no point: what it shapes stays unanalysed, as
before.  Variables are matched by name: TVM's legalization and ``FuseTIR`` name a PrimFunc's
shape variables after the Relax function's, and the graph checks, call by call, that the
specialized PrimFunc's buffers have the shapes of the tensors the call passes.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax, sym, tirx


def shape_vars(func: relax.Function) -> dict:
    """The symbolic dims of ``func``'s parameters, by name."""
    out = {}
    for param in func.params:
        ty = param.ty
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            out.update({d.name: d for d in ty.shape.values if isinstance(d, tirx.Var)})
    return out


def var_ranges(func: relax.Function) -> dict:
    """``{name: (lower, upper)}`` of the symbolic dims whose range ``func``'s attributes give
    (a missing lower bound is 0, a dim's least size)."""
    attrs = func.attrs or {}
    upper = attrs.get("tir_var_upper_bound", None) or {}
    lower = attrs.get("tir_var_lower_bound", None) or {}
    return {str(k): (int(lower[k]) if k in lower else 0, int(v)) for k, v in upper.items()}


def representative(func) -> dict[str, int]:
    """``{name: size}``: the point where ``func``'s symbolic dims are analysed, each at the
    upper bound of its range; dims without a range are left out (empty for a static function
    or anything but a Relax function)."""
    if not isinstance(func, relax.Function):
        return {}
    dims = shape_vars(func)
    return {n: hi for n, (lo, hi) in var_ranges(func).items() if n in dims and 1 <= lo <= hi}


def module_point(mod: tvm.IRModule) -> dict[str, int]:
    """The representative points of ``mod``'s Relax functions together (a name two functions
    place differently is left out)."""
    out, clash = {}, set()
    for func in mod.functions.values():
        for name, value in representative(func).items():
            if out.setdefault(name, value) != value:
                clash.add(name)
    return {n: v for n, v in out.items() if n not in clash}


def value_at(expr, point: dict) -> int | None:
    """The integer ``expr`` is at ``point`` (variables by name), or None when a variable of it
    has no value there."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, tirx.IntImm):
        return int(expr)
    if not point:
        return None
    free = {v.name: v for v in tirx.analysis.undefined_vars(expr)}
    if any(n not in point for n in free):
        return None
    analyzer = sym.Analyzer()
    for name, var in free.items():
        analyzer.bind(var, tirx.const(point[name], _dtype(var)))
    value = analyzer.simplify(expr)
    return int(value) if isinstance(value, tirx.IntImm) else None


def _dtype(var) -> str:
    """An integer expression's dtype (``.dtype`` is a buffer variable's only)."""
    return str(var.ty)


def dims_at(dims, point: dict) -> tuple[int, ...] | None:
    """``dims`` as ints at ``point``, or None when one has no value there."""
    out = []
    for d in dims:
        v = value_at(d, point)
        if v is None:
            return None
        out.append(v)
    return tuple(out)


def is_symbolic(dims) -> bool:
    """Whether any of ``dims`` is not a constant."""
    return any(not isinstance(d, (int, tirx.IntImm)) for d in dims)


def specialize(func: tirx.PrimFunc, point: dict) -> tirx.PrimFunc | None:
    """``func`` with its symbolic shape variables bound to their values at ``point`` (by
    name), or None when one of them has none there or TVM's ``specialize`` refuses.

    Scalar parameters (a call's shape arguments) take their values; a buffer parameter whose
    dims are variables or constants binds its variables, and TVM's ``PrimFunc.specialize``
    substitutes them everywhere.  A buffer with a composite dim (``s * 2``) binds in a later
    round, once the variables of the composite are constants."""
    if not point:
        return None
    for _ in range(4):
        mapping = {}
        for param in func.params:
            if hasattr(param, "shape"):
                dims = list(param.shape)
                if not is_symbolic(dims) or not all(isinstance(d, (tirx.Var, tirx.IntImm))
                                                    for d in dims):
                    continue
                values = dims_at(dims, point)
                if values is None:
                    return None
                shape = [tirx.IntImm(_dtype(d), v) for d, v in zip(dims, values)]
                mapping[param] = tirx.decl_buffer(shape, param.dtype, param.name)
            elif _dtype(param).startswith("int"):
                if param.name not in point:
                    return None
                mapping[param] = tirx.IntImm(_dtype(param), point[param.name])
        if not mapping:
            break
        try:
            func = func.specialize(mapping)
        except Exception:  # noqa: BLE001 - TVM refuses the binding: the function stays opaque
            return None
    return func


def call_types(call) -> list:
    """The types of a ``call_tir``'s tensors: its tensor arguments' (TVM 0.27 passes shape
    scalars in the same tuple), then its outputs'."""
    out = call.ty_args[0]
    outs = list(out.fields) if isinstance(out, tvm.ir.TupleType) else [out]
    return [a.ty for a in call.args[1].fields if not isinstance(a.ty, tvm.ir.PrimType)] + outs


def call_point(func: tirx.PrimFunc, call, point: dict) -> dict:
    """``point`` as ``func`` sees it when ``call`` (a ``call_tir`` of it) calls it: a
    parameter's variable takes the value of what the call passes in its place (one PrimFunc
    may serve calls of different dims — an ``arange`` of ``seq`` and one of ``batch``); other
    names keep theirs."""
    local = dict(point)
    scalars = [a for a in call.args[1].fields if isinstance(a.ty, tvm.ir.PrimType)]
    buffers = [p for p in func.params if hasattr(p, "shape")]
    names = [p for p in func.params if not hasattr(p, "shape")]
    for param, ty in zip(buffers, call_types(call)):
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            continue
        for dim, given in zip(param.shape, ty.shape.values):
            value = value_at(given, point)
            if isinstance(dim, tirx.Var) and value is not None:
                local[dim.name] = value
    for param, given in zip(names, scalars):
        value = value_at(given, point)
        if value is not None:
            local[param.name] = value
    return local


class Extent:
    """A symbolic extent: its size at the point for sizes and orderings (``<``, ``int()``),
    its expression for equality — equal to another extent only when TVM proves the two
    expressions equal for every value of their variables, never equal to an int.  Products
    (``math.prod`` of a shape) stay extents."""

    __slots__ = ("expr", "value")

    def __init__(self, expr, value: int):
        self.expr = sym.Analyzer().simplify(expr)
        self.value = value

    @staticmethod
    def of(dim, point: dict):
        """``dim`` as an int when constant, an :class:`Extent` when symbolic, None when it
        has no value at ``point``."""
        if isinstance(dim, (int, Extent)):
            return dim
        if isinstance(dim, tirx.IntImm):
            return int(dim)
        value = value_at(dim, point)
        return None if value is None else Extent(dim, value)

    def __eq__(self, other):
        if isinstance(other, Extent):
            return self.value == other.value and (
                tvm_ffi.structural_equal(self.expr, other.expr)
                or sym.Analyzer().can_prove_equal(self.expr, other.expr))
        return False

    def __hash__(self):
        return hash(self.value)  # equal extents have equal sizes

    def __mul__(self, other):
        if isinstance(other, Extent):
            expr, value = self.expr * other.expr, self.value * other.value
        elif isinstance(other, int):
            expr, value = self.expr * other, self.value * other
        else:
            return NotImplemented
        expr = sym.Analyzer().simplify(expr)
        return int(expr) if isinstance(expr, tirx.IntImm) else Extent(expr, value)

    __rmul__ = __mul__

    def __int__(self):
        return self.value

    def __lt__(self, other):
        return self.value < int(other)

    def __le__(self, other):
        return self.value <= int(other)

    def __gt__(self, other):
        return self.value > int(other)

    def __ge__(self, other):
        return self.value >= int(other)

    def __repr__(self):
        return str(self.expr)


def shape_at(ty, point: dict) -> tuple | None:
    """A Relax tensor type's shape, constants as ints and symbolic dims as :class:`Extent`
    (sized at ``point``); None when it is not a tensor of known rank or a dim has no value
    at ``point``."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = tuple(Extent.of(d, point) for d in ty.shape.values)
    return None if any(d is None for d in dims) else dims
