"""Element functions: one element of a tensor as an expression over the tensors it reads.

SOUFFLE lowers a model to tensor expressions and composes one-relies-on-one producers into their
consumers (the vertical TE transformation, §6.2).  :class:`Composer` does that on the tensor
dependency graph: asked for ``T[index]``, it substitutes ``index`` into the TIR block that writes
``T`` and recurses into the tensors that block reads, as far as a policy allows.  What it stops at
is a :class:`Leaf` (a tensor read at a composed, simplified index); a reduction it enters becomes
a :class:`Reduce` over a fresh variable.  Reshapes, transposes, broadcasts and slices disappear
into the indices; a cast, a scale, a mask or a softmax appears as the operators that compute it,
however the front end spelled them.

The result is plain data: recognizers match it (:mod:`tvm_stitch.analysis.recognize`), the
Triton printer prints it (:mod:`tvm_stitch.codegen.elem_printer`) and a TE builder evaluates it
for the reference implementations the CPU tests run.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable

from tvm import ir, sym, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.graph import Node, OpKind, TensorDependencyGraph

from .indexing import UnsupportedExprError, bind, dtype_of, substitute

#: Operators of element expressions: TIR node class -> name
_BINARY = {
    P.Add: "add",
    P.Sub: "sub",
    P.Mul: "mul",
    P.Div: "div",
    P.Min: "min",
    P.Max: "max",
    P.FloorDiv: "floordiv",
    P.FloorMod: "floormod",
    P.EQ: "eq",
    P.NE: "ne",
    P.LT: "lt",
    P.LE: "le",
    P.GT: "gt",
    P.GE: "ge",
    P.And: "and",
    P.Or: "or",
}
#: Bitwise operators on booleans, as the logical operators they are there (``mask & causal``)
_LOGICAL_BITWISE = {P.BitwiseAnd: "and", P.BitwiseOr: "or", P.BitwiseXor: "ne"}
#: TIR intrinsics element expressions keep (by their name without ``tirx.``)
INTRINSICS = frozenset(
    [
        "exp",
        "exp2",
        "log",
        "log2",
        "log1p",
        "erf",
        "tanh",
        "sigmoid",
        "sqrt",
        "rsqrt",
        "pow",
        "fabs",
        "sin",
        "cos",
        "floor",
        "ceil",
        "round",
        "isnan",
        "isinf",
    ]
)


class Elem:
    """Base of element expressions; ``dtype`` is the element type."""

    dtype: str

    def key(self, names=None) -> tuple:
        """A hashable structural key; ``names`` renames reduction variables (str -> str)."""
        raise NotImplementedError

    def children(self) -> tuple:
        return ()


def _index_key(index, names) -> tuple:
    text = tuple(str(i) for i in index)
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    return tuple(pattern.sub(lambda m: names[m.group(1)], t) for t in text)


@dataclasses.dataclass(frozen=True, eq=False)
class Leaf(Elem):
    """``tensor[index]``: a tensor read in place (the composition stopped there)."""

    tensor: str
    index: tuple
    dtype: str

    def key(self, names=None):
        return ("leaf", self.tensor, _index_key(self.index, names), self.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Const(Elem):
    """A scalar constant."""

    value: float
    dtype: str

    def key(self, names=None):
        return ("const", self.value, self.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Iter(Elem):
    """An integer expression of the coordinates used as a value (``i <= j`` masks, iotas)."""

    expr: object
    dtype: str

    def key(self, names=None):
        return ("iter", _index_key((self.expr,), names), self.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class Op(Elem):
    """An operator (``add``, ``mul``, ``select``, ``cast``, ``exp``, ...) applied to ``args``."""

    op: str
    args: tuple
    dtype: str

    def key(self, names=None):
        return ("op", self.op, self.dtype, *(a.key(names) for a in self.args))

    def children(self):
        return self.args


@dataclasses.dataclass(frozen=True, eq=False)
class Reduce(Elem):
    """``op`` (``sum``, ``max``, ``min``) of ``body`` over ``var`` in ``[0, extent)``."""

    op: str
    body: Elem
    var: object
    extent: int
    init: float
    dtype: str

    def key(self, names=None):
        names = dict(names or {})
        names[self.var.name] = f"_r{len(names)}"
        return ("reduce", self.op, self.extent, self.dtype, self.body.key(names))

    def children(self):
        return (self.body,)


def walk(elem: Elem):
    """``elem`` and every sub-expression, pre-order."""
    stack = [elem]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(reversed(e.children()))


def leaves(elem: Elem) -> list[Leaf]:
    """The distinct tensor reads of ``elem`` (by key), in order."""
    out, seen = [], set()
    for e in walk(elem):
        if isinstance(e, Leaf) and e.key() not in seen:
            seen.add(e.key())
            out.append(e)
    return out


def outer_leaves(elem: Elem) -> list[Leaf]:
    """The leaves of ``elem`` outside its reductions."""
    out, stack = [], [elem]
    while stack:
        e = stack.pop()
        if isinstance(e, Leaf):
            out.append(e)
        elif not isinstance(e, Reduce):
            stack.extend(reversed(e.children()))
    return out


def reductions(*elems: Elem | None) -> list[Reduce]:
    """The distinct reductions of ``elems`` (by key; None entries skipped), inner ones first."""
    out, seen = [], set()

    def visit(e):
        for child in e.children():
            visit(child)
        if isinstance(e, Reduce) and e.key() not in seen:
            seen.add(e.key())
            out.append(e)

    for elem in elems:
        if elem is not None:
            visit(elem)
    return out


def size(elem: Elem) -> int:
    return sum(1 for _ in walk(elem))


def replace(elem: Elem, fn: Callable[[Elem], Elem | None]) -> Elem:
    """``elem`` with every sub-expression ``e`` for which ``fn(e)`` is not None replaced by it."""
    new = fn(elem)
    if new is not None:
        return new
    if isinstance(elem, Op):
        return Op(elem.op, tuple(replace(a, fn) for a in elem.args), elem.dtype)
    if isinstance(elem, Reduce):
        return dataclasses.replace(elem, body=replace(elem.body, fn))
    return elem


def offset_erf(elem: Elem) -> Op | None:
    """The ``erf`` that ``elem`` adds to a constant at least half its scale, or None.

    ``elem`` of the form ``c ± s·erf(u)`` — through casts to floating types and multiplications
    by constants, ``|c| ≥ |s| / 2`` (GELU's ``1 + erf(x/√2)`` or ``0.5 + 0.5·erf(x/√2)``,
    however spelled). The sum is rounded at about ``2**-25·|s|`` or coarser, so an ``erf``
    accurate to ``1.1e-7`` absolute (not relative: its values near 0 lose digits) is as good as
    a correctly rounded one there, within two units of that rounding; that is all such a sum
    needs (:func:`tvm_stitch.codegen.triton_kernels._erf_abs`, half the instructions of
    libdevice's ``erff``). A float64 erf is left alone (its sum keeps more digits)."""
    if not isinstance(elem, Op) or elem.op not in ("add", "sub") or "float" not in elem.dtype:
        return None
    for const, other in (elem.args, elem.args[::-1]):
        if not isinstance(const, Const):
            continue
        scale, e = 1.0, other
        while isinstance(e, Op):
            if e.op == "cast" and "float" in e.dtype:
                e = e.args[0]
            elif e.op == "mul" and any(isinstance(a, Const) for a in e.args):
                c, e = e.args if isinstance(e.args[0], Const) else e.args[::-1]
                scale *= float(c.value)
            else:
                break
        if (isinstance(e, Op) and e.op == "erf" and e.dtype != "float64"
                and abs(float(const.value)) >= abs(scale) / 2):
            return e
    return None


def format_elem(elem: Elem) -> str:
    """Readable text of an element expression (for logs and reasons)."""
    if isinstance(elem, Leaf):
        return f"{elem.tensor}[{', '.join(str(i) for i in elem.index)}]"
    if isinstance(elem, Const):
        return repr(elem.value)
    if isinstance(elem, Iter):
        return f"({elem.expr})"
    if isinstance(elem, Reduce):
        return f"{elem.op}_{{{elem.var.name}<{elem.extent}}}({format_elem(elem.body)})"
    args = ", ".join(format_elem(a) for a in elem.args)
    if elem.op == "cast":
        return f"{elem.dtype}({args})"
    return f"{elem.op}({args})"


class CompositionError(ValueError):
    """The composition went somewhere the policy or the analyses do not support."""


@dataclasses.dataclass
class Policy:
    """Which producers a composition inlines.

    Attributes
    ----------
    inline : callable
        ``inline(node) -> bool`` for a node whose output is read.
    reductions : bool
        Whether row reductions may be inlined (a softmax between two products).
    budget : int
        Largest element expression (in nodes) before the composition gives up.
    """

    inline: Callable[[Node], bool]
    reductions: bool = False
    budget: int = 600


#: Node kinds whose blocks compute an element from elements at mapped positions
ELEMENTWISE_KINDS = (
    OpKind.LIGHT_ELEMWISE,
    OpKind.EXPENSIVE_ELEMWISE,
    OpKind.BROADCAST,
    OpKind.INJECTIVE,
)


def data_movement(node: Node) -> bool:
    """A block that only moves data: its value is one load (a reshape, transpose, slice,
    broadcast or copy), no arithmetic, no cast."""
    block = node.block
    return (
        block is not None
        and node.kind in ELEMENTWISE_KINDS
        and node.detail != "gather"
        and isinstance(block.body.value, ir.expr.TensorLoad)
    )


def elementwise(node: Node) -> bool:
    """A block computing each element from elements of its inputs (no reduction, no gather)."""
    return node.block is not None and node.kind in ELEMENTWISE_KINDS and node.detail != "gather"


class Composer:
    """Element functions over one tensor dependency graph.

    Parameters
    ----------
    graph : TensorDependencyGraph
    analyzer : tvm.sym.Analyzer
        Binds the coordinate variables callers compose over; reduction variables the
        composition creates are bound in it too.
    """

    _ids = itertools.count()

    def __init__(self, graph: TensorDependencyGraph, analyzer: sym.Analyzer):
        self.graph = graph
        self.analyzer = analyzer
        self._memo: dict = {}
        # the policies the memo has seen, kept alive: it is keyed by their ids, and a policy
        # made for one call and freed can give its id to another (a composition seen through
        # casts by one policy was once returned for another that stops at them)
        self._policies: dict = {}

    def element(self, tensor: str, index, policy: Policy) -> Elem:
        """``tensor[index]`` composed through the producers ``policy`` inlines.

        Raises
        ------
        CompositionError
            When an expression the analyses do not understand is met, or the budget is exceeded.
        """
        self._budget = policy.budget
        try:
            return self._element(tensor, tuple(self.analyzer.simplify(i) for i in index), policy)
        except UnsupportedExprError as err:
            raise CompositionError(str(err)) from err

    def _element(self, tensor, index, policy) -> Elem:
        self._policies.setdefault(id(policy), policy)
        key = (tensor, tuple(str(i) for i in index), id(policy))
        if key in self._memo:
            return self._memo[key]
        info = self.graph.tensors.get(tensor)
        if info is None:
            raise CompositionError(f"{tensor} is not a tensor of the graph")
        node = self.graph.nodes.get(info.producer) if info.producer else None
        out = None
        if node is not None and node.block is not None and self._inlines(node, policy):
            out = self._inline(node, index, policy)
        if out is None:
            if info.scope == "local":
                kind = f" ({node.kind.value})" if node is not None else ""
                raise CompositionError(
                    f"{tensor}{kind} lives inside a kernel the policy does not enter"
                )
            out = Leaf(tensor, index, info.dtype)
        self._memo[key] = out
        self._budget -= 1
        if self._budget < 0:
            raise CompositionError("the element expression grew past the budget")
        return out

    def _inlines(self, node: Node, policy: Policy) -> bool:
        if node.kind is OpKind.ROW_REDUCE:
            return policy.reductions and policy.inline(node)
        if self.graph.tensors[node.output].scope == "local":
            return elementwise(node)  # inside a kernel the policy entered
        return elementwise(node) and policy.inline(node)

    def _inline(self, node: Node, index, policy) -> Elem | None:
        block = node.block
        store = block.body
        spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
        reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
        if len(store.indices) != len(spatial) or len(index) != len(spatial):
            return None
        if not all(i.same_as(iv.var) for i, iv in zip(store.indices, spatial)):
            return None  # writes somewhere else than its own coordinates
        vmap = {iv.var: i for iv, i in zip(spatial, index)}
        if not reduce:
            return self._convert(store.value, vmap, node, policy)
        if len(reduce) != 1:
            return None
        combiner, src = _split_reduction(store)
        if combiner is None or block.init is None:
            return None
        red = reduce[0]
        var = tirx.Var(f"r{next(self._ids)}", dtype_of(red.var))
        bind(self.analyzer, var, int(red.dom.extent), int(red.dom.min))
        vmap[red.var] = var
        init = block.init.value
        if not isinstance(init, (P.FloatImm, P.IntImm)):
            return None
        body = self._convert(src, vmap, node, policy)
        return Reduce(
            combiner, body, var, int(red.dom.extent), float(init.value), str(store.buffer.dtype)
        )

    def _convert(self, expr, vmap, node: Node, policy) -> Elem:
        if isinstance(expr, ir.expr.TensorLoad):
            tensor = node.tensor_of.get(expr.source)
            if tensor is None:
                raise CompositionError(f"{node.name} reads an unknown buffer")
            index = tuple(self.analyzer.simplify(substitute(i, vmap)) for i in expr.indices)
            return self._element(tensor, index, policy)
        if isinstance(expr, (P.FloatImm, P.IntImm)):
            return Const(_number(expr), dtype_of(expr))
        if _index_only(expr):
            value = self.analyzer.simplify(substitute(expr, vmap))
            if "float" in dtype_of(expr):
                index = _uncast(value)
                return Op("cast", (Iter(index, dtype_of(index)),), dtype_of(expr))
            return Iter(value, dtype_of(expr))
        for cls, name in _BINARY.items():
            if isinstance(expr, cls):
                args = (
                    self._convert(expr.a, vmap, node, policy),
                    self._convert(expr.b, vmap, node, policy),
                )
                return Op(name, args, dtype_of(expr))
        logical = _LOGICAL_BITWISE.get(type(expr)) if dtype_of(expr) == "bool" else None
        if logical is not None:  # on booleans, bitwise and/or/xor are the logical ones
            args = (
                self._convert(expr.a, vmap, node, policy),
                self._convert(expr.b, vmap, node, policy),
            )
            return Op(logical, args, "bool")
        if isinstance(expr, P.Cast):
            return Op("cast", (self._convert(expr.value, vmap, node, policy),), dtype_of(expr))
        if isinstance(expr, P.Not):
            return Op("not", (self._convert(expr.a, vmap, node, policy),), dtype_of(expr))
        if isinstance(expr, P.Select):
            parts = (expr.condition, expr.true_value, expr.false_value)
            args = tuple(self._convert(p, vmap, node, policy) for p in parts)
            return Op("select", args, dtype_of(expr))
        if isinstance(expr, ir.expr.Call):
            name = expr.op.name.removeprefix("tirx.").removeprefix("prim.")
            args = tuple(self._convert(a, vmap, node, policy) for a in expr.args)
            if name == "if_then_else":
                return Op("select", args, dtype_of(expr))
            if name in INTRINSICS:
                return Op(name, args, dtype_of(expr))
            raise CompositionError(f"{node.name}: intrinsic {name} is not supported")
        raise CompositionError(f"{node.name}: {type(expr).__name__} is not supported")


def _number(imm):
    dtype = dtype_of(imm)
    if dtype == "bool":
        return bool(imm.value)
    return float(imm.value) if "float" in dtype else int(imm.value)


def _index_only(expr) -> bool:
    """No loads, and only variables and integers inside (a coordinate expression)."""
    stack = [expr]
    seen_var = False
    while stack:
        e = stack.pop()
        if isinstance(e, ir.expr.TensorLoad):
            return False
        if isinstance(e, ir.expr.Var):
            seen_var = True
        elif isinstance(e, P.FloatImm):
            return False
        elif isinstance(e, ir.expr.Call):
            return False
        for field in ("a", "b", "value", "condition", "true_value", "false_value"):
            child = getattr(e, field, None)
            if isinstance(child, ir.expr.Expr):
                stack.append(child)
    return seen_var


def _uncast(expr):
    while isinstance(expr, P.Cast) and "float" in dtype_of(expr):
        expr = expr.value
    return expr


def _split_reduction(store) -> tuple[str | None, object]:
    """``(combiner, source)`` of a reduction update ``acc = acc ⊕ source``."""
    value = store.value
    kinds = {P.Add: "sum", P.Max: "max", P.Min: "min"}
    for cls, name in kinds.items():
        if isinstance(value, cls):
            for acc, src in ((value.a, value.b), (value.b, value.a)):
                if isinstance(acc, ir.expr.TensorLoad) and acc.source.same_as(store.buffer):
                    return name, src
    return None, None


# -- numeric evaluation ------------------------------------------------------------------------
_NP_BINARY = {
    "add": "add",
    "sub": "subtract",
    "mul": "multiply",
    "div": "divide",
    "min": "minimum",
    "max": "maximum",
    "eq": "equal",
    "ne": "not_equal",
    "lt": "less",
    "le": "less_equal",
    "gt": "greater",
    "ge": "greater_equal",
    "and": "logical_and",
    "or": "logical_or",
    "floordiv": "floor_divide",
    "floormod": "mod",
}
_NP_UNARY = {"exp": "exp", "exp2": "exp2", "log": "log", "log2": "log2", "sqrt": "sqrt",
             "fabs": "abs", "floor": "floor", "ceil": "ceil", "sin": "sin", "cos": "cos",
             "tanh": "tanh", "isnan": "isnan", "isinf": "isinf", "not": "logical_not"}


def evaluate(elem: Elem, coords: dict, read: Callable[[Leaf], object]):
    """``elem`` evaluated with numpy: ``coords`` maps variable names to (broadcastable) integer
    arrays, ``read(leaf)`` returns the values a read stands for.  Reductions are not evaluated
    (``CompositionError``)."""
    import numpy as np

    def index(expr):
        return evaluate_index(expr, coords)

    def value(e):
        if isinstance(e, Const):
            return np.asarray(e.value, dtype=_np_dtype(e.dtype))
        if isinstance(e, Iter):
            return np.asarray(index(e.expr))
        if isinstance(e, Leaf):
            return np.asarray(read(e))
        if isinstance(e, Reduce):
            raise CompositionError("cannot evaluate a reduction")
        args = [value(a) for a in e.args]
        with np.errstate(all="ignore"):
            if e.op == "cast":
                return args[0].astype(_np_dtype(e.dtype))
            if e.op == "select":
                return np.where(*args)
            if e.op == "sigmoid":
                return 1 / (1 + np.exp(-args[0]))
            if e.op == "pow":
                return np.power(*args)
            if e.op in _NP_BINARY:
                return getattr(np, _NP_BINARY[e.op])(*args)
            if e.op in _NP_UNARY:
                return getattr(np, _NP_UNARY[e.op])(*args)
        raise CompositionError(f"cannot evaluate {e.op}")

    return value(elem)


def evaluate_index(expr, coords: dict):
    """An integer (or boolean) index expression evaluated with numpy, ``coords`` as in
    :func:`evaluate`."""
    import numpy as np

    if isinstance(expr, ir.expr.Var):
        return coords[expr.name]
    if isinstance(expr, P.IntImm):
        return int(expr.value)
    ops = {P.Add: np.add, P.Sub: np.subtract, P.Mul: np.multiply, P.FloorDiv: np.floor_divide,
           P.FloorMod: np.mod, P.Min: np.minimum, P.Max: np.maximum, P.EQ: np.equal,
           P.NE: np.not_equal, P.LT: np.less, P.LE: np.less_equal, P.GT: np.greater,
           P.GE: np.greater_equal, P.And: np.logical_and, P.Or: np.logical_or}
    for cls, fn in ops.items():
        if isinstance(expr, cls):
            return fn(evaluate_index(expr.a, coords), evaluate_index(expr.b, coords))
    if isinstance(expr, P.Cast):
        return evaluate_index(expr.value, coords)
    if isinstance(expr, P.Select):
        return np.where(evaluate_index(expr.condition, coords),
                        evaluate_index(expr.true_value, coords),
                        evaluate_index(expr.false_value, coords))
    raise CompositionError(f"cannot evaluate {type(expr).__name__}")


def _np_dtype(dtype: str):
    return "bool" if dtype == "bool" else dtype
