"""The ``chain`` family (:mod:`tvm_stitch.analysis.recognize` describes the families): two
contractions where the second reads the first's result through casts only (:func:`chain`).
"""

from __future__ import annotations

from tvm_stitch.analysis.elem import Leaf, format_elem
from tvm_stitch.analysis.match import (  # noqa: F401 - finalize: its views, the shared ones
    Match,
    NotRecognizedError,
    finalize,
    pair_description,
)
from tvm_stitch.analysis.regions import check_dtype, is_var, operand, pair_output, strip_casts

#: the contractions a chain's kernel holds (see :mod:`tvm_stitch.families`)
PRODUCTS = 2
describe = pair_description


def claim(region, n_var, graph):
    """What the second product reads of the first: anything attention (asked first) left."""
    return region


def chain(graph, frame, composer, c1, c2, between, vmap2, region, stop) -> Match:
    dtype = check_dtype(graph, c2)
    inner = strip_casts(between)
    if not isinstance(inner, Leaf) or inner.tensor != c1.out:
        raise NotRecognizedError(f"between the products: {format_elem(between)}")
    if len(c1.m) != 1 or len(c1.n) != 1:
        raise NotRecognizedError("the first product has several row or column axes")
    vmap1 = dict(zip(c1.node.block.body.indices, inner.index))
    if not (
        is_var(vmap1.get(c1.m[0].var), frame.vars["m"])
        and is_var(vmap1.get(c1.n[0].var), frame.vars["n"])
    ):
        raise NotRecognizedError("the second product does not contract the first's columns")
    vmap1[c1.k.var] = frame.axis("k", int(c1.k.dom.extent))
    a = operand(graph, frame, composer, *c1.a, vmap1, "A", stop)
    b = operand(graph, frame, composer, *c1.b, vmap1, "B", stop)
    d = operand(graph, frame, composer, *c2.b, vmap2, "D", stop)
    output, covered = pair_output(graph, frame, composer, c1, c2, vmap2, region, stop)
    return Match(
        "chain",
        frame,
        {"a": a, "b": b, "d": d},
        dtype,
        covered,
        outputs=[output],
        score_tensor=c1.out,
        acc_dtype=c2.acc_dtype,
    )
