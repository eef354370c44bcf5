"""The meaning as TE: the product in float32, then the output element."""

from __future__ import annotations

from tvm import te

from tvm_stitch.codegen.kernel_text import extra_views
from tvm_stitch.codegen.te_reference import F32, Evaluator, read, write


def reference(match, tensors, shapes) -> dict:
    ext = match.frame.extents
    a, b = match.views["a"], match.views["b"]
    kr = te.reduce_axis((0, ext["k"]), "kr")
    acc = te.compute((ext["m"], ext["n"]), lambda i, j: te.sum(
        read(a, tensors[a.tensor], {"m": i, "k": kr}).astype(F32)
        * read(b, tensors[b.tensor], {"k": kr, "n": j}).astype(F32), axis=kr), name="acc")
    (out,) = match.outputs

    def value_at(coords):
        accs = {t: (lambda c: acc[c["m"], c["n"]]) for t in out.accumulators}
        return Evaluator(match, tensors, extra_views(match), coords, accs)(out.elem)

    return {out.tensor: write(match, out, match.views["out0"], value_at, shapes)}
