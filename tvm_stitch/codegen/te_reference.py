"""A recognized kernel's meaning as a TE PrimFunc, for checking recognition on a CPU.

:func:`reference_func` builds, from a :class:`~tvm_stitch.analysis.match.Match` and its
generated source, a PrimFunc with the launch's signature (inputs ``I0..``, outputs ``O0..``) that
computes what the Triton kernel computes — operands read through their strided views, element
expressions evaluated as printed, the softmax in float32 and normalised at the end as the
kernel does.  Substituted for the Triton launches, it lets a whole model run on ``llvm`` with
every recognized kernel in place, so CI checks recognition, views and epilogues against PyTorch
on every zoo model.  (The Triton printers themselves are checked under ``TRITON_INTERPRET=1``.)
"""

from __future__ import annotations

import tvm
from tvm import te, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.analysis.elem import Const, Elem, Iter, Leaf, Reduce
from tvm_stitch.analysis.indexing import Strided, as_int64, dtype_of

from .kernel_text import UnsupportedKernelError

F32 = "float32"
ZERO = tirx.const(0, "int64")


def read(view: Strided, tensor, coords: dict):
    """Element ``coords`` (axis -> index expression) of ``view``, read from ``tensor``."""
    flat = tirx.const(view.offset, "int64")
    for axis, stride in view.strides:
        if stride:
            c = coords[axis]
            c = c.var if isinstance(c, tirx.IterVar) else c
            flat = flat + as_int64(c) * stride
    idx, rest = [], flat
    for d in reversed(view.shape):
        idx.append(tirx.floormod(rest, d))
        rest = tirx.floordiv(rest, d)
    return tensor[tuple(reversed(idx))]


def _cast(x, dtype):
    return x if dtype_of(x) == dtype else x.astype(dtype)


class Evaluator:
    """Element expressions as TE expressions."""

    def __init__(self, match, tensors, views, coords, acc, stats=None):
        self.tensors, self.views, self.coords, self.acc = tensors, views, coords, acc
        self.stats = stats or {}  # Reduce key -> reader of its values at the coordinates
        self.vars = dict(match.frame.vars)  # the frame's names of the coordinate variables

    def __call__(self, e: Elem):
        if isinstance(e, Const):
            return tirx.const(e.value, e.dtype)
        if isinstance(e, Iter):
            return self.index(e.expr)
        if isinstance(e, Leaf):
            if e.tensor in self.acc:
                return _cast(self.acc[e.tensor](self.coords), e.dtype)
            view = self.views[e.key()]
            return read(view, self.tensors[view.tensor], self.coords)
        if isinstance(e, Reduce):
            return self.stats[e.key()](self.coords)
        args = [self(a) for a in e.args]
        op = e.op
        binary = {
            "add": lambda a, b: a + b,
            "sub": lambda a, b: a - b,
            "mul": lambda a, b: a * b,
            "div": lambda a, b: a / b,
            "min": tirx.min,
            "max": tirx.max,
            "eq": lambda a, b: a == b,
            "ne": lambda a, b: a != b,
            "lt": lambda a, b: a < b,
            "le": lambda a, b: a <= b,
            "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b,
            "and": tirx.all,
            "or": tirx.any,
        }
        if op in binary:
            return binary[op](*args)
        if op == "cast":
            return args[0].astype(e.dtype)
        if op == "not":
            return P.Not(args[0])
        if op == "select":
            return tirx.if_then_else(*args)
        if op == "pow":
            return tirx.power(*args)
        fn = getattr(tirx, op, None)
        if fn is None:
            raise UnsupportedKernelError(f"operator {op}")
        return fn(*args)

    def index(self, expr):
        from tvm_stitch.analysis.indexing import substitute

        frame_vars = {v: self.coords[name] for name, v in self.vars.items() if name in self.coords}
        return substitute(expr, frame_vars)


def reference_func(match, source, shapes: dict) -> tvm.tirx.PrimFunc:
    """The TE PrimFunc computing what ``source`` (generated from ``match``) computes.

    ``shapes`` maps graph tensors to ``(shape, dtype)``.
    """
    tensors = {
        t: te.placeholder(tuple(shapes[t][0]), shapes[t][1], f"I{i}")
        for i, t in enumerate(source.inputs)
    }
    from tvm_stitch.families import part  # the registry: data only

    outs = part(match.family, "reference").reference(match, tensors, shapes)
    ordered = [outs[t] for t in source.outputs]
    return te.create_prim_func([*tensors.values(), *ordered])


def write(match, out, view: Strided, value_at, shapes) -> te.Tensor:
    """The output tensor: each of its elements maps back to frame coordinates through its view
    (a permutation of a dense layout: strides sorted descending are a mixed radix)."""
    shape, dtype = shapes[out.tensor]
    axes = sorted([(s, a) for a, s in view.strides if s], reverse=True)
    extents = match.frame.extents

    def element(*idx):
        flat = tirx.const(0, "int64")
        stride = 1
        for i, d in reversed(list(zip(idx, shape))):
            flat = flat + as_int64(i) * stride
            stride *= int(d)
        flat = flat - view.offset
        coords = {a: tirx.const(0, "int64") for a in extents}
        for s, a in axes:
            coords[a] = tirx.floormod(tirx.floordiv(flat, s), extents[a])
        return value_at(coords).astype(dtype)

    return te.compute(tuple(shape), element, name=f"out_{len(axes)}")


def statistics(match, tensors, extras) -> dict:
    """Row statistics (reductions over a row) as tensors over the frame's row axes; Reduce key
    -> reader at coordinates."""
    ext = match.frame.extents
    rows = [a for a in ext if a[:1] in "bm"]
    stats = {}
    for r in match.statistics:
        full = te.compute(tuple(ext[a] for a in rows), _reduction(match, r, rows, tensors,
                          extras, stats), name=f"stat{len(stats)}")
        stats[r.key()] = _reader(full, rows)
    return stats


def _reduction(match, r, rows, tensors, extras, stats):
    rk = te.reduce_axis((0, r.extent), r.var.name)
    reducer = {"sum": te.sum, "max": te.max, "min": te.min}[r.op]

    def fcompute(*idx):
        coords = {**dict(zip(rows, idx)), r.var.name: rk}
        ev = Evaluator(match, tensors, extras, coords, {}, stats)
        return reducer(ev(r.body).astype(r.dtype), axis=rk)

    return fcompute


def _reader(full, rows):
    return lambda c: full[tuple(as_int64(c[a]) for a in rows)]
