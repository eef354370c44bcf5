"""TE PrimFuncs computing the tensors a GEMM derives from weights (a normalization folded
through them, :mod:`tvm_stitch.analysis.through_weights`): a weight scaled along ``k`` by a
column factor, and a weight's column sums weighted by one.  The pass binds them before the
kernel; ``relax.transform.LiftTransformParams`` moves them out of the entry function."""

from __future__ import annotations

import hashlib

from tvm import te, tirx

from tvm_stitch.analysis.elem import Const, Leaf, Op, leaves


def derived_inputs(derived) -> list[str]:
    """The tensors a :class:`~tvm_stitch.analysis.through_weights.DerivedWeight` is computed
    from: its weight, then the one-dimensional weights its column factor reads (in order of
    first read)."""
    names = [derived.weight]
    for leaf in leaves(derived.column):
        if leaf.tensor not in names:
            names.append(leaf.tensor)
    return names


def derived_weight_func(derived, shapes: dict):
    """A TE PrimFunc computing ``derived`` from :func:`derived_inputs` (``shapes``: tensor ->
    ``(shape, dtype)``), its attribute ``digest`` naming what it computes."""
    names = derived_inputs(derived)
    holders = {t: te.placeholder(shapes[t][0], shapes[t][1], name=f"w{i}")
               for i, t in enumerate(names)}

    def column(e, k):
        if isinstance(e, Const):
            return tirx.const(e.value, "float32")
        if isinstance(e, Leaf):
            index = [k if not isinstance(i, tirx.IntImm) else int(i) for i in e.index]
            return holders[e.tensor][tuple(index)].astype("float32")
        if isinstance(e, Op) and e.op == "cast":
            return column(e.args[0], k)
        if isinstance(e, Op) and e.op == "neg":
            return -column(e.args[0], k)
        if isinstance(e, Op) and e.op in ("add", "sub", "mul", "div"):
            a, b = (column(x, k) for x in e.args)
            return {"add": a + b, "sub": a - b, "mul": a * b, "div": a / b}[e.op]
        raise ValueError(f"cannot compute a column factor with {getattr(e, 'op', e)}")

    w = holders[derived.weight]
    axis = derived.k_axis
    if derived.kind == "scaled":
        out = te.compute(derived.shape, lambda i, j: (
            w[i, j].astype("float32") * column(derived.column, (i, j)[axis])
        ).astype(derived.dtype), name="scaled")
    else:
        k = te.reduce_axis((0, w.shape[axis]), name="k")
        out = te.compute(derived.shape, lambda n: te.sum(
            (w[k, n] if axis == 0 else w[n, k]).astype("float32") * column(derived.column, k),
            axis=k), name="colsum")
    func = te.create_prim_func([*holders.values(), out])
    digest = hashlib.sha1(repr((derived.kind, derived.k_axis, derived.column.key(),
                                [shapes[t] for t in names])).encode()).hexdigest()[:10]
    return func.with_attr("digest", digest)
