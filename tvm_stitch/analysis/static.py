"""Which values of a Relax function depend on no input (SOUFFLE's canonicalization, step one).

Importers build causal and padding masks, position ids and rotary tables from ``arange``, ``full``
and comparisons.  Whatever depends only on static shapes and small constants is a constant of the
compiled model: :func:`static_values` finds those bindings so a pass can evaluate them once, at
compile time.  Weights are never folded: a binding that reads a function parameter, or a constant
larger than :data:`SMALL_CONSTANT_BYTES`, depends on the model's data.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import relax

from tvm_stitch.graph.tdg import dtype_bytes, static_shape

#: Constants up to this size feed folded values (scalars, ``inv_freq``); larger ones are weights.
SMALL_CONSTANT_BYTES = 64 * 1024
#: A folded value larger than this stays a computation (it would bloat the executable).
MAX_FOLDED_BYTES = 64 * 1024 * 1024

#: Operators that must run when the model runs (side effects, external code).
_IMPURE = (
    "relax.call_packed",
    "relax.call_dps_packed",
    "relax.call_pure_packed",
    "relax.call_inplace_packed",
    "relax.print",
    "relax.assert_op",
    "relax.null_value",
)


@dataclasses.dataclass
class StaticValues:
    """Bindings of one dataflow block that depend on no input.

    Attributes
    ----------
    bindings : list of relax.Binding
        Every input-independent binding, in program order.
    frontier : list of relax.Var
        The ones read by input-dependent code or returned: the values to fold into constants.
    skipped : list of (str, str)
        Frontier values left as computations, with the reason (too large, not a tensor).
    """

    bindings: list
    frontier: list
    skipped: list


def static_values(func: relax.Function, block: relax.DataflowBlock) -> StaticValues:
    """The bindings of ``block`` (in ``func``) whose values depend on no input.

    A binding is static when every variable it reads is static, every constant it reads is at
    most :data:`SMALL_CONSTANT_BYTES`, and its operator is pure.  Bindings whose value already is
    a constant are not listed (there is nothing to fold).
    """
    static: set = set()
    bindings = []
    for binding in block.bindings:
        value = binding.value
        if isinstance(value, tvm.ir.expr.Constant):
            if _nbytes(value) <= SMALL_CONSTANT_BYTES:
                static.add(binding.var)
            continue
        if not isinstance(value, (relax.Call, relax.Tuple, relax.TupleGetItem)):
            continue
        if isinstance(value, relax.Call) and getattr(value.op, "name", None) in _IMPURE:
            continue
        if isinstance(value, relax.Call) and not isinstance(value.op, (tvm.ir.Op, relax.GlobalVar)):
            continue
        if not all(v in static for v in relax.analysis.free_vars(value)):
            continue
        if any(_nbytes(c) > SMALL_CONSTANT_BYTES for c in _constants(value)):
            continue
        static.add(binding.var)
        bindings.append(binding)
    listed = {b.var for b in bindings}
    used_outside: set = set()
    for binding in block.bindings:
        if binding.var not in listed:
            used_outside.update(relax.analysis.free_vars(binding.value))
    used_outside.update(relax.analysis.free_vars(func.body.body))
    for binding in block.bindings:
        if binding.var in listed and not isinstance(binding.var, relax.DataflowVar):
            used_outside.add(binding.var)  # an output of the block
    frontier, skipped = [], []
    for binding in bindings:
        var = binding.var
        if var not in used_outside:
            continue
        shape = static_shape(var.ty)
        if shape is None:
            skipped.append((var.name, "not a tensor of static shape"))
        elif math.prod(shape) * dtype_bytes(var.ty.dtype) > MAX_FOLDED_BYTES:
            skipped.append((var.name, f"{shape} is larger than {MAX_FOLDED_BYTES} bytes"))
        else:
            frontier.append(var)
    return StaticValues(bindings, frontier, skipped)


def _constants(expr) -> list:
    out = []

    def visit(e):
        if isinstance(e, tvm.ir.expr.Constant):
            out.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return out


def _nbytes(const) -> int:
    shape = static_shape(const.ty)
    if shape is None:
        return 0
    return math.prod(shape) * dtype_bytes(const.ty.dtype)
