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

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func
from tvm.s_tir.dlight.base import try_inline
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule

from tvm_stitch.graph.tir_walk import buffer_loads, is_one, iter_exprs, loads_in_index

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
        found = _vector(sch.get(block), [sch.get(loop) for loop in loops])
        if found is None:
            return None
        vector, shifted, pieces = found
        # arithmetic is computed element by element into registers and stored in one piece:
        # float16 arithmetic is computed in float32 later (ComputeFloat32), and TVM's CUDA C
        # of an 8-lane float32 vector (a constant printed as make_ulonglong4 of eight floats)
        # or of a vector of booleans (a mask computed in the kernel) is not valid C; moving
        # values stays vectorized throughout
        # a shifted read's piece is chosen per element (``rotate_half``'s concatenate: a
        # select on the column), which is arithmetic too
        compute = block if shifted or _arithmetic(sch.get(block)) else None
        if compute is not None:
            block = sch.cache_write(compute, 0, "local")
            loops = sch.get_loops(block)
        # the lanes split off the last axis alone, so the row indices do not depend on them
        columns, lanes = sch.split(loops[-1], [None, vector])
        bx, tx = sch.split(sch.fuse(*loops[:-1], columns), [None, self.threads])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(lanes)
        if compute is not None:
            sch.compute_at(compute, tx, preserve_unit_loops=True)
            sch.unroll(sch.get_loops(compute)[-1])
            # an input read only at the thread's own piece comes in by one vector load
            for buf in pieces:
                index = _index([r.source for r in sch.get(compute).reads], buf)
                if index is None:
                    continue
                cached = sch.cache_read(compute, index, "local")
                sch.compute_at(cached, tx, preserve_unit_loops=True)
                sch.vectorize(sch.get_loops(cached)[-1])
        return sch


def _vector(block, loops) -> tuple[int, bool, list] | None:
    """Elements a thread takes at once in ``block`` (its ``loops``, one per iterator in order),
    whether some read is shifted along the columns, and the input buffers read only at the
    thread's own piece (each one vector load); None where its accesses are not contiguous,
    aligned pieces along the output's last axis.

    Every access of a piece must be one aligned vector of at most 16 bytes, or TVM falls back
    to element loads packed into a vector its CUDA code cannot build: the buffers are compact;
    a load walking the columns has the column index plus an offset as its last index (after
    simplification over the iterators' ranges: a reshape's ``(h * 128 + j) % 4096`` is
    ``h * 128 + j``), the offset a multiple of the piece, in a row as long as a multiple of
    the piece (``x[i, j]`` of a 28-wide ``x`` is not aligned); and no other index, buffer loads
    in indices included (``x[i, idx[j]]`` gathers columns), depends on the columns.  An
    offset other than the row's own (``x[i, j + 64]``, half of a rotation's ``rotate_half``)
    is a shifted read."""
    if len(block.writes) != 1 or not loops or len(loops) != len(block.iter_vars):
        return None
    out = block.writes[0]
    iters = [iv.var for iv in block.iter_vars]
    extents = [lp.extent for lp in loops]
    # the output in row-major order of the loops: each of its indices one iterator, in order;
    # the columns a constant count, the rows of any (a symbolic batch and length)
    if not isinstance(extents[-1], tvm.tirx.IntImm):
        return None
    # axes of one element (a batch of 1) have no iterator: their index is 0
    kept = [(r, d) for r, d in zip(out.region, out.source.shape) if not _unit(r, d)]
    if len(kept) != len(iters) or any(not (r.min.same_as(v) and is_one(r.extent))
                                      for (r, _), v in zip(kept, iters)):
        return None
    analyzer = tvm.sym.Analyzer()
    if not all(analyzer.can_prove_equal(d, e) for (_, d), e in zip(kept, extents)):
        return None
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    last = iters[-1]
    walking = [out.source]  # the buffers accessed a piece at a time
    offsets = []  # the column offsets of loads walking the columns
    own, other = [], []  # buffers of loads of the thread's own piece, and of any other load
    shifted = False  # a load at another offset than its row's own (a shift within a row)
    loads = _loads(block)
    if loads is None:
        return None
    for load in loads:
        if not load.indices:
            continue  # a zero-dimensional buffer (a scalar): one value for every element
        *rest, inner = (analyzer.simplify(i) for i in load.indices)
        if any(_uses(r, last) for r in rest):
            return None  # the columns pick rows of the input: a transpose
        if not _uses(inner, last):
            other.append(load.source)
            continue  # the same value for every column of a row (a gathered row's index)
        offset = analyzer.simplify(inner - last)
        if _uses(offset, last):
            return None  # not one column a column (a stride, a gather)
        walking.append(load.source)
        offsets.append(offset)
        aligned = analyzer.can_prove(tvm.tirx.floormod(offset, extents[-1]) == 0)
        shifted = shifted or not aligned
        gathered = any(loads_in_index(i) for i in rest)
        (own if aligned and not gathered else other).append(load.source)
    dtypes = [str(b.dtype) for b in walking]
    bits = [tvm.DataType(d).bits for d in dtypes]
    if "bool" in dtypes or any(b < 8 or b % 8 for b in bits):
        return None  # booleans, sub-byte types: TVM's CUDA code has no vectors of them
    vector = VECTOR_BYTES * 8 // max(bits)  # no access wider than 16 bytes
    rows = [_int(b.shape[-1]) for b in walking]
    if vector < 2 or any(r is None or r % vector for r in rows):
        return None
    if not all(analyzer.can_prove(tvm.tirx.floormod(o, vector) == 0) for o in offsets):
        return None
    if not all(_compact(b) for b in walking):
        return None
    # the inputs (not the output: a reduction of one element reads it back) read nowhere else
    pieces = [b for b in dict.fromkeys(own)
              if not any(b.same_as(o) for o in (*other, out.source))]
    return vector, shifted, pieces


def _index(buffers, buf) -> int | None:
    return next((i for i, b in enumerate(buffers) if b.same_as(buf)), None)


def _loads(block) -> list | None:
    """The buffer loads of ``block``'s stored value, those in other loads' indices too; None
    where its body is not one store."""
    if not isinstance(block.body, tvm.tirx.BufferStore):
        return None
    found = []
    for load in buffer_loads(block.body.value):
        found.append(load)
        for index in load.indices:
            found.extend(loads_in_index(index))
    return found


def _arithmetic(block) -> bool:
    """Whether ``block``'s stored value computes anything (loads, casts, selects and constants
    only move values; indices do not count)."""
    if not isinstance(block.body, tvm.tirx.BufferStore):
        return True
    moves = (tvm.ir.expr.TensorLoad, tvm.tirx.Cast, tvm.tirx.Select, tvm.tirx.FloatImm,
             tvm.tirx.IntImm)
    return not all(isinstance(e, moves) for e in iter_exprs(block.body.value))


def _compact(buf) -> bool:
    """Whether ``buf`` is laid out densely from its start (no strides, no offset)."""
    return not list(buf.strides) and _int(buf.elem_offset) == 0


def _unit(region, dim) -> bool:
    """Whether an output axis of one element is written at its index 0."""
    return _int(dim) == 1 and _int(region.min) == 0 and is_one(region.extent)


def _int(value) -> int | None:
    return int(value) if isinstance(value, tvm.tirx.IntImm) else None


def _uses(expr, var) -> bool:
    """Whether ``expr`` reads ``var``, inside buffer indices too."""
    return any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(expr))

