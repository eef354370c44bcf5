"""SOUFFLE's element-wise dependence (§5.2) for one input of one TIR block.

For a block with spatial iteration variables ``v`` (the output element) and reduction variables
``r``, each input access ``B[f_0(v, r), ..., f_m(v, r)]`` is one of:

* **one-relies-on-one** — no reduction variable appears: each output element needs one input
  element.  When every ``f_i`` is affine the map is ``M·v + c`` with ``M`` an integer matrix of
  shape ``(input rank, output rank)`` (row ``i`` holds the coefficients of ``f_i``).  Reshapes give
  *quasi-affine* maps (``floordiv``/``floormod`` by constants); those keep their expressions and
  have no matrix.
* **one-relies-on-many** — reduction variables appear: each output element needs the region the
  reduction variables sweep (``reduce_region``); the affine part over ``v`` and ``r`` is kept as a
  matrix over ``v ++ r``.
* **data-dependent** — an index loads from another buffer (gather/take): no static map.
"""

from __future__ import annotations

import dataclasses
import enum

from tvm import ir, sym
from tvm.ir.prim import expr as P

from .tir_walk import loads_in_index


class Dependence(str, enum.Enum):
    """How an output element depends on an input tensor."""

    ONE_TO_ONE = "one-relies-on-one"
    ONE_TO_MANY = "one-relies-on-many"
    DATA_DEPENDENT = "data-dependent"


@dataclasses.dataclass(frozen=True)
class AccessMap:
    """Element-wise dependence of a block's output on one input tensor.

    Attributes
    ----------
    tensor : str
        Name of the input tensor in the graph.
    dependence : Dependence
        One-relies-on-one, one-relies-on-many or data-dependent.
    out_vars : tuple of str
        Names of the block's spatial variables (the output index ``v``), then its reduction
        variables.
    exprs : tuple of str
        The index expression of each input dimension, simplified over the iteration domain.
    matrix : tuple of tuple of int, or None
        ``M`` with ``input index = M·[v, r] + c`` when every dimension is affine; columns follow
        ``out_vars``.  None for quasi-affine or data-dependent accesses.
    offset : tuple of int, or None
        ``c``, with ``matrix``.
    quasi_affine : bool
        Some dimension needs ``floordiv``/``floormod`` by a constant (a reshape).
    reduce_region : tuple of (str, int, int)
        ``(variable, min, extent)`` of each reduction variable this access sweeps.
    dim_vars : tuple of tuple of str
        The block variables each input dimension's index uses.
    extents : tuple of int
        Extent of each variable of ``out_vars``.
    shape : tuple of int
        Shape of the accessed tensor.
    footprint : int
        Distinct input elements touched over the whole iteration domain (upper bound).
    """

    tensor: str
    dependence: Dependence
    out_vars: tuple[str, ...]
    exprs: tuple[str, ...]
    matrix: tuple[tuple[int, ...], ...] | None
    offset: tuple[int, ...] | None
    quasi_affine: bool
    reduce_region: tuple[tuple[str, int, int], ...]
    dim_vars: tuple[tuple[str, ...], ...]
    extents: tuple[int, ...]
    shape: tuple[int, ...]
    footprint: int

    @property
    def n_spatial(self) -> int:
        """Number of output (spatial) variables."""
        return len(self.out_vars) - len(self.reduce_region)

    @property
    def is_identity(self) -> bool:
        """The input element has the same coordinates as the output element."""
        if self.matrix is None or any(self.offset):
            return False
        rows = len(self.matrix)
        return rows == self.n_spatial and all(
            self.matrix[i][j] == (1 if i == j else 0)
            for i in range(rows)
            for j in range(len(self.out_vars))
            if self.extents[j] > 1  # a variable of extent 1 is the constant 0
        )

    @property
    def is_broadcast(self) -> bool:
        """A spatial variable of extent > 1 does not index the input: one input element feeds
        several output elements."""
        if self.matrix is None:
            return False
        return any(
            self.extents[j] > 1 and all(row[j] == 0 for row in self.matrix)
            for j in range(self.n_spatial)
        )

    def describe(self) -> str:
        """``M·v + c`` in a compact text form, e.g. ``[v1, v0]`` or ``{[v0, k] : 0<=k<64}``."""
        body = f"{self.tensor}[{', '.join(self.exprs)}]"
        if self.reduce_region:
            rng = ", ".join(f"{lo}<={v}<{lo + n}" for v, lo, n in self.reduce_region)
            return f"{{{body} : {rng}}}"
        return body


def analyze_access(
    tensor: str, indices, spatial, reduce, analyzer: sym.Analyzer, shape
) -> AccessMap:
    """Build the :class:`AccessMap` of one buffer access.

    Parameters
    ----------
    tensor : str
        Graph name of the accessed tensor.
    indices : list of PrimExpr
        The access's index expressions.
    spatial, reduce : list of tvm.tirx.IterVar
        The block's spatial and reduction iteration variables.
    analyzer : tvm.sym.Analyzer
        An analyzer with every block variable bound to its domain.
    shape : list of int
        The accessed buffer's shape (bounds the footprint).
    """
    all_vars = [iv.var for iv in spatial] + [iv.var for iv in reduce]
    simplified = [analyzer.simplify(i) for i in indices]
    data_dependent = any(loads_in_index(i) for i in simplified)
    dim_vars = tuple(tuple(sorted({v.name for v in vars_in(i)})) for i in simplified)
    used = {name for names in dim_vars for name in names}
    region = tuple(
        (iv.var.name, int(iv.dom.min), int(iv.dom.extent)) for iv in reduce if iv.var.name in used
    )
    matrix, offset, quasi = None, None, False
    if not data_dependent:
        rows, consts = [], []
        for idx in simplified:
            coeffs = sym.detect_linear_equation(idx, all_vars)
            if len(coeffs) != len(all_vars) + 1 or not all(isinstance(c, P.IntImm) for c in coeffs):
                quasi = quasi or _is_quasi_affine(idx)
                rows = None
                break
            rows.append(tuple(int(c) for c in coeffs[:-1]))
            consts.append(int(coeffs[-1]))
        if rows is not None:
            matrix, offset = tuple(rows), tuple(consts)
        elif not quasi:
            data_dependent = True  # neither affine nor quasi-affine: treat as opaque
    if data_dependent:
        dependence = Dependence.DATA_DEPENDENT
    elif region:
        dependence = Dependence.ONE_TO_MANY
    else:
        dependence = Dependence.ONE_TO_ONE
    return AccessMap(
        tensor=tensor,
        dependence=dependence,
        out_vars=tuple(v.name for v in all_vars),
        exprs=tuple(str(i) for i in simplified),
        matrix=matrix,
        offset=offset,
        quasi_affine=quasi,
        reduce_region=region,
        dim_vars=dim_vars,
        extents=tuple(int(iv.dom.extent) for iv in [*spatial, *reduce]),
        shape=tuple(int(d) for d in shape),
        footprint=_footprint(simplified, shape, analyzer, spatial + reduce),
    )


def vars_in(expr) -> list:
    out, stack = [], [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.expr.Var):
            out.append(node)
        elif isinstance(node, ir.expr.TensorLoad):
            stack.extend(node.indices)
        elif isinstance(node, ir.expr.Call):
            stack.extend(node.args)
        else:
            for field in ("a", "b", "value", "condition", "true_value", "false_value"):
                child = getattr(node, field, None)
                if isinstance(child, ir.expr.Expr):
                    stack.append(child)
    return out


def _is_quasi_affine(expr) -> bool:
    """Built only from variables, integer constants, +, -, *const, floordiv/floormod by const."""
    if isinstance(expr, (ir.expr.Var, P.IntImm)):
        return True
    if isinstance(expr, (P.Add, P.Sub)):
        return _is_quasi_affine(expr.a) and _is_quasi_affine(expr.b)
    if isinstance(expr, P.Mul):
        return (isinstance(expr.a, P.IntImm) and _is_quasi_affine(expr.b)) or (
            isinstance(expr.b, P.IntImm) and _is_quasi_affine(expr.a)
        )
    if isinstance(expr, (P.FloorDiv, P.FloorMod)):
        return isinstance(expr.b, P.IntImm) and _is_quasi_affine(expr.a)
    if isinstance(expr, P.Cast):
        return _is_quasi_affine(expr.value)
    return False


def _footprint(indices, shape, analyzer: sym.Analyzer, iter_vars) -> int:
    """Distinct elements an access can touch: per-dimension index ranges, capped by the shape.

    A data-dependent dimension touches at most as many rows as there are distinct values of the
    variables its index load depends on.
    """
    total = 1
    for idx, size in zip(indices, shape):
        dim = int(size)
        nested = loads_in_index(idx)
        if nested:
            names = {v.name for load in nested for i in load.indices for v in vars_in(i)}
            extent = 1
            for iv in iter_vars:
                if iv.var.name in names:
                    extent *= int(iv.dom.extent)
        else:
            bound = analyzer.const_int_bound(idx)
            extent = int(bound.max_value) - int(bound.min_value) + 1
        total *= max(1, min(dim, extent))
    return total
