"""Apply a :class:`~tvm_stitch.stitch.plan.KernelPlan` to a stitched PrimFunc (TVM schedules).

* Non-sub-roots are inlined into their consumers (``compute_inline``): thread composition, the
  index propagation of the paper done by TVM.
* The output block is the anchor: its rows go to ``blockIdx.x`` (``block``) or to
  ``blockIdx.x`` × ``threadIdx.y`` (``warp``: one row per warp), its columns to ``threadIdx.x``.
* Every sub-root is computed at the anchor's row loop with its own columns (or reduced axis)
  on ``threadIdx.x``: TVM lowers a reduction over ``threadIdx.x`` to warp shuffles, and — with
  more than one warp per row — to shared memory and barriers.  Sub-root results live in shared
  memory (read by other threads of the row).
"""

from __future__ import annotations

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from .plan import IllegalPatternError, KernelPlan


def apply_plan(func: tvm.tirx.PrimFunc, plan: KernelPlan, gpu: bool = True) -> tvm.tirx.PrimFunc:
    """The scheduled PrimFunc (one kernel).  Raises IllegalPatternError if TVM refuses a step.

    With ``gpu=False`` the same plan is lowered for a CPU (``llvm``): the same inlining,
    sub-roots at the row loop and column splits, with the block loop parallel and the thread
    loops serial, so CI checks the plan's index propagation numerically without a GPU.

    Several output blocks (independent patterns packed into one kernel, FusionStitching's
    kernel packing) share the row loop: their row loops are merged (``Schedule.merge``), so a
    thread block computes the same rows of every packed pattern.
    """
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if not infos:
        raise IllegalPatternError("TVM could not normalise the pattern's loops")
    blocks = [info.block_rv for info in infos]
    names = [sch.get(b).name_hint for b in blocks]
    params = list(func.params)

    def writes_param(b):
        return any(any(r.source.same_as(p) for p in params) for r in sch.get(b).writes)

    outputs = [n for n, b in zip(names, blocks) if not sch.get_consumers(b)]
    for n, b in zip(names, blocks):
        if n not in outputs and writes_param(b):
            # other threads of the row would read it back from global memory: no barrier orders
            # that, so such a pattern is left to TVM's schedule
            raise IllegalPatternError(f"{n} is an output that the pattern also reads")
    inlined = set()
    for name, b in reversed(list(zip(names, blocks))):
        if name in plan.inlined and name not in outputs:
            try:
                sch.compute_inline(b)
                inlined.add(name)
            except Exception:  # noqa: BLE001 - TVM refuses to inline it: it stays a sub-root
                pass
    rows = []
    for n in outputs:
        loops = sch.get_loops(sch.get_sblock(n))
        if len(loops) < 2:
            raise IllegalPatternError(f"{n} has no row dimension")
        rows.append(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    extents = {int(sch.get(r).extent) for r in rows}
    if len(extents) > 1:
        raise IllegalPatternError(f"packed patterns with different row counts {sorted(extents)}")
    row = sch.merge(*rows) if len(rows) > 1 else rows[0]
    bind = sch.bind if gpu else _cpu_bind(sch)
    if plan.composition == "warp":
        bx, ty = sch.split(row, [None, plan.rows_per_block])
        bind(bx, "blockIdx.x")
        bind(ty, "threadIdx.y")
        anchor = ty
    else:
        bind(row, "blockIdx.x")
        anchor = row
    for n in outputs:
        col = sch.get_loops(sch.get_sblock(n))[-1]
        c_o, tx = sch.split(col, [None, plan.threads])
        sch.reorder(tx, c_o)
        bind(tx, "threadIdx.x")
    anchor_loop = sch.get(anchor)
    first = sch.get_sblock(outputs[0])
    depth = [sch.get(lp).same_as(anchor_loop) for lp in sch.get_loops(first)].index(True) + 1
    kept = [sch.get_sblock(n) for n in names if n not in inlined and n not in outputs]
    for b in reversed(kept):
        try:
            sch.compute_at(b, anchor, preserve_unit_loops=True)
        except Exception as err:
            raise IllegalPatternError(f"cannot stitch {sch.get(b).name_hint}: {err}") from err
        inner = sch.get_loops(b)[depth:]
        if not inner:
            raise IllegalPatternError(f"{sch.get(b).name_hint} has no column loop")
        fused = sch.fuse(*inner) if len(inner) > 1 else inner[0]
        o, t = sch.split(fused, [None, plan.threads])
        sch.reorder(t, o)
        bind(t, "threadIdx.x")
        if gpu:
            # a sub-root's result, read by every thread of the row: with one warp per row the
            # shuffles leave a reduction's result in every lane's registers; otherwise it goes
            # through shared memory
            reduce = any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in sch.get(b).iter_vars)
            scope = "local" if plan.composition == "warp" and reduce else "shared"
            for i, _ in enumerate(sch.get(b).writes):
                sch.set_scope(b, i, scope)
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)


def _cpu_bind(sch):
    """Thread bindings on a CPU: blocks run in parallel, threads become serial loops."""

    def bind(loop, tag):
        if tag == "blockIdx.x":
            sch.parallel(loop)

    return bind
