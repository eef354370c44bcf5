"""Memory-intensive subgraphs built to offer fusion choices (issue 50's set): a producer shared
by two reductions, transposes around a LayerNorm, a broadcast read by several patterns,
independent patterns of different row counts, chains where joining a neighbour costs
parallelism. Each is a :class:`~tvm_stitch.explore.fusion.FusionGraph` of float16 tensors, for
the tests and the explorer's study to compare the explorer, the greedy rule and the exact
plan."""

from __future__ import annotations

import math

from tvm_stitch.explore.fusion import FusionGraph, Vertex
from tvm_stitch.graph.classify import OpKind

E, X, R, B, T = (OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.ROW_REDUCE,
                 OpKind.BROADCAST, OpKind.INJECTIVE)
GEMM = OpKind.COMPUTE_INTENSIVE


class Builder:
    """Vertices in program order, named; sizes in float16 elements."""

    def __init__(self):
        self.vertices: list[Vertex] = []
        self.index: dict[str, int] = {}

    def op(self, name, kind, shape, inputs=(), reads=(), output=False, rows=None):
        reads = tuple((n, math.prod(s) * 2) for n, s in reads)
        if kind is R and rows is None:
            rows = tuple(shape)  # a reduction of the trailing axis keeps the leading dims
        self.index[name] = len(self.vertices)
        self.vertices.append(Vertex(name, kind, tuple(shape), math.prod(shape) * 2,
                                    tuple(self.index[i] for i in inputs), reads, output,
                                    rows and tuple(rows)))
        return name

    def layer_norm(self, x, rows, width, prefix, reads=()):
        """A LayerNorm of ``x`` (already a vertex, or read from outside through ``reads``)."""
        shape = (*rows, width)
        src = (x,) if x else ()
        mean = self.op(f"{prefix}mean", R, rows, src, reads)
        cen = self.op(f"{prefix}centred", E, shape, (*src, mean), reads)
        sq = self.op(f"{prefix}square", E, shape, (cen,))
        var = self.op(f"{prefix}var", R, rows, (sq,))
        rstd = self.op(f"{prefix}rstd", X, rows, (var,))
        return self.op(f"{prefix}out", E, shape, (cen, rstd), (("gamma", (width,)),))

    def graph(self) -> FusionGraph:
        return FusionGraph(self.vertices)


def layer_norm(rows=(8, 128), width=768) -> FusionGraph:
    b = Builder()
    out = b.layer_norm(None, rows, width, "", (("x", (*rows, width)),))
    b.vertices[b.index[out]] = _output(b.vertices[b.index[out]])
    return b.graph()


def shared_producer(rows=(8, 128), width=768) -> FusionGraph:
    """``e = exp(x)`` read by a softmax-like row sum and by a LayerNorm of ``e + y``: the
    greedy rule gives ``e`` to its first reader."""
    b = Builder()
    shape = (*rows, width)
    e = b.op("exp", X, shape, reads=(("x", shape),))
    s = b.op("sum", R, rows, (e,))
    b.op("softmax", E, shape, (e, s), output=True)
    z = b.op("add", E, shape, (e,), (("y", shape),))
    out = b.layer_norm(z, rows, width, "ln.")
    b.vertices[b.index[out]] = _output(b.vertices[b.index[out]])
    return b.graph()


def transposed_layer_norm(rows=(8, 128), width=768) -> FusionGraph:
    """A convolution's bias, then a LayerNorm between two transposes (a convolution-headed
    encoder's channels-first tensors), then a GEMM: the greedy rule reads the transposed
    tensor from memory."""
    b = Builder()
    shape = (*rows, width)
    channels = (rows[0], width, rows[1])
    conv = b.op("conv", GEMM, channels, reads=(("x", channels),))
    bias = b.op("bias", E, channels, (conv,), (("b", (width, 1)),))
    t = b.op("to_rows", T, shape, (bias,))
    out = b.layer_norm(t, rows, width, "ln.")
    back = b.op("to_channels", T, (rows[0], width, rows[1]), (out,))
    b.op("matmul", GEMM, (rows[0], width, rows[1]), (back,), output=True)
    return b.graph()


def shared_across_row_spaces(rows=(8, 128), width=768) -> FusionGraph:
    """``e = exp(x)`` read by a LayerNorm over each token and by a mean over each sequence
    (another row space): ``e`` can join one of them; the greedy rule gives it to the first."""
    b = Builder()
    shape = (*rows, width)
    e = b.op("exp", X, shape, reads=(("x", shape),))
    sm = b.op("seq_sum", R, rows[:1], (e,))
    b.op("seq_mean", E, rows[:1], (sm,), output=True)
    z = b.op("add", E, shape, (e,), (("y", shape),))
    w = b.op("mul", E, shape, (z,), (("w", shape),))
    out = b.layer_norm(w, rows, width, "ln.")
    b.vertices[b.index[out]] = _output(b.vertices[b.index[out]])
    return b.graph()


def broadcast_shared(rows=(8, 128), width=768) -> FusionGraph:
    """A mask broadcast from ``(rows[0], width)`` read by two LayerNorm patterns."""
    b = Builder()
    shape = (*rows, width)
    m = b.op("mask", B, shape, reads=(("m", (rows[0], 1, width)),))
    a = b.op("a", E, shape, (m,), (("x", shape),))
    out1 = b.layer_norm(a, rows, width, "ln1.")
    c = b.op("c", E, shape, (m,), (("y", shape),))
    out2 = b.layer_norm(c, rows, width, "ln2.")
    for o in (out1, out2):
        b.vertices[b.index[o]] = _output(b.vertices[b.index[o]])
    return b.graph()


def broadcast_across_gemm(rows=(8, 128), width=768) -> FusionGraph:
    """A mask broadcast from ``(rows[0], width)`` read by a LayerNorm pattern and, past a GEMM
    of that pattern's output, by a second one: the patterns cannot merge, so the broadcast is
    written by one and read back by the other, or recomputed by both."""
    b = Builder()
    shape = (*rows, width)
    m = b.op("mask", B, shape, reads=(("m", (rows[0], 1, width)),))
    a = b.op("a", E, shape, (m,), (("x", shape),))
    out1 = b.layer_norm(a, rows, width, "ln1.")
    h = b.op("matmul", GEMM, shape, (out1,), (("w", (width, width)),))
    c = b.op("c", E, shape, (m, h))
    out2 = b.layer_norm(c, rows, width, "ln2.")
    b.vertices[b.index[out2]] = _output(b.vertices[b.index[out2]])
    return b.graph()


def independent(rows=((8, 128), (8, 64)), width=768) -> FusionGraph:
    """Two LayerNorms with nothing between them, of different row counts."""
    b = Builder()
    for n, r in enumerate(rows):
        out = b.layer_norm(None, r, width, f"ln{n}.", ((f"x{n}", (*r, width)),))
        b.vertices[b.index[out]] = _output(b.vertices[b.index[out]])
    return b.graph()


def residual_chain(rows=(8, 128), width=768, layers=3) -> FusionGraph:
    """Residual adds and LayerNorms between GEMMs, as a transformer's layers have them."""
    b = Builder()
    shape = (*rows, width)
    x = b.op("x", GEMM, shape, reads=(("in", shape),))
    for n in range(layers):
        h = b.op(f"matmul{n}", GEMM, shape, (x,))
        r = b.op(f"residual{n}", E, shape, (h, x))
        x = b.layer_norm(r, rows, width, f"ln{n}.")
    b.vertices[b.index[x]] = _output(b.vertices[b.index[x]])
    return b.graph()


def few_rows(rows=(4,), width=65536) -> FusionGraph:
    """Wide rows, fewer than the SMs: a reduction's pattern costs parallelism."""
    b = Builder()
    shape = (*rows, width)
    e = b.op("scale", E, shape, reads=(("x", shape),))
    s = b.op("max", R, rows, (e,))
    b.op("sub", E, shape, (e, s), output=True)
    return b.graph()


def _output(v: Vertex) -> Vertex:
    import dataclasses

    return dataclasses.replace(v, output=True)


CASES = {
    "layer-norm": layer_norm,
    "shared-producer": shared_producer,
    "shared-across-row-spaces": shared_across_row_spaces,
    "transposed-layer-norm": transposed_layer_norm,
    "broadcast-shared": broadcast_shared,
    "broadcast-across-gemm": broadcast_across_gemm,
    "independent": independent,
    "residual-chain": residual_chain,
    "few-rows": few_rows,
}


def random_graph(seed: int, ops: int = 12) -> FusionGraph:
    """A random block of ``ops`` memory-intensive ops (and a GEMM or two) over two row spaces:
    tokens ``(8, 128)`` rows of 768, sequences ``(8,)`` rows of 128 × 768; every op reads one
    or two earlier values or outside tensors, the last few leave the block."""
    import random

    rng = random.Random(seed)
    b = Builder()
    tokens, seqs, width = (8, 128), (8,), 768
    full = (*tokens, width)
    for n in range(ops):
        earlier = [v.name for v in b.vertices if v.shape == full]
        pick = rng.random()
        inputs = tuple(rng.sample(earlier, min(len(earlier), rng.choice((1, 1, 2)))))
        reads = () if inputs and rng.random() < 0.7 else ((f"in{n}", full),)
        if pick < 0.08 and earlier:
            b.op(f"matmul{n}", GEMM, full, inputs[:1])
        elif pick < 0.3 and inputs:
            rows = tokens if rng.random() < 0.75 else seqs
            r = b.op(f"reduce{n}", R, rows, inputs[:1])
            b.op(f"norm{n}", E, full, (inputs[0], r) if rows == tokens else inputs[:1], reads)
        elif pick < 0.4:
            b.op(f"exp{n}", X, full, inputs, reads)
        elif pick < 0.48 and not inputs:
            b.op(f"bcast{n}", B, full, (), ((f"in{n}", (tokens[0], 1, width)),))
        else:
            b.op(f"add{n}", E, full, inputs, reads)
    readers = {j for v in b.vertices for j in v.inputs}
    for i, v in enumerate(b.vertices):
        if i not in readers or rng.random() < 0.1:
            b.vertices[i] = _output(v)
    return b.graph()
