"""Index expressions: substitution, and strides of quasi-affine accesses.

A tensor read through a chain of reshapes, transposes, broadcasts and slices is, element for
element, a read of the chain's first tensor at a quasi-affine index (SOUFFLE's one-relies-on-one
maps composed).  When the flat offset of that index is affine in the reader's coordinates, the
chain is a *view*: an offset and one stride per coordinate, which a kernel can read in place.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import ir, sym, tirx
from tvm.ir.prim import expr as P

_BINARY = {
    P.Add: lambda a, b: a + b,
    P.Sub: lambda a, b: a - b,
    P.Mul: lambda a, b: a * b,
    P.FloorDiv: tirx.floordiv,
    P.FloorMod: tirx.floormod,
    P.Div: tirx.div,
    P.Mod: tirx.truncmod,
    P.Min: tirx.min,
    P.Max: tirx.max,
    P.EQ: P.EQ,
    P.NE: P.NE,
    P.LT: P.LT,
    P.LE: P.LE,
    P.GT: P.GT,
    P.GE: P.GE,
    P.And: P.And,
    P.Or: P.Or,
}


class UnsupportedExprError(ValueError):
    """An expression outside what the analyses understand (the message says what)."""


#: The 16-bit floating formats: stored in 16 bits, computed and accumulated in float32
HALF = ("float16", "bfloat16")


def dtype_of(expr) -> str:
    """The dtype of a PrimExpr (calls carry it as their type)."""
    dtype = getattr(expr, "dtype", None)
    return str(dtype) if dtype is not None else str(expr.ty)


def substitute(expr, vmap: dict):
    """``expr`` with the variables of ``vmap`` (Var -> PrimExpr) replaced; loads not entered."""
    if isinstance(expr, ir.expr.Var):
        for var, value in vmap.items():
            if var.same_as(expr):
                want = dtype_of(var)
                return value if dtype_of(value) == want else P.Cast(want, value)
        return expr
    if isinstance(expr, (P.IntImm, P.FloatImm)):
        return expr
    for cls, make in _BINARY.items():
        if isinstance(expr, cls):
            return make(substitute(expr.a, vmap), substitute(expr.b, vmap))
    if isinstance(expr, P.Cast):
        return P.Cast(str(expr.dtype), substitute(expr.value, vmap))
    if isinstance(expr, P.Not):
        return P.Not(substitute(expr.a, vmap))
    if isinstance(expr, P.Select):
        return P.Select(
            substitute(expr.condition, vmap),
            substitute(expr.true_value, vmap),
            substitute(expr.false_value, vmap),
        )
    if isinstance(expr, ir.expr.Call):
        return tirx.call_intrin(str(expr.ty), expr.op, *[substitute(a, vmap) for a in expr.args])
    raise UnsupportedExprError(f"cannot substitute into {type(expr).__name__}: {expr}")


def flat_offset(index, shape):
    """Row-major offset of ``index`` in a tensor of ``shape``."""
    offset = tirx.const(0, "int64")
    stride = 1
    for i, d in reversed(list(zip(index, shape))):
        offset = offset + as_int64(i) * stride
        stride *= int(d)
    return offset


def as_int64(expr):
    """``expr`` as an int64 index expression."""
    return expr if dtype_of(expr) == "int64" else P.Cast("int64", expr)


def linear_in(expr, variables, analyzer: sym.Analyzer) -> tuple[list[int], int] | None:
    """``(coefficients, constant)`` with ``expr == Σ c_i · v_i + constant``, or None."""
    expr = analyzer.simplify(expr)
    coeffs = sym.detect_linear_equation(expr, list(variables))
    if len(coeffs) != len(variables) + 1 or not all(isinstance(c, P.IntImm) for c in coeffs):
        return None
    return [int(c) for c in coeffs[:-1]], int(coeffs[-1])


@dataclasses.dataclass(frozen=True)
class Strided:
    """A tensor read (or written) in place: ``base[offset + Σ strides[a] · coordinate[a]]``.

    Attributes
    ----------
    tensor : str
        The graph tensor holding the memory.
    shape : tuple of int
        That tensor's shape (its buffer is contiguous).
    dtype : str
    offset : int
        Elements from the buffer's start.
    strides : dict of str to int
        Elements per step of each kernel coordinate (0: broadcast along it).
    """

    tensor: str
    shape: tuple
    dtype: str
    offset: int
    strides: tuple  # ((axis, stride), ...), hashable

    @property
    def stride(self) -> dict:
        return dict(self.strides)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def strided(tensor: str, shape, dtype: str, index, axes: dict, analyzer) -> Strided | None:
    """The view of ``tensor[index]`` over kernel coordinates ``axes`` (name -> Var), or None.

    ``index`` is a tuple of PrimExprs over the coordinate variables, which ``analyzer`` bounds.
    The access is a view when its flat offset is affine in them.
    """
    names = list(axes)
    found = linear_in(flat_offset(index, shape), [axes[n] for n in names], analyzer)
    if found is None:
        return None
    coeffs, const = found
    if const < 0 or any(c < 0 for c in coeffs):
        return None
    return Strided(tensor, tuple(int(d) for d in shape), dtype, const, tuple(zip(names, coeffs)))


def bind(analyzer: sym.Analyzer, var, extent: int, start: int = 0) -> None:
    """Bound ``var`` to ``[start, start + extent)`` in ``analyzer``."""
    analyzer.bind(var, tvm.ir.Range.from_min_extent(start, extent))


def new_var(name: str):
    """A fresh int64 index variable."""
    return tirx.Var(name, "int64")
