"""Triton source for recognized kernels (:mod:`tvm_stitch.analysis.recognize`).

One printer per family turns a :class:`~tvm_stitch.analysis.recognize.Match` into the text of one
``@triton.jit`` kernel: shapes, strides and offsets are literals, only the tensors' base pointers
are arguments (inputs ``I0, I1, ...`` then outputs ``O0, ...``), and the tile sizes and launch
options stay ``tl.constexpr`` for the search.  Element expressions (epilogues, attention logits)
are printed operator by operator, each shared sub-expression once.  The main loops are the
templates' shared device functions (:mod:`.triton_kernels`), so a generated kernel and the
template the search measures run the same product loop.

The text is written to a cache directory and imported (Triton compiles functions from their
source), under a name derived from its content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import math
import os
import re
import sys
from pathlib import Path

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
from tvm_stitch.codegen.triton_kernels import ATTENTION_MAX_TILE, GEMM_MAX_TILE

_TL_DTYPES = {
    "float16": "tl.float16",
    "bfloat16": "tl.bfloat16",
    "float32": "tl.float32",
    "float64": "tl.float64",
    "int8": "tl.int8",
    "int16": "tl.int16",
    "int32": "tl.int32",
    "int64": "tl.int64",
    "uint8": "tl.uint8",
    "bool": "tl.int1",
}
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


LOG2E = 1.4426950408889634

logger = logging.getLogger("tvm_stitch.codegen")


class UnsupportedKernelError(ValueError):
    """A match the printers cannot express (the message says why)."""


def tl_dtype(dtype: str) -> str:
    try:
        return _TL_DTYPES[str(dtype)]
    except KeyError:
        raise UnsupportedKernelError(f"dtype {dtype} has no Triton type") from None


@dataclasses.dataclass(frozen=True)
class Descriptor:
    """A TMA descriptor argument of a generated kernel, made on the host (by TVM's host code in
    the executable, by Triton's launcher when tuning) and passed by value: descriptors made on
    the device cost their writes and fences in every program (H100: 5 µs of an attention's 21,
    1-3 µs of a persistent GEMM's 10-36).

    ``tensor`` (a graph tensor, from element ``offset``) read or written as a ``rows`` ×
    ``cols`` matrix whose rows are ``stride`` elements apart, in boxes of ``box`` (rows,
    columns): ints or the names of the kernel's constexprs giving them."""

    name: str
    tensor: str
    dtype: str
    offset: int
    rows: int
    cols: int
    stride: int
    box: tuple

    def block(self, consts: dict) -> list[int]:
        """The box for the constexprs ``consts``."""
        return [consts[b] if isinstance(b, str) else b for b in self.box]


def torch_descriptors(source, config: dict, consts: dict, inputs: list, outputs=()) -> dict:
    """Argument name -> Triton host descriptor of each of ``source``'s descriptors for a launch
    with ``config`` (``consts`` its constexprs) over the torch tensors ``inputs`` and
    ``outputs`` (``source.inputs``' and ``source.outputs``' order): what Triton's launcher
    needs to run the kernel from Python."""
    out = {}
    tensors = dict(zip(source.inputs, inputs)) | dict(zip(source.outputs, outputs))
    for d in source.descriptors(config):
        if d.tensor not in tensors:
            raise ValueError(f"no tensor given for descriptor {d.name} ({d.tensor})")
        tensor = tensors[d.tensor]
        # an output stored through it must be the tensor itself: a view, never a copy
        flat = (tensor.view(-1) if d.tensor in source.outputs else tensor.reshape(-1))[d.offset:]
        block = d.block(consts)
        if config.get("WS"):
            from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

            from .gluon_attention import smem_layout

            out[d.name] = TensorDescriptor(flat, [d.rows, d.cols], [d.stride, 1], block,
                                           smem_layout(*block, d.dtype))
        else:
            from triton.tools.tensor_descriptor import TensorDescriptor

            out[d.name] = TensorDescriptor(flat, [d.rows, d.cols], [d.stride, 1], block)
    return out


@dataclasses.dataclass
class KernelSource:
    """A generated kernel.

    Attributes
    ----------
    name : str
        The function's name (also the PTX symbol prefix).
    text : str
        Its source (a module: imports, then the function).
    inputs, outputs : list of str
        Graph tensors behind the pointer arguments ``I0..`` and ``O0..``, in order.
    constexprs : dict
        Fixed ``tl.constexpr`` values (head tiles); the search adds the tiles.
    family : str
    persistent : bool
        A GEMM with the persistent TMA formulation (constexpr ``PERSISTENT``).
    tma : bool
        An attention with tensor-descriptor loads (constexpr ``TMA``).
    split_k : bool
        A GEMM whose programs may split k (constexpr ``SPLIT_K``; pointer arguments ``WS``, a
        float32 workspace, and ``CNT``, per-tile counters that are zero between launches, see
        :func:`split_k_buffers`).
    descs : tuple of Descriptor
        TMA descriptor arguments of the kernel (a GEMM's persistent formulation reads A and B
        through them, and with ``TMA_STORE`` writes its outputs through them; its other
        formulations ignore them).
    tma_store : bool
        A GEMM whose persistent formulation can store its outputs by TMA (constexpr
        ``TMA_STORE``).
    ws : str, optional
        A warp-specialized Gluon form (an attention's, :mod:`.gluon_attention`, or a GEMM's,
        :mod:`.gluon_gemm`), the text of a module defining a kernel of the same name and
        pointer arguments, then the TMA descriptors ``ws_descs``; a config with ``WS``
        launches it (a GEMM's ``WS`` is its consumer warpgroups).
    """

    name: str
    text: str
    inputs: list
    outputs: list
    constexprs: dict
    family: str
    persistent: bool = False
    tma: bool = False
    split_k: bool = False
    ws: str | None = None
    ws_descs: tuple = ()
    descs: tuple = ()
    tma_store: bool = False

    def descriptors(self, config: dict) -> tuple:
        """The TMA descriptor arguments of the form ``config`` launches."""
        return self.ws_descs if config.get("WS") else self.descs

    def grid(self, config: dict, match) -> tuple:
        """Programs along x, y for the tile sizes in ``config``."""
        ext = match.frame.extents
        if self.family == "gemm":
            tiles = _gemm_tiles(match, config)
            # persistent: the Triton form's (PERSISTENT) and the warp-specialized form, whose
            # descriptors are its own (bands over B tensors of their own have no Triton one)
            if (self.persistent and config.get("PERSISTENT")) or _consumers(config) > 1:
                return (min(config["NUM_SMS"], tiles), 1)
            return (tiles * config.get("SPLIT_K", 1), ext.get("b", 1))
        if self.family == "attention":
            tiles = (_cdiv(ext["m"], config["BLOCK_M"]), ext.get("b", 1) * ext.get("h", 1))
            if config.get("WS"):  # persistent: a program per SM, each over several tiles
                return (min(tiles[0] * tiles[1], config["NUM_SMS"]), 1)
            return tiles
        return (
            _cdiv(ext["m"], config["BLOCK_M"]),
            _cdiv(ext["d"], config["BLOCK_H"]),
            ext.get("b", 1) * ext.get("h", 1),
        )


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _consumers(config: dict) -> int:
    """Consumer warpgroups of a warp-specialized GEMM launch (``WS``), else 1 — also where
    ``WS`` is a Triton GEMM's split-K workspace argument (a buffer among its constexprs)."""
    ws = config.get("WS")
    return int(ws) if isinstance(ws, int) and ws else 1


def _gemm_tiles(match, config: dict) -> int:
    """Output tiles of one batch instance of a GEMM (every band's columns) for ``config``: a
    warp-specialized launch's tile is ``WS`` consumers' ``BLOCK_M`` rows each."""
    tiles_n = sum(_cdiv(s.n, config["BLOCK_N"]) for s in match.segments)
    rows = config["BLOCK_M"] * _consumers(config)
    return _cdiv(match.frame.extents["m"], rows) * tiles_n


def launch_constexprs(source: KernelSource, match, config: dict, arg_names) -> dict:
    """The ``tl.constexpr`` values of ``source``'s kernel for the tiles and options in
    ``config`` (keys the kernel does not take are dropped: launch options, another
    formulation's)."""
    consts = {"GROUP_M": 8, "PERSISTENT": False, "TMA": False, "TMA_STORE": False,
              "NUM_SMS": 1, "SPLIT_K": 1, **config, **source.constexprs}
    consts["DOT_PREC"] = "ieee" if match.dtype == "float32" else "tf32"
    consts.setdefault("NB", config.get("num_stages", 2))  # a Gluon kernel's ring slots
    consts["CONSUMERS"] = _consumers(config)  # the Gluon GEMM's consumer warpgroups
    consts["EW"] = int(config.get("EW") or 0)  # and its epilogue partition's warps
    consts["PTR_STORE"] = int(config.get("PTR_STORE") or 0)  # storing through pointers
    if consts["PERSISTENT"]:
        consts["SPLIT_K"] = 1  # the persistent formulation does not split
    if consts["SPLIT_K"] == 1:  # no workspace: the pointers are compiled out
        consts.update(WS=None, CNT=None)
    return {k: v for k, v in consts.items() if k in arg_names}


def split_k_buffers(source: KernelSource, match, consts: dict) -> dict:
    """Buffers a split-K launch needs (``consts`` from :func:`launch_constexprs`): name ->
    ``(elements, dtype)`` for the float32 workspace ``WS`` (``SPLIT_K`` partial tiles per output
    tile and product) and the int32 counters ``CNT`` (one per output tile), which must be zero
    before the first launch (the kernel leaves them zero); empty without a split."""
    split = consts.get("SPLIT_K", 1)
    if not source.split_k or split == 1:
        return {}
    tiles = _gemm_tiles(match, consts) * match.frame.extents.get("b", 1)
    products = len(match.segments[0].products)
    per_tile = split * products * consts["BLOCK_M"] * consts["BLOCK_N"]
    return {"WS": (tiles * per_tile, "float32"), "CNT": (tiles, "int32")}


def pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, math.ceil(math.log2(max(1, n)))))


# -- element expressions ---------------------------------------------------------------------------
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


def _literal(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else f'float("{value}")'


#: columns of a row statistic's loop: a (BLOCK_M, ROW_CHUNK) tile per step
ROW_CHUNK = 64
#: largest tile (BLOCK_M * BLOCK_N) whose GEMM combines its row statistics after the product loop
LATE_STATISTICS = 64 * 64
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
            value = f"tl.where({col_mask}, {value}, {_literal(r.init)})"
        init = full.format(value=_literal(r.init), dtype=dtype)
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


# -- kernels ---------------------------------------------------------------------------------------
#: 16-bit float type -> the helper rounding float32 to it two values an instruction
PAIRED_CASTS = {"float16": "_cvt_f16x2", "bfloat16": "_cvt_bf16x2"}

_HEADER = '''"""Generated by tvm_stitch.codegen.triton_gen: {describe}"""
import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import (
    _erf_abs, _split_arrive, _split_sum, _tile_of, _tile_product, _tile_product2,
    _tile_product_tma
)

'''


def _pointers(match) -> tuple[dict, list, list]:
    """Pointer argument of every tensor: inputs ``I0..`` (views' tensors, in role order), outputs
    ``O0..``; returns (tensor -> name, inputs, outputs)."""
    outputs = [o.tensor for o in match.all_outputs]
    inputs = []
    for role, view in match.views.items():
        if isinstance(role, str) and role.startswith("out"):
            continue
        if view.tensor not in inputs and view.tensor not in outputs:
            inputs.append(view.tensor)
    names = {t: f"I{i}" for i, t in enumerate(inputs)}
    names.update({t: f"O{i}" for i, t in enumerate(outputs)})
    return names, inputs, outputs


def _extra_views(match) -> dict:
    """Leaf key -> view, for the reads of element expressions."""
    return {role[1]: v for role, v in match.views.items() if isinstance(role, tuple)}


def _strides(view: Strided, *axes) -> list[int]:
    s = view.stride
    return [s.get(a, 0) for a in axes]


def _base(view: Strided, pointers, scalars: dict) -> str:
    """``pointer + offset + Σ stride · scalar`` for the axes held by scalars (batch, head)."""
    terms = [pointers[view.tensor]]
    if view.offset:
        terms.append(str(view.offset))
    for axis, stride in view.strides:
        if stride and axis in scalars:
            terms.append(f"{scalars[axis]} * {stride}")
    return " + ".join(terms)


def _store(printer: ElemPrinter, value: str, view: Strided) -> str:
    """The store of ``value`` through the output view ``view``."""
    return (
        f"tl.store({printer.address(view)}, {value}.to({tl_dtype(view.dtype)}), "
        f"mask={printer.mask(view)})"
    )


def _write_output(match, pointers, tiles, masks, accumulator: str) -> list[str]:
    """Lines computing and storing the one output of an attention or chain kernel, whose
    accumulator (float32) is the Triton value ``accumulator``."""
    (out,) = match.outputs
    acc = {t: (accumulator, "float32") for t in out.accumulators}
    printer = ElemPrinter(tiles, masks, pointers, _extra_views(match), acc, prefix="y")
    value = printer.expr(out.elem)
    return [*printer.lines, _store(printer, value, match.views["out0"])]


def _function(match, name, inputs, outputs, constexprs, lines, workspace=()) -> str:
    """The module text: header, then the jitted kernel over the pointer arguments (inputs,
    outputs, then the ``workspace`` buffers its launch provides)."""
    pointers = [f"I{i}" for i in range(len(inputs))] + [f"O{i}" for i in range(len(outputs))]
    pointers += list(workspace)
    params = ", ".join(pointers + [f"{c}: tl.constexpr" for c in constexprs])
    body = "\n".join("    " + line for line in lines)
    # the paired roundings are imported only where used: the other kernels' texts, so their
    # names and tuning records, stay as they were
    paired = [f for f in PAIRED_CASTS.values() if re.search(rf"\b{f}\(", body)]
    header = _HEADER.format(describe=match.describe(outputs=True))
    if paired:
        header += f"from tvm_stitch.codegen.triton_kernels import {', '.join(paired)}\n\n"
    return header + f"@triton.jit\ndef {name}({params}):\n{body}\n"


def gemm_source(match, name: str) -> KernelSource:
    """The GEMM kernel: ``A`` (b, m, k) times each segment's ``B`` (b, k, n), epilogues, stores.

    One program per output tile; a product per band whose operands TMA can read (see
    :func:`tma_layout`) also gets the persistent formulation, chosen by ``PERSISTENT``, whose
    tiles, with one band whose outputs TMA can write, may be stored through descriptors
    (``TMA_STORE``).
    """
    pointers, inputs, outputs = _pointers(match)
    ext = match.frame.extents
    m, k = ext["m"], ext["k"]
    views = match.views
    a = views["a"]
    scalars = {"b": "pid_b"}
    if a.stride.get("k") is None:
        raise UnsupportedKernelError("A does not vary along k")
    s_am, s_ak = _strides(a, "m", "k")
    prelude = [f"tiles_m = tl.cdiv({m}, BLOCK_M)"]
    bounds, start = [], "0"
    for i, seg in enumerate(match.segments):
        prelude.append(f"t{i} = tl.cdiv({seg.n}, BLOCK_N)")
        bounds.append(f"{start} + t{i}" if start != "0" else f"t{i}")
        start = bounds[-1]
    prelude.append(f"tiles_n = {start}")
    # split-K (a computed A, a folded normalization, is not split): SPLIT_K programs per output
    # tile, each over a slice of k whole BLOCK_K steps long
    split = match.prologue is None
    lines = ["pid_b = tl.program_id(1)"]
    if split:
        per = f"(({k} + BLOCK_K * SPLIT_K - 1) // (BLOCK_K * SPLIT_K) * BLOCK_K)"
        lines += [
            "if SPLIT_K == 1:",
            "    tile = tl.program_id(0)",
            "    k_lo = 0",
            f"    k_hi = {k}",
            "else:",
            "    tile = tl.program_id(0) // SPLIT_K",
            f"    k_lo = tl.program_id(0) % SPLIT_K * {per}",
            f"    k_hi = tl.minimum(k_lo + {per}, {k})",
        ]
    else:
        lines.append("tile = tl.program_id(0)")
    lines += [
        "pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
    ]
    if match.prologue is None:
        lines.append(f"A = {_base(a, pointers, scalars)}")
    extras = _extra_views(match)
    row_tiles = {"b": "pid_b", "m": "rm[:, None]"}
    row_masks = {"m": f"(rm < {m})[:, None]"} if m % GEMM_MAX_TILE else {}
    stat_issue, stat_combine, reduced = row_statistics(match.statistics, row_tiles, row_masks,
                                                       pointers, extras)
    stat_lines = stat_issue + stat_combine
    lines += stat_issue
    # small tiles (latency-bound kernels, registers to spare) combine the statistics after the
    # product loop, their loads in flight meanwhile (BERT-base 1x128 folded through the
    # weights: 386.6 -> 367-375 us on an H100); larger ones before it, keeping the registers
    # (held across the loop, (128, 64) float32 pieces cost 32 registers a thread: Q/K/V at
    # 4096 tokens 102 -> 167 registers and no faster, 45.6 vs 45.3 us); so does a prologue
    # reading them
    after = f"BLOCK_M * BLOCK_N <= {LATE_STATISTICS}"
    before = f"BLOCK_M * BLOCK_N > {LATE_STATISTICS}"
    if match.prologue is not None:
        lines += stat_combine
    elif stat_combine:
        lines += [f"if {before}:", *["    " + line for line in stat_combine]]
    segments = match.segments
    # one product loop for every band: recognition groups bands by their number of products
    # (recognize._by_products), so this only guards matches built otherwise
    products = {len(seg.products) for seg in segments}
    if len(products) != 1 or products.pop() > 2:
        raise UnsupportedKernelError("bands with different numbers of products")
    bviews = [[views[f"b{si}.{pi}"] for pi in range(len(seg.products))]
              for si, seg in enumerate(segments)]
    n_axes = [_n_axis(bv[0]) for bv in bviews]
    strides = [[tuple(_strides(bv, "k", n_axes[si])) for bv in bvs]
               for si, bvs in enumerate(bviews)]
    # one product loop for every band (one set of pipeline buffers): the band's B pointers,
    # width and strides are chosen first; literals where every band agrees
    same_n = len({seg.n for seg in segments}) == 1
    same_strides = len({tuple(st) for st in strides}) == 1
    heads = []
    for si in range(len(segments)):
        first = bounds[si - 1] if si else "0"
        if si == 0:
            heads.append((f"if pid_n < {bounds[0]}:" if len(segments) > 1 else None, first))
        elif si == len(segments) - 1:
            heads.append(("else:", first))
        else:
            heads.append((f"elif pid_n < {bounds[si]}:", first))
    for si, (head, first) in enumerate(heads):
        body = [f"rn = (pid_n - ({first})) * BLOCK_N + tl.arange(0, BLOCK_N)"]
        for bi, bv in enumerate(bviews[si]):
            body.append(f"B{bi} = {_base(bv, pointers, scalars)}")
            if not same_strides:
                body.append(f"s_b{bi}k = {strides[si][bi][0]}")
                body.append(f"s_b{bi}n = {strides[si][bi][1]}")
        if not same_n:
            body.append(f"n_band = {segments[si].n}")
        lines += ["    " + line for line in body] if head else body
        if head:
            lines.insert(len(lines) - len(body), head)
    width = str(segments[0].n) if same_n else "n_band"

    def stride(bi, which):
        return str(strides[0][bi][which]) if same_strides else f"s_b{bi}{'kn'[which]}"

    zeros = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
    # operands stored in another precision than the product's are converted in registers
    stored = {a.dtype, *(bv.dtype for bvs in bviews for bv in bvs)}
    convert = f", {tl_dtype(match.dtype)}" if stored != {match.dtype} else ""
    if match.prologue is not None:
        lines += _prologue_product(match, pointers, extras, reduced, row_masks, width,
                                   len(bviews[0]), stride, convert)
    elif len(bviews[0]) == 1:
        lines.append(
            f"acc0 = _tile_product({zeros}, A, B0, rm, rn, {m}, {width}, {k}, {s_am}, {s_ak}, "
            f"{stride(0, 0)}, {stride(0, 1)}, BLOCK_K, DOT_PREC{convert}, K_LO=k_lo, K_HI=k_hi)"
        )
    else:
        lines.append(
            f"acc0, acc1 = _tile_product2({zeros}, {zeros}, A, B0, B1, rm, rn, {m}, {width}, "
            f"{k}, {s_am}, {s_ak}, {stride(0, 0)}, {stride(0, 1)}, {stride(1, 0)}, "
            f"{stride(1, 1)}, BLOCK_K, DOT_PREC{convert}, K_LO=k_lo, K_HI=k_hi)"
        )
    if match.prologue is None and stat_combine:
        lines += [f"if {after}:", *["    " + line for line in stat_combine]]
    if split:
        lines += _split_reduction(len(bviews[0]))
    def band_body(si, seg, within=None, names=pointers, prefix=None, stores=None):
        """Band ``si``'s epilogue; ``within``: a condition every load and store of it also
        needs (a program computing every band's epilogue, storing only its own); ``names``:
        the pointer of each tensor it reads or writes; ``stores``: output tensor -> the TMA
        descriptor storing its tiles (instead of pointers)."""
        n_axis = n_axes[si]
        tiles = {"b": "pid_b", "m": "rm[:, None]", n_axis: "rn[None, :]"}
        # no bounds checks along an axis every legal tile divides
        masks = {
            axis: text
            for axis, extent, text in (
                ("m", m, f"(rm < {m})[:, None]"),
                (n_axis, seg.n, f"(rn < {seg.n})[None, :]"),
            )
            if extent % GEMM_MAX_TILE
        }
        if within:  # on the column axis: every store and every load of a column varies
            masks[n_axis] = f"{masks[n_axis]} & {within}" if n_axis in masks else within
        acc = {t: (f"acc{i}", match.acc_dtype) for i, t in enumerate(seg.accumulators)}
        printer = ElemPrinter(tiles, masks, names, extras, acc, prefix=prefix or f"e{si}_",
                              reduced=reduced)
        body = []
        for oi, out in enumerate(seg.outputs):
            value = printer.expr(out.elem)
            body += printer.lines
            printer.lines = []
            if out.chunk:
                body += _moment_store(out, value, names, m, seg.n, f"mo{oi}")
            elif stores:  # the descriptor clips the tile at the tensor's bounds: no masks
                dtype = tl_dtype(views[f"out{si}.{oi}"].dtype)
                body.append(f"{stores[out.tensor]}.store([pid_m * BLOCK_M, pid_n * BLOCK_N], "
                            f"tl.broadcast_to({value}, (BLOCK_M, BLOCK_N)).to({dtype}))")
            else:
                body.append(_store(printer, value, views[f"out{si}.{oi}"]))
        return body

    epilogues = []
    for si, seg in enumerate(segments):
        head = heads[si][0]
        body = band_body(si, seg)
        if head:
            epilogues.append(head)
            body = ["    " + line for line in body]
        epilogues += body
    if split:  # only a tile's last split applies the epilogue
        lines += ["if last:", *["    " + line for line in epilogues]]
    else:
        lines += epilogues
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "DOT_PREC"]
    if split:
        constexprs.append("SPLIT_K")
    layout = tma_layout(match)
    if isinstance(layout, str):
        body = prelude + lines
    else:
        b_nk, _ = layout
        descs = tma_descriptors(match)  # bands: consecutive column ranges of one B
        # B's column of the tile: a band's tiles start at its first column (a tile reading
        # past its band's last column reads the next band's: those columns are not stored)
        def by_band(value):  # value(band, its first tile) for the band holding pid_n
            text = value(len(segments) - 1, heads[-1][1])
            for si in range(len(segments) - 2, -1, -1):
                text = f"tl.where(pid_n < {bounds[si]}, {value(si, heads[si][1])}, {text})"
            return text

        def first_column(si, first):
            column = sum(seg.n for seg in segments[:si])
            return f"{column} + (pid_n - ({first})) * BLOCK_N" if si else "pid_n * BLOCK_N"

        off_n = by_band(first_column)
        if len(segments) > 1:
            # no `if` choosing the band (Triton 3.6 cannot flatten the tile loop around one):
            # bands whose epilogues differ only in the tensors they read and write (Q, K, V's
            # biases and outputs) and in integers (widths, strides) share one, over pointers
            # and integers chosen by the tile's band; otherwise every band's epilogue runs on
            # the tile's columns, its loads and stores predicated on the tile being in that
            # band (BERT-base's Q/K/V at 4096 tokens on an H100: 28.8 µs shared, 32.8 so)
            local = by_band(lambda si, first: f"pid_n - ({first})" if si else "pid_n")
            epilogues = [f"rn = ({local}) * BLOCK_N + tl.arange(0, BLOCK_N)"]
            shared = _shared_epilogue(segments, band_body, pointers, views)
            if shared is not None:
                choose, body = shared
                epilogues += [f"{p} = {by_band(lambda si, _f, c=c: c[si])}" for p, c in choose]
                epilogues += body
            else:
                epilogues.append("tile_n = (rn * 0 + pid_n)[None, :]")  # a row: a mask's shape
                for si, seg in enumerate(segments):
                    lower = f"tile_n >= {bounds[si - 1]}" if si else None
                    upper = f"tile_n < {bounds[si]}" if si < len(segments) - 1 else None
                    cond = " & ".join(f"({c})" for c in (lower, upper) if c)
                    epilogues += [f"in_band{si} = {cond}", *band_body(si, seg, f"in_band{si}")]
        else:
            # TMA_STORE: the outputs' tiles stored through descriptors (from shared memory, by
            # the copy engine) where TMA can write them
            stores = _tma_stores(match)
            if stores:
                out_descs = [Descriptor(desc, t, views[role].dtype, views[role].offset, m,
                                        segments[0].n, views[role].stride["m"],
                                        ("BLOCK_M", "BLOCK_N"))
                             for t, (desc, role) in stores.items()]
                descs = (*descs, *out_descs)
                tma = band_body(0, segments[0], stores={t: d for t, (d, _) in stores.items()})
                epilogues = ["if TMA_STORE:", *["    " + line for line in tma],
                             "else:", *["    " + line for line in epilogues]]
                constexprs.append("TMA_STORE")
            epilogues = ["rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", *epilogues]
        # float32 products in IEEE precision, as PyTorch's (Triton's default is TF32); a
        # 16-bit kernel's text is left as it was (its tuning records are found by its name)
        ieee = ", DOT_PREC=DOT_PREC" if match.dtype == "float32" else ""
        persistent = [
            "pid_b = 0",
            "done = tl.program_id(0) - NUM_SMS",
            "for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True):",
            "    pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)",
            f"    acc0 = _tile_product_tma({zeros}, a_desc, b_desc, pid_m * BLOCK_M, "
            f"{off_n}, {k}, BLOCK_K, {b_nk}{convert}{ieee})",
            "    # the epilogue's own tile counter keeps it apart from the pipelined prologue",
            "    done += NUM_SMS",
            "    pid_m, pid_n = _tile_of(done, tiles_m, tiles_n, GROUP_M)",
            "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            *["    " + line for line in stat_lines],
            *["    " + line for line in epilogues],
        ]
        body = [
            *prelude,
            "if PERSISTENT:",
            *["    " + line for line in persistent],
            "else:",
            *["    " + line for line in lines],
        ]
        constexprs += ["PERSISTENT", "NUM_SMS"]
    workspace = ["WS", "CNT"] if split else []
    descs = () if isinstance(layout, str) else descs
    text = _function(match, name, inputs, outputs, constexprs, body,
                     [*workspace, *(d.name for d in descs)])
    from .gluon_gemm import gemm_ws_source, ws_descriptors, ws_legality

    why = ws_legality(match)
    if why:
        logger.info("%s: no warp-specialized form: %s", match.describe(), why)
    return KernelSource(name, text, inputs, outputs, {}, "gemm", persistent=not isinstance(
        layout, str), split_k=split, descs=descs, tma_store="TMA_STORE" in constexprs,
        ws=None if why else gemm_ws_source(match, name),
        ws_descs=() if why else ws_descriptors(match))


def _split_reduction(products: int) -> list[str]:
    """Lines adding up a split-K tile (``SPLIT_K > 1``): every split stores its float32
    partial products in the tile's slots of the workspace ``WS``, counts itself in on the
    tile's counter in ``CNT`` (zero between launches), and the last to arrive sums the slots
    and goes on to the epilogue (``last``)."""
    tile = "BLOCK_M * BLOCK_N"
    lines = [
        "last = True",
        "if SPLIT_K > 1:",
        "    slot = pid_b * tiles_m * tiles_n + tile",
        f"    ws = WS + slot * (SPLIT_K * {products} * {tile})",
        "    rw = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
        f"    mine = ws + tl.program_id(0) % SPLIT_K * ({products} * {tile})",
    ]
    lines += [f"    tl.store(mine + {i} * {tile} + rw, acc{i})" for i in range(products)]
    lines += ["    last = _split_arrive(CNT + slot, SPLIT_K)", "    if last:"]
    lines += [
        f"        acc{i} = _split_sum(ws + {i} * {tile}, {products} * {tile}, rw, SPLIT_K)"
        for i in range(products)
    ]
    return lines


class _Placeholders(dict):
    """Tensor -> a placeholder pointer name (``P0``, ``P1``, ...), numbered in the order the
    tensors are first asked for."""

    def __init__(self):
        super().__init__()
        self.order: list[str] = []

    def __missing__(self, tensor):
        self[tensor] = name = f"P{len(self.order)}"
        self.order.append(tensor)
        return name


#: a number in printed code (not part of a name): integers and floats
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[-+]?\d+)?|\d+(?:e[-+]?\d+)?)(?![\w.])")


def _shared_epilogue(segments, band_body, pointers, views):
    """One epilogue for every band of a GEMM, when the bands' epilogues are the same code over
    different tensors of the same types, up to integers (bounds and strides: Q, K and V
    bands of different widths; no moments: their slots follow the tile's column).
    Returns ``(choices, lines)``: ``choices`` pairs each placeholder of ``lines`` (a pointer
    ``P<j>`` or an integer ``N<j>``) with what it stands for in each band; None when the
    bands differ otherwise."""
    bodies, orders = [], []
    for si, seg in enumerate(segments):
        if any(out.chunk for out in seg.outputs):
            return None
        names = _Placeholders()
        bodies.append(band_body(si, seg, names=names, prefix="e_"))
        orders.append(names.order)
    dtypes = {v.tensor: v.dtype for v in views.values()}
    if len({len(b) for b in bodies}) != 1 or len({len(o) for o in orders}) != 1:
        return None
    if any(len({dtypes[o[j]] for o in orders}) != 1 for j in range(len(orders[0]))):
        return None
    choices = [(f"P{j}", [pointers[o[j]] for o in orders]) for j in range(len(orders[0]))]
    integers: dict = {}  # the bands' values -> placeholder
    lines = []
    for band_lines in zip(*bodies):
        pieces = [_NUMBER.split(line) for line in band_lines]
        if len({len(p) for p in pieces}) != 1:
            return None
        merged = []
        for i, alike in enumerate(zip(*pieces)):
            if len(set(alike)) == 1:
                merged.append(alike[0])
            elif i % 2 and all(v.isdigit() and int(v) < 2**31 for v in alike):
                # integers (numbers sit at odd indices) of int32 range: in the epilogue's
                # addresses and masks (no shapes there: moments are left out above)
                name = integers.setdefault(alike, f"N{len(integers)}")
                merged.append(name)
            else:
                return None
        lines.append("".join(merged))
    choices += [(name, list(values)) for values, name in integers.items()]
    return choices, lines


def _moment_store(out, value: str, pointers, m: int, n: int, name: str) -> list[str]:
    """Lines storing a row moment in pieces (the first phase of a two-phase reduction; the
    readers of the row add the pieces): the sum of ``value`` (the tile of its monomial) over
    the tile's columns goes to the first of the ``BLOCK_N // out.chunk`` slots the tile owns,
    zeros to the others — a row's total whatever the tiles, from one reduction along the
    accumulator's rows (no change of layout)."""
    c = out.chunk
    chunks = _cdiv(n, c)
    v = f"{value}.to(tl.float32)"
    if n % GEMM_MAX_TILE:  # a tile may reach past the row: those columns add nothing
        v = f"tl.where((rn < {n})[None, :], {v}, 0.0)"
    rows = f"(rm < {m})[:, None] & " if m % GEMM_MAX_TILE else ""
    slots = f"tl.arange(0, BLOCK_N // {c})"
    return [
        f"{name} = tl.sum({v}, axis=1)",
        f"rj = pid_n * (BLOCK_N // {c}) + {slots}",
        f"{name} = tl.where(({slots} == 0)[None, :], {name}[:, None], 0.0)",
        f"tl.store({pointers[out.tensor]} + rm[:, None] * {chunks} + rj[None, :], {name}, "
        f"mask={rows}(rj < {chunks})[None, :])",
    ]


def _prologue_product(match, pointers, extras, reduced, row_masks, width, products, stride,
                      convert) -> list[str]:
    """The product loop of a GEMM whose ``A`` is computed (a folded normalization): each
    (BLOCK_M, BLOCK_K) tile of ``A`` is computed in registers from the tensors it reads and the
    row statistics, then multiplied."""
    k = match.frame.extents["k"]
    dtype = tl_dtype(match.dtype)
    masks = dict(row_masks)
    k_mask = f"(kk < {k})[None, :]"
    if k % GEMM_MAX_TILE:
        masks["k"] = k_mask
    printer = ElemPrinter({"b": "pid_b", "m": "rm[:, None]", "k": "kk[None, :]"}, masks,
                          pointers, extras, {}, prefix="a_", reduced=reduced)
    value = printer.expr(match.prologue)
    zeros = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
    lines = [f"acc{i} = {zeros}" for i in range(products)]
    lines += [f"for k0 in range(0, {k}, BLOCK_K):", "    kk = k0 + tl.arange(0, BLOCK_K)"]
    body = [*printer.lines, f"a = {value}.to({dtype})"]
    if "k" in masks:  # the padding past k must not reach the product
        body.append(f"a = tl.where({k_mask}, a, 0.0)")
    for i in range(products):
        load = (f"tl.load(B{i} + kk[:, None] * {stride(i, 0)} + rn[None, :] * {stride(i, 1)}, "
                f"mask=(kk[:, None] < {k}) & (rn[None, :] < {width}), other=0.0)")
        body.append(f"b{i} = {load}" + (f".to({dtype})" if convert else ""))
        body.append(f"acc{i} = tl.dot(a, b{i}, acc{i}, input_precision=DOT_PREC)")
    return lines + ["    " + line for line in body]


def _tma_stores(match) -> dict:
    """Output tensor -> ``(descriptor name, view role)`` of every output of a one-band GEMM,
    when TMA can store each (row-major over (m, n), 16-byte aligned, no moments); else {}."""
    if len(match.segments) != 1:
        return {}
    (seg,) = match.segments
    n_axis = _n_axis(match.views["b0.0"])
    stores = {}
    for oi, out in enumerate(seg.outputs):
        if out.chunk or _tma_unreadable(match.views[f"out0.{oi}"], n_axis, "m"):
            return {}
        stores[out.tensor] = (f"o{oi}_desc", f"out0.{oi}")
    return stores


def tma_layout(match, apart: bool = False):
    """How TMA reads a GEMM's operands: ``(b_nk, b_row_stride)``, or why it cannot.

    One product per band, no batch axis, A contiguous along k and B along k (a Linear weight,
    ``b_nk``) or n, every other stride and offset a multiple of 16 bytes (TMA's alignment); the
    bands (if several) consecutive column ranges of one B tensor (see
    :mod:`tvm_stitch.analysis.weights`), which one descriptor reads, or with ``apart`` any B
    tensors of the same strides and dtype, each band read through a descriptor of its own
    (:func:`tma_descriptors` makes them)."""
    ext = match.frame.extents
    if any(len(seg.products) != 1 for seg in match.segments):
        return "several products"
    if match.prologue is not None:
        return "A is computed"
    if ext.get("b", 1) != 1:
        return "a batch axis"
    a, bv = match.views["a"], match.views["b0.0"]
    n_axis = _n_axis(bv)
    s_bk, s_bn = _strides(bv, "k", n_axis)
    if s_bk != 1 and s_bn != 1:
        return "B is contiguous along neither k nor n"
    b_nk = s_bk == 1
    why = _tma_unreadable(a, "k", "m")
    if why:
        return f"A {why}"
    if len(match.segments) > 1 and any(o.chunk for o in match.all_outputs):
        return "bands writing row moments"
    for si in range(len(match.segments)):
        view = match.views[f"b{si}.0"]
        if _strides(view, "k", _n_axis(view)) != [s_bk, s_bn] or view.dtype != bv.dtype:
            return "bands read B with different strides"
    why = _apart(match)  # one descriptor: B's bands are consecutive columns of one tensor
    if why and not apart:
        return why
    for si in range(len(match.segments) if why else 1):  # else a descriptor a band
        view = match.views[f"b{si}.0"]
        n_si = _n_axis(view)
        why = _tma_unreadable(view, "k", n_si) if b_nk else _tma_unreadable(view, n_si, "k")
        if why:
            return f"B {why}" if not si else f"band {si}'s B {why}"
    return b_nk, s_bn if b_nk else s_bk


def _apart(match) -> str | None:
    """Why ``match``'s bands are not consecutive column ranges of one B tensor, or None."""
    bv = match.views["b0.0"]
    s_bn = _strides(bv, "k", _n_axis(bv))[1]
    column = bv.offset
    for si, seg in enumerate(match.segments):
        view = match.views[f"b{si}.0"]
        if view.tensor != bv.tensor:
            return "bands read different B tensors"
        if view.offset != column:
            return "bands are not consecutive columns of B"
        column += seg.n * s_bn
    return None


def tma_descriptors(match, apart: bool = False) -> tuple | str:
    """The TMA descriptors of ``match``'s operands, ``a_desc`` then ``b_desc`` (all bands'
    columns), or with ``apart`` and bands reading B tensors of their own, a descriptor a band
    (``b_desc``, ``b1_desc``, ...); or why TMA cannot read them (:func:`tma_layout`)."""
    layout = tma_layout(match, apart)
    if isinstance(layout, str):
        return layout
    b_nk, b_stride = layout
    a = match.views["a"]
    m, k = match.frame.extents["m"], match.frame.extents["k"]
    s_am = _strides(a, "m", "k")[0]
    box = ("BLOCK_N", "BLOCK_K") if b_nk else ("BLOCK_K", "BLOCK_N")
    descs = [Descriptor("a_desc", a.tensor, a.dtype, a.offset, m, k, s_am, ("BLOCK_M", "BLOCK_K"))]
    if _apart(match) is None:  # one descriptor over every band's columns
        widths = [sum(seg.n for seg in match.segments)]
    else:
        widths = [seg.n for seg in match.segments]
    for si, n in enumerate(widths):
        bv = match.views[f"b{si}.0"]
        descs.append(Descriptor("b_desc" if not si else f"b{si}_desc", bv.tensor, bv.dtype,
                                bv.offset, *((n, k) if b_nk else (k, n)), b_stride, box))
    return tuple(descs)


_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _tma_unreadable(view: Strided, inner: str, rows: str, scalars=()) -> str | None:
    """Why TMA cannot read ``view`` as boxes of (``rows``, ``inner``) elements, or None: it is
    contiguous along ``inner``, advances along ``rows``, is constant along every other axis but
    the ``scalars`` a program fixes (batch, head), and its strides and offset are multiples of
    16 bytes (TMA's alignment)."""
    width = _BYTES.get(view.dtype)
    if width is None:
        return f"holds {view.dtype} elements"
    if view.stride.get(inner) != 1:
        return f"is not contiguous along {inner}"
    if view.stride.get(rows, 0) <= 0:
        return f"does not advance along {rows}"
    for axis, step in view.strides:
        if axis not in (inner, rows, *scalars) and step:
            return f"varies along {axis}"
        if axis != inner and (step * width) % 16:
            return f"has a {axis} stride that is not a multiple of 16 bytes"
    if (view.offset * width) % 16:
        return "has an offset that is not a multiple of 16 bytes"
    return None


def _n_axis(view: Strided) -> str:
    axes = [a for a, _ in view.strides if a.startswith("n")]
    nonzero = [a for a, s in view.strides if a.startswith("n") and s]
    return (nonzero or axes or ["n"])[0]


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
    c = _literal(scale)
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


def attention_tma(match) -> str | None:
    """Why TMA cannot bring in an attention's Q, K and V tiles, or None when it can.

    Each operand is contiguous along its head dimension, and its row, batch and head strides
    and its offset are multiples of 16 bytes (TMA's alignment); a head tile is at most 256
    elements (a TMA box's limit)."""
    ext = match.frame.extents
    if max(pow2(ext["k"]), pow2(ext["d"])) > 256:
        return "a head dimension wider than a TMA box (256 elements)"
    for role, inner, rows in (("q", "k", "m"), ("k", "k", "n"), ("v", "d", "n")):
        why = _tma_unreadable(match.views[role], inner, rows, scalars=("b", "h"))
        if why:
            return f"{role} {why}"
    return None


def attention_source(match, name: str, paired: bool = True) -> KernelSource:
    """Flash attention with the recognized logits ``g(s)`` and output epilogue.

    Bounds checks are printed only along axes whose extent a tile may not divide: the head
    tiles are the head dimensions rounded up to powers of two, and query and key tiles are
    powers of two of at most :data:`ATTENTION_MAX_TILE` (the template's legality), so sequence
    lengths that are multiples of it need none.  A causal attention skips the key blocks past
    the diagonal and evaluates its mask only on the blocks the diagonal crosses
    (:func:`~tvm_stitch.analysis.recognize.visible_logits`).  When TMA can read Q, K and V
    (:func:`attention_tma`), the constexpr ``TMA`` chooses tensor-descriptor loads.  Logits
    rounded to 16 bits (BERT's ``(q·kᵀ).half()``) are rounded two values an instruction
    (``paired``; False: one at a time, as Triton does, for studies).
    """
    from tvm_stitch.analysis.recognize import visible_logits

    pointers, inputs, outputs = _pointers(match)
    ext = match.frame.extents
    views = match.views
    m, n, dk, dh = ext["m"], ext["n"], ext["k"], ext["d"]
    heads = ext.get("h", 1)
    q, kv, vv = views["q"], views["k"], views["v"]
    extras = _extra_views(match)
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
    pointer_loads = {
        "q": f"tl.load(Q + rm[:, None] * {sq.get('m', 0)} + rk[None, :] * {sq.get('k', 0)}"
        f"{mask('m', 'k')})",
        "k": f"tl.load(K + rk[:, None] * {sk.get('k', 0)} + rn[None, :] * {sk.get('n', 0)}"
        f"{mask('k', 'n')})",
        "v": f"tl.load(V + rn[:, None] * {sv.get('n', 0)} + rh[None, :] * {sv.get('d', 0)}"
        f"{mask('n', 'd')})",
    }
    # out-of-bounds rows and columns of a descriptor's box read as zero: no masks
    tma_loads = {"q": "q_desc.load([pid_m * BLOCK_M, 0])", "k": "k_desc.load([n0, 0]).T",
                 "v": "v_desc.load([n0, 0])"}

    def load(role):
        if not tma:
            return [f"{role} = {pointer_loads[role]}"]
        return ["if TMA:", f"    {role} = {tma_loads[role]}", "else:",
                f"    {role} = {pointer_loads[role]}"]

    lines = [
        "pid_m = tl.program_id(0)",
        "pid = tl.program_id(1)",
        f"b = pid // {heads}",
        f"h = pid % {heads}",
        *([f"hk = h // {match.group}"] if match.group > 1 else []),
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rk = tl.arange(0, BLOCK_K)",
        "rh = tl.arange(0, BLOCK_H)",
        f"Q = {_base(q, pointers, {'b': 'b', 'h': 'h'})}",
        f"K = {_base(kv, pointers, {'b': 'b', 'h': head_k})}",
        f"V = {_base(vv, pointers, {'b': 'b', 'h': head_k})}",
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

    def loop(score, start, stop):
        printer = ElemPrinter(
            tiles, masks, pointers, extras, {match.score_tensor: ("s", "float32")}, prefix="g",
            paired=paired,
        )
        z = printer.expr(score)
        if "n" in cols:
            z = f"tl.where({cols['n']}, {z}, float('-inf'))"
        body = [
            "rn = n0 + tl.arange(0, BLOCK_N)",
            *load("k"),
            "s = tl.dot(q, k, input_precision=DOT_PREC)",
            *printer.lines,
            f"z = {z}",
            "m_new = tl.maximum(m_i, tl.max(z, 1))",
            "m_safe = tl.where(m_new == float('-inf'), 0.0, m_new)",
            f"p = tl.exp2({exp2[0].format(m='m_safe[:, None]')})",
            f"alpha = tl.exp2({exp2[1]})",
            *load("v"),
            "l_i = l_i * alpha + tl.sum(p, 1)",
            # the rescaled output is the product's accumulator (wgmma adds into it in place)
            "acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)",
            "m_i = m_new",
        ]
        return [f"for n0 in range({start}, {stop}, BLOCK_N):", *["    " + x for x in body]]

    if match.causal is not None:
        # keys past the diagonal of every row of this block are masked: skip their blocks
        lines.append(f"hi = tl.minimum({n}, (pid_m + 1) * BLOCK_M + {match.causal})")
        if visible is not None:
            # blocks of keys every row of the block sees: no mask to evaluate
            lines.append(
                f"lo = tl.minimum(hi, (pid_m * BLOCK_M + {match.causal + 1}) // BLOCK_N * BLOCK_N)"
            )
            lines += loop(visible, 0, "lo")
            lines += loop(logits, "lo", "hi")
        else:
            lines += loop(logits, 0, "hi")
    else:
        lines += loop(logits, 0, n)
    from .gluon_attention import (
        attention_ws_source,
        empty_rows_denominator,
        ws_descriptors,
        ws_legality,
    )

    lines.append(f"o = acc / {empty_rows_denominator(match)}[:, None]")
    tiles = {"b": "b", "h": "h", "m": "rm[:, None]", "d": "rh[None, :]"}
    out_masks = {a: x for a, x in (("m", rows.get("m")), ("d", cols.get("d"))) if x}
    lines += _write_output(match, pointers, tiles, out_masks, "o")
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H", "DOT_PREC", *(["TMA"] if tma else [])]
    text = _function(match, name, inputs, outputs, constexprs, lines)

    why = ws_legality(match)
    if why:
        logger.info("%s: no warp-specialized form: %s", match.describe(), why)
    return KernelSource(
        name, text, inputs, outputs, {"BLOCK_K": pow2(dk), "BLOCK_H": pow2(dh)}, "attention",
        tma=tma, ws=None if why else attention_ws_source(match, name),
        ws_descs=() if why else tuple(ws_descriptors(match)),
    )


def chain_source(match, name: str) -> KernelSource:
    """``E = (A·B)·D`` with the product rounded to D's dtype, and the output epilogue."""
    pointers, inputs, outputs = _pointers(match)
    ext = match.frame.extents
    views = match.views
    m, n, k, d = ext["m"], ext["n"], ext["k"], ext["d"]
    heads = ext.get("h", 1)
    a, b, dv = views["a"], views["b"], views["d"]
    scal = {"b": "bb", "h": "hh"}
    sa, sb, sd = a.stride, b.stride, dv.stride
    lines = [
        "pid_m = tl.program_id(0)",
        "pid_h = tl.program_id(1)",
        "pid = tl.program_id(2)",
        f"bb = pid // {heads}",
        f"hh = pid % {heads}",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)",
        f"A = {_base(a, pointers, scal)}",
        f"B = {_base(b, pointers, scal)}",
        f"D = {_base(dv, pointers, scal)}",
        "acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)",
        f"for n0 in range(0, {n}, BLOCK_N):",
        "    rn = n0 + tl.arange(0, BLOCK_N)",
        "    c = _tile_product(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), A, B, rm, rn, "
        f"{m}, {n}, {k}, {sa.get('m', 0)}, {sa.get('k', 0)}, {sb.get('k', 0)}, "
        f"{sb.get('n', 0)}, BLOCK_K, DOT_PREC)",
        f"    dd = tl.load(D + rn[:, None] * {sd.get('n', 0)} + rh[None, :] * {sd.get('d', 0)}, "
        f"mask=(rn < {n})[:, None] & (rh < {d})[None, :], other=0.0)",
        "    acc += tl.dot(c.to(dd.dtype), dd, input_precision=DOT_PREC)",
    ]
    tiles = {"b": "bb", "h": "hh", "m": "rm[:, None]", "d": "rh[None, :]"}
    masks = {"m": f"(rm < {m})[:, None]", "d": f"(rh < {d})[None, :]"}
    lines += _write_output(match, pointers, tiles, masks, "acc")
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H", "DOT_PREC"]
    text = _function(match, name, inputs, outputs, constexprs, lines)
    return KernelSource(name, text, inputs, outputs, {}, "chain")


PRINTERS = {"gemm": gemm_source, "attention": attention_source, "chain": chain_source}


def kernel_source(match, name: str | None = None) -> KernelSource:
    """The generated kernel of ``match``, named after its content unless ``name`` is given."""
    draft = PRINTERS[match.family](match, "KERNEL")
    body = draft.text[draft.text.index("@triton.jit") :]  # the header names the call site
    if draft.ws:  # another form to search: records of the Triton form alone are stale
        body += draft.ws[draft.ws.index("@gluon") :]
    # the launch's buffers are part of the kernel: equal code over differently shaped tensors
    # (a residual of (1, s, h) in one layer, (s, h) in another) is another PrimFunc
    # (by the pointer arguments' order, never the graph's tensor names: equal kernels of two
    # layers or two models share their name, PrimFunc and tuning record)
    _, inputs, outputs = _pointers(match)
    shapes = {v.tensor: (v.shape, v.dtype) for v in match.views.values()}
    signature = [shapes[t] for t in (*inputs, *outputs)]
    digest = hashlib.sha1((body + repr(signature)).encode()).hexdigest()[:10]
    name = name or f"stitch_{match.family}_{digest}"

    def named(text):  # the draft under its name (printing it again costs as much as the draft)
        return re.sub(r"\bKERNEL\b", name, text) if text else text

    return dataclasses.replace(draft, name=name, text=named(draft.text), ws=named(draft.ws))


# -- loading ---------------------------------------------------------------------------------------
_LOADED: dict = {}


#: unwritable kernel cache folders -> the temporary folder standing in for each
_CACHE_FALLBACKS: dict = {}


def cache_dir() -> Path:
    """Where generated sources are written (``$TVM_STITCH_CACHE`` or ``~/.cache/tvm-stitch``,
    its ``triton`` folder), made if missing; where that folder cannot be made or written, a
    private temporary folder of this process, removed at exit (with a warning, once)."""
    import atexit
    import shutil
    import tempfile

    root = os.environ.get("TVM_STITCH_CACHE")
    folder = (Path(root) if root else Path.home() / ".cache" / "tvm-stitch") / "triton"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # writable, not only there
            return folder
    except OSError as err:
        fallbacks = _CACHE_FALLBACKS
        if folder not in fallbacks or not fallbacks[folder].is_dir():
            fallbacks[folder] = Path(tempfile.mkdtemp(prefix="tvm-stitch-triton-"))
            atexit.register(shutil.rmtree, fallbacks[folder], ignore_errors=True)
            logger.warning("kernel cache %s not writable (%s): generated sources go to %s",
                           folder, err, fallbacks[folder])
        return fallbacks[folder]


def load(source: KernelSource, config: dict | None = None):
    """The jitted function of ``source`` (written to :func:`cache_dir` and imported once); its
    warp-specialized Gluon form when ``config`` has ``WS``."""
    text = source.text
    if config and config.get("WS"):
        if not source.ws:
            raise UnsupportedKernelError(f"{source.name} has no warp-specialized form")
        text = source.ws
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key in _LOADED:
        return _LOADED[key]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{source.name}_{key}.py"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    module_name = f"tvm_stitch_generated_{key}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    _LOADED[key] = getattr(module, source.name)
    return _LOADED[key]
