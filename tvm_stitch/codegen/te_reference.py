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

from .kernel_text import UnsupportedKernelError, extra_views

_F32 = "float32"
_ZERO = tirx.const(0, "int64")


def _read(view: Strided, tensor, coords: dict):
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


class _Evaluator:
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
            return _read(view, self.tensors[view.tensor], self.coords)
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
    build = {"gemm": _gemm, "attention": _attention, "chain": _chain}[match.family]
    outs = build(match, tensors, shapes)
    ordered = [outs[t] for t in source.outputs]
    return te.create_prim_func([*tensors.values(), *ordered])


def _write(match, out, view: Strided, value_at, shapes) -> te.Tensor:
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


def _statistics(match, tensors, extras) -> dict:
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
        ev = _Evaluator(match, tensors, extras, coords, {}, stats)
        return reducer(ev(r.body).astype(r.dtype), axis=rk)

    return fcompute


def _reader(full, rows):
    return lambda c: full[tuple(as_int64(c[a]) for a in rows)]


def _gemm(match, tensors, shapes) -> dict:
    views = match.views
    extras = extra_views(match)
    ext = match.frame.extents
    a = views["a"]
    stats = _statistics(match, tensors, extras)
    outs = {}
    for si, seg in enumerate(match.segments):
        accs = {}
        for pi, (tensor, _) in enumerate(seg.products):
            bv = views[f"b{si}.{pi}"]
            n_axis = next((x for x, s in bv.strides if x.startswith("n") and s), "n")
            product = _product(match, tensors, a, bv, n_axis, ext["k"], extras, stats)
            full = te.compute((ext.get("b", 1), ext["m"], seg.n), product, name=f"acc{si}_{pi}")
            accs[tensor] = (full, n_axis)
        for oi, out in enumerate(seg.outputs):
            n_axis = next(iter(accs.values()))[1]

            def value_at(coords, out=out, accs=accs, n_axis=n_axis):
                def acc_reader(name):
                    full, _ = accs[name]
                    return lambda c: full[as_int64(c.get("b", _ZERO)), c["m"], c[n_axis]]

                accs_at = {t: acc_reader(t) for t in out.accumulators}
                ev = _Evaluator(match, tensors, extras, coords, accs_at, stats)
                return ev(out.elem)

            if out.chunk:
                outs[out.tensor] = _moments(out, value_at, n_axis, seg.n, shapes)
            else:
                outs[out.tensor] = _write(match, out, views[f"out{si}.{oi}"], value_at, shapes)
    return outs


def _moments(out, value_at, n_axis, n, shapes) -> te.Tensor:
    """A row moment in pieces: ``out.elem`` summed over each ``out.chunk`` columns."""
    shape, _ = shapes[out.tensor]
    c = te.reduce_axis((0, out.chunk), "c")

    def element(row, j):
        col = as_int64(j) * out.chunk + c.var
        value = value_at({"b": _ZERO, "m": row, n_axis: col}).astype(_F32)
        return te.sum(tirx.if_then_else(col < n, value, tirx.const(0, _F32)), axis=c)

    return te.compute(tuple(shape), element, name="moments")


def _product(match, tensors, a, bv, n_axis, k, extras, stats):
    """``fcompute(b, m, n)`` of ``Σ_k A[b, m, k] · B[b, k, n]`` in the accumulator's dtype
    (``A`` computed by the prologue when there is one)."""
    kr = te.reduce_axis((0, k), "kr")

    def product(b, m, n):
        # operands stored in another precision are converted to the product's first
        if match.prologue is not None:
            ev = _Evaluator(match, tensors, extras, {"b": b, "m": m, "k": kr}, {}, stats)
            x = ev(match.prologue).astype(match.dtype)
        else:
            x = _read(a, tensors[a.tensor], {"b": b, "m": m, "k": kr}).astype(match.dtype)
        y = _read(bv, tensors[bv.tensor], {"b": b, n_axis: n, "k": kr}).astype(match.dtype)
        return te.sum(x.astype(match.acc_dtype) * y.astype(match.acc_dtype), axis=kr)

    return product


def _attention(match, tensors, shapes) -> dict:
    views = match.views
    extras = extra_views(match)
    ext = match.frame.extents
    q, k, v = views["q"], views["k"], views["v"]
    group = match.group
    batch, heads = ext.get("b", 1), ext.get("h", 1)
    m, n, dk, dh = ext["m"], ext["n"], ext["k"], ext["d"]

    def kv(bb, hh):
        return {"b": bb, "h": tirx.floordiv(hh, group) if group > 1 else hh}

    kr = te.reduce_axis((0, dk), "kr")
    s = te.compute(
        (batch, heads, m, n),
        lambda bb, hh, i, j: te.sum(
            _read(q, tensors[q.tensor], {"b": bb, "h": hh, "m": i, "k": kr}).astype(_F32)
            * _read(k, tensors[k.tensor], {**kv(bb, hh), "n": j, "k": kr}).astype(_F32),
            axis=kr,
        ),
        name="s",
    )

    def logits(bb, hh, i, j):
        coords = {"b": bb, "h": hh, "m": i, "n": j}
        ev = _Evaluator(
            match,
            tensors,
            extras,
            coords,
            {match.score_tensor: lambda c: s[c["b"], c["h"], c["m"], c["n"]]},
        )
        return ev(match.score).astype(_F32)

    g = te.compute((batch, heads, m, n), logits, name="g")
    r1 = te.reduce_axis((0, n), "r1")
    mx = te.compute((batch, heads, m), lambda bb, hh, i: te.max(g[bb, hh, i, r1], axis=r1))
    if match.zero_empty_rows:
        # a row of -inf logits: exponentials of 0 and a sum of 0 (divided by 1), zeros out
        minus_inf = tirx.const(float("-inf"), _F32)
        mx = te.compute((batch, heads, m), lambda bb, hh, i: tirx.Select(
            mx[bb, hh, i] == minus_inf, tirx.const(0.0, _F32), mx[bb, hh, i]), name="mx_safe")
    r2 = te.reduce_axis((0, n), "r2")
    den = te.compute(
        (batch, heads, m),
        lambda bb, hh, i: te.sum(te.exp(g[bb, hh, i, r2] - mx[bb, hh, i]), axis=r2),
    )
    r3 = te.reduce_axis((0, n), "r3")
    o = te.compute(
        (batch, heads, m, dh),
        lambda bb, hh, i, d: te.sum(
            te.exp(g[bb, hh, i, r3] - mx[bb, hh, i]).astype(v.dtype).astype(_F32)
            * _read(v, tensors[v.tensor], {**kv(bb, hh), "n": r3, "d": d}).astype(_F32),
            axis=r3,
        ),
        name="o",
    )
    (out,) = match.outputs

    def value_at(coords):
        def acc(c):
            bb, hh = as_int64(c.get("b", _ZERO)), as_int64(c.get("h", _ZERO))
            total = den[bb, hh, c["m"]]
            if match.zero_empty_rows:
                total = tirx.Select(total == tirx.const(0.0, _F32), tirx.const(1.0, _F32), total)
            return o[bb, hh, c["m"], c["d"]] / total

        ev = _Evaluator(match, tensors, extras, coords, {t: acc for t in out.accumulators})
        return ev(out.elem)

    return {out.tensor: _write(match, out, views["out0"], value_at, shapes)}


def _chain(match, tensors, shapes) -> dict:
    views = match.views
    ext = match.frame.extents
    a, b, d = views["a"], views["b"], views["d"]
    batch, heads = ext.get("b", 1), ext.get("h", 1)
    kr = te.reduce_axis((0, ext["k"]), "kr")

    def coords(bb, hh, **rest):
        return {"b": bb, "h": hh, **rest}

    c = te.compute(
        (batch, heads, ext["m"], ext["n"]),
        lambda bb, hh, i, j: te.sum(
            _read(a, tensors[a.tensor], coords(bb, hh, m=i, k=kr)).astype(_F32)
            * _read(b, tensors[b.tensor], coords(bb, hh, k=kr, n=j)).astype(_F32),
            axis=kr,
        ),
    )
    nr = te.reduce_axis((0, ext["n"]), "nr")
    e = te.compute(
        (batch, heads, ext["m"], ext["d"]),
        lambda bb, hh, i, j: te.sum(
            c[bb, hh, i, nr].astype(d.dtype).astype(_F32)
            * _read(d, tensors[d.tensor], coords(bb, hh, n=nr, d=j)).astype(_F32),
            axis=nr,
        ),
    )
    (out,) = match.outputs

    def value_at(cs):
        def acc(cc):
            return e[as_int64(cc.get("b", _ZERO)), as_int64(cc.get("h", _ZERO)), cc["m"], cc["d"]]

        ev = _Evaluator(match, tensors, extra_views(match), cs, {t: acc for t in out.accumulators})
        return ev(out.elem)

    return {out.tensor: _write(match, out, views["out0"], value_at, shapes)}
