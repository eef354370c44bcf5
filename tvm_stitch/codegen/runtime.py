"""Kernels whose extents are arguments: generated kernels for functions of symbolic shape.

A generated kernel's shapes, strides and offsets are literals (:mod:`.kernel_text`).  For a
function whose dims are symbolic (``R.Tensor(("batch", "seq", 768))``), a family that lists an
axis in its ``RUNTIME_EXTENTS`` (a GEMM's rows ``m``) gets that axis's extent as an argument
instead, computed by the launch from the tensors' shapes at call time.

What may vary is established, not assumed: the match is recognized at two **sentinel points**
(each symbolic dim a distinct prime above 1000, different at each point) and its kernel printed
at both.  The runtime axes must take different extents at the two points, every other extent
the same, and the two texts must be equal once each point's runtime extents are replaced by the
argument names: then no stride, offset, mask or bound of the kernel depends on the dims other
than through those extents.  A runtime extent is then an expression of the function's dims
(a product of consecutive dims of one of its tensors) that has the right value at both points.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re

import tvm
from tvm import relax, tirx

from tvm_stitch.graph.specialize import value_at

from .kernel_text import KernelSource, UnsupportedKernelError
from .triton_gen import kernel_source

#: the symbolic dims' values at the two sentinel points (primes, none a product of others)
SENTINELS = ((1009, 1013, 1019, 1021, 1031, 1033), (1039, 1049, 1051, 1061, 1063, 1069))


#: the launch options of a kernel with runtime extents: none sized by them (a persistent grid
#: over the tiles, TMA descriptors, split-K workspaces, warp-specialized rings)
FIXED_OPTIONS = {"PERSISTENT": False, "TMA": False, "TMA_STORE": False, "WS": None,
                 "SPLIT_K": 1}


def sentinel_points(dims) -> tuple[dict, dict]:
    """The two points where a function's symbolic ``dims`` (names) are read."""
    names = sorted(dims)
    if len(names) > len(SENTINELS[0]):
        raise UnsupportedKernelError(f"{len(names)} symbolic dims (at most "
                                     f"{len(SENTINELS[0])} have sentinels)")
    return tuple({n: values[i] for i, n in enumerate(names)} for values in SENTINELS)


def argument(axis: str) -> str:
    """The kernel argument holding ``axis``'s extent."""
    return f"RT_{axis.upper()}"


@dataclasses.dataclass
class RuntimeKernel:
    """A generated kernel with runtime extents.

    Attributes
    ----------
    source : KernelSource
        Its text takes the runtime extents as arguments (:func:`argument`) before its pointers.
    extents : dict
        Axis -> the expression of the function's symbolic dims it equals.
    match : Match
        The match at the first sentinel point, ``runtime`` set, its frame giving the runtime
        axes' expressions (what the launch passes, :func:`~.embed.generated_launch`).
    """

    source: KernelSource
    extents: dict
    match: object


def runtime_kernel(matches, points, values, axes) -> RuntimeKernel:
    """The kernel of a match recognized at the two sentinel ``points`` (``matches``, one at
    each), with the extents of ``axes`` as arguments; ``values`` maps graph tensors to their
    Relax values (whose symbolic shapes give the extents' expressions).  Raises
    :class:`UnsupportedKernelError` where the kernel depends on the dims otherwise."""
    first, second = (dataclasses.replace(m, runtime=tuple(axes)) for m in matches)
    ext1, ext2 = first.frame.extents, second.frame.extents
    if set(ext1) != set(ext2):
        raise UnsupportedKernelError("the match differs between the sentinel points")
    varying = sorted(a for a in ext1 if ext1[a] != ext2[a])
    if not varying or not set(varying) <= set(axes):
        raise UnsupportedKernelError(
            f"extents {varying} depend on the symbolic dims; only {list(axes)} may")
    texts, names = [], []
    for match, ext in ((first, ext1), (second, ext2)):
        source = kernel_source(match, name="KERNEL")
        text = source.text
        for axis in varying:
            text = re.sub(rf"(?<![\w.]){ext[axis]}(?![\d.])", argument(axis), text)
        texts.append(text)
        names.append((tuple(source.inputs), tuple(source.outputs)))
    if texts[0] != texts[1] or names[0] != names[1]:
        raise UnsupportedKernelError("its kernel's literals depend on the symbolic dims beyond "
                                     f"the extents of {varying}")
    args = ", ".join(argument(a) for a in varying)
    text = texts[0].replace("def KERNEL(", f"def KERNEL({args}, ", 1)
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    name = f"{first.family}_rt_{digest}"
    text = text.replace("def KERNEL(", f"def {name}(", 1)
    inputs, outputs = names[0]
    source = dataclasses.replace(kernel_source(first, name="KERNEL"), name=name, text=text,
                                 ws=None, ws_descs=(), descs=(), persistent=False)
    tensors = [*inputs, *outputs]
    extents = {a: _expression(a, ext1[a], ext2[a], tensors, values, points) for a in varying}
    frame = copy.copy(first.frame)
    frame.extents = {**frame.extents, **extents}
    return RuntimeKernel(source, extents, dataclasses.replace(first, frame=frame))


def _expression(axis, at1, at2, tensors, values, points):
    """A product of consecutive dims of one of ``tensors`` worth ``at1`` and ``at2`` at the
    two points."""
    for tensor in tensors:
        value = values.get(tensor)
        ty = getattr(value, "ty", None)
        if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
            continue
        dims = list(ty.shape.values)
        for i in range(len(dims)):
            expr = None
            for j in range(i, len(dims)):
                expr = dims[j] if expr is None else expr * dims[j]
                if (value_at(expr, points[0]) == at1 and value_at(expr, points[1]) == at2):
                    return tvm.sym.Analyzer().simplify(expr)
    raise UnsupportedKernelError(f"no dims of the kernel's tensors give the extent of {axis}")


def shape_vars(shapes) -> list:
    """The symbolic dims (tir Vars) the ``shapes`` use, by name, in name order."""
    found = {}
    for shape in shapes:
        for dim in shape:
            if not isinstance(dim, (int, tirx.IntImm)):
                for var in tirx.analysis.undefined_vars(dim):
                    found.setdefault(var.name, var)
    return [found[n] for n in sorted(found)]
