"""The text of generated kernels, shared by the families' printers (:mod:`tvm_stitch.families`).

A family's printer (``families/<family>/triton.py``, ``families/<family>/gluon.py``) turns a
:class:`~tvm_stitch.analysis.match.Match` into the text of one kernel: shapes, strides and
offsets are literals, only the tensors' base pointers are arguments (inputs ``I0, I1, ...`` then
outputs ``O0, ...``), and the tile sizes and launch options stay constexprs for the search.
Here: what more than one of them uses — the generated kernel's :class:`KernelSource` and its
TMA :class:`Descriptor` arguments, the constexprs and buffers of a launch, the module text
around a Triton kernel (:func:`function`), the pointer arguments and bases, TMA's alignment
rules, and the Gluon forms' shared helpers.  Element expressions are printed by
:mod:`tvm_stitch.codegen.elem_printer`; the dispatch, naming and loading of kernels is
:mod:`tvm_stitch.codegen.triton_gen`'s.
"""

from __future__ import annotations

import dataclasses
import math
import re

from tvm_stitch.analysis.indexing import Strided

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


class UnsupportedKernelError(ValueError):
    """A match the printers cannot express (the message says why)."""


def tl_dtype(dtype: str) -> str:
    try:
        return _TL_DTYPES[str(dtype)]
    except KeyError:
        raise UnsupportedKernelError(f"dtype {dtype} has no Triton type") from None


def pow2(n: int, least: int = 16) -> int:
    return max(least, 1 << max(0, math.ceil(math.log2(max(1, n)))))


def literal(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else f'float("{value}")'


def plus(c: int) -> str:
    """`` + c`` or `` - |c|``: an integer added to the term before it in printed code."""
    return f" - {-c}" if c < 0 else f" + {c}"


@dataclasses.dataclass(frozen=True)
class Descriptor:
    """A TMA descriptor argument of a generated kernel, made on the host (by TVM's host code in
    the executable, by Triton's launcher when tuning) and passed by value: descriptors made on
    the device cost their writes and fences in every program (H100: 5 µs of an attention's 21,
    1-3 µs of a persistent GEMM's 10-36).

    ``tensor`` (a graph tensor, from element ``offset``) read or written as a ``rows`` ×
    ``cols`` matrix whose rows are ``stride`` elements apart, in boxes of ``box`` (rows,
    columns): ints, the names of the kernel's constexprs giving them, or ``(factor, name)``
    for a multiple of one (a paired GEMM's B box, ``2 * BLOCK_N`` rows)."""

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
        return [consts[b] if isinstance(b, str) else b[0] * consts[b[1]]
                if isinstance(b, tuple) else b for b in self.box]


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

            out[d.name] = TensorDescriptor(flat, [d.rows, d.cols], [d.stride, 1], block,
                                           smem_layout(*block, d.dtype))
        else:
            from triton.tools.tensor_descriptor import TensorDescriptor

            out[d.name] = TensorDescriptor(flat, [d.rows, d.cols], [d.stride, 1], block)
    return out


def smem_layout(rows: int, cols: int, dtype: str):
    """The shared-memory layout of a (rows, cols) box (the kernel's ``_smem_layout``)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for([rows, cols], getattr(gl, dtype))


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
        :func:`launch_buffers`).
    descs : tuple of Descriptor
        TMA descriptor arguments of the kernel (a GEMM's persistent formulation reads A and B
        through them, and with ``TMA_STORE`` writes its outputs through them; its other
        formulations ignore them).
    tma_store : bool
        A GEMM whose persistent formulation can store its outputs by TMA (constexpr
        ``TMA_STORE``).
    arguments : dict
        Integer arguments before the pointers (a kernel of symbolic shape,
        :mod:`tvm_stitch.codegen.runtime`): name -> the expression of the symbolic dims the
        launch passes.
    ws : str, optional
        A warp-specialized Gluon form (an attention's, :mod:`tvm_stitch.families.attention.gluon`,
        or a GEMM's, :mod:`tvm_stitch.families.gemm.gluon`), the text of a module defining a
        kernel of the same name and pointer arguments, then the TMA descriptors ``ws_descs``;
        a config with ``WS`` launches it (a GEMM's ``WS`` is its consumer warpgroups).
    prefetch : tuple of str
        Inputs in memory before the function runs (weights) that the kernel pulls into L2
        before it waits for the kernel before it
        (:func:`~tvm_stitch.codegen.dependent.prefetch_inputs`).
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
    arguments: dict = dataclasses.field(default_factory=dict)
    prefetch: tuple = ()

    def descriptors(self, config: dict) -> tuple:
        """The TMA descriptor arguments of the form ``config`` launches."""
        return self.ws_descs if config.get("WS") else self.descs

    def grid(self, config: dict, match) -> tuple:
        """Programs along x, y (, z) for the tile sizes in ``config`` (the family's
        ``grid``)."""
        from tvm_stitch.families import part  # the registry: data only

        return part(self.family, "triton").grid(config, match, self)


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def smaller(a, b):
    """``min(a, b)`` of ints, or of integer expressions known at call time (a runtime
    kernel's grid, :mod:`tvm_stitch.codegen.runtime`)."""
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    import tvm

    return tvm.tirx.min(a, b)


def consumers(config: dict) -> int:
    """Consumer warpgroups of a warp-specialized GEMM launch (``WS``), else 1 — also where
    ``WS`` is a Triton GEMM's split-K workspace argument (a buffer among its constexprs)."""
    ws = config.get("WS")
    return int(ws) if isinstance(ws, int) and ws else 1


def launch_constexprs(source: KernelSource, match, config: dict, arg_names) -> dict:
    """The ``tl.constexpr`` values of ``source``'s kernel for the tiles and options in
    ``config`` (keys the kernel does not take are dropped: launch options, another
    formulation's)."""
    consts = {"GROUP_M": 8, "PERSISTENT": False, "TMA": False, "TMA_STORE": False,
              "NUM_SMS": 1, "SPLIT_K": 1, **config, **source.constexprs}
    consts["DOT_PREC"] = "ieee" if match.dtype == "float32" else "tf32"
    consts.setdefault("NB", config.get("num_stages", 2))  # a Gluon kernel's ring slots
    consts["CONSUMERS"] = consumers(config)  # the Gluon GEMM's consumer warpgroups
    consts["EW"] = int(config.get("EW") or 0)  # and its epilogue partition's warps
    consts["PTR_STORE"] = int(config.get("PTR_STORE") or 0)  # storing through pointers
    if consts["PERSISTENT"]:
        consts["SPLIT_K"] = 1  # the persistent formulation does not split
    if consts["SPLIT_K"] == 1:  # no workspace: the pointers are compiled out
        consts.update(WS=None, CNT=None)
    elif source.split_k:  # the workspace and counters are buffers passed, not the config's
        consts.pop("WS", None)  # warp-specialized form (``WS``: None for a runtime kernel)
        consts.pop("CNT", None)
    return {k: v for k, v in consts.items() if k in arg_names}


def launch_buffers(source: KernelSource, match, consts: dict) -> dict:
    """Buffers a launch needs besides the kernel's tensors (``consts`` from
    :func:`launch_constexprs`): name -> ``(elements, dtype)``, from the family's optional
    ``triton.buffers`` (a split-K GEMM's workspace and counters); empty for the others."""
    from tvm_stitch.families import part  # the registry: data only

    buffers = getattr(part(source.family, "triton"), "buffers", None)
    return buffers(source, match, consts) if buffers else {}


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


def pointer_args(match) -> tuple[dict, list, list]:
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


def extra_views(match) -> dict:
    """Leaf key -> view, for the reads of element expressions."""
    return {role[1]: v for role, v in match.views.items() if isinstance(role, tuple)}


def base(view: Strided, pointers, scalars: dict) -> str:
    """``pointer + offset + Σ stride · scalar`` for the axes held by scalars (batch, head)."""
    terms = [pointers[view.tensor]]
    if view.offset:
        terms.append(str(view.offset))
    for axis, stride in view.strides:
        if stride and axis in scalars:
            terms.append(f"{scalars[axis]} * {stride}")
    return " + ".join(terms)


def function(match, name, inputs, outputs, constexprs, lines, workspace=()) -> str:
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


_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def tma_unreadable(view: Strided, inner: str, rows: str, scalars=()) -> str | None:
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


# -- Gluon forms ----------------------------------------------------------------------------------
def gluon_version() -> str | None:
    """Why Gluon's Hopper warp specialization is not available here, or None."""
    try:
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.hopper import tma
    except ImportError as err:
        return f"Triton has no Gluon ({err})"
    if not hasattr(gl, "warp_specialize") or not (
            hasattr(tma, "async_load") or hasattr(tma, "async_copy_global_to_shared")):
        return "this Triton's Gluon lacks warp_specialize or TMA loads"
    return None


_GL_CALLS = [(r"\btl\.math\.erf\(", "gl.erf("), (r"\btl\.sigmoid\(", "_sigmoid("),
             (r"\btl\.", "gl.")]


def gluon_line(line: str, erf_abs: bool = False) -> str:
    """A line of the Triton printers in Gluon: ``tl.`` names become ``gl.``'s (Gluon has no
    ``sigmoid``: a helper of the module computes it); ``_erf_abs`` stays where the module
    defines it (``erf_abs``), else becomes ``gl.erf``."""
    if not erf_abs:
        line = re.sub(r"\b_erf_abs\(", "gl.erf(", line)
    for pattern, repl in _GL_CALLS:
        line = re.sub(pattern, repl, line)
    return line


def hoisted(lines: list[str], product: str | tuple = "s") -> tuple[list, list]:
    """Printed lines ``name = expr`` split into the loads that do not depend on the products
    ``product`` (a name, or several: values there only after the products) — masks, a GEMM's
    bias or residual — with what they need and what is computed from them alone — issued
    before the products, their latency hidden by them — and the rest
    (index arithmetic, such as a causal mask, stays after: hoisted, its tiles would hold
    registers across the products)."""
    parsed = [line.split(" = ", 1) for line in lines]

    def refs(expr, names):
        return {n for n in names if re.search(rf"\b{n}\b", expr)}

    dependent = {product} if isinstance(product, str) else set(product)
    for name, expr in parsed:
        if refs(expr, dependent):
            dependent.add(name)
    defined = [name for name, _ in parsed]
    hoisted = set()
    for name, expr in parsed:  # loads and what is computed from loads alone
        if name not in dependent and (".load(" in expr or refs(expr, hoisted)):
            hoisted.add(name)
    changed = True
    while changed:  # with the temporaries they read
        need = {n for name, expr in parsed if name in hoisted for n in refs(expr, defined)}
        changed = not need <= hoisted
        hoisted |= need
    pre = [f"{n} = {e}" for n, e in parsed if n in hoisted]
    return pre, [f"{n} = {e}" for n, e in parsed if n not in hoisted]
