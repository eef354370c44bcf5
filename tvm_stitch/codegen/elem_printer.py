"""Element expressions (:mod:`tvm_stitch.analysis.elem`) printed as lines of Triton code: an
epilogue, an attention's logits, a computed ``A``, the row statistics a kernel reads, and the
stores of its outputs.  Printed operator by operator, each shared sub-expression once; the
Gluon forms print with the same printer and rename ``tl.`` to ``gl.``
(:func:`~tvm_stitch.codegen.kernel_text.gluon_line`)."""

from __future__ import annotations

import math

from tvm import ir
from tvm.ir.prim import expr as P

from tvm_stitch.analysis.elem import (
    Const,
    Elem,
    Iter,
    Leaf,
    Op,
    Reduce,
    leaves,
    offset_erf,
    reductions,
    replace,
)
from tvm_stitch.analysis.indexing import Strided, dtype_of
from tvm_stitch.codegen.kernel_text import (
    PAIRED_CASTS,
    UnsupportedKernelError,
    extra_views,
    literal,
    tl_dtype,
)

_INFIX = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "and": "&",
    "or": "|",
}
_CALLS = {
    "exp": "tl.exp",
    "exp2": "tl.exp2",
    "log": "tl.log",
    "log2": "tl.log2",
    "sqrt": "tl.sqrt",
    "rsqrt": "tl.rsqrt",
    "sigmoid": "tl.sigmoid",
    "fabs": "tl.abs",
    "floor": "tl.floor",
    "ceil": "tl.ceil",
    "erf": "tl.math.erf",
    "erf_abs": "_erf_abs",  # an erf inside c + s·erf, |c| ≥ |s|/2 (analysis.elem.offset_erf)
    "sin": "tl.sin",
    "cos": "tl.cos",
}


class ElemPrinter:
    """Prints element expressions into lines of Triton code.

    Parameters
    ----------
    tiles : dict
        Frame axis name -> Triton expression of its coordinates in the current tile (a scalar
        like ``b`` or a broadcastable tile like ``rm[:, None]``).
    masks : dict
        Axis name -> boolean tile of the in-bounds coordinates (axes without one need none).
    pointers : dict
        Graph tensor -> pointer argument name.
    views : dict
        Leaf key -> :class:`Strided` view of that read.
    accumulators : dict
        Graph tensor -> Triton name of the value standing for it (accumulators, logits).
    reduced : dict, optional
        Structural key of a row statistic (:class:`Reduce`) -> Triton name of its values over
        the tile's rows (computed beforehand, see :func:`row_statistics`).
    paired : bool, optional
        Float32 values cast (or accumulators read) as 16-bit floats are rounded two values an
        instruction (:func:`~tvm_stitch.codegen.triton_kernels._cvt_f16x2`; Triton code only,
        where the rounding is on a loop's path: an attention's float16 logits).
    """

    def __init__(self, tiles, masks, pointers, views, accumulators, prefix="t", reduced=None,
                 paired=False):
        self.paired = paired
        self.tiles, self.masks = tiles, masks
        self.pointers, self.views, self.acc = pointers, views, accumulators
        self.reduced = reduced or {}
        self.lines: list[str] = []
        self._names: dict = {}
        self._keys: dict = {}  # id -> structural key (the elements outlive the printer)
        self._prefix = prefix
        self._count = 0

    def _tmp(self, text: str) -> str:
        name = f"{self._prefix}{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {text}")
        return name

    def expr(self, e: Elem) -> str:
        # structurally equal subexpressions are printed once (an epilogue's tree repeats them:
        # GELU's x appears twice, with its bias load and add); Triton does not merge loads
        key = self._keys.get(id(e))
        if key is None:
            key = self._keys[id(e)] = e.key()
        if key in self._names:
            return self._names[key]
        text = self._print(e)
        if not isinstance(e, (Const,)) and not text.isidentifier():
            text = self._tmp(text)
        self._names[key] = text
        return text

    def _print(self, e: Elem) -> str:
        if isinstance(e, Const):
            if e.dtype == "bool":
                return "True" if e.value else "False"
            if "float" in e.dtype:
                value = float(e.value)
                if math.isinf(value) or math.isnan(value) or abs(value) > 65504:
                    lit = repr(value) if math.isfinite(value) else f'float("{value}")'
                    return f"tl.full([], {lit}, {tl_dtype(e.dtype)})"
                return repr(value)
            return str(int(e.value))
        if isinstance(e, Iter):
            return f"({self.index(e.expr)})"
        if isinstance(e, Leaf):
            if e.tensor in self.acc:
                name, dtype = self.acc[e.tensor]
                return name if dtype == e.dtype else self._cast(name, dtype, e.dtype, True)
            return self.load(e)
        if isinstance(e, Reduce):
            name = self.reduced.get(e.key())
            if name is None:
                raise UnsupportedKernelError("a reduction inside an epilogue")
            return f"{name}[:, None]"
        erf = offset_erf(e)
        if erf is not None:  # the sum needs the erf's absolute accuracy only
            e = replace(e, lambda x: Op("erf_abs", x.args, x.dtype) if x is erf else None)
        folded = _constant(e)
        if folded is not None:  # a folded mask's False, cast: Triton has no False.to()
            return self._print(folded)
        args = [self.expr(a) for a in e.args]
        op = e.op
        if op in _INFIX:
            return f"({args[0]} {_INFIX[op]} {args[1]})"
        if op == "cast":
            whole = any(x.tensor in self.acc for x in leaves(e.args[0]))
            return self._cast(args[0], e.args[0].dtype, e.dtype, whole)
        if op == "not":
            return f"(~{args[0]})"
        if op == "select":
            return f"tl.where({args[0]}, {args[1]}, {args[2]})"
        if op in ("min", "max"):
            return f"tl.{op}imum({args[0]}, {args[1]})"
        if op in ("floordiv", "floormod"):
            raise UnsupportedKernelError(f"{op} of values")
        if op == "tanh":  # tanh(u) = 2·sigmoid(2u) - 1 (Triton 3.6 has no tl.tanh)
            wide = f"{args[0]}.to(tl.float32)" if e.dtype != "float64" else args[0]
            return f"(2.0 * tl.sigmoid(2.0 * {wide}) - 1.0).to({tl_dtype(e.dtype)})"
        if op == "pow":
            return self._pow(e, args)
        if op == "isnan":
            return f"({args[0]} != {args[0]})"
        if op == "isinf":
            return f"(tl.abs({args[0]}) == float('inf'))"
        if op in _CALLS:
            # Triton's math functions take float32 or float64: compute half precision in float32
            if e.dtype in ("float16", "bfloat16"):
                return f"{_CALLS[op]}({args[0]}.to(tl.float32)).to({tl_dtype(e.dtype)})"
            return f"{_CALLS[op]}({args[0]})"
        raise UnsupportedKernelError(f"operator {op}")

    def _cast(self, text: str, src: str, dst: str, whole: bool) -> str:
        """``text``, of type ``src``, cast to ``dst``: rounded in pairs (``paired``) where it
        is float32 rounded to 16 bits and ``whole`` — it reads an accumulator, so it is a
        whole tile in the product's layout, two neighbouring values a thread (a row or column
        vector, or a scalar, keeps ``.to()``)."""
        if self.paired and whole and src == "float32" and dst in PAIRED_CASTS:
            return f"{PAIRED_CASTS[dst]}({text})"
        return f"{text}.to({tl_dtype(dst)})"

    def _pow(self, e: Op, args) -> str:
        base, exponent = e.args
        if not isinstance(exponent, Const):
            raise UnsupportedKernelError("a power with a computed exponent")
        p = float(exponent.value)
        if p == int(p) and 1 <= p <= 4:
            return "(" + " * ".join([args[0]] * int(p)) + ")"
        if p == 0.5:
            return self._print(Op("sqrt", (base,), e.dtype))
        wide = f"{args[0]}.to(tl.float32)"
        return f"tl.exp(tl.log({wide}) * {p}).to({tl_dtype(e.dtype)})"

    def load(self, leaf: Leaf) -> str:
        view = self.views[leaf.key()]
        mask = self.mask(view)
        if mask == "None":
            return f"tl.load({self.address(view)})"
        return f"tl.load({self.address(view)}, mask={mask}, other=0)"

    def address(self, view: Strided, tiles=None) -> str:
        tiles = tiles or self.tiles
        terms = [self.pointers[view.tensor]]
        if view.offset:
            terms.append(str(view.offset))
        for axis, stride in view.strides:
            if stride:
                tile = tiles[axis]
                terms.append(tile if stride == 1 else f"{tile} * {stride}")
        return " + ".join(terms)

    def mask(self, view: Strided, masks=None) -> str:
        masks = masks or self.masks
        parts = [masks[a] for a, s in view.strides if s and a in masks]
        return " & ".join(parts) if parts else "None"

    def index(self, expr) -> str:
        """A coordinate expression (PrimExpr over the frame's variables) in Triton."""
        if isinstance(expr, ir.expr.Var):
            return self.tiles[expr.name]
        if isinstance(expr, P.IntImm):
            return str(int(expr.value))
        binary = {
            P.Add: "+",
            P.Sub: "-",
            P.Mul: "*",
            P.FloorDiv: "//",
            P.FloorMod: "%",
            P.EQ: "==",
            P.NE: "!=",
            P.LT: "<",
            P.LE: "<=",
            P.GT: ">",
            P.GE: ">=",
            P.And: "&",
            P.Or: "|",
        }
        for cls, sym in binary.items():
            if isinstance(expr, cls):
                return f"({self.index(expr.a)} {sym} {self.index(expr.b)})"
        if isinstance(expr, (P.Min, P.Max)):
            name = "minimum" if isinstance(expr, P.Min) else "maximum"
            return f"tl.{name}({self.index(expr.a)}, {self.index(expr.b)})"
        if isinstance(expr, P.Cast):
            return f"({self.index(expr.value)}).to({tl_dtype(dtype_of(expr))})"
        if isinstance(expr, P.Not):
            return f"(~{self.index(expr.a)})"
        if isinstance(expr, P.Select):
            c, t, f = (self.index(x) for x in (expr.condition, expr.true_value, expr.false_value))
            return f"tl.where({c}, {t}, {f})"
        raise UnsupportedKernelError(f"coordinate expression {type(expr).__name__}")


#: columns of a row statistic's loop: a (BLOCK_M, ROW_CHUNK) tile per step
ROW_CHUNK = 64
_COMBINE = {"sum": "{acc} + tl.sum({v}, axis=1)", "max": "tl.maximum({acc}, tl.max({v}, axis=1))",
            "min": "tl.minimum({acc}, tl.min({v}, axis=1))"}


def row_statistics(reduces, tiles, masks, pointers, views, arange="tl.arange(0, {n})",
                   full="tl.full([BLOCK_M], {value}, {dtype})") -> tuple[list, list, dict]:
    """Lines computing each row statistic over the tile's rows (``tiles``/``masks`` give the
    row coordinates), inner statistics first: the first phase of a two-phase reduction whose
    second is the kernel's use of them.  Returns the lines that issue the loads, the lines
    that combine them, and key -> Triton name.

    A statistic over at most ``ROW_CHUNK`` values of a row that reads no other statistic (the
    pieces of a moment its producer wrote) is loaded in one (BLOCK_M, width) tile by the first
    lines and summed by the second, so a kernel can issue the loads before its product loop
    and combine them after it: the loads' latency hides behind the products. Longer ones, and
    those reading other statistics, loop over chunks of ``ROW_CHUNK`` columns in the first
    lines, after the statistics before them are combined.  ``arange`` and ``full``: how a
    range of columns and a row of initial values are printed (Gluon names their layouts)."""
    issue, combine, names = [], [], {}
    for i, r in enumerate(reduces):
        name, var = f"stat{i}", r.var.name
        dtype = tl_dtype(r.dtype)
        one = r.extent <= ROW_CHUNK and not reductions(r.body)
        width = 1 << max(r.extent - 1, 0).bit_length() if one else ROW_CHUNK
        rr = f"rr{i}"
        col_mask = f"({rr} < {r.extent})[None, :]"
        inner_masks = dict(masks)
        if r.extent % width:
            inner_masks[var] = col_mask
        printer = ElemPrinter({**tiles, var: f"{rr}[None, :]"}, inner_masks, pointers, views, {},
                              prefix=f"s{i}_", reduced=names)
        value = f"{printer.expr(r.body)}.to({dtype})"
        if r.extent % width:
            value = f"tl.where({col_mask}, {value}, {literal(r.init)})"
        init = full.format(value=literal(r.init), dtype=dtype)
        if one:
            issue += [f"{rr} = {arange.format(n=width)}", *printer.lines]
            combine.append(f"{name} = " + _COMBINE[r.op].format(acc=init, v=value))
        else:  # it may read the statistics before it: those are combined first
            issue += combine
            combine = []
            issue += [f"{name} = {init}", f"for r0 in range(0, {r.extent}, {ROW_CHUNK}):",
                      f"    {rr} = r0 + {arange.format(n=ROW_CHUNK)}",
                      *["    " + line for line in printer.lines],
                      f"    {name} = " + _COMBINE[r.op].format(acc=name, v=value)]
        names[r.key()] = name
    return issue, combine, names


def store(printer: ElemPrinter, value: str, view: Strided) -> str:
    """The store of ``value`` through the output view ``view``."""
    return (
        f"tl.store({printer.address(view)}, {value}.to({tl_dtype(view.dtype)}), "
        f"mask={printer.mask(view)})"
    )


def write_output(match, pointers, tiles, masks, accumulator: str) -> list[str]:
    """Lines computing and storing the one output (``match.outputs``, view ``out0``) of a
    kernel (attention, chain), whose accumulator (float32) is the Triton value
    ``accumulator``."""
    (out,) = match.outputs
    acc = {t: (accumulator, "float32") for t in out.accumulators}
    printer = ElemPrinter(tiles, masks, pointers, extra_views(match), acc, prefix="y")
    value = printer.expr(out.elem)
    return [*printer.lines, store(printer, value, match.views["out0"])]


def _constant(e: Elem) -> Const | None:
    """``e`` as one constant where it is a constant cast (any number of times), else None."""
    if not (isinstance(e, Op) and e.op == "cast"):
        return None
    inner = e.args[0] if isinstance(e.args[0], Const) else _constant(e.args[0])
    if inner is None:
        return None
    import numpy as np

    with np.errstate(all="ignore"):  # the cast as the kernel makes it (rounded, wrapped)
        value = np.asarray(inner.value, inner.dtype).astype(e.dtype).item()
    return Const(value, e.dtype)
