"""Canonicalization before fusion: compile-time values and scans TVM cannot build.

``FoldStaticShapes`` runs first in the stitch pipeline, before TVM's library dispatch: every value
that depends on no input (:func:`tvm_stitch.analysis.static.static_values` — causal and padding
masks built from ``arange``/``full``/comparisons, position ids, rotary tables) is evaluated once
on the CPU and becomes a constant.  Importers build these with ``cumsum`` over ``bool`` and
``index_tensor``, which TVM's ``llvm`` code generator cannot compile (``CreateAdd`` on a boolean)
and its CUDA dispatch turns into scan kernels with symbolic shapes; folded, they are gone.

Constructs TVM 0.27 cannot build are rewritten into equivalent ones it can: a scan over ``bool``
accumulates in ``int32`` and is cast back (what TVM's type for it, ``bool``, says it computes),
comparisons of ``bool`` tensors compare them as ``int8`` (its ``llvm`` backend emits float
compares and adds for ``bool``), ``full`` with an infinite value becomes a ``broadcast_to``
of that constant (its legalization fails on infinities), and a power by a small integer constant
becomes multiplications (TVM's CUDA ``power`` returns NaN for negative bases: RMSNorm's ``x²``,
GELU's ``x³``), and a concatenation leaves out its empty parts (Phi-3's rotary embedding joins
the rotated head to its empty pass-through part; TVM's GPU schedules fail on loops of no
iteration).

A gather whose indices are ``arange``s over the axes of its input, in their order, reads it in
place and becomes a reshape (Hugging Face's padding mask, ``mask[batch_idx, kv_idx]``: with a
symbolic batch or length, a kernel copying the mask).

A row gather whose indices are known whatever their number is a slice or a broadcast row:
``0, 1, ..., n-1`` in order (position ids: a buffer of ``arange`` gathered by ``arange(seq)``)
reads the first ``n`` rows; one value everywhere (token-type ids of a zero buffer) reads that
row.

A cast of a table that is then gathered is applied to the gathered rows instead:
``take(astype(W), i)`` becomes ``astype(take(W, i))`` (``ToMixedPrecision`` keeps embeddings in
float32, which otherwise converts a whole embedding table on every call).  A gather in ``fast``
mode (``nn.Embedding``'s and PyTorch indexing's; no bounds check: an index out of range reads
outside the table, and TVM warns of a segfault at every legalization) wraps its indices instead
(``wrap``): a negative index counts from the end, as PyTorch's indexing counts it, and any
index stays inside the table (PyTorch raises for one outside; ``from_torch`` can check token
ids).

Nothing is folded when evaluation fails; the reason is logged and the function is left as it was.

``BoundSymbolicShapes`` runs before it: in a function whose symbolic dims have ranges (TVM's
``tir_var_lower_bound``/``tir_var_upper_bound``, which ``from_exported_program`` writes from
``torch.export``'s ``Dim`` ranges), shapes and values are simplified under those ranges and a
slice that provably stays inside its input says so (``assume_inbound``), so shape inference
gives ``seq`` where it gave ``min(seq, 512)``; a slice's negative axes are counted from the front
(TVM's legalization of a slice with symbolic bounds takes no negative axis;
:mod:`tvm_stitch.analysis.bounds`).
"""

from __future__ import annotations

import logging
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from tvm_stitch.analysis.bounds import (
    bounded_analyzer,
    positive_axes,
    simplified,
    slice_in_bounds,
)
from tvm_stitch.analysis.static import static_values
from tvm_stitch.errors import error_line
from tvm_stitch.graph.tdg import static_shape

from .module import replace_functions

logger = logging.getLogger("tvm_stitch.canonicalize")

_KERNEL_ATTRS = ("Primitive", "Composite", "Codegen")


@tvm.transform.module_pass(opt_level=0, name="StitchFoldStaticShapes")
class FoldStaticShapes:
    """Fold values that depend on no input into constants; rewrite what TVM cannot build."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = _each_function(mod, lambda name, func: _fold(mod, name, _rewrites(func)))
        if out is mod:
            return mod
        # folded values feed their readers as constants (a scalar becomes an immediate in TIR)
        try:
            out = relax.transform.FoldConstant()(out)
        except Exception as err:  # noqa: BLE001 - TVM's folding failed: keep the bindings
            logger.warning("fold: constants not propagated: %r", err)
        # constants that only now reach their readers (a cast exponent): rewrite those too
        out = _each_function(out, lambda _name, func: _rewrites(func))
        return relax.transform.DeadCodeElimination()(out)


@tvm.transform.module_pass(opt_level=0, name="StitchBoundSymbolicShapes")
class BoundSymbolicShapes:
    """Simplify shapes under the ranges of a function's symbolic dims (the module docstring)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        out = _each_function(mod, _bounded, "bound")
        # a slice replaced by its gather leaves an alias of the gather
        return out if out is mod else relax.transform.CanonicalizeBindings()(out)


_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")


def _bounded(name, func):
    analyzer = bounded_analyzer(func)
    if analyzer is None:
        return func
    mutator = _Bounded(analyzer)
    out = mutator.visit_expr(func)
    if mutator.count:
        logger.info("bound: %s: %d shapes simplified under the ranges of its symbolic dims",
                    name, mutator.count)
    return out if mutator.count else func


@relax.expr_functor.mutator
class _Bounded(relax.PyExprMutator):
    """Calls re-made with their shapes and values simplified under the ranges; their types
    inferred again."""

    def __init__(self, analyzer):
        super().__init__()
        self.analyzer = analyzer
        self.count = 0

    def visit_call_(self, call):
        if isinstance(call.op, tvm.ir.Op) and not call.op.name.startswith("relax."):
            return call  # an integer expression (a shape's): simplified with its shape
        call = super().visit_call_(call)
        args = [simplified(a, self.analyzer) for a in call.args]
        changed = any(not a.same_as(b) for a, b in zip(args, call.args))
        new = relax.Call(call.op, args, call.attrs, call.ty_args) if changed else call
        if new.op.same_as(_STRIDED_SLICE):
            axes = positive_axes(new)
            inbound = bool(new.attrs.assume_inbound) or slice_in_bounds(new, self.analyzer)
            if inbound and not all(isinstance(v, tvm.tirx.IntImm)
                                   for v in (*args[2].fields, *args[3].fields)):
                # TVM's legalization of a slice of symbolic bounds gives it a shape of its own
                # (``min(max(if_then_else(...)))``); a gather of ``arange(begin, end)`` along
                # each axis has the bounds' shape
                out = args[0]
                positive = args[1] if axes is None else axes
                for axis, b, e in zip(positive.fields, args[2].fields, args[3].fields):
                    rows = self.builder_.emit(relax.op.arange(b, e, 1, "int64"))
                    out = self.builder_.emit(relax.op.take(out, rows, axis=int(axis)))
                self.count += 1
                return out
            if axes is not None or inbound != bool(new.attrs.assume_inbound):
                new = relax.op.strided_slice(args[0], args[1] if axes is None else axes, *args[2:4],
                                             args[4] if len(args) > 4 else None,
                                             assume_inbound=inbound)
                changed = True
        self.count += changed
        return new


def _each_function(mod, rewrite, what: str = "fold"):
    """``mod`` with ``rewrite(name, func)`` applied to every Relax function that is not a kernel;
    a function whose rewrite fails is kept as it was (logged as ``what``'s)."""
    updates = {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or any(
            k in (func.attrs or {}) for k in _KERNEL_ATTRS
        ):
            continue
        try:
            new = rewrite(gv.name_hint, func)
        except Exception as err:  # never break a build: this function unchanged
            logger.debug("%s", gv.name_hint, exc_info=True)
            logger.warning("%s: %s left as it is: %r", what, gv.name_hint, err)
            continue
        if not new.same_as(func):
            updates[gv] = new
    return replace_functions(mod, updates)


def _fold(mod, name, func):
    """``func`` with its input-independent values replaced by constants."""
    blocks, folded = [], 0
    for block in func.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            blocks.append(block)
            continue
        static = static_values(func, block)
        for var, why in static.skipped:
            logger.info("fold: %s left as a computation: %s", var, why)
        if not static.frontier:
            blocks.append(block)
            continue
        try:
            values = _evaluate(mod, static)
        except Exception as err:  # noqa: BLE001 - any failure: keep the computation
            logger.info("fold: %s: %d values left as computations: %s", name, len(static.frontier),
                        error_line(err, repr(err)))
            blocks.append(block)
            continue
        consts = dict(zip(static.frontier, values))
        new = []
        for binding in block.bindings:
            if binding.var in consts:
                const = relax.const(consts[binding.var], str(binding.var.ty.dtype))
                new.append(relax.VarBinding(binding.var, const))
            else:
                new.append(binding)
        blocks.append(relax.DataflowBlock(new))
        folded += len(static.frontier)
    if not folded:
        return func
    logger.info("fold: %s: %d input-independent values folded into constants", name, folded)
    return relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs
    )


def _evaluate(mod, static) -> list:
    """Run the static bindings once on the CPU; return the frontier's values (numpy arrays)."""
    out = relax.Var("folded", relax.TupleType([v.ty for v in static.frontier]))
    body = [*static.bindings, relax.VarBinding(out, relax.Tuple(static.frontier))]
    func = relax.Function([], relax.SeqExpr([relax.DataflowBlock(body)], out), out.ty)
    func = _rewrites(func).with_attr("global_symbol", "fold")
    funcs = {"fold": func}
    for gv in _global_vars(func):
        funcs[gv.name_hint] = mod[gv]
    sub = tvm.IRModule(funcs)
    # a context of its own: the enclosing build's options (CUDA graphs) are not this one's
    with tvm.transform.PassContext(opt_level=3), tvm.target.Target("llvm"):
        ex = tvm.compile(sub, target="llvm")
    result = relax.VirtualMachine(ex, tvm.cpu())["fold"]()
    return [result[i].numpy() for i in range(len(static.frontier))]


def _global_vars(expr) -> list:
    found = []

    def visit(e):
        if isinstance(e, relax.GlobalVar) and e not in found:
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return found


_COMPARISONS = ("relax.equal", "relax.not_equal", "relax.less", "relax.less_equal",
                "relax.greater", "relax.greater_equal")


def _is_bool(expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == "bool"


def _empty(expr) -> bool:
    """A tensor of a static shape with no element (the pass-through part of a rotary embedding
    over the whole head: ``q[..., rotary_dim:]``)."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return False
    return any(getattr(d, "value", None) == 0 for d in ty.shape.values)


def _counted_from_the_start(index, table, take):
    """Constant gather indices with the negative ones counted from the end, as PyTorch counts
    them (``x[..., [-2], :]``, Falcon's K of its fused Q/K/V): TVM's ``take`` reads outside the
    table for them in ``fast`` mode and clamps them to row 0 in ``clip`` mode."""
    if not isinstance(index, tvm.ir.expr.Constant):
        return index
    values = index.value.numpy()
    extent = table.ty.shape.values[int(take.attrs.axis) % len(table.ty.shape.values)]
    if not (values < 0).any() or getattr(extent, "value", None) is None:
        return index
    logger.info("canonicalize: negative gather indices counted from the end")
    return relax.const(np.where(values < 0, values + int(extent.value), values), values.dtype)


def _gathered_in_place(expr, data, indices, var2val):
    """``data`` reshaped, where the gather ``expr`` = ``data[i0, i1, ...]`` reads every element
    in place: each index is ``arange(0, n)`` over its axis of ``data`` (seen through
    ``expand_dims``, ``reshape``, integer casts and ``+ 0``), varying along one axis of the
    output, in ``data``'s order, every other output axis of one element (PyTorch's
    ``mask[batch_idx, kv_idx]`` of Hugging Face's padding masks, from ``arange``s of the
    batch and the length). Else None. Folded with the ``arange``s where shapes are static;
    with a symbolic batch or length it was a kernel writing a copy, which the attention then
    read (a boolean a key, one byte at a time at an unaligned length)."""
    fields = getattr(indices, "fields", None)
    shape = getattr(expr.ty, "shape", None)
    dshape = getattr(data.ty, "shape", None)
    if fields is None or not isinstance(shape, relax.ShapeExpr) or not isinstance(
            dshape, relax.ShapeExpr) or len(fields) != len(dshape.values):
        return None
    analyzer = tvm.sym.Analyzer()
    out = list(shape.values)
    unit = [analyzer.can_prove_equal(d, 1) for d in out]
    axes = []
    for index, extent in zip(fields, dshape.values):
        known = _index_values(index, var2val)
        base = known[1] if known and known[0] == "iota" else None
        ishape = getattr(index.ty, "shape", None)
        if base is None or not isinstance(ishape, relax.ShapeExpr) or len(
                ishape.values) != len(out) or not analyzer.can_prove_equal(base, extent):
            return None
        varying = [a for a, d in enumerate(ishape.values) if not analyzer.can_prove_equal(d, 1)]
        if len(varying) != 1 or not analyzer.can_prove_equal(out[varying[0]], extent):
            return None
        axes.append(varying[0])
    if axes != sorted(set(axes)) or any(not u for a, u in enumerate(unit) if a not in axes):
        return None
    logger.info("canonicalize: a gather by arange indices reads its input in place: a reshape")
    return relax.op.reshape(data, shape)


def _rows_by_known_index(expr, table, index, var2val, analyzer):
    """The rows ``take(table, index)`` reads, as a slice or a broadcast row, where the 1-D
    index's values are known at compile time whatever its size: ``0, 1, ..., n-1`` (a slice
    of the first ``n`` rows: position ids, ``arange`` or a buffer of ``arange`` sliced by
    one), or one value everywhere (that row broadcast: token-type ids of a zero buffer). Else
    None. With symbolic dims these gathers were
    kernels of their own (HF BERT's position and token-type embeddings: two kernels and their
    index kernels, folded into constants in a static build)."""
    known = _index_values(index, var2val)
    ishape, tshape, shape = (getattr(e.ty, "shape", None) for e in (index, table, expr))
    if known is None or not all(isinstance(t, relax.ShapeExpr)
                                for t in (ishape, tshape, shape)):
        return None
    if len(ishape.values) != 1:  # the rows would need a reshape, which cuts a stitched
        return None  # pattern off the reads before it (GPT-2's positions: [1, s] ids)
    axis = int(expr.attrs.axis) % len(tshape.values)
    extent = tshape.values[axis]
    kind, value = known
    if kind == "uniform":
        if not 0 <= value or not analyzer.can_prove(extent > value):
            return None
        logger.info("canonicalize: a gather of one row everywhere is that row broadcast")
        row = relax.op.strided_slice(table, [axis], [value], [value + 1], assume_inbound=True)
        return relax.op.broadcast_to(row, shape)
    if not analyzer.can_prove_equal(ishape.values[0], value) or \
            not analyzer.can_prove(value <= extent):
        return None
    logger.info("canonicalize: a gather of rows 0..n-1 in order is a slice of the first n")
    return relax.op.strided_slice(table, [axis], [0], [value], assume_inbound=True)


def _gathered_unflattened(expr, gathered, var2val, analyzer):
    """``take(table, indices)``, where ``expr`` reshapes ``take(table, reshape(indices))`` to
    what the gather by ``indices`` themselves gives (``table``'s shape with the gathered axis
    replaced by ``indices``' shape: PyTorch's ``nn.Embedding`` of ``[batch, seq]`` ids as TVM's
    importer writes it, the ids flattened and the rows unflattened). Else None. The two are
    equal elementwise (a reshape of the middle axes of a row-major tensor regroups them
    alone). With a symbolic batch and length, the reshapes' index arithmetic (divisions by
    ``seq``, ``% (batch * seq)``, in 64 bits) made the gather 5x slower than the static one on
    the H200."""
    flat = gathered.args[1]
    flat = var2val.get(flat, flat) if isinstance(flat, relax.Var) else flat
    if not (isinstance(flat, relax.Call) and getattr(flat.op, "name", "") == "relax.reshape"):
        return None
    table, indices = gathered.args[0], flat.args[0]
    tshape, ishape, shape = (getattr(e.ty, "shape", None) for e in (table, indices, expr))
    if not all(isinstance(t, relax.ShapeExpr) for t in (tshape, ishape, shape)):
        return None
    axis = int(gathered.attrs.axis) % len(tshape.values)
    want = [*tshape.values[:axis], *ishape.values, *tshape.values[axis + 1:]]
    if len(want) != len(shape.values) or not all(
            analyzer.can_prove_equal(a, b) for a, b in zip(want, shape.values)):
        return None
    logger.info("canonicalize: a gather by flattened indices, unflattened, gathers by them")
    return relax.op.take(table, indices, axis=axis, mode=gathered.attrs.mode)


def _index_values(index, var2val, depth=0):
    """What is known of an integer index tensor's values whatever its size: ``("iota", n)``
    for ``0..n-1`` along its one axis of more than one element, ``("uniform", v)`` for ``v``
    everywhere, else None. Seen through integer casts, reshapes, ``expand_dims`` and ``+ 0``
    (and broadcasts of a uniform value), ``arange(0, n)``, constants, and gathers of such."""
    while isinstance(index, relax.Var) and index in var2val:
        index = var2val[index]
    if depth > 16:
        return None
    if isinstance(index, tvm.ir.expr.Constant):
        values = index.value.numpy()
        if values.size == 0 or values.dtype.kind not in "iu":
            return None
        if (values == values.flat[0]).all():
            return ("uniform", int(values.flat[0]))
        flat = values.reshape(-1)
        if sum(d > 1 for d in values.shape) == 1 and (flat == np.arange(flat.size)).all():
            return ("iota", flat.size)
        return None
    if not isinstance(index, relax.Call) or not isinstance(index.op, tvm.ir.Op):
        return None
    name, args = index.op.name, index.args
    if name == "relax.arange":
        start, end, step = args[:3]
        if getattr(start, "value", None) == 0 and getattr(step, "value", None) == 1:
            return ("iota", end)
        return None
    if name == "relax.astype" and str(index.ty.dtype).startswith(("int", "uint")):
        return _index_values(args[0], var2val, depth + 1)
    if name in ("relax.reshape", "relax.expand_dims", "relax.squeeze"):
        return _index_values(args[0], var2val, depth + 1)
    if name == "relax.add" and (_is_zero(args[0]) or _is_zero(args[1])):  # x + 0
        return _index_values(args[1] if _is_zero(args[0]) else args[0], var2val, depth + 1)
    if name == "relax.broadcast_to":  # a uniform value stays one; a range is repeated
        known = _index_values(args[0], var2val, depth + 1)
        return known if known and known[0] == "uniform" else None
    if name in ("relax.take", "relax.gather_elements"):
        data = _index_values(args[0], var2val, depth + 1)
        if data and data[0] == "uniform":
            return data  # any element of a uniform tensor
        picked = _index_values(args[1], var2val, depth + 1)
        if name == "relax.take" and data and picked and data[0] == "iota":
            return picked  # the identity's elements at the indices: the indices
        return None
    return None


def _is_zero(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.Constant) and not expr.value.numpy().any()


def _infinite_fills(func):
    """``func`` with every ``full`` of an infinity or NaN a ``broadcast_to`` of the value (TVM
    0.27's ``full`` legalization refuses them: it tests ``"float" in dtype`` on a type)."""
    shape, value = wildcard(), wildcard()

    def full(expr, matches):
        fill = matches[value]
        if not isinstance(fill, tvm.ir.expr.Constant) or fill.ty.shape.values:
            return expr
        number = fill.value.numpy().item()
        if not isinstance(number, float) or math.isfinite(number):
            return expr
        return relax.op.broadcast_to(relax.const(number, str(expr.ty.dtype)), matches[shape])

    return _rewrite_calls(is_op("relax.full")(shape, value), full, func)


def finite_fills(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``full`` of an infinity or NaN written as a ``broadcast_to`` in every Relax
    function: what an imported ``torch.full(..., float("-inf"))`` becomes, so that TVM's own
    pipeline (which cannot legalize such a ``full``) builds the module too.

    Parameters
    ----------
    mod : tvm.IRModule

    Returns
    -------
    tvm.IRModule
    """
    return _each_function(mod, lambda _name, func: _infinite_fills(func), "finite_fills")


def _rewrite_calls(pattern, rewriter, func):
    """``rewrite_call`` whose ``rewriter`` sees calls only: the matcher also hands it a
    variable bound to a matching call (``gv = lv1``), which is left as it is."""
    return rewrite_call(
        pattern, lambda expr, m: rewriter(expr, m) if isinstance(expr, relax.Call) else expr,
        func)


def _rewrites(func):
    """Scans over ``bool`` accumulate in ``int32``, comparisons of ``bool`` compare ``int8``,
    ``full`` of an infinity is a ``broadcast_to``, ``x ** k`` (k = 1..4) multiplications, a cast
    table is gathered before it is cast, and wraps its indices; empty tensors are left out of
    concatenations (TVM's GPU schedules fail on loops of no iteration); a gather by
    flattened indices, unflattened, gathers by the indices; a sum, mean, maximum,
    minimum or product over axes of one element is its input, reshaped (TVM's GPU schedule of
    such a reduction fused with what follows writes the accumulator to the output and reads
    it back: a wrong value; its stitched plans cannot be lowered)."""
    x, y = wildcard(), wildcard()

    def scan(expr, matches):
        arg = matches[x]
        if not _is_bool(arg) or not _is_bool(expr):
            return expr
        op = relax.op.cumsum if expr.op.name == "relax.cumsum" else relax.op.cumprod
        attrs = expr.attrs
        out = op(relax.op.astype(arg, "int32"), axis=attrs.axis, dtype="int32",
                 exclusive=attrs.exclusive)
        logger.info("canonicalize: %s over bool accumulates in int32", expr.op.name)
        return relax.op.astype(out, "bool")

    def compare(expr, matches):
        a, b = matches[x], matches[y]
        if not (_is_bool(a) and _is_bool(b)):
            return expr
        return relax.Call(expr.op, [relax.op.astype(a, "int8"), relax.op.astype(b, "int8")])

    def power(expr, matches):
        value = matches[y]
        if not isinstance(value, tvm.ir.expr.Constant) or value.ty.shape.values:
            return expr
        exponent = value.value.numpy().item()
        if exponent not in (1, 2, 3, 4):
            return expr
        base = matches[x]
        out = base
        for _ in range(int(exponent) - 1):
            out = relax.op.multiply(out, base)
        return out

    def gather_first(expr, matches):
        table, index = matches[x], _counted_from_the_start(matches[y], matches[x], expr)
        mode = "wrap" if expr.attrs.mode == "fast" else expr.attrs.mode
        if isinstance(table, relax.Call) and table.op.name == "relax.astype":
            rows = relax.op.take(table.args[0], index, axis=expr.attrs.axis, mode=mode)
            return relax.op.astype(rows, str(expr.ty.dtype))
        if mode != expr.attrs.mode or not index.same_as(matches[y]):
            return relax.op.take(table, index, axis=expr.attrs.axis, mode=mode)
        return expr

    def unit_reduction(expr, matches):
        data = matches[x]
        dims = static_shape(data.ty)
        if dims is None:
            return expr
        axes = expr.attrs.axis
        axes = range(len(dims)) if axes is None else [int(a) % len(dims) for a in axes]
        if not dims or any(dims[a] != 1 for a in axes):
            return expr
        logger.info("canonicalize: %s over axes of one element is its input, reshaped",
                    expr.op.name)
        return relax.op.reshape(data, expr.ty.shape)

    def concat(expr, matches):
        fields = list(getattr(matches[x], "fields", None) or [])  # a tuple written in place
        kept = [p for p in fields if not _empty(p)]
        if not kept or len(kept) == len(fields):
            return expr
        logger.info("canonicalize: %d empty tensors left out of a concat",
                    len(fields) - len(kept))
        return kept[0] if len(kept) == 1 else relax.op.concat(kept, axis=expr.attrs.axis)

    def identity_gather(expr, matches):
        view = _gathered_in_place(expr, matches[x], matches[y], var2val)
        return expr if view is None else view

    def unflattened(expr, matches):
        gathered = matches[x]
        gathered = var2val.get(gathered, gathered) if isinstance(gathered, relax.Var) \
            else gathered
        if not (isinstance(gathered, relax.Call)
                and getattr(gathered.op, "name", "") == "relax.take"):
            return expr
        take = _gathered_unflattened(expr, gathered, var2val, analyzer)
        return expr if take is None else take

    def known_rows(expr, matches):
        rows = _rows_by_known_index(expr, matches[x], matches[y], var2val, analyzer)
        return expr if rows is None else rows

    var2val = relax.analysis.get_var2val(func)
    analyzer = bounded_analyzer(func) or tvm.sym.Analyzer()
    func = _rewrite_calls(is_op("relax.index_tensor")(x, y), identity_gather, func)
    func = _rewrite_calls(is_op("relax.take")(x, y), known_rows, func)
    for name in ("relax.cumsum", "relax.cumprod"):
        func = _rewrite_calls(is_op(name)(x), scan, func)
    for name in ("relax.sum", "relax.mean", "relax.max", "relax.min", "relax.prod"):
        func = _rewrite_calls(is_op(name)(x), unit_reduction, func)
    func = _rewrite_calls(is_op("relax.concat")(x), concat, func)
    func = _rewrite_calls(is_op("relax.take")(x, y), gather_first, func)
    var2val = relax.analysis.get_var2val(func)
    func = _rewrite_calls(is_op("relax.reshape")(x, y), unflattened, func)
    func = _infinite_fills(func)
    func = _rewrite_calls(is_op("relax.power")(x, y), power, func)
    for name in _COMPARISONS:
        func = _rewrite_calls(is_op(name)(x, y), compare, func)
    return func
