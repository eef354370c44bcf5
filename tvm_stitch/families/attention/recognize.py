"""The ``attention`` family (:mod:`tvm_stitch.analysis.recognize` describes the families):
``O = softmax(g(Q·Kᵀ)) · V`` (:func:`attention`), the softmax found in the element expression
between the two products (:func:`match_softmax`, PyTorch's safe softmax too), Q and K read
through constant scales, a float32 attention of 16-bit copies read at 16 bits, K/V shared by
groups of query heads, and a causal mask or sliding window recognized by its values
(:func:`mask_band`, :func:`visible_logits`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import weakref

from tvm import ir, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.analysis.elem import (
    Composer,
    CompositionError,
    Const,
    Elem,
    Iter,
    Leaf,
    Op,
    Policy,
    Reduce,
    data_movement,
    elementwise,
    evaluate,
    evaluate_index,
    format_elem,
    leaves,
    replace,
    walk,
)
from tvm_stitch.analysis.indexing import (
    HALF,
    Strided,
    bind,
    dtype_of,
    new_var,
    strided,
    substitute,
)
from tvm_stitch.analysis.match import (
    Access,
    Frame,
    Match,
    NotRecognizedError,
    all_accesses,
    apply,
    collapse_frame,
    pair_description,
    substituted,
    view_of,
)
from tvm_stitch.analysis.regions import (
    check_dtype,
    float_cast,
    is_var,
    operand,
    pair_output,
    strip_casts,
    uses,
)
from tvm_stitch.errors import error_line
from tvm_stitch.graph.access import vars_in

logger = logging.getLogger("tvm_stitch.recognize")

#: the contractions an attention kernel holds (see :mod:`tvm_stitch.families`)
PRODUCTS = 2
describe = pair_description


def claim(region, n_var, graph):
    """The logits ``g(Q·Kᵀ)`` where ``region`` (what the second product reads of the first)
    is their softmax over ``n_var``, else None (:func:`match_softmax`)."""
    return match_softmax(region, n_var, graph)


def zero_empty_rows(region, n_var, graph) -> bool:
    """Whether ``region`` is PyTorch's safe softmax: rows with no visible key are zeros
    (:func:`safe_softmax`)."""
    return safe_softmax(region, n_var, graph) is not None


def finalize(graph, match: Match) -> None:
    """Its views (:func:`finalize_attention`)."""
    finalize_attention(graph, match)


def _scaled_operand(graph, frame, composer, tensor, index, vmap, what, stop,
                    widen=False) -> tuple:
    """``(Access, factor)``: an operand read in place through data movement and products with
    scalar constants (with ``widen``, also through a float32 copy of a 16-bit tensor), and the
    product of those constants (``scaled_dot_product_attention`` decomposes to ``Q·√c`` and
    ``K·√c``)."""
    idx = tuple(frame.simplify(substitute(i, vmap)) for i in index)

    def inline(node):
        return node.output not in stop and (
            data_movement(node) or _scalar_product(node) or (widen and _widening(node)))

    elem = composer.element(tensor, idx, Policy(inline=inline))
    factor = 1.0
    while isinstance(elem, Op) and elem.op in ("mul", "cast"):
        if elem.op == "cast":  # a widening (the only casts inlined): it changes no value
            elem = elem.args[0]
            continue
        consts = [a for a in elem.args if isinstance(a, Const)]
        if len(consts) != 1:
            break
        factor *= consts[0].value
        elem = next(a for a in elem.args if a is not consts[0])
    if not isinstance(elem, Leaf):
        raise NotRecognizedError(f"{what} is not a view of a tensor: {format_elem(elem)}")
    return Access(elem.tensor, elem.index), factor


def _scalar_product(node) -> bool:
    """A block that only multiplies one element by a constant of its own type."""
    value = node.block.body.value if elementwise(node) else None
    if not isinstance(value, P.Mul):
        return False
    args = (value.a, value.b)
    return (sum(isinstance(x, ir.expr.TensorLoad) for x in args) == 1
            and sum(isinstance(x, P.FloatImm) for x in args) == 1)


def _widened_operand(graph, frame, composer, tensor, index, vmap, dtype, stop) -> Access:
    """An operand that is a float32 cast of a view of a ``dtype`` tensor: that tensor's view."""
    access = operand(graph, frame, composer, tensor, index, vmap, "V", stop, casts=True)
    if graph.tensors[access.tensor].dtype != dtype:
        raise NotRecognizedError(f"V is not a widened {dtype} view")
    return access


def _widening(node) -> bool:
    """A block that only converts a 16-bit float element to float32 (exactly)."""
    return (elementwise(node) and float_cast(node)
            and dtype_of(node.block.body.value) == "float32"
            and dtype_of(node.block.body.value.value) in HALF)


# -- softmax ---------------------------------------------------------------------------------------
def match_softmax(e: Elem, n_var, graph=None) -> Elem | None:
    """``g`` when ``e == softmax_n(g)`` (any casts around it; max-subtracted or not), else None.

    ``softmax_n(g) = exp(g - max_r g[n:=r]) / Σ_r exp(g - max_r g[n:=r])``; a division by the sum
    or a product with its reciprocal.  A softmax whose rows of ``-inf`` logits give zeros
    instead of NaN (PyTorch's safe softmax, :func:`safe_softmax`) is one too.
    """
    safe = safe_softmax(e, n_var, graph)
    e = strip_casts(safe if safe is not None else e)
    if not isinstance(e, Op):
        return None
    if e.op == "div":
        num, den = e.args
    elif e.op == "mul":
        inv = [
            a
            for a in e.args
            if isinstance(a, Op)
            and a.op == "div"
            and isinstance(a.args[0], Const)
            and a.args[0].value == 1
        ]
        if len(inv) != 1:
            return None
        num = e.args[1] if e.args[0] is inv[0] else e.args[0]
        den = inv[0].args[1]
    else:
        return None
    den = strip_casts(den)
    num = strip_casts(num)
    if not (isinstance(den, Reduce) and den.op == "sum"):
        return None
    if not _same_over(num, n_var, den.body, den.var):
        return None
    if not (isinstance(num, Op) and num.op == "exp"):
        return None
    inner = strip_casts(num.args[0])
    if isinstance(inner, Op) and inner.op == "sub":
        g, mx = inner.args
        mx = strip_casts(mx)
        if isinstance(mx, Reduce) and mx.op == "max" and _same_over(g, n_var, mx.body, mx.var):
            return g
    return num.args[0]


def safe_softmax(e: Elem, n_var, graph=None) -> Elem | None:
    """``s`` when ``e`` is ``select(all_n(g == -inf), 0, s)`` (or the select the other way round
    on the negated test) and ``s == softmax_n(g)``: the softmax with rows that have no finite
    logit set to zero — what ``scaled_dot_product_attention`` decomposes to since PyTorch 2.5.
    None otherwise (the zero may be a constant tensor of zeros of ``graph``)."""
    e = strip_casts(e)
    if not (isinstance(e, Op) and e.op == "select"):
        return None
    cond, yes, no = e.args
    for zero, s, empty in ((yes, no, True), (no, yes, False)):
        if not _zero(graph, strip_casts(zero)):
            continue
        g = match_softmax(s, n_var, graph)
        if g is not None and _all_minus_inf(cond, g, n_var) is empty:
            return s
    return None


def _zero(graph, e: Elem) -> bool:
    """``e`` is zero: a constant, or a read of a constant tensor of zeros."""
    if isinstance(e, Const):
        return e.value == 0
    value = graph.values.get(e.tensor) if graph is not None and isinstance(e, Leaf) else None
    if not isinstance(value, ir.expr.Constant):
        return False
    return not value.value.numpy().any()


def _boolean(e: Elem) -> tuple[Elem, bool]:
    """``(x, positive)``: ``e`` is ``x`` (``positive``) or ``not x``, through logical nots and
    casts between booleans and integers (which keep a truth value)."""
    positive = True
    while isinstance(e, Op):
        if e.op == "cast" and _integral(e.dtype) and _integral(e.args[0].dtype):
            e = e.args[0]
        elif e.op == "not":
            positive, e = not positive, e.args[0]
        elif e.op in ("lt", "ne") and _zero(None, e.args[0]) and _integral(e.args[1].dtype):
            e = e.args[1]  # 0 < x, 0 != x: x's truth (TVM's select on a boolean cast)
        elif e.op in ("gt", "ne") and _zero(None, e.args[1]) and _integral(e.args[0].dtype):
            e = e.args[0]
        else:
            break
    return e, positive


def _integral(dtype: str) -> bool:
    return dtype == "bool" or dtype.startswith(("int", "uint"))


def _all_minus_inf(cond: Elem, g: Elem, n_var) -> bool | None:
    """True where ``cond`` is ``all_n(g == -inf)`` (a row of the logits ``g`` with no finite
    value), False where it is the negation, None where it is neither (or not recognized).

    The test is a ``max`` (any) or ``min`` (all) over the key axis of ``g == -inf`` or
    ``g != -inf``, with nots and boolean casts anywhere; ``g`` may be widened first."""
    red, outer = _boolean(cond)
    if not (isinstance(red, Reduce) and red.op in ("max", "min")):
        return None
    test, inner = _boolean(red.body)
    if not (isinstance(test, Op) and test.op in ("eq", "ne")):
        return None
    a, b = (strip_casts(x) for x in test.args)
    if isinstance(a, Const):
        a, b = b, a
    if not (isinstance(b, Const) and b.value == float("-inf")):
        return None
    if not _same_over(strip_casts(g), n_var, a, red.var):
        return None
    is_inf = (test.op == "eq") == inner  # the reduced predicate is "g == -inf"
    if red.op == "min" and is_inf:  # all(g == -inf)
        return outer
    if red.op == "max" and not is_inf:  # any(g != -inf) = not all(g == -inf)
        return not outer
    return None


def _same_over(a: Elem, a_var, b: Elem, b_var) -> bool:
    """``a`` (over ``a_var``) and ``b`` (over ``b_var``) compute the same function."""
    return a.key({a_var.name: "_j"}) == b.key({b_var.name: "_j"})


def _half_attention(graph, frame, composer, c1, c2, vmap1, vmap2, stop):
    """``(dtype, Q, K)`` where a float32 attention multiplies float32 copies of Q, K and V of
    one 16-bit ``dtype`` (PyTorch's math kernel in a float16 export on the CPU): the kernel
    reads the 16-bit tensors (the same products, accumulated in float32); else None (mixed
    dtypes, or a V that is no such copy: the float32 attention as written)."""
    try:
        q = _scaled_operand(graph, frame, composer, *c1.a, vmap1, "Q", stop, widen=True)
        k = _scaled_operand(graph, frame, composer, *c1.b, vmap1, "K", stop, widen=True)
        read = {graph.tensors[x.tensor].dtype for x, _ in (q, k)}
        if len(read) != 1 or not read <= set(HALF):
            return None
        dtype = read.pop()
        _widened_operand(graph, frame, composer, *c2.b, vmap2, dtype, stop)
    except NotRecognizedError:
        return None
    return dtype, q, k


def attention(graph, frame, composer, c1, c2, score, vmap2, region, stop) -> Match:
    dtype = check_dtype(graph, c1)
    s_leaves = [leaf for leaf in leaves(score) if leaf.tensor == c1.out]
    if len({leaf.key() for leaf in s_leaves}) != 1:
        raise NotRecognizedError("the logits read Q·Kᵀ at several positions")
    s_index = s_leaves[0].index
    if len(c1.m) != 1 or len(c1.n) != 1:
        raise NotRecognizedError("Q·Kᵀ has several row or column axes")
    # Q·Kᵀ's coordinates as expressions of the frame
    out1 = c1.node.block.body.indices
    vmap1 = {}
    for var, expr in zip(out1, s_index):
        vmap1[var] = expr
    if not (
        is_var(vmap1.get(c1.m[0].var), frame.vars["m"])
        and is_var(vmap1.get(c1.n[0].var), frame.vars["n"])
    ):
        raise NotRecognizedError("the softmax does not run along Q·Kᵀ's key axis")
    dk = int(c1.k.dom.extent)
    vmap1[c1.k.var] = frame.axis("k", dk)
    q, q_scale = _scaled_operand(graph, frame, composer, *c1.a, vmap1, "Q", stop)
    k, k_scale = _scaled_operand(graph, frame, composer, *c1.b, vmap1, "K", stop)
    if dtype == "float32":
        half = _half_attention(graph, frame, composer, c1, c2, vmap1, vmap2, stop)
        if half is not None:
            dtype, (q, q_scale), (k, k_scale) = half
    widened = check_dtype(graph, c2) != dtype
    if widened and check_dtype(graph, c2) != "float32":
        raise NotRecognizedError("the two products have different dtypes")
    if q_scale * k_scale != 1:
        # (c·Q)·(c'·K)ᵀ = c·c'·(Q·Kᵀ): the constants join the logits, Q and K are read in place
        score = replace(score, lambda e: (
            Op("mul", (e, Const(q_scale * k_scale, e.dtype)), e.dtype)
            if isinstance(e, Leaf) and e.tensor == c1.out else None))
    if widened:
        # P·V in float32 on a widened copy of V (TVM's import of a float16 attention): V is read
        # at its own precision and the product runs in it, as FlashAttention does
        v = _widened_operand(graph, frame, composer, *c2.b, vmap2, dtype, stop)
    else:
        v = operand(graph, frame, composer, *c2.b, vmap2, "V", stop)
    bad = [x for x in leaves(score) if x.tensor != c1.out and uses(x, frame.vars.get("d"))]
    if bad:
        raise NotRecognizedError("the logits depend on the head dimension")
    output, covered = pair_output(graph, frame, composer, c1, c2, vmap2, region, stop)
    match = Match(
        "attention",
        frame,
        {"q": q, "k": k, "v": v},
        dtype,
        covered,
        outputs=[output],
        score=score,
        score_tensor=c1.out,
        acc_dtype=c2.acc_dtype,
    )
    return match


# -- views and causal masks ------------------------------------------------------------------------
def finalize_attention(graph, match: Match) -> None:
    """:func:`~tvm_stitch.analysis.match.finalize` of an attention: its frame's batch axes
    collapsed, its views with K/V shared by groups of query heads (:func:`_attention_finalize`)."""
    collapse_frame(graph, match)
    _attention_finalize(graph, match)


def _attention_finalize(graph, match: Match) -> None:
    """Views of an attention; a flattened (batch · heads) axis is split back when the accesses
    need it, and K/V may be shared by groups of query heads."""
    try:
        _attention_views(graph, match)
        _mask_bands(graph, match)
        return
    except NotRecognizedError as err:
        first = err
    frame = match.frame
    if "h" not in frame.vars or "b" in frame.vars:
        raise first
    extent = frame.extents["h"]
    for heads in range(2, extent):
        if extent % heads:
            continue
        b, h = new_var("b"), new_var("h")
        bind(frame.analyzer, b, extent // heads)
        bind(frame.analyzer, h, heads)
        trial = substituted(match, {frame.vars["h"]: b * heads + h})
        if trial is None:
            continue
        trial.frame = Frame()
        trial.frame.analyzer = frame.analyzer
        trial.frame.vars = {"b": b, **{a: (h if a == "h" else v) for a, v in frame.vars.items()}}
        trial.frame.extents = {"b": extent // heads, **frame.extents, "h": heads}
        trial.views, trial.group = {}, 1
        try:
            _attention_views(graph, trial)
        except NotRecognizedError:
            continue
        apply(match, trial)
        match.frame, match.views, match.group = trial.frame, trial.views, trial.group
        _mask_bands(graph, match)
        return
    raise first


def _mask_bands(graph, match: Match) -> None:
    """The band of a folded mask (:func:`mask_band`), else of a mask read at run time
    (:func:`runtime_band`)."""
    _bands_to_indices(graph, match)
    match.window, match.causal = mask_band(graph, match)
    if match.window is None and match.causal is None:
        try:
            match.runtime_band = runtime_band(graph, match)
        except Exception as err:  # noqa: BLE001 - it only skips work: the kernel reads all
            logger.warning("%s: every key block read (the band under its run-time mask not "
                           "found: %s)", match.describe(), error_line(err, type(err).__name__))


#: logits at or below this (or -inf) add nothing to a softmax: float16's lowest finite value,
#: what float16 models mask with (``finfo(float16).min``; float32 ones use float32's, far below);
#: ``exp(-65504 - max)`` underflows to 0 exactly in every float format
MASKED = -65504.0
#: a row whose largest logit is at or below this saw no key: an additive fill rounded with
#: its logit (float16's -65504 + 40 is -65472) stays far below it, a logit seen far above
UNSEEN = MASKED / 2


def _constant_grid(graph, match, leaf):
    """The values of a constant read by the logits over (query, key), or None: a constant
    that also varies along the batch or the heads must hold the same grid for each (a mask
    materialized per sequence, ``[batch, 1, query, key]``)."""
    import numpy as np

    value = graph.values.get(leaf.tensor)
    view = match.views.get(("x", leaf.key()))
    if not isinstance(value, ir.expr.Constant) or view is None:
        return None
    ext = match.frame.extents
    others = [(a, s) for a, s in view.strides if s and a not in ("m", "n")]
    if any(a not in ext for a, _ in others):
        return None
    data = value.value.numpy().reshape(-1)
    rows = np.arange(ext["m"])[:, None]
    cols = np.arange(ext["n"])[None, :]
    stride = view.stride
    at = view.offset + stride.get("m", 0) * rows + stride.get("n", 0) * cols
    grid = data[at]
    for index in itertools.product(*(range(ext[a]) for a, _ in others)):
        shift = sum(i * s for i, (_, s) in zip(index, others))
        if shift and not np.array_equal(data[at + shift], grid):
            return None
    return grid


def _band(region, rows, cols) -> tuple[int | None, int | None] | None:
    """``(lo, hi)`` when ``region`` (a boolean grid over (query, key)) is exactly where ``lo <=
    key - query <= hi``, a limit None where it cuts nothing off; None when it is no such band
    (or empty)."""
    import numpy as np

    if not region.any():
        return None
    diag = cols - rows
    lo, hi = int(diag[region].min()), int(diag[region].max())
    if not np.array_equal(region, (diag >= lo) & (diag <= hi)):
        return None
    return (lo if lo > diag.min() else None), (hi if hi < diag.max() else None)


def _outside(frame, lo: int | None, hi: int | None):
    """The index comparison true outside ``lo <= key - query <= hi`` (a limit None: none)."""
    m, n = frame.vars["m"], frame.vars["n"]
    parts = [*([n > m + hi] if hi is not None else []), *([n < m + lo] if lo is not None else [])]
    cond = parts[0] if len(parts) == 1 else tirx.Or(parts[0], parts[1])
    return Iter(frame.simplify(cond), "bool")


def _bands_to_indices(graph, match) -> None:
    """A constant the logits read that takes one value inside a band of diagonals (``lo <= key
    - query <= hi``: a folded causal mask, a sliding window) and another outside becomes that
    comparison of the indices, and one that holds a single value (a mask hiding nothing)
    becomes that value: exactly the same values, and no tensor to read."""
    import numpy as np

    frame = match.frame
    for leaf in leaves(match.score):
        grid = _constant_grid(graph, match, leaf)
        if grid is None or grid.size < 2:
            continue
        values = np.unique(grid)
        if len(values) == 1:  # the same value everywhere (a mask hiding nothing): that value
            _read_as(match, leaf, Const(values[0].item(), leaf.dtype))
            continue
        if len(values) != 2:
            continue
        rows, cols = np.indices(grid.shape)
        first = grid[0, 0]  # the value of the first query's first key: inside, usually
        for inside, outside in ((first, values[values != first][0]),
                                (values[values != first][0], first)):
            band = _band(grid == inside, rows, cols)
            if band is None or band == (None, None):
                continue
            _read_as(match, leaf, Op("select", (_outside(frame, *band), Const(
                outside.item(), leaf.dtype), Const(inside.item(), leaf.dtype)), leaf.dtype))
            break


def _read_as(match, leaf, value) -> None:
    """``match``'s logits with ``value`` in place of the constant ``leaf`` reads (no longer
    read: its view goes)."""
    key = leaf.key()
    match.score = replace(match.score, lambda e: value if isinstance(e, Leaf)
                          and e.key() == key else None)
    match.views.pop(("x", key), None)


def mask_band(graph, match) -> tuple[int | None, int | None]:
    """``(window, causal)`` when the attention's logits are masked exactly outside ``window <=
    key - query <= causal`` (a limit None where there is none; ``(None, None)`` when the mask is
    no such band): a causal mask (``key > query + causal`` masked), a sliding window, or both.

    Decided on the values, not the spelling: every read of the logits besides ``Q·Kᵀ`` must be
    a constant (a mask folded at compile time) indexed by (query, key); the logits are
    evaluated with the product at 0, and the masked set (``-inf`` or below :data:`MASKED`) must
    be the band's outside. Every row must see a key: there, a masked logit adds exactly 0 to
    the softmax, so the key blocks outside the band may be skipped.
    """
    import numpy as np

    none = (None, None)
    ext = match.frame.extents
    m, n = ext["m"], ext["n"]
    grids = {}
    for leaf in leaves(match.score):
        if leaf.tensor == match.score_tensor:
            continue
        grid = _constant_grid(graph, match, leaf)
        if grid is None:
            return none
        grids[leaf.key()] = grid
    rows, cols = np.arange(m)[:, None], np.arange(n)[None, :]

    def read(leaf):
        if leaf.tensor == match.score_tensor:
            return np.zeros((m, n), "float32")
        return grids[leaf.key()]

    coords = {v.name: 0 for v in match.frame.vars.values()}
    coords.update({match.frame.vars["m"].name: rows, match.frame.vars["n"].name: cols})
    try:
        logits = np.broadcast_to(evaluate(match.score, coords, read), (m, n)).astype("float64")
    except (CompositionError, IndexError, ValueError, TypeError):
        return none
    masked = _hidden(logits)
    if not masked.any() or masked.all(axis=1).any():
        return none
    return _band(~masked, rows, cols) or none


#: the most value combinations of a mask's run-time inputs :func:`runtime_band` evaluates, and
#: the logits it evaluates at once (query rows by keys)
RUNTIME_COMBINATIONS = 64
RUNTIME_GRID = 1 << 22
#: graph -> {the composed logits' structure: its band}: every layer of a decoder reads the
#: same mask, and evaluating it took 0.5 s a layer at 2048 tokens
_RUNTIME_BANDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")


def runtime_band(graph, match) -> tuple[int | None, int | None] | None:
    """``(lo, hi)`` where the logits are masked outside ``lo <= key - query <= hi`` whatever
    values the mask's run-time inputs hold (a causal mask combined with a padding mask, as
    Hugging Face's models build it: ``causal & attention_mask[b, key]``), else None.

    The logits' reads besides ``Q·Kᵀ`` are composed through the elementwise ops that made
    them (a mask materialized by another kernel included, which the kernel still reads);
    what they read at run time must depend on the sequence and the key only, and be
    booleans or enter only through comparisons with constants (a cast to bool is one): the
    logits then take finitely many forms, each evaluated with the product at 0 over (query,
    key). Unlike :func:`mask_band`'s, rows may see no key at run time (a sequence's left
    padding): the kernel then computes the skipped blocks too, so the result is the dense one.
    Logits of the same structure in one graph (a decoder's layers, reading one mask) are
    evaluated once.
    """
    ext, names = match.frame.extents, {a: v.name for a, v in match.frame.vars.items()}
    if "m" not in ext or "n" not in ext:
        return None
    square = {names["m"], names["n"]}
    composer = Composer(graph, match.frame.analyzer)
    policy = Policy(inline=lambda node: elementwise(node) or data_movement(node))
    expanded, inputs = {}, {}
    for leaf in leaves(match.score):
        if leaf.tensor == match.score_tensor or _constant(graph, leaf.tensor):
            continue
        try:
            expanded[leaf.key()] = e = composer.element(leaf.tensor, leaf.index, policy)
        except CompositionError:
            return None
        for x in leaves(e):
            if not _constant(graph, x.tensor):
                inputs[x.key()] = x
    if not inputs:
        return None
    allowed = {names[a] for a in ("b", "n") if a in names}
    # the logits with what they read composed in: each input where it enters them
    whole = replace(match.score, lambda e: expanded.get(e.key()) if isinstance(e, Leaf)
                    else None)
    values = {}
    for key, x in inputs.items():
        if not {v.name for i in x.index for v in vars_in(i)} <= allowed:
            return None  # it varies along the queries or the heads
        values[key] = _representatives(x, whole)
        if values[key] is None:
            return None
    for e in [match.score, *expanded.values()]:  # the rest varies along (query, key) only
        for x in walk(e):
            if isinstance(x, Iter):
                used = vars_in(x.expr)
            elif isinstance(x, Leaf) and _constant(graph, x.tensor):
                used = [v for i in x.index for v in vars_in(i)]
            else:
                continue
            if {v.name for v in used} - square:
                return None
    if math.prod(len(v) for v in values.values()) > RUNTIME_COMBINATIONS:
        return None
    m, n = ext["m"], ext["n"]
    # the logits' structure, the product and the frame's variables named by role: what the
    # evaluation below reads (constants by name, in this graph)
    roles = {v: a for a, v in names.items()}
    scores = replace(whole, lambda e: Leaf("", e.index, e.dtype) if isinstance(e, Leaf)
                     and e.tensor == match.score_tensor else None)
    key = (scores.key(roles), m, n)
    known = _RUNTIME_BANDS.setdefault(graph, {})
    if key not in known:
        known[key] = _evaluated_band(graph, match, expanded, values, names, m, n)
    return known[key]


def _evaluated_band(graph, match, expanded, values, names, m, n):
    """:func:`runtime_band`'s band, from the logits evaluated for every combination of the
    run-time inputs' ``values``, ``step`` query rows at a time."""
    import numpy as np

    always = np.ones((m, n), bool)
    step = max(1, RUNTIME_GRID // n)  # query rows evaluated at once
    for r0, combo in itertools.product(range(0, m, step), itertools.product(*values.values())):
        rows = np.arange(r0, min(m, r0 + step))[:, None]
        coords = {v: 0 for v in names.values()}
        coords.update({names["m"]: rows, names["n"]: np.arange(n)[None, :]})
        read = _reader(graph, match, expanded, dict(zip(values, combo)), coords, (len(rows), n))
        try:
            logits = np.broadcast_to(evaluate(match.score, coords, read), (len(rows), n))
        except (CompositionError, IndexError, KeyError, ValueError, TypeError):
            return None
        logits = logits.astype("float64")
        always[r0:r0 + len(rows)] &= _hidden(logits)
    if not always.any():
        return None
    rows, cols = np.arange(m)[:, None], np.arange(n)[None, :]
    band = _band(~always, rows, cols)
    return None if band is None or band == (None, None) else band


def _reader(graph, match, expanded: dict, given: dict, coords: dict, shape: tuple):
    """``read(leaf)`` for :func:`~tvm_stitch.analysis.elem.evaluate` of the logits with the
    product at 0: run-time inputs take their ``given`` values, tensors made of them their
    ``expanded`` elements, constants their values at ``coords``."""
    import numpy as np

    def read(leaf):
        if leaf.tensor == match.score_tensor:
            return np.zeros(shape, "float32")
        if leaf.key() in given:
            return given[leaf.key()]
        if leaf.key() in expanded:
            return evaluate(expanded[leaf.key()], coords, read)
        data = np.asarray(graph.values[leaf.tensor].value.numpy())
        return data[tuple(evaluate_index(i, coords) for i in leaf.index)]

    return read


def _hidden(logits):
    """Where ``logits`` (numpy) add nothing to a softmax: ``-inf`` or at most :data:`MASKED`."""
    import numpy as np

    return np.isneginf(logits) | (logits <= MASKED)


def _constant(graph, tensor: str) -> bool:
    return isinstance(graph.values.get(tensor), ir.expr.Constant)


def _representatives(leaf: Leaf, logits: Elem) -> list | None:
    """Values of a run-time input, one for each way it can decide the comparisons it enters in
    ``logits`` (booleans: both), or None where it enters anything but comparisons with
    constants and casts to bool."""
    if leaf.dtype == "bool":
        return [False, True]
    key, cuts = leaf.key(), set()
    if isinstance(logits, Leaf) and logits.key() == key:
        return None  # the logits are the input itself
    for x in walk(logits):
        if not isinstance(x, Op):
            continue
        args = [a for a in x.args if isinstance(a, Leaf) and a.key() == key]
        if not args:
            continue
        if x.op == "cast" and x.dtype == "bool":
            cuts.add(0.0)  # bool(v) is v != 0
        elif x.op in _COMPARISONS and len(x.args) == 2 and any(
                isinstance(a, Const) for a in x.args):
            cuts.add(float(next(a for a in x.args if isinstance(a, Const)).value))
        else:
            return None
    if not cuts:
        return None
    finite = sorted(c for c in cuts if math.isfinite(c))
    mids = [(a + b) / 2 for a, b in itertools.pairwise(finite)]
    values = [finite[0] - 1.0, *finite, *mids, finite[-1] + 1.0] if finite else []
    if len(finite) < len(cuts):  # a comparison with an infinity (or NaN): the infinities, and
        # a value beyond every finite cut short of them
        big = 1.7976931348623157e308
        values = [-math.inf, -big, *values, big, math.inf]
    return values


def key_masked(match) -> bool:
    """Whether the logits' mask depends on the sequence and the key only (a padding mask read
    at run time, ``[batch, key]``): every query of a sequence sees the same keys, so the
    kernel may find, at run time, the last key a sequence shows and skip the key blocks past
    it (all masked in every row) — unless it shows none, where every row's softmax is over
    masked logits alike and nothing is skipped. False for a constant band (skipped as such),
    or where anything but ``Q·Kᵀ`` varies along the queries or the heads."""
    if match.score is None or match.causal is not None or match.window is not None:
        return False
    reads = [x for x in leaves(match.score) if x.tensor != match.score_tensor]
    if not reads:
        return False
    for leaf in reads:
        view = match.views.get(("x", leaf.key()))
        if view is None or any(s and a not in ("b", "n") for a, s in view.strides):
            return False
    names = {match.frame.vars[a].name for a in match.frame.vars if a not in ("b", "n")}
    for e in walk(match.score):
        if isinstance(e, Iter) and names & {v.name for v in vars_in(e.expr)}:
            return False
    return True


def visible_logits(match) -> Elem | None:
    """The logits over the keys every query sees (``window <= key - query <= causal``): each
    index comparison of (query, key) that is constant over that region becomes its value and
    the selects on it fold away, so key blocks inside the band are computed without the mask
    (FlashAttention's split of the causal loop).  None when the mask is no band or no
    comparison folds.
    """
    import numpy as np

    if (match.causal is None and match.window is None) or match.score is None:
        return None
    ext, names = match.frame.extents, {a: v.name for a, v in match.frame.vars.items()}
    rows, cols = np.arange(ext["m"])[:, None], np.arange(ext["n"])[None, :]
    seen = np.ones((ext["m"], ext["n"]), bool)
    if match.causal is not None:
        seen &= cols <= rows + match.causal
    if match.window is not None:
        seen &= cols >= rows + match.window
    coords = {names["m"]: rows, names["n"]: cols}

    def fold(e):
        if isinstance(e, Iter):
            if not {v.name for v in vars_in(e.expr)} <= set(coords):
                return None
            try:
                values = np.broadcast_to(evaluate(e, coords, None), seen.shape)[seen]
            except (CompositionError, TypeError, ValueError):
                return None
            if values.size and (values == values[0]).all():
                return Const(values[0].item(), e.dtype)
            return None
        if isinstance(e, Op):
            args = tuple(replace(a, fold) for a in e.args)
            if e.op == "select" and isinstance(args[0], Const):
                return args[1] if args[0].value else args[2]
            if e.op in ("add", "sub") and isinstance(args[1], Const) and args[1].value == 0 \
                    and args[0].dtype == e.dtype:
                return args[0]
            if e.op == "add" and isinstance(args[0], Const) and args[0].value == 0 \
                    and args[1].dtype == e.dtype:
                return args[1]
            return Op(e.op, args, e.dtype)
        return None

    visible = replace(match.score, fold)
    return None if visible.key() == match.score.key() else visible


def _attention_views(graph, match) -> None:
    """Every access by strides; K and V may be shared by groups of query heads (GQA)."""
    frame = match.frame
    axes = dict(frame.vars)
    heads = frame.extents.get("h", 1)
    views = {}
    for role, access in all_accesses(match).items():
        view = view_of(graph, access, axes, frame)
        if view is None and role in ("k", "v") and "h" in frame.vars:
            for group in range(2, heads + 1):
                if heads % group == 0 and match.group in (1, group):
                    view = _grouped(graph, access, frame, group)
                    if view is not None:
                        match.group = group
                        break
        if view is None:
            raise NotRecognizedError(f"{role} ({access.tensor}) is not a strided view")
        views[role] = view
    if match.group > 1 and any(views[r].stride.get("h", 0) == 0 and heads > 1 for r in ("q",)):
        raise NotRecognizedError("Q does not vary with the head")
    match.views = views


def _grouped(graph, access, frame, group) -> Strided | None:
    """``access`` as a view over (…, h // group, …): each K/V head serves ``group`` query heads."""
    h = frame.vars["h"]
    hk, r = new_var("hk"), new_var("hr")
    bind(frame.analyzer, hk, frame.extents["h"] // group)
    bind(frame.analyzer, r, group)
    index = tuple(frame.simplify(substitute(i, {h: hk * group + r})) for i in access.index)
    axes = {a: (hk if a == "h" else v) for a, v in frame.vars.items()}
    axes["hr"] = r
    info = graph.tensors[access.tensor]
    view = strided(access.tensor, info.shape, info.dtype, index, axes, frame.analyzer)
    if view is None or view.stride.get("hr", 0) != 0:
        return None
    return dataclasses.replace(view, strides=tuple((a, s) for a, s in view.strides if a != "hr"))
