"""Kernels whose sizes are arguments: generated kernels for functions of symbolic shape.

A generated kernel's shapes, strides and offsets are literals (:mod:`.kernel_text`).  For a
function whose dims are symbolic (``R.Tensor(("batch", "seq", 768))``), a family that lists
axes in its ``RUNTIME_EXTENTS`` (a GEMM's rows ``m``; an attention's batch, queries and keys)
gets the literals that depend on them as arguments instead — extents, strides, bounds —
computed by the launch from the symbolic dims at call time.

What varies is established, not assumed: the match is recognized at two **sentinel points**
(each symbolic dim a distinct prime above 1000, different at each point) and its kernel printed
at both.  Only the runtime axes may take different extents at the two points; the two texts
must be the same but for their integer literals; and every literal that differs must be a
constant times a product of the dims (:func:`monomial`), which then becomes an argument.  Any
other dependence on the dims (a different structure, a literal no product of the dims gives)
refuses the kernel, which stays TVM's.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import logging
import math
import re

import numpy as np
import tvm
from tvm import relax, tirx

from tvm_stitch.graph.specialize import value_at

from .kernel_text import KernelSource, UnsupportedKernelError
from .triton_gen import kernel_source

logger = logging.getLogger("tvm_stitch.runtime")

#: the symbolic dims' values at the two sentinel points (primes, none a product of others)
SENTINELS = ((1009, 1013, 1019, 1021, 1031, 1033), (1039, 1049, 1051, 1061, 1063, 1069))


#: the launch options of a kernel with runtime extents: none sized by them (the Triton form's
#: persistent grid and TMA descriptors, made in the kernel); the warp-specialized form, whose
#: descriptors are made on the host at call time, where it has one (:func:`fixed`)
FIXED_OPTIONS = {"PERSISTENT": False, "TMA": False, "TMA_STORE": False}


def fixed(config: dict, source, split: bool = False) -> dict:
    """``config`` for a runtime kernel ``source``: :data:`FIXED_OPTIONS`, no warp-specialized
    form where it has none, and with ``split`` (a variant of bounded size, whose split-K
    workspace is sized at its bound: :func:`.embed.generated_launch`) its split of k, else
    none."""
    out = {**config, **FIXED_OPTIONS}
    if not source.ws:
        out["WS"] = None
    if not split:
        out["SPLIT_K"] = 1
    return out


def at_bound(match, bound: int):
    """``match`` (of a runtime kernel) with its one varying runtime extent at ``bound`` (a
    variant's largest size, :func:`variant_bounds`), for sizing what the variant's launches
    need at most; None where more than one extent varies (a product bounds none of them)."""
    varying = [a for a in match.runtime if not isinstance(match.frame.extents.get(a, 1), int)]
    if len(varying) != 1:
        return None
    frame = copy.copy(match.frame)
    frame.extents = {**frame.extents, varying[0]: int(bound)}
    return dataclasses.replace(match, frame=frame)


#: the largest split-K workspace (bytes) a runtime kernel's variant is given, sized at the
#: variant's bound; a variant whose split needs more runs unsplit
SPLIT_WORKSPACE_LIMIT = 64 << 20


def bounded_splits(source, match, variants) -> tuple:
    """A runtime kernel's ``variants`` ``((bound, config), ...)``, each that splits k
    (``SPLIT_K``) kept where its workspace at its bound is at most
    :data:`SPLIT_WORKSPACE_LIMIT` (and one extent varies, which the bound bounds), else
    unsplit."""
    from .kernel_text import launch_buffers, launch_constexprs
    from .triton_gen import load

    out = []
    for bound, other in variants:
        if other.get("SPLIT_K", 1) > 1:
            sized = at_bound(match, bound)
            why = "more than one extent varies"
            if sized is not None:
                consts = launch_constexprs(source, match, other, load(source, other).arg_names)
                need = sum(n * np.dtype(dtype).itemsize
                           for n, dtype in launch_buffers(source, sized, consts).values())
                why = (f"its workspace at {bound} takes {need} bytes"
                       if need > SPLIT_WORKSPACE_LIMIT else None)
            if why:
                logger.info("%s: the variant up to %s does not split k: %s", source.name,
                            bound, why)
                out.append((bound, {**other, "SPLIT_K": 1}))
                continue
        out.append((bound, other))
    return tuple(out)


#: the smallest product of the dims a bucket point has (below it, tiles hardly differ: the
#: smallest point's serve)
SMALLEST_BUCKET = 16


def kernel_size(extents: dict, axes) -> object:
    """The size a runtime kernel's variants are chosen by: the product of those of its
    runtime ``axes`` whose extent varies (an expression of the dims; a constant one, such as a
    batch of 1 an attention has no axis for, leaves it unchanged)."""
    size = 1
    for axis in axes:
        extent = extents.get(axis, 1)
        if not isinstance(extent, int):
            size = size * extent
    return size


def bucket_points(ranges: dict) -> list[dict]:
    """The points below the representative one where runtime kernels get their own tiles, the
    largest first: from the upper bounds of ``ranges`` ``{dim: (lower, upper)}``, the smallest
    dim above its lower bound halved (rounded up), while the product of the dims is at least
    :data:`SMALLEST_BUCKET`.

    Each point halves one dim, so every kernel's size (a product of the dims) never grows
    along the list, and a GEMM's rows (batch × length) fall by 2 at each. The smallest dim
    goes first (a batch before a length): a length indexes an attention's queries and keys
    both, and its tiles follow it. BERT-base's batch 64 × 512 tokens gives 32 × 512,
    16 × 512, ..., 1 × 512, 1 × 256, ..., 1 × 16.
    """
    point = {d: up for d, (_, up) in ranges.items()}
    points = []
    while True:
        free = [d for d in point if point[d] > max(ranges[d][0], 1)]
        if not free:
            return points
        dim = min(free, key=lambda d: (point[d], d))
        point = {**point, dim: max(ranges[dim][0], 1, -(-point[dim] // 2))}
        if math.prod(point.values()) < SMALLEST_BUCKET:
            return points
        points.append(point)


def variant_bounds(top: tuple, found: list) -> tuple:
    """A runtime kernel's variants by size: ``((bound, config), ...)`` ascending, the first
    whose bound a call's size does not exceed launched (:func:`.embed.generated_launch`).

    ``top`` is ``(size, config)`` at the representative point (what runs above every bound),
    ``found`` the same at the bucket points. A point's tiles serve the sizes nearer to it than
    to the next larger point, in ratio (up to the geometric mean of the two sizes): 5117 rows
    take the tiles of 4096, not of 8192, and an attention of 3 x 77 tokens those of 1 x 128.
    Any tiles compute any size (the runtime forms mask their bounds); only their speed
    depends on it. Points of equal tiles are one variant, bounded by the largest of them.
    """
    variants = []
    larger_size, larger = top
    if larger_size is None:
        return ()
    for size, tiles in sorted(found, key=lambda x: -x[0]):  # the largest first
        if size is None or size >= larger_size:
            continue
        if tiles != larger:
            variants.append((math.isqrt(size * larger_size), tiles))
        larger_size, larger = size, tiles
    return tuple(reversed(variants))


def sentinel_points(dims) -> tuple[dict, dict]:
    """The two points where a function's symbolic ``dims`` (names) are read."""
    names = sorted(dims)
    if len(names) > len(SENTINELS[0]):
        raise UnsupportedKernelError(f"{len(names)} symbolic dims (at most "
                                     f"{len(SENTINELS[0])} have sentinels)")
    return tuple({n: values[i] for i, n in enumerate(names)} for values in SENTINELS)


def argument(index: int) -> str:
    """The name of the kernel's ``index``-th runtime argument."""
    return f"RT_{index}"


@dataclasses.dataclass
class RuntimeKernel:
    """A generated kernel with runtime extents.

    Attributes
    ----------
    source : KernelSource
        Its text takes the runtime values as arguments (``arguments``) before its pointers.
    extents : dict
        Runtime axis -> the expression of the function's symbolic dims it equals.
    match : Match
        The match at the first sentinel point, ``runtime`` set, its frame giving the runtime
        axes' expressions (what the launch's grid is computed from,
        :func:`~.embed.generated_launch`).
    """

    source: KernelSource
    extents: dict
    match: object


#: an integer literal (also after the ``x`` of a shape, ``12x1013``, in the text's header)
_NUMBER = re.compile(r"(?<![A-Za-wyz_\d.])(\d+)(?![\d.])")


def runtime_kernel(matches, points, values, axes, at_point=None,
                   upper: dict | None = None) -> RuntimeKernel:
    """The kernel of a match recognized at the two sentinel ``points`` (``matches``, one at
    each), whose ``axes`` may vary; ``values`` maps graph tensors to their Relax values (their
    shapes hold the symbolic dims).  Every literal of the kernel's text that differs between
    the points becomes an argument: it must be a constant times a product of the dims (a
    stride, a bound, a row count).  Raises :class:`UnsupportedKernelError` where the kernel
    depends on the dims otherwise.

    With ``at_point``, the same match recognized at the function's representative point
    ``upper`` (the dims' upper bounds): its extents must be what the runtime axes' expressions
    give there, and no argument may reach 2³¹ there (the launch passes them as int32)."""
    first, second = (dataclasses.replace(m, runtime=tuple(axes)) for m in matches)
    ext1, ext2 = first.frame.extents, second.frame.extents
    if set(ext1) != set(ext2):
        raise UnsupportedKernelError("the match differs between the sentinel points")
    varying = sorted(a for a in ext1 if ext1[a] != ext2[a])
    if not varying or not set(varying) <= set(axes):
        raise UnsupportedKernelError(
            f"extents {varying} depend on the symbolic dims; only {list(axes)} may")
    sources = [kernel_source(m, name="KERNEL") for m in (first, second)]
    if (sources[0].inputs, sources[0].outputs) != (sources[1].inputs, sources[1].outputs):
        raise UnsupportedKernelError("the kernel's tensors differ between the sentinel points")
    dims = _dims({t: values[t] for t in (*sources[0].inputs, *sources[0].outputs)
                  if t in values})
    if set(dims) - set(points[0]):
        raise UnsupportedKernelError(f"dims {sorted(set(dims) - set(points[0]))} of its "
                                     "tensors have no range")
    names, arguments = {}, {}

    def argument_of(a: int, b: int) -> str:
        if (a, b) not in names:
            expr = monomial((a, b), dims, points)  # raises where it is none
            names[(a, b)] = argument(len(names))
            arguments[names[(a, b)]] = expr
        return names[(a, b)]

    text = _with_arguments(sources[0].text, sources[1].text, argument_of)
    ws, ws_descs = sources[0].ws, sources[0].ws_descs
    if ws:  # the warp-specialized form, where it takes its sizes the same way
        kept = dict(names), dict(arguments)
        try:
            ws = _with_arguments(ws, sources[1].ws or "", argument_of)
            ws_descs = tuple(_descriptor(d, e, lambda a, b: monomial((a, b), dims, points))
                             for d, e in zip(ws_descs, sources[1].ws_descs, strict=True))
        except (UnsupportedKernelError, ValueError) as err:
            logger.info("%s: no warp-specialized form with runtime sizes: %s",
                        first.describe(), err)
            ws, ws_descs = None, ()
            for now, before in zip((names, arguments), kept):  # none of the arguments
                now.clear()  # only that form took
                now.update(before)
    signature = f"def KERNEL({', '.join(names.values())}, " if names else "def KERNEL("
    text = text.replace("def KERNEL(", signature, 1)
    if ws:
        ws = _partitions_take(ws.replace("def KERNEL(", signature, 1), list(names.values()))
        if ws is None:
            logger.info("%s: no warp-specialized form with runtime sizes: its module-level "
                        "text reads them", first.describe())
            ws, ws_descs = None, ()
    # named after its code and its tensors' symbolic types, not the header's tensor names:
    # the same kernel in every layer is one kernel (one compile, one PrimFunc)
    types = [_type(values.get(t)) for t in (*sources[0].inputs, *sources[0].outputs)]
    body = text[text.index("@triton.jit"):] + (ws[ws.index("@gluon"):] if ws else "")
    digest = hashlib.sha1((body + repr(types)).encode()).hexdigest()[:12]
    name = f"{first.family}_rt_{digest}"
    text = re.sub(r"\bKERNEL\b", name, text)
    ws = re.sub(r"\bKERNEL\b", name, ws) if ws else ws
    source = dataclasses.replace(sources[0], name=name, text=text, ws=ws, ws_descs=ws_descs,
                                 descs=(), persistent=False, tma=False, arguments=arguments)
    extents = {a: monomial((ext1[a], ext2[a]), dims, points) for a in varying}
    if at_point is not None:
        _check_at(at_point, extents, arguments, upper or {})
    frame = copy.copy(first.frame)
    frame.extents = {**frame.extents, **extents}
    return RuntimeKernel(source, extents, dataclasses.replace(first, frame=frame))


def _with_arguments(first: str, second: str, argument_of) -> str:
    """``first`` with each integer literal that differs from ``second``'s (the same text printed
    at the other sentinel point) replaced by its argument's name; raises
    :class:`UnsupportedKernelError` where the texts differ otherwise."""
    parts = [_NUMBER.split(t) for t in (first, second)]
    if len(parts[0]) != len(parts[1]) or parts[0][::2] != parts[1][::2]:
        raise UnsupportedKernelError("the kernel's text depends on the symbolic dims beyond "
                                     "its literals")
    return "".join(a if i % 2 == 0 or a == b else argument_of(int(a), int(b))
                   for i, (a, b) in enumerate(zip(*parts)))


def _partitions_take(text: str, arguments: list) -> str | None:
    """A warp-specialized (Gluon) kernel's ``text`` with the runtime ``arguments`` passed on
    to the functions that need them: those that read them, and the functions calling those
    (``gl.warp_specialize``'s partitions take them first in their argument tuples); None
    where the module's own text outside its functions reads them."""
    if not arguments:
        return text
    chunks = re.split(r"(?=^@gluon\.jit)", text, flags=re.M)
    words = re.compile(r"\b(?:" + "|".join(map(re.escape, arguments)) + r")\b")
    if words.search(chunks[0]):
        return None  # a module-level constant of the sizes
    bodies = {}
    for chunk in chunks[1:]:
        name = re.search(r"^def (\w+)\(", chunk, flags=re.M)
        if name and "def KERNEL" not in chunk:
            bodies[name.group(1)] = chunk
    need = {f for f, body in bodies.items() if words.search(body)}
    grown = True
    while grown:  # callers of a function that needs them pass them on
        callers = {f for f, body in bodies.items() if f not in need and any(
            re.search(rf"(?<![\w.]){re.escape(g)}\b", body) for g in need)}
        grown = bool(callers)
        need |= callers
    if not need:
        return text
    given = ", ".join(arguments) + ", "
    names = "|".join(sorted(map(re.escape, need)))
    text = re.sub(rf"(\bdef (?:{names})\()", rf"\g<1>{given}", text)

    def in_lists(match):  # the partitions' argument tuples, in warp_specialize's lists only
        return re.sub(rf"(\(\s*(?:{names}),\s*\()", rf"\g<1>{given}", match.group(0))

    text = re.sub(r"warp_specialize\(\s*\[.*?\]\s*,", in_lists, text, flags=re.S)
    return re.sub(rf"((?<!def )(?<![\w.])(?:{names})\()", rf"\g<1>{given}", text)


def _descriptor(first, second, expression):
    """A host-made TMA descriptor (:class:`~.kernel_text.Descriptor`) whose sizes may vary
    between the sentinel points: each that does is the expression of the dims worth it at
    both (``expression(a, b)``, :func:`monomial`; the launch computes it on the host)."""
    fields = {}
    for field in ("offset", "rows", "cols", "stride"):
        a, b = getattr(first, field), getattr(second, field)
        if a != b:
            try:
                fields[field] = expression(a, b)
            except UnsupportedKernelError as err:
                raise UnsupportedKernelError(f"descriptor {first.name}'s {field}: {err}") \
                    from err
    if (first.name, first.tensor, first.dtype, first.box) != (
            second.name, second.tensor, second.dtype, second.box):
        raise UnsupportedKernelError(f"descriptor {first.name} differs between the points")
    return dataclasses.replace(first, **fields)


def _type(value) -> tuple | None:
    """A Relax tensor value's shape (dims by name) and dtype."""
    ty = getattr(value, "ty", None)
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return tuple(str(d) for d in ty.shape.values), str(ty.dtype)


def _check_at(match, extents: dict, arguments: dict, upper: dict) -> None:
    """Refuse a kernel whose runtime expressions disagree with the match at the representative
    point, or whose arguments overflow an int32 at the dims' upper bounds."""
    for axis, expr in extents.items():
        if value_at(expr, upper) != match.frame.extents[axis]:
            raise UnsupportedKernelError(
                f"the extent of {axis}, {expr}, is not {match.frame.extents[axis]} at {upper}")
    for name, expr in arguments.items():
        value = value_at(expr, upper)
        if value is None or value >= 2**31:
            raise UnsupportedKernelError(f"{name} = {expr} reaches {value} at {upper}, past "
                                         "an int32")


def monomial(pair, dims: dict, points):
    """The expression ``c * Π dim^e`` (exponents up to 2) worth ``pair`` at the two points,
    the lowest degree first; raises :class:`UnsupportedKernelError` when there is none."""
    names = sorted(dims)
    for degree in range(1, 2 * len(names) + 1):
        for exps in itertools.product(range(3), repeat=len(names)):
            if sum(exps) != degree:
                continue
            at = [math.prod(p[n] ** e for n, e in zip(names, exps)) for p in points]
            if all(v % a == 0 for v, a in zip(pair, at)) and pair[0] // at[0] == pair[1] // at[1]:
                expr = tirx.IntImm("int64", pair[0] // at[0])
                for n, e in zip(names, exps):
                    for _ in range(e):
                        expr = expr * dims[n]
                return tvm.sym.Analyzer().simplify(expr)
    raise UnsupportedKernelError(f"a literal of the kernel, {pair[0]} and {pair[1]} at the "
                                 "sentinel points, is no product of the symbolic dims")


def _dims(values) -> dict:
    """The symbolic dims (tir Vars) the shapes of ``values`` hold, by name; raises
    :class:`UnsupportedKernelError` where a dim is more than a product of them (a ``min``, a
    division: a size the sentinel points could hide)."""
    found = {}
    for value in values.values():
        ty = getattr(value, "ty", None)
        if isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr):
            for dim in ty.shape.values:
                if not _product(dim):
                    raise UnsupportedKernelError(f"a tensor of the kernel has a dim {dim}, "
                                                 "not a product of the symbolic dims")
            for var in dims_of([ty.shape.values]):
                found.setdefault(var.name, var)
    return found


def _product(dim) -> bool:
    """Whether ``dim`` is built of dims and constants by multiplication only."""
    if isinstance(dim, (int, tirx.IntImm, tirx.Var)):
        return True
    if isinstance(dim, tirx.Mul):
        return _product(dim.a) and _product(dim.b)
    return False


def dims_of(shapes) -> list:
    """The symbolic dims (tir Vars) the ``shapes`` use, by name, in name order."""
    found = {}
    for shape in shapes:
        for dim in shape:
            if not isinstance(dim, (int, tirx.IntImm)):
                for var in tirx.analysis.undefined_vars(dim):
                    found.setdefault(var.name, var)
    return [found[n] for n in sorted(found)]
