"""Weights of a banded GEMM joined into one tensor, so that one TMA descriptor reads them all.

A GEMM kernel of several bands (products sharing ``A``, e.g. a layer's Q, K and V projections,
grouped by :func:`tvm_stitch.analysis.recognize.recognize`) reads one ``B`` per band.  When the
bands' ``B`` are whole 2-D weights of the function (parameters past its ``num_input``), laid
out alike, they can be concatenated along their column axis into one tensor: each band then
reads a consecutive column range of it, and the kernel's persistent TMA formulation — one
descriptor, one pipelined product loop over every band's tiles — applies (see
:func:`tvm_stitch.families.gemm.triton.tma_layout`).  The concatenation depends on weights
only: ``relax.transform.LiftTransformParams`` moves it into the module's ``*_transform_params``
function, run once when the weights are loaded, not per call.  Weights bound into the module as
constants (:func:`bound_weights`) are joined at compile time instead: one constant.

This module decides whether the join is possible and rewrites the match's views; the pass
(:mod:`tvm_stitch.passes.mcfuser`) binds the concatenation and leaves lifting to TVM.
"""

from __future__ import annotations

import dataclasses

from .indexing import Strided


@dataclasses.dataclass(frozen=True)
class JoinedWeights:
    """The bands' weights concatenated.

    Attributes
    ----------
    name : str
        The joined tensor (a new name, not a tensor of the graph).
    parts : tuple of str
        The bands' weights, in band order.
    axis : int
        The axis they are concatenated along (the weights' column axis ``n``).
    shape : tuple of int
    dtype : str
    """

    name: str
    parts: tuple
    axis: int
    shape: tuple
    dtype: str
    interleaved: bool = False


def interleave(parts, axis: int):
    """Two arrays of one shape joined along ``axis`` a row (column) of each in turn — what
    :func:`pair_weights`' joined tensor holds (numpy, for weights bound as constants)."""
    import numpy as np

    stacked = np.stack(parts, axis=axis + 1)
    shape = list(parts[0].shape)
    shape[axis] *= 2
    return stacked.reshape(shape)


def weight_tensors(graph, func) -> set[str]:
    """Graph tensors that are ``func``'s weights: its parameters past ``num_input`` (none
    without that attribute: nothing says which parameters are weights)."""
    from tvm import relax

    num_input = (func.attrs or {}).get("num_input")
    if num_input is None:
        return set()
    params = list(func.params)[int(num_input):]
    return {t for t, v in graph.values.items()
            if isinstance(v, relax.Var) and any(v.same_as(p) for p in params)}


def prefetched(inputs, weights, shapes: dict, l2_bytes: int) -> tuple:
    """The ``inputs`` of a kernel that are ``weights`` (in memory before the function runs,
    or made of weights alone), for it to pull into L2 before it waits for the kernel before
    it; none where together they exceed a quarter of ``l2_bytes`` (they would evict each
    other and the activations). ``shapes``: tensor -> ``(shape, dtype)``."""
    import math

    from tvm_stitch.graph.tdg import dtype_bytes

    mine = tuple(t for t in dict.fromkeys(inputs) if t in weights)
    size = sum(math.prod(int(d) for d in shapes[t][0]) * dtype_bytes(shapes[t][1])
               for t in mine)
    return mine if size <= l2_bytes // 4 else ()


def bound_weights(graph) -> set[str]:
    """Graph tensors that are constants: weights bound into the module (as
    ``relax.transform.BindParams`` leaves them). Their concatenation is a constant too, made
    at compile time: joining them changes no function's parameters."""
    import tvm

    return {t for t, v in graph.values.items() if isinstance(v, tvm.ir.expr.Constant)}


def _n_axis(view: Strided) -> str | None:
    axes = [a for a, s in view.strides if a.startswith("n") and s]
    return axes[0] if len(axes) == 1 else None


def weight_axis(view: Strided, k: int, n: int) -> int | None:
    """The column axis of the ``n × k`` (0: a Linear weight) or ``k × n`` (1) weight that
    ``view`` reads whole, along one column axis of the kernel and ``k`` only; None when it
    reads no such weight."""
    n_axis = _n_axis(view)
    if len(view.shape) != 2 or view.offset or n_axis is None:
        return None
    if any(s for a, s in view.strides if a not in ("k", n_axis)):
        return None
    rows, cols = view.shape
    s_k, s_n = view.stride.get("k", 0), view.stride[n_axis]
    if (s_n, s_k, rows, cols) == (cols, 1, n, k):
        return 0
    if (s_n, s_k, rows, cols) == (1, cols, k, n):
        return 1
    return None


def _weights_axis(views, widths, k: int, weights, what: str) -> int | str:
    """The column axis (:func:`weight_axis`) of the distinct weights ``views`` read whole, each
    ``widths[i]`` columns by ``k``, of one dtype and layout; or why not (``what``: whose B)."""
    names = [v.tensor for v in views]
    if len(set(names)) != len(names) or not all(t in weights for t in names):
        return f"the {what} B are not distinct weights"
    if len({v.dtype for v in views}) != 1:
        return "the weights' dtypes differ"
    axis = None
    for view, n in zip(views, widths):
        here = weight_axis(view, k, n)
        if here is None:
            return f"{view.tensor} is not a {n}x{k} weight read whole along one column axis"
        if axis not in (None, here):
            return "the weights' layouts differ"
        axis = here
    return axis


def join_weights(match, weights) -> tuple:
    """``(match', JoinedWeights)``: ``match`` reading its bands' ``B`` from one concatenated
    tensor, or ``(None, why)`` when the bands' ``B`` cannot be joined.

    Parameters
    ----------
    match : Match
        A finalized GEMM match.
    weights : collection of str
        Graph tensors that are weights (a function's parameters past its ``num_input``, or
        constants: :func:`bound_weights`).
    """
    segments = match.segments
    if len(segments) < 2:  # bands: products sharing A side by side (GEMMs)
        return None, "not a GEMM of several bands"
    if match.prologue is not None or any(len(s.products) != 1 for s in segments):
        return None, "a computed A or several products per band"
    if match.frame.extents.get("b", 1) != 1:
        return None, "a batch axis"
    k = match.frame.extents["k"]
    views = [match.views[f"b{si}.0"] for si in range(len(segments))]
    names = [v.tensor for v in views]
    # (n, k): a Linear weight, bands stacked along rows; (k, n): bands side by side
    axis = _weights_axis(views, [seg.n for seg in segments], k, weights, "bands'")
    if isinstance(axis, str):
        return None, axis
    width = sum(seg.n for seg in segments)
    shape = (width, k) if axis == 0 else (k, width)
    joined = JoinedWeights(f"{names[0]}__joined", tuple(names), axis, shape, views[0].dtype)
    new_views, column = dict(match.views), 0
    for si, (seg, view) in enumerate(zip(segments, views)):
        if axis == 0:
            strides, offset = view.strides, column * k
        else:
            strides = tuple((a, width if a == "k" else s) for a, s in view.strides)
            offset = column
        new_views[f"b{si}.0"] = Strided(joined.name, shape, joined.dtype, offset, strides)
        column += seg.n
    return dataclasses.replace(match, views=new_views), joined


def pair_weights(match, weights) -> tuple:
    """``(match', JoinedWeights)``: a GEMM of one band and two products over two weights of
    one shape and layout (SwiGLU's gate and up) reading them from one tensor whose rows (of a
    Linear weight; else columns) take turns, gate then up, marked ``paired``: its kernel
    computes one product of twice the columns, over one B, and splits it after the product
    loop; or ``(None, why)``.

    The views of ``match'`` read the gate's and the up's elements where they are in the
    joined tensor (every second row, from the first and from the second), so any kernel of
    two products still computes it as before.

    Parameters
    ----------
    match : Match
        A finalized GEMM match.
    weights : collection of str
        Graph tensors that are weights (see :func:`join_weights`).
    """
    segments = match.segments
    if len(segments) != 1 or len(segments[0].products) != 2:
        return None, "not a GEMM of one band of two products"
    if match.frame.extents.get("b", 1) != 1:
        return None, "a batch axis"
    k, n = match.frame.extents["k"], segments[0].n
    views = [match.views["b0.0"], match.views["b0.1"]]
    names = [v.tensor for v in views]
    axis = _weights_axis(views, [n, n], k, weights, "products'")
    if isinstance(axis, str):
        return None, axis
    shape = (2 * n, k) if axis == 0 else (k, 2 * n)
    joined = JoinedWeights(f"{names[0]}__paired", tuple(names), axis, shape, views[0].dtype,
                           interleaved=True)
    new_views = dict(match.views)
    for pi, view in enumerate(views):
        n_axis = _n_axis(view)
        if axis == 0:  # row j of each: row 2j + pi
            strides = tuple((a, 2 * k if a == n_axis else s) for a, s in view.strides)
            offset = pi * k
        else:  # column j of each: column 2j + pi, rows 2n apart
            strides = tuple((a, 2 if a == n_axis else 2 * n if a == "k" else s)
                            for a, s in view.strides)
            offset = pi
        new_views[f"b0.{pi}"] = Strided(joined.name, shape, joined.dtype, offset, strides)
    return dataclasses.replace(match, views=new_views, paired=True), joined
