"""Kernels with no reduction (copies, gathers, elementwise ops no pattern took) in 16-byte pieces.

TVM's fallback GPU schedule gives each thread one element: an embedding lookup of 4096 tokens ×
768 float16 values (BERT-base at 8×512) moves its 12.6 MB two bytes at a time.  Where every
access is contiguous along the output's last axis — the output's columns are the innermost loop,
and each read either walks them with unit stride or does not depend on them (a gathered row, a
broadcast, a data-dependent row index) — a thread moves ``16 / element size`` consecutive
elements with one vector load or store each.  Anything else (a transpose, a reduction, a
column count that does not divide) is left to TVM's rules.
"""

from __future__ import annotations

import logging

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from tvm_stitch.graph.tir_walk import iter_exprs

logger = logging.getLogger("tvm_stitch.stitch")

#: bytes a thread loads or stores at once (``ld.global.v4.b32``)
VECTOR_BYTES = 16


class VectorizedInjective(GPUScheduleRule):
    """A dlight rule: a PrimFunc of one spatial block whose accesses are contiguous along the
    output's last axis; that axis is split ``[columns, vector]`` (the lanes vectorized), the
    other loops and the columns fused and split ``[blockIdx.x, threadIdx.x]``.

    Parameters
    ----------
    threads : int
        Threads per block.
    """

    def __init__(self, threads: int = 128):
        self.threads = threads

    def apply(self, func, target, _tunable):
        """``func`` scheduled (an ``s_tir.Schedule``), or None where the rule does not apply."""
        if not isinstance(func, tvm.tirx.PrimFunc) or not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        infos = normalize_prim_func(sch)
        if infos is None:
            return None
        infos = try_inline(sch, infos)
        if len(infos) != 1 or not infos[0].is_injective():
            return None
        block = infos[0].block_rv
        loops = sch.get_loops(block)
        vector = _vector(sch.get(block), [sch.get(loop) for loop in loops])
        if vector is None:
            return None
        # the lanes split off the last axis alone, so the row indices do not depend on them
        columns, lanes = sch.split(loops[-1], [None, vector])
        bx, tx = sch.split(sch.fuse(*loops[:-1], columns), [None, self.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(lanes)
        return sch


def _vector(block, loops) -> int | None:
    """Elements a thread takes at once in ``block`` (its ``loops``, one per iterator in order),
    or None where its accesses are not contiguous along the output's last axis."""
    if len(block.writes) != 1 or not loops or len(loops) != len(block.iter_vars):
        return None
    out = block.writes[0]
    iters = [iv.var for iv in block.iter_vars]
    # the output in row-major order of the loops: each of its indices one iterator, in order
    if len(out.region) != len(iters) or any(
        not (r.min.same_as(v) and _is_one(r.extent)) for r, v in zip(out.region, iters)
    ):
        return None
    if [int(d) for d in out.source.shape if isinstance(d, tvm.tirx.IntImm)] != [
        int(lp.extent) for lp in loops if isinstance(lp.extent, tvm.tirx.IntImm)
    ] or not all(isinstance(lp.extent, tvm.tirx.IntImm) for lp in loops):
        return None
    last = iters[-1]
    for read in block.reads:
        *rest, inner = read.region
        if any(_uses(r.min, last) or _uses(r.extent, last) for r in rest):
            return None  # the columns pick rows of the input: a transpose
        if _uses(inner.min, last) and not (inner.min.same_as(last) and _is_one(inner.extent)):
            return None
    dtypes = [str(b.source.dtype) for b in [*block.reads, out]]
    bits = [tvm.DataType(d).bits for d in dtypes]
    if "bool" in dtypes or any(b < 8 or b % 8 for b in bits):
        return None  # booleans, sub-byte types: TVM's CUDA code has no vectors of them
    width = max(bits) // 8
    vector = VECTOR_BYTES * 8 // tvm.DataType(out.source.dtype).bits
    if width * vector > 2 * VECTOR_BYTES or int(loops[-1].extent) % vector or vector < 2:
        return None
    return vector


def _uses(expr, var) -> bool:
    return any(isinstance(e, tvm.tirx.Var) and e.same_as(var) for e in iter_exprs(expr))


def _is_one(extent) -> bool:
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == 1
