"""The ``attention`` family's Triton kernel (:func:`attention_source`): flash attention with the
recognized logits ``g(s)`` and output epilogue, the softmax in base-2 exponentials
(:func:`scaled_logits`, :func:`softmax_exp2`), causal block skipping, and Q/K/V read by TMA where
it can (:func:`attention_tma`).  Its warp-specialized Gluon form is :mod:`.gluon`'s."""

from __future__ import annotations

import math

from tvm_stitch.analysis.elem import Const, Elem, Leaf, Op
from tvm_stitch.codegen.elem_printer import ElemPrinter, write_output
from tvm_stitch.codegen.kernel_text import (
    KernelSource,
    base,
    cdiv,
    extra_views,
    function,
    literal,
    plus,
    pointer_args,
    pow2,
    smaller,
    tma_unreadable,
)
from tvm_stitch.families.attention.recognize import (
    MASKED,
    UNSEEN,
    key_masked,
    visible_logits,
)
from tvm_stitch.families.attention.template import ATTENTION_MAX_TILE

LOG2E = 1.4426950408889634


def _times(e: Elem, factor: float) -> Elem:
    """``e · factor`` in float32, the factor pushed into ``e``'s float32 sums, selects and
    constant scales (``s / √d · log2 e`` is one multiplication, a mask's constants are scaled at
    compile time)."""
    if e.dtype != "float32":
        wide = Op("cast", (e,), "float32")
        return Op("mul", (wide, Const(factor, "float32")), "float32")
    if isinstance(e, Const):
        return Const(float(e.value) * factor, e.dtype)
    if isinstance(e, Op):
        a = e.args
        if e.op in ("add", "sub"):
            return Op(e.op, (_times(a[0], factor), _times(a[1], factor)), e.dtype)
        if e.op == "select":
            return Op("select", (a[0], _times(a[1], factor), _times(a[2], factor)), e.dtype)
        if e.op == "mul" and isinstance(a[1], Const):
            return Op("mul", (a[0], Const(float(a[1].value) * factor, e.dtype)), e.dtype)
        if e.op == "mul" and isinstance(a[0], Const):
            return Op("mul", (a[1], Const(float(a[0].value) * factor, e.dtype)), e.dtype)
        if e.op == "div" and isinstance(a[1], Const) and a[1].value:
            return Op("mul", (a[0], Const(factor / float(a[1].value), e.dtype)), e.dtype)
    return Op("mul", (e, Const(factor, e.dtype)), e.dtype)


def scaled_logits(*scores: Elem, product: str | None = None) -> tuple[list[Elem], float, bool]:
    """``(ys, c, fused)``: logits ``ys`` and a factor ``c > 0`` with ``exp(score − max) =
    exp2(y·c − max·c)``, one ``c`` for all.

    ``fused``: each ``scores[i] · log2 e`` equals ``ys[i] · c`` — the softmax takes its row
    maxima of ``y`` and computes ``exp2(y · c − max · c)``, one fused multiply-add per logit
    instead of a multiplication and a subtraction (FlashAttention's form; the maximum commutes
    with a positive scale).  Only where every ``y · c`` is bounded (:data:`FMA_LOGIT_BOUND`:
    the products ``product``, float16 values, moderate constants): ``max · c`` is rounded once
    for a row, and a row whose logits are all one huge masked value (-1e9 added to every key)
    would see that rounding error as the exponent — inf or 0 where the exact form gives 1.

    Otherwise ``ys`` are the scores as written, ``c = log2 e``, and the softmax computes
    ``exp2((y − max) · c)``: the difference first, so that no logit is scaled past float32's
    range (a mask of ``finfo(float32).min``, or bfloat16's lowest value, times ``log2 e`` is
    ``-inf``, and a row of them a NaN where PyTorch's softmax gives a finite row)."""
    scaled = [_times(s, LOG2E) for s in scores]
    factor = next((c for c in map(_factor_of, scaled) if c is not None), None)
    if factor is not None and factor > 0 and math.isfinite(factor):
        ys = [_unscaled(s, factor) for s in scaled]
        if all(y is not None and _bounded(y, factor, product) for y in ys):
            return ys, factor, True
    return list(scores), LOG2E, False


#: the largest ``|y · c|`` the fused exponent takes: float32's rounding of ``max · c`` then
#: stays below 2^-7 in the exponent (0.5% of a probability, common to a row's block)
FMA_LOGIT_BOUND = 2.0 ** 17


def _bounded(e: Elem, factor: float, product: str | None) -> bool:
    """Whether ``|e · factor|`` stays within :data:`FMA_LOGIT_BOUND` by construction: the
    products themselves (as in the scaled form), a 16-bit float widened, constants (or
    ``±inf``), through sums and selects (not their conditions)."""
    if isinstance(e, Const):
        value = float(e.value)
        return math.isinf(value) or abs(value * factor) <= FMA_LOGIT_BOUND
    if isinstance(e, Leaf):
        return product is not None and e.tensor == product
    if isinstance(e, Op):
        if e.op == "cast" and e.args[0].dtype == "float16":
            return 65504.0 * factor <= FMA_LOGIT_BOUND
        if e.op in ("add", "sub"):
            return all(_bounded(a, factor, product) for a in e.args)
        if e.op == "select":
            return all(_bounded(a, factor, product) for a in e.args[1:])
    return False


def softmax_exp2(scale: float, fused: bool) -> tuple[str, str]:
    """The arguments of the online softmax's two ``exp2``: a logit's (``z`` against the row
    maximum ``{m}``) and the old maximum's rescaling (``m_i`` against ``m_safe``), for logits
    ``z`` scaled by ``scale``, fused or not (:func:`scaled_logits`)."""
    c = literal(scale)
    if fused:
        return f"z * {c} - {{m}} * {c}", f"(m_i - m_safe) * {c}"
    return f"(z - {{m}}) * {c}", f"(m_i - m_safe) * {c}"


def _factor_of(e: Elem) -> float | None:
    """The constant factor of the first float32 scaling in ``e`` (through sums and selects)."""
    if isinstance(e, Op):
        if e.op == "mul" and isinstance(e.args[1], Const) and e.dtype == "float32":
            return float(e.args[1].value)
        if e.op in ("add", "sub", "select"):
            for a in e.args[-2:]:
                c = _factor_of(a)
                if c is not None:
                    return c
    return None


def _unscaled(e: Elem, factor: float) -> Elem | None:
    """``y`` with ``y · factor = e``: scalings by ``factor`` dropped, constants divided by it
    (``-inf`` stays), through sums and selects; None where a term is not scaled by it."""
    if isinstance(e, Const):
        return Const(float(e.value) / factor, e.dtype)
    if isinstance(e, Op):
        a = e.args
        if e.op == "mul" and isinstance(a[1], Const) and float(a[1].value) == factor:
            return a[0]
        if e.op in ("add", "sub"):
            x, y = _unscaled(a[0], factor), _unscaled(a[1], factor)
            return None if x is None or y is None else Op(e.op, (x, y), e.dtype)
        if e.op == "select":
            x, y = _unscaled(a[1], factor), _unscaled(a[2], factor)
            return None if x is None or y is None else Op("select", (a[0], x, y), e.dtype)
    return None


def attention_tma(match, host: bool = False) -> str | None:
    """Why TMA cannot bring in an attention's Q, K and V tiles, or None when it can.

    Each operand is contiguous along its head dimension, and its row, batch and head strides
    and its offset are multiples of 16 bytes (TMA's alignment); a head tile is at most 256
    elements (a TMA box's limit). Sizes known at run time only for descriptors the launch
    makes on the host (``host``: the warp-specialized form's, from the call's sizes)."""
    ext = match.frame.extents
    if match.runtime and not host:
        return "sizes known at run time (the kernel makes its descriptors for its sizes)"
    if max(pow2(ext["k"]), pow2(ext["d"])) > 256:
        return "a head dimension wider than a TMA box (256 elements)"
    for role, inner, rows in (("q", "k", "m"), ("k", "k", "n"), ("v", "d", "n")):
        why = tma_unreadable(match.views[role], inner, rows, scalars=("b", "h"))
        if why:
            return f"{role} {why}"
    return None


def empty_rows_denominator(match, lang: str = "tl") -> str:
    """The softmax denominator ``l_i`` the output is divided by; where the model gives rows with
    every key masked zeros (``match.zero_empty_rows``), 1 for those rows, whose sums and
    accumulators are 0 (their exponentials ``exp2(-inf - 0)``)."""
    return f"{lang}.where(l_i == 0.0, 1.0, l_i)" if match.zero_empty_rows else "l_i"


def attention_source(match, name: str, paired: bool = True) -> KernelSource:
    """Flash attention with the recognized logits ``g(s)`` and output epilogue.

    Bounds checks are printed only along axes whose extent a tile may not divide: the head
    tiles are the head dimensions rounded up to powers of two, and query and key tiles are
    powers of two of at most :data:`ATTENTION_MAX_TILE` (the template's legality), so sequence
    lengths that are multiples of it need none.  A causal attention skips the key blocks past
    the diagonal and evaluates its mask only on the blocks the diagonal crosses
    (:func:`~tvm_stitch.families.attention.recognize.visible_logits`); a sliding window skips
    the blocks before it too, and evaluates its mask only on the blocks its edges cross.
    When TMA can read Q, K and V (:func:`attention_tma`), the constexpr ``TMA`` chooses
    tensor-descriptor loads.  Logits
    rounded to 16 bits (BERT's ``(q·kᵀ).half()``) are rounded two values an instruction
    (``paired``; False: one at a time, as Triton does, for studies).
    """
    pointers, inputs, outputs = pointer_args(match)
    ext = match.frame.extents
    views = match.views
    m, n, dk, dh = ext["m"], ext["n"], ext["k"], ext["d"]
    heads = ext.get("h", 1)
    q, kv, vv = views["q"], views["k"], views["v"]
    extras = extra_views(match)
    head_k = "hk" if match.group > 1 else "h"
    bound = {
        axis: f"({tile} < {extent})"
        for axis, tile, extent, even in (
            ("m", "rm", m, m % ATTENTION_MAX_TILE == 0),
            ("n", "rn", n, n % ATTENTION_MAX_TILE == 0),
            ("k", "rk", dk, dk == pow2(dk)),
            ("d", "rh", dh, dh == pow2(dh)),
        )
        if not even
    }

    rows = {a: f"{b}[:, None]" for a, b in bound.items()}  # broadcast along a tile's rows
    cols = {a: f"{b}[None, :]" for a, b in bound.items()}  # ... and along its columns

    def mask(row_axis, col_axis):
        parts = [x for x in (rows.get(row_axis), cols.get(col_axis)) if x]
        return f", mask={' & '.join(parts)}, other=0.0" if parts else ""

    sq, sk, sv = q.stride, kv.stride, vv.stride
    tma = attention_tma(match) is None
    def pointer_loads(keys_bounded=True):
        kn, nd = ("n", "n") if keys_bounded else (None, None)
        return {
            "q": f"tl.load(Q + rm[:, None] * {sq.get('m', 0)} + rk[None, :] * {sq.get('k', 0)}"
            f"{mask('m', 'k')})",
            "k": f"tl.load(K + rk[:, None] * {sk.get('k', 0)} + rn[None, :] * {sk.get('n', 0)}"
            f"{mask('k', kn)})",
            "v": f"tl.load(V + rn[:, None] * {sv.get('n', 0)} + rh[None, :] * {sv.get('d', 0)}"
            f"{mask(nd, 'd')})",
        }
    # out-of-bounds rows and columns of a descriptor's box read as zero: no masks
    tma_loads = {"q": "q_desc.load([pid_m * BLOCK_M, 0])", "k": "k_desc.load([n0, 0]).T",
                 "v": "v_desc.load([n0, 0])"}

    def load(role, keys_bounded=True):
        pointer = pointer_loads(keys_bounded)[role]
        if not tma:
            return [f"{role} = {pointer}"]
        return ["if TMA:", f"    {role} = {tma_loads[role]}", "else:", f"    {role} = {pointer}"]

    lines = [
        "pid_m = tl.program_id(0)",
        "pid = tl.program_id(1)",
        f"b = pid // {heads}",
        f"h = pid % {heads}",
        *([f"hk = h // {match.group}"] if match.group > 1 else []),
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rk = tl.arange(0, BLOCK_K)",
        "rh = tl.arange(0, BLOCK_H)",
        f"Q = {base(q, pointers, {'b': 'b', 'h': 'h'})}",
        f"K = {base(kv, pointers, {'b': 'b', 'h': head_k})}",
        f"V = {base(vv, pointers, {'b': 'b', 'h': head_k})}",
    ]
    if tma:
        lines += [
            "if TMA:",
            f"    q_desc = tl.make_tensor_descriptor(Q, [{m}, {dk}], [{sq['m']}, 1], "
            "[BLOCK_M, BLOCK_K])",
            f"    k_desc = tl.make_tensor_descriptor(K, [{n}, {dk}], [{sk['n']}, 1], "
            "[BLOCK_N, BLOCK_K])",
            f"    v_desc = tl.make_tensor_descriptor(V, [{n}, {dh}], [{sv['n']}, 1], "
            "[BLOCK_N, BLOCK_H])",
        ]
    lines += [
        *load("q"),
        "m_i = tl.full((BLOCK_M,), float('-inf'), dtype=tl.float32)",
        "l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)",
        "acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)",
    ]
    tiles = {"b": "b", "h": "h", "m": "rm[:, None]", "n": "rn[None, :]"}
    masks = {a: x for a, x in (("m", rows.get("m")), ("n", cols.get("n"))) if x}

    visible = visible_logits(match)
    # base-2 exponentials: exp2 is one instruction; log2(e) joins the logits' own scale, which
    # comes out of the row maxima: p = exp2(y·c − max·c), one fused multiply-add a logit (where
    # bounded; else exp2((y − max)·log2 e), see scaled_logits)
    (logits, *rest), scale, fused = scaled_logits(
        match.score, *([visible] if visible else []), product=match.score_tensor)
    visible = rest[0] if rest else None
    exp2 = softmax_exp2(scale, fused)

    def loop(score, start, stop, keys_bounded=True):
        """The key loop; ``keys_bounded`` False: over whole key blocks only, no key bound
        checked (unmasked loads, vectorized and copied asynchronously where aligned)."""
        bounded = masks if keys_bounded else {a: x for a, x in masks.items() if a != "n"}
        printer = ElemPrinter(
            tiles, bounded, pointers, extras, {match.score_tensor: ("s", "float32")},
            prefix="g", paired=paired,
        )
        z = printer.expr(score)
        if "n" in cols and keys_bounded:
            z = f"tl.where({cols['n']}, {z}, float('-inf'))"
        body = [
            "rn = n0 + tl.arange(0, BLOCK_N)",
            *load("k", keys_bounded),
            "s = tl.dot(q, k, input_precision=DOT_PREC)",
            *printer.lines,
            f"z = {z}",
            "m_new = tl.maximum(m_i, tl.max(z, 1))",
            "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
            f"p = tl.exp2({exp2[0].format(m='m_safe[:, None]')})",
            f"alpha = tl.exp2({exp2[1]})",
            *load("v", keys_bounded),
            "l_i = l_i * alpha + tl.sum(p, 1)",
            # the rescaled output is the product's accumulator (wgmma adds into it in place)
            "acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)",
            "m_i = m_new",
        ]
        return [f"for n0 in range({start}, {stop}, BLOCK_N):", *["    " + x for x in body]]

    if match.causal is not None or match.window is not None:
        # keys outside the band (past the diagonal, before a sliding window) of every row of
        # this block are masked: skip their blocks; the blocks every row sees whole go
        # without the mask
        causal, window = match.causal, match.window
        lines.append(f"hi = tl.minimum({n}, (pid_m + 1) * BLOCK_M + {causal})"
                     if causal is not None else f"hi = {n}")
        start = full = 0
        if window is not None:
            lines.append(f"start = tl.maximum(pid_m * BLOCK_M{plus(window)}, 0) // BLOCK_N "
                         "* BLOCK_N")
            start = "start"
        if visible is None:
            lines += loop(logits, start, "hi")
        else:
            if window is not None:  # the first block whose keys the block's last row sees
                lines.append(f"full = tl.minimum(hi, tl.maximum(pid_m * BLOCK_M + BLOCK_M + "
                             f"BLOCK_N{plus(window - 2)}, 0) // BLOCK_N * BLOCK_N)")
                full = "full"
            # ... and the block past the last one its first row sees whole
            lo = "hi" if causal is None else (
                f"tl.minimum(hi, (pid_m * BLOCK_M + {causal + 1}) // BLOCK_N * BLOCK_N)")
            lines.append(f"lo = tl.maximum(full, {lo})" if window is not None and causal
                         is not None else f"lo = {lo}")
            if window is not None:
                lines += loop(logits, start, full)
            lines += loop(visible, full, "lo")
            lines += loop(logits, "lo", "hi")
    elif match.runtime_band is not None:
        lines += _runtime_band_loops(match, n, bound.get("m"), loop, logits, scale)
    else:
        end = n
        if key_masked(match):  # padding read at run time: the keys past the last shown
            lines += _shown_keys(match, n, cols, pointers, extras)
            end = "hi"
        if "n" in cols:
            # the key bound is checked on the last, partial block only (FlashAttention's way)
            lines.append(f"whole = {end} // BLOCK_N * BLOCK_N")
            lines += loop(logits, 0, "whole", keys_bounded=False)
            lines += loop(logits, "whole", end)
        else:
            lines += loop(logits, 0, end)
    lines.append(f"o = acc / {empty_rows_denominator(match)}[:, None]")
    tiles = {"b": "b", "h": "h", "m": "rm[:, None]", "d": "rh[None, :]"}
    out_masks = {a: x for a, x in (("m", rows.get("m")), ("d", cols.get("d"))) if x}
    lines += write_output(match, pointers, tiles, out_masks, "o")
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H", "DOT_PREC", *(["TMA"] if tma else [])]
    text = function(match, name, inputs, outputs, constexprs, lines)
    return KernelSource(
        name, text, inputs, outputs, {"BLOCK_K": pow2(dk), "BLOCK_H": pow2(dh)}, "attention",
        tma=tma,
    )


def _runtime_band_loops(match, n, valid_rows, loop, logits, scale: float) -> list[str]:
    """The key loop of a mask read at run time that hides every key outside a band whatever
    it holds (:func:`~tvm_stitch.families.attention.recognize.runtime_band`): the blocks the
    band crosses, the mask applied on each; then, where a row of the block saw no key (its
    largest score at or below :data:`~tvm_stitch.families.attention.recognize.UNSEEN`; the
    logits are the scores times ``LOG2E / scale``, :func:`scaled_logits`: a sequence's padding
    hid every key it may see, and a softmax of masked logits alike is over every key), the
    blocks outside too, so every row is what the dense kernel computes. A band outside the
    keys (no row of the block sees one) leaves every block to the second part."""
    lo, hi = match.runtime_band
    lines = []
    start = 0
    if lo is not None:  # (at most the keys, so the blocks before it are keys' blocks)
        lines.append(f"start = tl.minimum(tl.maximum(pid_m * BLOCK_M{plus(lo)}, 0), {n}) "
                     "// BLOCK_N * BLOCK_N")
        start = "start"
    end = f"tl.minimum({n}, (pid_m + 1) * BLOCK_M{plus(hi)})" if hi is not None else f"{n}"
    lines.append(f"hi = tl.maximum({end}, {start})")  # (no key before the band's start)
    lines += loop(logits, start, "hi")
    seen = f"tl.where({valid_rows}, m_i, 0.0)" if valid_rows else "m_i"
    rest = ["hi_block = (hi + BLOCK_N - 1) // BLOCK_N * BLOCK_N", *loop(logits, "hi_block", n)]
    if lo is not None:
        rest = [*loop(logits, 0, "start"), *rest]
    unseen = literal(UNSEEN * LOG2E / scale)
    return [*lines, f"if tl.min({seen}, 0) <= {unseen}:", *["    " + x for x in rest]]


def _shown_keys(match, n, cols, pointers, extras) -> list[str]:
    """Lines setting ``hi`` past the last key the program's sequence shows (a padding mask read
    at run time, :func:`~tvm_stitch.families.attention.recognize.key_masked`): the logits'
    mask evaluated with the product at 0 over every key, a key shown where it is above
    :data:`~tvm_stitch.families.attention.recognize.MASKED`; ``hi`` is every key where the
    sequence shows none (its rows' softmax is over masked logits alike)."""
    bounded = "n" in cols
    printer = ElemPrinter({"b": "b", "h": "h", "n": "kn"}, {"n": f"(kn < {n})"} if bounded
                          else {}, pointers, extras, {match.score_tensor: ("s0", "float32")},
                          prefix="shown_")
    z = printer.expr(match.score)
    seen = f"(z0 > {MASKED})" + (f" & (kn < {n})" if bounded else "")
    return [
        "shown = 0",
        f"for n_first in range(0, {n}, BLOCK_N):",
        "    kn = n_first + tl.arange(0, BLOCK_N)",
        "    s0 = tl.zeros((BLOCK_N,), dtype=tl.float32)",
        *["    " + line for line in printer.lines],
        f"    z0 = ({z}).to(tl.float32)",
        f"    shown = tl.maximum(shown, tl.max(tl.where({seen}, kn + 1, 0), 0))",
        f"hi = tl.where(shown == 0, {n}, shown)",
    ]


kernel = attention_source  # the family's printer (see :mod:`tvm_stitch.families`)


#: axes whose sizes may be kernel arguments (:mod:`tvm_stitch.codegen.runtime`)
RUNTIME_EXTENTS = ("b", "m", "n")


def grid(config: dict, match, source) -> tuple:
    """Programs along x, y: one per query tile and (batch, head); the warp-specialized form
    (``WS``, persistent) one per SM, each over several tiles."""
    ext = match.frame.extents
    tiles = (cdiv(ext["m"], config["BLOCK_M"]), ext.get("b", 1) * ext.get("h", 1))
    if config.get("WS"):
        return (smaller(tiles[0] * tiles[1], config["NUM_SMS"]), 1)
    return tiles
