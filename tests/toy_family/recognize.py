"""Recognition: one contraction of one row and one column axis, without its epilogue."""

from __future__ import annotations

from tvm import tirx

from tvm_stitch.analysis.elem import Composer
from tvm_stitch.analysis.indexing import dtype_of
from tvm_stitch.analysis.match import Frame, Match, NotRecognizedError, finalize
from tvm_stitch.analysis.regions import (
    check_dtype,
    epilogue,
    epilogue_regions,
    operand,
    out_index_of,
)

PRODUCTS = 1


def toy(graph, c, written, read) -> Match:
    dtype = check_dtype(graph, c)
    if c.batch or len(c.m) != 1 or len(c.n) != 1:
        raise NotRecognizedError("not one row and one column axis")
    frame = Frame()
    vmap = {c.m[0].var: frame.axis("m", int(c.m[0].dom.extent)),
            c.n[0].var: frame.axis("n", int(c.n[0].dom.extent)),
            c.k.var: frame.axis("k", int(c.k.dom.extent))}
    for iv in c.node.block.iter_vars:
        vmap.setdefault(iv.var, tirx.const(0, dtype_of(iv.var)))
    composer = Composer(graph, frame.analyzer)
    a = operand(graph, frame, composer, *c.a, vmap, "A", written)
    b = operand(graph, frame, composer, *c.b, vmap, "B", written)
    empty = epilogue_regions(graph, c.out, written, read)[-1]  # the product alone
    out, _ = epilogue(graph, frame, composer, c, out_index_of(c, vmap), empty, written)
    out.output.accumulators = (c.out,)
    match = Match("toy", frame, {"a": a, "b": b}, dtype, [c.node.name], outputs=[out.output],
                  acc_dtype=c.acc_dtype)
    finalize(graph, match)
    return match


def describe(match) -> str:
    ext = match.frame.extents
    return f"toy {ext['m']}x{ext['n']}x{ext['k']} {match.dtype}"
