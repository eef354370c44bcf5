"""The ``attention`` family's meaning as TE tensors (:mod:`tvm_stitch.codegen.te_reference`)."""

from __future__ import annotations

from tvm import te, tirx

from tvm_stitch.analysis.indexing import as_int64
from tvm_stitch.codegen.kernel_text import extra_views
from tvm_stitch.codegen.te_reference import F32, ZERO, Evaluator, read, write


def reference(match, tensors, shapes) -> dict:
    """The logits, the softmax in float32 normalised at the end, the product with V, the
    output epilogue (rows with no visible key zeros where the match says so)."""
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
            read(q, tensors[q.tensor], {"b": bb, "h": hh, "m": i, "k": kr}).astype(F32)
            * read(k, tensors[k.tensor], {**kv(bb, hh), "n": j, "k": kr}).astype(F32),
            axis=kr,
        ),
        name="s",
    )

    def logits(bb, hh, i, j):
        coords = {"b": bb, "h": hh, "m": i, "n": j}
        ev = Evaluator(
            match,
            tensors,
            extras,
            coords,
            {match.score_tensor: lambda c: s[c["b"], c["h"], c["m"], c["n"]]},
        )
        return ev(match.score).astype(F32)

    g = te.compute((batch, heads, m, n), logits, name="g")
    r1 = te.reduce_axis((0, n), "r1")
    mx = te.compute((batch, heads, m), lambda bb, hh, i: te.max(g[bb, hh, i, r1], axis=r1))
    if match.zero_empty_rows:
        # a row of -inf logits: exponentials of 0 and a sum of 0 (divided by 1), zeros out
        minus_inf = tirx.const(float("-inf"), F32)
        mx = te.compute((batch, heads, m), lambda bb, hh, i: tirx.Select(
            mx[bb, hh, i] == minus_inf, tirx.const(0.0, F32), mx[bb, hh, i]), name="mx_safe")
    r2 = te.reduce_axis((0, n), "r2")
    den = te.compute(
        (batch, heads, m),
        lambda bb, hh, i: te.sum(te.exp(g[bb, hh, i, r2] - mx[bb, hh, i]), axis=r2),
    )
    r3 = te.reduce_axis((0, n), "r3")
    o = te.compute(
        (batch, heads, m, dh),
        lambda bb, hh, i, d: te.sum(
            te.exp(g[bb, hh, i, r3] - mx[bb, hh, i]).astype(v.dtype).astype(F32)
            * read(v, tensors[v.tensor], {**kv(bb, hh), "n": r3, "d": d}).astype(F32),
            axis=r3,
        ),
        name="o",
    )
    (out,) = match.outputs

    def value_at(coords):
        def acc(c):
            bb, hh = as_int64(c.get("b", ZERO)), as_int64(c.get("h", ZERO))
            total = den[bb, hh, c["m"]]
            if match.zero_empty_rows:
                total = tirx.Select(total == tirx.const(0.0, F32), tirx.const(1.0, F32), total)
            return o[bb, hh, c["m"], c["d"]] / total

        ev = Evaluator(match, tensors, extras, coords, {t: acc for t in out.accumulators})
        return ev(out.elem)

    return {out.tensor: write(match, out, views["out0"], value_at, shapes)}
