"""Apply a :class:`~tvm_stitch.stitch.plan.KernelPlan` to a stitched PrimFunc (TVM schedules).

* Non-sub-roots are inlined into their consumers (``compute_inline``): thread composition, the
  index propagation of the paper done by TVM.
* The output block is the anchor: its rows go to ``blockIdx.x`` (``block``) or to
  ``blockIdx.x`` × ``threadIdx.y`` (``warp``: one row per warp), its columns to ``threadIdx.x``.
* Every sub-root is computed at the anchor's row loop with its own columns (or reduced axis)
  on ``threadIdx.x``: TVM lowers a reduction over ``threadIdx.x`` to warp shuffles, and — with
  more than one warp per row — to shared memory and barriers.  Sub-root results live in shared
  memory (read by other threads of the row).
* Columns are split ``[passes, threadIdx.x, vector]`` the same way in every block, so a thread
  touches the same columns in every pass: with ``plan.vector > 1`` the accesses are 128-bit,
  and with ``plan.cached`` the row inputs that several passes read are loaded once into
  registers (``cache_read`` to ``local``, laid out ``[pass, thread, vector]`` so each thread's
  slice is dense; the pass loops are unrolled so the slice stays in registers).
"""

from __future__ import annotations

import logging
import math

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from tvm_stitch.errors import error_line
from tvm_stitch.graph.specialize import is_symbolic, specialize, value_at
from tvm_stitch.graph.tir_walk import buffer_loads, is_one, iter_exprs, iter_sblocks

from .bind import cpu_bind, finish
from .columns import apply_column_plan, column_plans, is_column_pattern
from .plan import IllegalPatternError, KernelPlan, candidate_plans

logger = logging.getLogger("tvm_stitch.stitch")

#: Plans tried per pattern, cheapest first, before it is left to TVM; beyond them, the cheapest
#: plan of each grouping of rows not tried yet (composition and rows per block).
FALLBACK_PLANS = 4


def schedule_pattern(
    func: tvm.tirx.PrimFunc, hw, gpu: bool = True, thread_only: bool = False, cache=None,
    point=None,
):
    """``func`` scheduled by the cheapest of its candidate plans that TVM accepts.

    The plans are tried cheapest first (up to :data:`FALLBACK_PLANS`, then the cheapest of each
    grouping of rows not tried yet): a plan whose schedule TVM refuses gives way to the next.
    A refusal can be the grouping's: rows over three or more loops (``(batch, seq, heads)`` of
    a per-head norm) split into blocks of rows that do not nest with the inner loops' extents
    (16 rows of ``(2, 37, 2)``) leave a sub-root's index outside what TVM's iterator maps
    express, and TVM will not bind its threads; 2 rows a block nest.  Nothing raises: every
    refusal is a reason.

    Parameters
    ----------
    func : tvm.tirx.PrimFunc
        A pattern (``FuseTIR``'s merge of its ops).
    hw : HardwareModel
        The GPU the plans are made for (also when lowered for ``llvm``).
    gpu : bool
        Bind GPU threads (False: the plan's loops lowered for a CPU, see :func:`apply_plan`).
    thread_only : bool
        Only a thread-composition plan (elementwise groups ``FuseOps`` formed).
    cache : dict, optional
        Results of earlier calls (structurally equal functions are scheduled once): the
        pipeline shares one between the fusion's legality check and the scheduling pass.
    point : dict, optional
        Where symbolic dims are read (``{name: size}``, :mod:`tvm_stitch.graph.specialize`):
        a pattern with symbolic shapes is planned specialized there and the plan applied to
        the symbolic function (its loops split with guards; TVM checks every step).

    Returns
    -------
    (scheduled, plan, reasons)
        The scheduled function and its plan, or ``(None, None, reasons)`` when no plan applies;
        ``reasons`` lists the refusals met on the way.
    """
    planned = _at_point(func, point)
    if planned is None:
        return None, None, ["symbolic shapes without a value at the point"]
    if cache is None:
        return _schedule_pattern(func, hw, gpu, thread_only, planned, point)
    key = (tvm_ffi.structural_hash(func), hw, gpu, thread_only)
    for seen, result in cache.get(key, ()):
        if tvm_ffi.structural_equal(seen, func):
            return result
    result = _schedule_pattern(func, hw, gpu, thread_only, planned, point)
    cache.setdefault(key, []).append((func, result))
    return result


def _at_point(func, point):
    """``func`` itself when its shapes are static, else specialized at ``point`` (None when
    it cannot be)."""
    if not any(is_symbolic(p.shape) for p in func.params if hasattr(p, "shape")):
        return func  # static (a scalar parameter alone is refused later, as it always was)
    return specialize(func, point or {})


def _symbolic_rows(func) -> bool:
    """Whether a buffer of ``func`` has a row (its last axis) of symbolic length."""
    return any(is_symbolic(list(p.shape)[-1:]) for p in func.params if hasattr(p, "shape"))


def _schedule_pattern(func, hw, gpu, thread_only, planned, point):
    column = not thread_only and _is_column_pattern(planned)
    plan, apply = (column_plans, apply_column_plan) if column else (candidate_plans, apply_plan)
    try:
        plans = plan(planned, hw)
    except IllegalPatternError as err:
        return None, None, [str(err)]
    except Exception as err:  # noqa: BLE001 - never break a build: TVM's schedule
        return None, None, [repr(err)]
    if thread_only and plans[0].composition != "thread":
        return None, None, ["a row pattern the former did not form"]
    # a column pattern's refusals are the pattern's (below): its four cheapest plans only
    plans = [p for p in plans[: FALLBACK_PLANS if column else None] if math.isfinite(p.latency_us)]
    if planned is not func and _symbolic_rows(func):
        # a row of symbolic length has no constant slice per thread to keep in registers, and
        # no vector TVM can keep whole (a guarded vector is split into elements)
        plans = [p for p in plans if not getattr(p, "cached", 0)
                 and not getattr(p, "registers", ()) and getattr(p, "vector", 1) == 1]
    if not plans:
        return None, None, ["no plan fits the SM"]
    reasons, seen, groupings = [], set(), set()
    for i, candidate in enumerate(plans):
        grouping = (candidate.composition, getattr(candidate, "rows_per_block", 1))
        if i >= FALLBACK_PLANS and grouping in groupings:
            continue
        groupings.add(grouping)
        try:
            # a symbolic function takes the plan made at the point
            scheduled = apply(func, candidate, gpu=gpu,
                              point=None if planned is func else point)
            _lowers(scheduled, gpu)
            return scheduled, candidate, reasons
        except Exception as err:  # noqa: BLE001 - any refusal: the next plan, then TVM
            why = err if isinstance(err, IllegalPatternError) else repr(err)
            if column and str(why) in seen:
                break  # a column pattern's reason, not the plan's: every plan would say it
            seen.add(str(why))
            reasons.append(f"plan refused ({candidate.describe()}): {why}")
    return None, None, reasons


def _lowers(func: tvm.tirx.PrimFunc, gpu: bool) -> None:
    """Raise :class:`IllegalPatternError` where TVM cannot lower ``func``: the target's own TIR
    pipeline and finalizing passes (:func:`tvm_stitch.codegen.check.lower`) run on the kernel
    alone ahead of the build — tens of milliseconds — so a plan TVM cannot lower gives way to
    the next one instead of failing the build.  Seen: barriers inside a guard (patterns over
    the heads' rows at one token), a reduction over a unit axis beside a row reduction (a
    loop variable used before its definition)."""
    from tvm_stitch.codegen.check import lower

    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != ("cuda" if gpu else "llvm"):
        target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"} if gpu else "llvm")
    try:
        lower(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    except Exception as err:  # any refusal of TVM's refuses the plan
        raise IllegalPatternError(f"TVM cannot lower the plan: {error_line(err)}") from err


def _is_column_pattern(func) -> bool:
    try:
        return is_column_pattern(func)
    except Exception:  # noqa: BLE001 - not analysable: the row planner says why
        return False


def apply_plan(func: tvm.tirx.PrimFunc, plan: KernelPlan, gpu: bool = True,
               point=None) -> tvm.tirx.PrimFunc:
    """The scheduled PrimFunc (one kernel).  Raises IllegalPatternError if TVM refuses a step.

    A function with symbolic shapes takes the plan made at ``point`` (its sizes there), every
    step checked by TVM as for any other: where a split leaves guards that a step cannot take
    (a row reduction under a guard on its rows — rows in blocks of several that need not
    divide — is no cross-thread reduction TVM can lower), TVM refuses the step and the plan
    gives way to the next; a plan of one row per block splits no row loop.

    With ``gpu=False`` the same plan is lowered for a CPU (``llvm``): the same inlining,
    sub-roots at the row loop and column splits, with the block loop parallel and the thread
    loops serial, so CI checks the plan's index propagation numerically without a GPU.

    Several output blocks (independent patterns packed into one kernel, FusionStitching's
    kernel packing) share the row loop: their row loops are merged (``Schedule.merge``), so a
    thread block computes the same rows of every packed pattern.
    """
    sch = s_tir.Schedule(func)
    hoist_row_reciprocals(sch)
    for name in plan.epilogue:
        # the row op before a reshape/transpose writes its element straight to the permuted
        # place: the layout op disappears into the pattern's output block
        try:
            sch.reverse_compute_inline(sch.get_sblock(name))
        except Exception as err:  # TVM refuses: the pattern is left to TVM
            raise IllegalPatternError(f"cannot write the output through {name}: {err}") from err
    _recompute_read_outputs(sch, func)
    infos = normalize_prim_func(sch)
    if not infos:
        raise IllegalPatternError("TVM could not normalise the pattern's loops")
    blocks = [info.block_rv for info in infos]
    names = [sch.get(b).name_hint for b in blocks]
    outputs = [n for n, b in zip(names, blocks) if not sch.get_consumers(b)]
    inlined = set()
    for name, b in reversed(list(zip(names, blocks))):
        if name in plan.inlined and name not in outputs:
            try:
                sch.compute_inline(b)
                inlined.add(name)
            except Exception:  # noqa: BLE001 - TVM refuses to inline it: it stays a sub-root
                pass
    bind = sch.bind if gpu else cpu_bind(sch)
    if plan.composition == "thread":
        # staged through registers only at static sizes (TVM sizes a register buffer of a
        # symbolic function's elementwise by its whole extent: "constant size stack
        # allocation" refused at build)
        return _elementwise(sch, outputs, plan, bind, gpu, staged=point is None)
    # with 128-bit accesses an output is computed element by element into registers and
    # stored one vector at a time (TVM's CUDA code for 8-lane float vectors is not valid C)
    # one value per row (a row sum kept as (..., rows, 1), or reduced without keepdims): all
    # its loops are the row, written by the row's threads alike
    # (in a kernel packing patterns, each block against its own pattern's rows)
    own = dict(plan.part_rows)
    unit = {n for n in outputs if _per_row(sch, sch.get_sblock(n), own.get(n, plan.rows), point)}
    stores = {}
    if plan.vector > 1 and not plan.epilogue:  # through a transpose: stores stay scalar
        for n in outputs:
            if n not in unit:
                stores[n] = sch.get(sch.cache_write(sch.get_sblock(n), 0, "local")).name_hint
    rows = []
    for n in outputs:
        loops = sch.get_loops(sch.get_sblock(stores.get(n, n)))
        if n in unit:
            rows.append(sch.fuse(*loops) if len(loops) > 1 else loops[0])
            continue
        if len(loops) < 2:
            raise IllegalPatternError(f"{n} has no row dimension")
        rows.append(sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0])
    extents = {_dim_key(sch.get(r).extent) for r in rows}
    if len(extents) > 1:
        rows = _padded(sch, rows, unit)
    row = sch.merge(*rows) if len(rows) > 1 else rows[0]
    if plan.composition == "warp":
        bx, ty = sch.split(row, [None, plan.rows_per_block])
        bind(bx, "blockIdx.x")
        bind(ty, "threadIdx.y")
        anchor = ty
    else:
        bind(row, "blockIdx.x")
        anchor = row
    threads, vector = plan.threads, plan.vector

    def columns(loop, vectorize):
        """Split a row's columns [passes, threadIdx.x, vector]; the thread loop goes outside."""
        if vector > 1:
            o, t, v = sch.split(loop, [None, threads, vector])
            sch.reorder(t, o, v)
        else:
            o, t = sch.split(loop, [None, threads])
            sch.reorder(t, o)
            v = None
        bind(t, "threadIdx.x")
        if plan.cached:
            sch.unroll(o)  # constant indices into the cached slice: it stays in registers
        if v is not None:
            sch.vectorize(v) if vectorize else sch.unroll(v)
        return o

    for n in outputs:
        if n in unit:
            continue
        o = columns(sch.get_loops(sch.get_sblock(stores.get(n, n)))[-1], vectorize=n in stores)
        if n in stores:
            compute = sch.get_sblock(n)
            sch.compute_at(compute, o, preserve_unit_loops=True)
            sch.unroll(sch.get_loops(compute)[-1])
            for buf in _per_column_params(sch, compute):  # LayerNorm's weight and bias
                load = sch.cache_read(compute, buf.name, "local", consumer_blocks=[compute])
                sch.compute_at(load, o, preserve_unit_loops=True)
                sch.vectorize(sch.get_loops(load)[-1])
    anchor_loop = sch.get(anchor)
    first = sch.get_sblock(stores.get(outputs[0], outputs[0]))
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
        columns(sch.fuse(*inner) if len(inner) > 1 else inner[0], vectorize=False)
        name = sch.get(b).name_hint
        if name in plan.registers:
            _keep_in_registers(sch, b, threads * vector, vector, gpu)
        elif gpu:
            # a sub-root's result, read by every thread of the row: with one warp per row the
            # shuffles leave a reduction's result in every lane's registers; otherwise it goes
            # through shared memory
            reduce = any(iv.iter_type == tvm.tirx.IterVar.CommReduce for iv in sch.get(b).iter_vars)
            scope = "local" if plan.composition == "warp" and reduce else "shared"
            for i, _ in enumerate(sch.get(b).writes):
                sch.set_scope(b, i, scope)
    if plan.cached:
        readers = kept + [sch.get_sblock(n) for n in outputs]
        for buf in _row_inputs(sch, func, readers):
            users = [b for b in readers if _reads(sch, b, buf)]
            cache = sch.cache_read(users[0], buf.name, "local", consumer_blocks=users)
            sch.compute_at(cache, anchor, preserve_unit_loops=True)
            inner = sch.get_loops(cache)[depth:]
            columns(sch.fuse(*inner) if len(inner) > 1 else inner[0], vectorize=True)
            if gpu:
                _thread_private(sch, cache, threads * vector, vector)
    return finish(sch, gpu)


def _padded(sch, rows, unit) -> list:
    """Row loops of packed patterns with different row counts, each split to the most rows
    (a loop of one outside, a guard on the rows it does not have), so that they merge: the
    thread blocks past a pattern's rows skip its blocks."""
    if unit or any(not isinstance(sch.get(r).extent, tvm.tirx.IntImm) for r in rows):
        raise IllegalPatternError("packed patterns with different row counts need static rows "
                                  "of more than one element")
    most = max(int(sch.get(r).extent) for r in rows)
    return [sch.split(r, [None, most])[1] for r in rows]  # each as deep, to merge


def _recompute_read_outputs(sch, func: tvm.tirx.PrimFunc) -> None:
    """Outputs that the pattern also reads (a pre-norm residual stream: ``h = x + y`` is returned
    and normalized) are recomputed by their readers.

    Other threads of the row would read such an output back from global memory, and no barrier
    orders that.  The block is split (``cache_write``): it computes a copy that the readers read
    and a copy block writes the output; the computing block is then inlined into both, so the
    output becomes one more output of the row loop (packed with the others) and its readers
    recompute it from the pattern's inputs.  A block TVM will not inline (a reduction) is refused.
    """
    params = list(func.params)
    for block, _ in list(iter_sblocks(sch.mod["main"].body)):
        rv = sch.get_sblock(block.name_hint)
        writes = sch.get(rv).writes
        if not any(any(w.source.same_as(p) for p in params) for w in writes):
            continue
        consumers = sch.get_consumers(rv)
        if not consumers:
            continue
        try:
            sch.cache_write(rv, 0, "global", consumer_blocks=consumers)
            sch.compute_inline(rv)
        except Exception as err:
            raise IllegalPatternError(
                f"{block.name_hint} is an output that the pattern also reads and cannot be "
                f"recomputed by its readers: {err}"
            ) from err


def _size(dim, point) -> int:
    """A dim's size (at ``point`` when symbolic, where the plan's sizes are)."""
    value = value_at(dim, point or {})
    if value is None:
        raise IllegalPatternError(f"{dim} has no size at the point {point}")
    return value


def _dim_key(dim):
    """A dim as an int when constant (whatever its index dtype), else its simplified text."""
    if isinstance(dim, tvm.tirx.IntImm):
        return int(dim)
    return str(tvm.sym.Analyzer().simplify(dim))


def _same_shape(a, b) -> bool:
    """Equal shapes: constant dims by value (int32 and int64 alike), symbolic ones when TVM
    proves them equal."""
    def same(x, y):
        if isinstance(x, tvm.tirx.IntImm) and isinstance(y, tvm.tirx.IntImm):
            return int(x) == int(y)
        return tvm_ffi.structural_equal(x, y) or tvm.sym.Analyzer().can_prove_equal(x, y)

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))


def _per_row(sch, block, rows: int, point=None) -> bool:
    """Whether ``block`` writes one value per row: a tensor whose last axis has extent 1, or
    one of ``rows`` elements (a reduction without keepdims: every axis is a row axis)."""
    (write,) = sch.get(block).writes
    shape = write.source.shape
    if len(shape) > 1 and is_one(shape[-1]):
        return True
    return math.prod(_size(d, point) for d in shape) == rows


def _keep_in_registers(sch, block, span: int, vector: int, gpu: bool) -> None:
    """An expensive op's result in each thread's registers: legal when every reader loads it at
    its own (row, column), which the shared column split makes the computing thread's."""
    buf = sch.get(block).writes[0].source
    for r in sch.get_consumers(block):
        if not _identity_loads(sch.get(r), buf):
            raise IllegalPatternError(
                f"{sch.get(r).name_hint} reads {buf.name} at other columns: not thread-local"
            )
    if gpu:
        sch.set_scope(block, 0, "local")
        _thread_private(sch, block, span, vector)


def _thread_private(sch, block, span: int, vector: int) -> None:
    """``block``'s local result laid out as each thread's own ``[pass, vector]`` slice: the
    thread index is dropped from the layout (a "local" buffer is private to its thread)."""
    ndim = len(sch.get(block).writes[0].source.shape)
    sch.transform_layout(
        block, ("write", 0), _thread_slice(ndim, span, vector), assume_injective_transform=True
    )


def hoist_row_reciprocals(sch) -> None:
    """``a / s`` with ``s`` the same for the whole row (a sub-root's result) becomes
    ``a * (1 / s)``: the reciprocal is one division per row (the compiler hoists the common
    ``1 / s``) instead of an IEEE division per element — softmax's normalisation."""
    for block, _ in list(iter_sblocks(sch.mod["main"].body)):
        store = block.body
        if not isinstance(store, tvm.tirx.BufferStore) or not block.iter_vars:
            continue
        col = block.iter_vars[-1].var
        value = _row_reciprocal(store.value, col)
        if value.same_as(store.value):
            continue
        new = s_tir.SBlock(
            block.iter_vars,
            block.reads,
            block.writes,
            block.name_hint,
            tvm.tirx.BufferStore(store.buffer, value, store.indices),
            block.init,
            block.alloc_buffers,
            block.match_buffers,
            block.annotations,
        )
        sch.state.replace(sch.get_sref(sch.get_sblock(block.name_hint)), new, {block: new})


def _row_reciprocal(expr, col):
    """``expr`` with each float ``a / s`` (``s`` a load that does not depend on ``col``)
    written ``a * (1 / s)``; descends through arithmetic and casts only."""
    if isinstance(expr, tvm.tirx.Cast):
        value = _row_reciprocal(expr.value, col)
        return expr if value.same_as(expr.value) else tvm.tirx.Cast(str(expr.ty.dtype), value)
    if not isinstance(expr, tvm.ir.prim.expr.BinaryOpExpr):
        return expr
    a, b = _row_reciprocal(expr.a, col), _row_reciprocal(expr.b, col)
    if (
        isinstance(expr, tvm.tirx.Div)
        and str(expr.ty.dtype).startswith(("float", "bfloat"))
        and any(isinstance(e, tvm.ir.expr.TensorLoad) for e in _all_exprs(b))
        and not any(e.same_as(col) for e in _all_exprs(b))
    ):
        return tvm.tirx.Mul(a, tvm.tirx.Div(tvm.tirx.const(1, str(expr.ty.dtype)), b))
    if a.same_as(expr.a) and b.same_as(expr.b):
        return expr
    return type(expr)(a, b)


def _all_exprs(expr):
    """``expr``'s sub-expressions, buffer indices included."""
    for e in iter_exprs(expr):
        yield e
        if isinstance(e, tvm.ir.expr.TensorLoad):
            for i in e.indices:
                yield from _all_exprs(i)


def _elementwise(sch, outputs, plan, bind, gpu, staged=True) -> tvm.tirx.PrimFunc:
    """Thread composition: ``vector`` consecutive elements of a row per thread, threads over
    (rows × column vectors), ``plan.threads`` per block.  On a GPU the output is computed into
    registers and stored with one 128-bit store; full-size inputs are loaded the same way (an
    op TVM cannot vectorize, such as ``erf``, then runs on registers, not on global memory)."""
    if len(outputs) != 1:
        raise IllegalPatternError(f"elementwise pattern with {len(outputs)} outputs")
    out = sch.get_sblock(outputs[0])
    gpu_staged = gpu and staged
    store = sch.cache_write(out, 0, "local") if gpu_staged else out
    loops = sch.get_loops(store)
    if len(loops) > 2:
        loops = [sch.fuse(*loops[:-1]), loops[-1]]
    c_o, vec = sch.split(loops[-1], [None, plan.vector])
    flat = sch.fuse(loops[0], c_o) if len(loops) > 1 else c_o
    bx, tx = sch.split(flat, [None, plan.threads])
    bind(bx, "blockIdx.x")
    bind(tx, "threadIdx.x")
    # TVM's CUDA C has no vectors of booleans (a mask stored or read 8 at a time)
    if _boolean(sch.get(store).writes[0].source):
        sch.unroll(vec)
    else:
        sch.vectorize(vec)
    if not gpu_staged:
        return finish(sch, gpu)
    sch.compute_at(out, tx, preserve_unit_loops=True)
    sch.unroll(sch.get_loops(out)[-1])
    shape = list(sch.get(store).writes[0].source.shape)
    for buf in list(_full_size_inputs(sch, out, shape)):
        load = sch.cache_read(out, buf.name, "local")
        sch.compute_at(load, tx, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(load)[-1])
    return finish(sch, gpu)


def _full_size_inputs(sch, block, shape):
    """Inputs of ``block`` with the output's shape, read at the output's own position (but
    booleans: TVM's CUDA C has no vectors of them)."""
    for r in sch.get(block).reads:
        buf = r.source
        if (_same_shape(list(buf.shape), shape) and not _boolean(buf)
                and _identity_loads(sch.get(block), buf)):
            yield buf


def _boolean(buf) -> bool:
    return str(buf.dtype) == "bool"


def _thread_slice(ndim: int, span: int, vector: int) -> tvm.tirx.IndexMap:
    """``(..., col) -> (..., col // span, col % vector)``: a thread's cached columns, dense."""
    return tvm.tirx.IndexMap.from_func(
        lambda *i: (*i[:-1], i[-1] // span, i[-1] % vector), ndim=ndim
    )


def _per_column_params(sch, block) -> list:
    """Inputs of ``block`` that are one row indexed by its column (a weight, a bias or an
    additive mask broadcast over rows: shape ``(cols,)`` or ``(1, ..., cols)``)."""
    block_ = sch.get(block)
    col = block_.iter_vars[-1].var

    def by_column(ld):
        *lead, last = ld.indices
        return last.same_as(col) and all(
            isinstance(i, tvm.tirx.IntImm) and int(i) == 0 for i in lead
        )

    found = []
    for r in block_.reads:
        loads = _loads(block_, r.source)
        lead = list(r.source.shape)[:-1]
        if all(is_one(d) for d in lead) and loads and all(by_column(ld) for ld in loads):
            found.append(r.source)
    return found


def _reads(sch, block, buf) -> bool:
    return any(r.source.same_as(buf) for r in sch.get(block).reads)


def _row_inputs(sch, func, readers) -> list:
    """Parameters that several passes read at their own (row, column) position: each thread
    reads back only what it loaded, so a thread-local cache is exact."""
    written = {w.source for b in readers for w in sch.get(b).writes}
    found = []
    for buf in func.params:
        if buf in written:
            continue
        users = [b for b in readers if _reads(sch, b, buf)]
        if len(users) > 1 and all(_identity_loads(sch.get(b), buf) for b in users):
            found.append(buf)
    return found


def _identity_loads(block, buf) -> bool:
    """Whether every load of ``buf`` in ``block`` is indexed by the block's iterators in order.

    Unit axes do not count: an index 0 into an axis of extent 1 (a batch of one, which TVM's
    loop normalisation leaves out of the iterators) and an iterator of extent 1 are skipped."""
    ivs = [iv.var for iv in block.iter_vars if not is_one(iv.dom.extent)]
    loads = _loads(block, buf)

    def own(ld) -> bool:
        idx = [
            i
            for i, d in zip(ld.indices, buf.shape)
            if not (is_one(d) and isinstance(i, tvm.tirx.IntImm) and int(i) == 0)
        ]
        idx = [
            i
            for i in idx
            if not any(i.same_as(iv.var) and is_one(iv.dom.extent) for iv in block.iter_vars)
        ]
        return len(idx) == len(ivs) and all(a.same_as(b) for a, b in zip(idx, ivs))

    return loads is not None and all(own(ld) for ld in loads)


def _loads(block, buf) -> list | None:
    """The loads of ``buf`` in ``block``'s stored value (None: the body is not one store)."""
    if not isinstance(block.body, tvm.tirx.BufferStore):
        return None
    return [ld for ld in buffer_loads(block.body.value) if ld.source.same_as(buf)]
