"""The ``chain`` family's meaning as TE tensors (:mod:`tvm_stitch.codegen.te_reference`)."""

from __future__ import annotations

from tvm import te

from tvm_stitch.analysis.indexing import as_int64
from tvm_stitch.codegen.kernel_text import extra_views
from tvm_stitch.codegen.te_reference import F32, ZERO, Evaluator, read, write


def reference(match, tensors, shapes) -> dict:
    """``(A·B)·D`` in float32, the product rounded to D's dtype, and the output epilogue."""
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
            read(a, tensors[a.tensor], coords(bb, hh, m=i, k=kr)).astype(F32)
            * read(b, tensors[b.tensor], coords(bb, hh, k=kr, n=j)).astype(F32),
            axis=kr,
        ),
    )
    nr = te.reduce_axis((0, ext["n"]), "nr")
    e = te.compute(
        (batch, heads, ext["m"], ext["d"]),
        lambda bb, hh, i, j: te.sum(
            c[bb, hh, i, nr].astype(d.dtype).astype(F32)
            * read(d, tensors[d.tensor], coords(bb, hh, n=nr, d=j)).astype(F32),
            axis=nr,
        ),
    )
    (out,) = match.outputs

    def value_at(cs):
        def acc(cc):
            return e[as_int64(cc.get("b", ZERO)), as_int64(cc.get("h", ZERO)), cc["m"], cc["d"]]

        ev = Evaluator(match, tensors, extra_views(match), cs, {t: acc for t in out.accumulators})
        return ev(out.elem)

    return {out.tensor: write(match, out, views["out0"], value_at, shapes)}
