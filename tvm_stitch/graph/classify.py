"""Op kinds of TIR blocks (FusionStitching §4.1, SOUFFLE §5.3).

One block is one tensor-expression computation.  Its kind is decided from what the block computes
(its stored value), its reduction variables and its access maps, never from op names, so it works
the same for blocks that came from ``relax.nn.layer_norm``, from ops written one by one, or from
an importer.
"""

from __future__ import annotations

import enum

from tvm import ir
from tvm.ir.prim import expr as P

from .access import AccessMap, Dependence
from .tir_walk import iter_exprs

#: SOUFFLE's compute/memory threshold: arithmetic operations per element read or written (§5.3).
COMPUTE_MEMORY_THRESHOLD = 3.0

#: Intrinsics FusionStitching treats as expensive element-wise ops (sub-root candidates).
EXPENSIVE_INTRINSICS = frozenset(
    f"tirx.{name}"
    for name in (
        "exp",
        "exp2",
        "exp10",
        "log",
        "log2",
        "log10",
        "log1p",
        "tanh",
        "erf",
        "sigmoid",
        "sqrt",
        "rsqrt",
        "pow",
        "sin",
        "cos",
        "tan",
        "atan",
        "asin",
        "acos",
        "sinh",
        "cosh",
        "fmod",
    )
)

_ARITH = (P.Add, P.Sub, P.Mul, P.Div, P.Mod, P.FloorDiv, P.FloorMod, P.Min, P.Max, P.Select)
_COMPARE = (P.LT, P.LE, P.GT, P.GE, P.EQ, P.NE, P.And, P.Or, P.Not)


class OpKind(str, enum.Enum):
    """What a block is, for fusion decisions."""

    LIGHT_ELEMWISE = "light-elementwise"
    EXPENSIVE_ELEMWISE = "expensive-elementwise"
    ROW_REDUCE = "row-reduce"
    COLUMN_REDUCE = "column-reduce"
    BROADCAST = "broadcast"
    INJECTIVE = "injective"
    COMPUTE_INTENSIVE = "compute-intensive"
    OPAQUE = "opaque"

    @property
    def memory_intensive(self) -> bool:
        """Everything but GEMM/BMM/conv and opaque calls."""
        return self not in (OpKind.COMPUTE_INTENSIVE, OpKind.OPAQUE)


def count_flops(value) -> tuple[int, bool]:
    """Arithmetic operations in one evaluation of ``value`` and whether any of them is expensive.

    Casts, loads and constants are free; a float division counts as expensive, as in
    FusionStitching's classification.
    """
    flops, expensive = 0, False
    for node in iter_exprs(value):
        if isinstance(node, ir.expr.Call):
            op_name = getattr(node.op, "name", "")
            if op_name in EXPENSIVE_INTRINSICS:
                flops, expensive = flops + 1, True
            elif op_name not in ("tirx.if_then_else", "tirx.reinterpret", "tirx.likely"):
                flops += 1
        elif isinstance(node, _ARITH):
            flops += 1
            if isinstance(node, P.Div) and "float" in str(node.ty):
                expensive = True
        elif isinstance(node, _COMPARE):
            flops += 1
    return flops, expensive


def classify(
    value,
    inputs: list[AccessMap],
    reduce_vars: list,
    flops_per_iter: int,
    expensive: bool,
    ratio: float,
) -> tuple[OpKind, str]:
    """Return ``(kind, detail)`` for a block.

    Parameters
    ----------
    value : PrimExpr
        The stored value (the reduction update for a reduction block).
    inputs : list of AccessMap
        Access maps of the block's inputs (the reduction accumulator excluded).
    reduce_vars : list of tvm.tirx.IterVar
        The block's reduction variables.
    flops_per_iter, expensive : int, bool
        From :func:`count_flops`.
    ratio : float
        Compute/memory ratio of the block (operations per element read or written).
    """
    if reduce_vars:
        if ratio >= COMPUTE_MEMORY_THRESHOLD and _is_multiply_accumulate(value, inputs):
            return OpKind.COMPUTE_INTENSIVE, _ci_detail(inputs, reduce_vars)
        swept = [m for m in inputs if m.dependence is Dependence.ONE_TO_MANY]
        return (
            OpKind.ROW_REDUCE if all(_reduces_trailing(m) for m in swept) else OpKind.COLUMN_REDUCE
        ), "reduce"
    if any(m.dependence is Dependence.DATA_DEPENDENT for m in inputs):
        return OpKind.INJECTIVE, "gather"
    if flops_per_iter == 0:
        return _data_movement(value, inputs)
    if expensive:
        return OpKind.EXPENSIVE_ELEMWISE, "elementwise"
    return OpKind.LIGHT_ELEMWISE, "elementwise"


def _data_movement(value, inputs: list[AccessMap]) -> tuple[OpKind, str]:
    """A block that only moves (and maybe casts) data: copy, cast, broadcast, transpose, ..."""
    if any(
        getattr(n.op, "name", "") == "tirx.if_then_else"
        for n in iter_exprs(value)
        if isinstance(n, ir.expr.Call)
    ):
        return OpKind.INJECTIVE, "select"  # concat, pad
    if not inputs:
        return OpKind.LIGHT_ELEMWISE, "fill"
    access = inputs[0]
    if access.is_identity:
        return OpKind.LIGHT_ELEMWISE, ("cast" if isinstance(value, P.Cast) else "copy")
    if access.is_broadcast:
        return OpKind.BROADCAST, "broadcast"
    if access.quasi_affine:
        return OpKind.INJECTIVE, "reshape"
    m = access.matrix
    if m is not None and _is_permutation(m) and not any(access.offset):
        rank_changed = len(m) != access.n_spatial
        return OpKind.INJECTIVE, ("reshape" if rank_changed else "transpose")
    if m is not None and _is_diagonal(m):
        return OpKind.INJECTIVE, "slice"
    return OpKind.INJECTIVE, "reshape"


def _is_multiply_accumulate(value, inputs: list[AccessMap]) -> bool:
    """``acc + a * b`` with two swept inputs: GEMM, BMM, convolution."""
    swept = [m for m in inputs if m.dependence is Dependence.ONE_TO_MANY]
    has_mul = any(isinstance(n, P.Mul) for n in iter_exprs(value))
    return has_mul and len({m.tensor for m in swept}) >= 2


def _ci_detail(inputs: list[AccessMap], reduce_vars: list) -> str:
    swept = [m for m in inputs if m.dependence is Dependence.ONE_TO_MANY]
    if any(_has_window(m) for m in swept):
        return "conv"
    # a batch variable indexes every operand (attention's Q·K^T); a linear layer's weight has none
    shared = set.intersection(*({v for names in m.dim_vars for v in names} for m in swept))
    first = swept[0]
    spatial = {v for v, e in zip(first.out_vars[: first.n_spatial], first.extents) if e > 1}
    return "bmm" if shared & spatial else "gemm"


def _has_window(m: AccessMap) -> bool:
    """A dimension indexed by a spatial and a reduction variable together (a sliding window)."""
    reduce_names = {name for name, _, _ in m.reduce_region}
    return any(set(names) & reduce_names and set(names) - reduce_names for names in m.dim_vars)


def _reduces_trailing(m: AccessMap) -> bool:
    """The reduction variables index only the innermost dimensions of size > 1 of the input."""
    reduce_names = {name for name, _, _ in m.reduce_region}
    dims = [names for names, size in zip(m.dim_vars, m.shape) if size > 1]
    swept = [i for i, names in enumerate(dims) if reduce_names & set(names)]
    return swept == list(range(len(dims) - len(swept), len(dims)))


def _is_permutation(matrix) -> bool:
    return all(sorted(row) == [0] * (len(row) - 1) + [1] for row in matrix) and all(
        sum(col) <= 1 for col in zip(*matrix)
    )


def _is_diagonal(matrix) -> bool:
    return all(all(c == 0 for j, c in enumerate(row) if j != i) for i, row in enumerate(matrix))
