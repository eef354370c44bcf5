"""The ``gemm`` family's meaning as TE tensors (:mod:`tvm_stitch.codegen.te_reference`)."""

from __future__ import annotations

from tvm import te, tirx

from tvm_stitch.analysis.indexing import as_int64
from tvm_stitch.codegen.kernel_text import extra_views
from tvm_stitch.codegen.te_reference import F32, ZERO, Evaluator, read, statistics, write


def reference(match, tensors, shapes) -> dict:
    """Each output of each band: the products over k, the epilogue, row moments in pieces."""
    views = match.views
    extras = extra_views(match)
    ext = match.frame.extents
    a = views["a"]
    stats = statistics(match, tensors, extras)
    outs = {}
    for si, seg in enumerate(match.segments):
        accs = {}
        for pi, (tensor, _) in enumerate(seg.products):
            bv = views[f"b{si}.{pi}"]
            n_axis = next((x for x, s in bv.strides if x.startswith("n") and s), "n")
            fn = product(match, tensors, a, bv, n_axis, ext["k"], extras, stats)
            full = te.compute((ext.get("b", 1), ext["m"], seg.n), fn, name=f"acc{si}_{pi}")
            accs[tensor] = (full, n_axis)
        for oi, out in enumerate(seg.outputs):
            n_axis = next(iter(accs.values()))[1]

            def value_at(coords, out=out, accs=accs, n_axis=n_axis):
                def acc_reader(name):
                    full, _ = accs[name]
                    return lambda c: full[as_int64(c.get("b", ZERO)), c["m"], c[n_axis]]

                accs_at = {t: acc_reader(t) for t in out.accumulators}
                ev = Evaluator(match, tensors, extras, coords, accs_at, stats)
                return ev(out.elem)

            if out.chunk:
                outs[out.tensor] = moments(out, value_at, n_axis, seg.n, shapes)
            else:
                outs[out.tensor] = write(match, out, views[f"out{si}.{oi}"], value_at, shapes)
    return outs


def moments(out, value_at, n_axis, n, shapes) -> te.Tensor:
    """A row moment in pieces: ``out.elem`` summed over each ``out.chunk`` columns."""
    shape, _ = shapes[out.tensor]
    c = te.reduce_axis((0, out.chunk), "c")

    def element(row, j):
        col = as_int64(j) * out.chunk + c.var
        value = value_at({"b": ZERO, "m": row, n_axis: col}).astype(F32)
        return te.sum(tirx.if_then_else(col < n, value, tirx.const(0, F32)), axis=c)

    return te.compute(tuple(shape), element, name="moments")


def product(match, tensors, a, bv, n_axis, k, extras, stats):
    """``fcompute(b, m, n)`` of ``Σ_k A[b, m, k] · B[b, k, n]`` in the accumulator's dtype
    (``A`` computed by the prologue when there is one)."""
    kr = te.reduce_axis((0, k), "kr")

    def product(b, m, n):
        # operands stored in another precision are converted to the product's first
        if match.prologue is not None:
            ev = Evaluator(match, tensors, extras, {"b": b, "m": m, "k": kr}, {}, stats)
            x = ev(match.prologue).astype(match.dtype)
        else:
            x = read(a, tensors[a.tensor], {"b": b, "m": m, "k": kr}).astype(match.dtype)
        y = read(bv, tensors[bv.tensor], {"b": b, n_axis: n, "k": kr}).astype(match.dtype)
        return te.sum(x.astype(match.acc_dtype) * y.astype(match.acc_dtype), axis=kr)

    return product
