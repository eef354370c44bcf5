"""Row statistics as sums of moments, for the two-phase reduction of a folded normalization.

A normalization's statistics are sums over a row, some of them of functions of other statistics
(LayerNorm's variance ``Σ_r (x_r - μ)²`` uses the mean ``μ``).  Expanded as polynomials in what
varies along the row, every statistic becomes a combination of *moments* ``Σ_r f(x_r)`` whose
terms depend on ``x`` alone (``Σ x²``, ``Σ x``) with coefficients made of other statistics and
constants: ``Σ (x - μ)² = Σ x² - 2μ Σ x + K μ²``.  Moments of a row can be summed by whoever
writes the row, in pieces (per column chunk), and combined by whoever reads it — the GEMM that
writes ``x`` and the GEMMs that normalize it.
"""

from __future__ import annotations

from .elem import Const, Elem, Iter, Leaf, Op, Reduce, replace, walk


def depends(elem: Elem, name: str) -> bool:
    """Whether ``elem`` varies with the variable called ``name``."""
    from tvm_stitch.graph.access import vars_in

    for e in walk(elem):
        if isinstance(e, Leaf) and any(v.name == name for i in e.index for v in vars_in(i)):
            return True
        if isinstance(e, Iter) and any(v.name == name for v in vars_in(e.expr)):
            return True
    return False


def _mul(a: Elem, b: Elem, dtype: str) -> Elem:
    if isinstance(a, Const) and a.value == 1:
        return b
    if isinstance(b, Const) and b.value == 1:
        return a
    return Op("mul", (a, b), dtype)


def _terms(e: Elem, name: str) -> list[tuple[Elem, Elem | None]]:
    """``e`` as ``Σ coefficient · monomial``: coefficients free of ``name``, monomials free of
    reductions (None: the constant term)."""
    if not depends(e, name):
        return [(e, None)]
    if isinstance(e, Op) and e.op in ("add", "sub"):
        left, right = (_terms(a, name) for a in e.args)
        if e.op == "sub":
            right = [(Op("mul", (Const(-1.0, c.dtype), c), c.dtype), m) for c, m in right]
        return left + right
    if isinstance(e, Op) and e.op == "mul":
        out = []
        for c1, m1 in _terms(e.args[0], name):
            for c2, m2 in _terms(e.args[1], name):
                mono = m2 if m1 is None else m1 if m2 is None else Op("mul", (m1, m2), e.dtype)
                out.append((_mul(c1, c2, e.dtype), mono))
        return out
    if isinstance(e, Op) and e.op == "div" and not depends(e.args[1], name):
        return [(Op("div", (c, e.args[1]), e.dtype), m) for c, m in _terms(e.args[0], name)]
    if any(isinstance(x, Reduce) for x in walk(e)):
        raise ValueError("a statistic inside a function that is not a polynomial")
    return [(Const(1.0, e.dtype), e)]


def as_moments(stat: Reduce) -> tuple[Elem, list[Elem]]:
    """``stat`` (a sum over a row whose inner statistics are already moments) as an element
    over moment placeholders: returns ``(expression, monomials)`` where the expression holds
    ``Reduce("sum", monomial, var, extent)`` for each distinct monomial (the moments) and the
    constant terms scaled by the extent.  Raises ValueError when it is no polynomial in what
    varies along the row."""
    if stat.op != "sum":
        raise ValueError(f"a {stat.op} is no sum of moments")
    name = stat.var.name
    merged: dict = {}
    order = []
    for coeff, mono in _terms(stat.body, name):
        key = mono.key() if mono is not None else None
        if key not in merged:
            merged[key] = []
            order.append((key, mono))
        merged[key].append(coeff)
    parts, monomials = [], []
    for key, mono in order:
        coeffs = merged[key]
        coeff = coeffs[0]
        for c in coeffs[1:]:
            coeff = Op("add", (coeff, c), stat.dtype)
        if mono is None:
            parts.append(Op("mul", (coeff, Const(float(stat.extent), stat.dtype)), stat.dtype))
            continue
        monomials.append(mono)
        moment = Reduce("sum", mono, stat.var, stat.extent, 0.0, stat.dtype)
        parts.append(_mul(coeff, moment, stat.dtype))
    out = parts[0]
    for p in parts[1:]:
        out = Op("add", (out, p), stat.dtype)
    body = stat.body
    if isinstance(body, Op) and body.op == "mul" and body.args[0].key() == body.args[1].key():
        # a sum of squares (a variance) stays one: Σx² - Kμ² may round below zero
        out = Op("max", (out, Const(0.0, stat.dtype)), stat.dtype)
    return out, monomials


def expand_statistics(elem: Elem) -> Elem:
    """``elem`` with every sum over a row rewritten as a combination of moments (inner
    statistics first); ValueError when one is not a polynomial in the row's values."""

    def fn(e):
        if not isinstance(e, Reduce):
            return None
        inner = replace(e.body, fn)
        rebuilt = Reduce(e.op, inner, e.var, e.extent, e.init, e.dtype)
        return as_moments(rebuilt)[0]

    return replace(elem, fn)

