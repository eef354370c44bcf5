"""Column reductions in two phases (SOUFFLE's two-phase reduction; issue 11, item 3).

A *column pattern* reduces a tensor over axes that are not its innermost one — ``x.sum(0)``,
mean pooling over a sequence (``(h * mask).sum(1) / mask.sum(1)``), a BatchNorm's statistics —
with elementwise ops before the reductions (inlined: recomputed where the reductions read
them, never written) and elementwise ops on the reduced result after them.  Its output space is
``(outer, columns)``; the reduced extent ``K`` is everything in between.  A thread block cannot
own a whole reduced column the way it owns a row (the columns' elements lie ``columns`` apart
in memory), so when the outer × column tiles alone do not fill the GPU the reduction is split
in two phases:

1. ``chunks`` pieces of ``K``, each reduced by a thread block over a tile of adjacent columns
   (threads along the columns: coalesced, ``vector`` columns per thread), partial results in a
   ``(chunks, outer, columns)`` float buffer — every column reduction of the pattern in the
   same kernel (horizontal fusion: the input is read once);
2. a thread per output element adds its ``chunks`` partials and applies the epilogue.

With ``chunks == 1`` the second phase alone is the kernel (a thread reduces its whole
column).  The partial buffers become outputs of the PrimFunc (:func:`lift_partials`), so Relax
allocates them like any tensor (planned memory, CUDA graphs) instead of the kernel asking for a
workspace at run time.  The latency-evaluator (waves × each thread's serial chain, against the
DRAM traffic of both phases and the second launch) chooses threads, vector width and chunks.
"""

from __future__ import annotations

import dataclasses
import math

import tvm
from tvm import s_tir
from tvm.s_tir.dlight.analysis import normalize_prim_func

from tvm_stitch.graph.access import Dependence
from tvm_stitch.graph.classify import OpKind
from tvm_stitch.graph.kernels import PARTIALS_ATTR
from tvm_stitch.graph.tdg import prim_func_nodes
from tvm_stitch.graph.tir_walk import iter_realizes
from tvm_stitch.hardware import HardwareModel

from .bind import cpu_bind, finish
from .plan import IllegalPatternError, _bytes, _latency

#: Op kinds a column pattern may hold besides its column reductions.
_ELEMENTWISE = (OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.BROADCAST)


@dataclasses.dataclass(frozen=True)
class ColumnPlan:
    """A two-phase schedule for a column pattern and its estimated latency.

    Attributes
    ----------
    threads : int
        Threads per block of the first phase, along the columns.
    vector : int
        Adjacent columns per thread in the first phase (``vector × bytes ≤ 16``).
    chunks : int
        Pieces of the reduced extent, reduced by different thread blocks (1: one kernel).
    reductions : tuple of str
        The column reductions (one first-phase kernel computes them all).
    outer, reduced, cols : int
        The output space ``(outer, cols)`` and the reduced extent.
    latency_us : float
        The latency-evaluator's estimate, both phases.
    rows : int
        Rows of the reduced extent over ``threadIdx.y`` in a block (1: one row chain per
        thread); TVM reduces them through shared memory.
    composition : str
        ``"column"`` (beside :class:`~tvm_stitch.stitch.plan.KernelPlan`'s compositions).
    """

    threads: int
    vector: int
    chunks: int
    reductions: tuple
    outer: int
    reduced: int
    cols: int
    latency_us: float
    rows: int = 1
    composition: str = "column"

    def describe(self) -> str:
        """One line: phases, block shape, the reductions and the estimate."""
        rows = f" x {self.rows} rows" if self.rows > 1 else ""
        if self.chunks == 1:
            head = f"column reduction in one phase, {self.threads} columns{rows} per block"
        else:
            head = (
                f"column reduction in two phases: {self.chunks} chunks of "
                f"{math.ceil(self.reduced / self.chunks)} rows, {self.threads} threads x "
                f"{self.vector} columns{rows} per block"
            )
        return (
            f"{head}, {len(self.reductions)} reductions over ({self.outer}, {self.reduced}, "
            f"{self.cols}), est {self.latency_us:.1f} us"
        )


def is_column_pattern(func: tvm.tirx.PrimFunc) -> bool:
    """Whether ``func`` reduces some tensor over axes other than its innermost."""
    return any(n.kind is OpKind.COLUMN_REDUCE for n in prim_func_nodes(func, "p"))


def column_space(nodes) -> tuple[int, int, int, tuple]:
    """``(outer, reduced, cols, reductions)`` of a column pattern's tensor-graph nodes.

    Raises
    ------
    IllegalPatternError
        When an op is neither elementwise nor a column reduction, when the reductions do not
        share one output space and reduced extent, when one sweeps its input's innermost axis
        (a column's elements must be adjacent across threads), or when one reduces a value
        computed from another's result (a variance in one function: two passes).
    """
    reductions = [n for n in nodes if n.kind is OpKind.COLUMN_REDUCE]
    if not reductions:
        raise IllegalPatternError("no column reduction")
    for n in nodes:
        if n.kind is not OpKind.COLUMN_REDUCE and n.kind not in _ELEMENTWISE:
            raise IllegalPatternError(
                f"{n.name} is {n.kind.value} ({n.detail}) in a column pattern"
            )
    spaces = set()
    for n in reductions:
        if not n.spatial:
            raise IllegalPatternError(f"{n.name} reduces to a scalar")
        col, cols = n.spatial[-1]
        outer = math.prod(e for _, e in n.spatial[:-1])
        reduced = math.prod(e for _, e in n.reduction)
        spaces.add((outer, reduced, cols))
        for m in n.inputs:
            if m.dependence is not Dependence.ONE_TO_MANY or not m.dim_vars:
                continue
            inner = [names for names, size in zip(m.dim_vars, m.shape) if size > 1]
            swept = {name for name, _, _ in m.reduce_region}
            if inner and (set(inner[-1]) & swept or col not in inner[-1]):
                raise IllegalPatternError(
                    f"{n.name} does not keep {m.tensor}'s innermost axis as its columns"
                )
    if len(spaces) > 1:
        raise IllegalPatternError(f"column reductions over different spaces {sorted(spaces)}")
    after = set()  # tensors computed from a reduction's result
    for n in nodes:
        if any(m.tensor in after for m in n.inputs):
            if n.kind is OpKind.COLUMN_REDUCE:
                raise IllegalPatternError(
                    f"{n.name} reduces a value computed from another reduction (two passes)"
                )
            after.add(n.output)
        if n.kind is OpKind.COLUMN_REDUCE:
            after.add(n.output)
    ((outer, reduced, cols),) = spaces
    for n in nodes:
        if n.kind is OpKind.COLUMN_REDUCE:
            continue
        elements = math.prod(e for _, e in n.spatial) or 1
        if elements not in (outer * cols, outer * reduced * cols) and elements > outer * cols:
            raise IllegalPatternError(f"{n.name} is outside the pattern's spaces")
    return outer, reduced, cols, tuple(n.name.split("/")[-1] for n in reductions)


def column_plans(func: tvm.tirx.PrimFunc, hw: HardwareModel) -> list[ColumnPlan]:
    """Every column plan the latency-evaluator considers for ``func``, cheapest first.

    Raises
    ------
    IllegalPatternError
        See :func:`column_space`.
    """
    nodes = prim_func_nodes(func, "p")
    outer, reduced, cols, reductions = column_space(nodes)
    # the inputs over the whole reduced space are the ones read with vector accesses
    full = outer * reduced * cols
    widest = max([_bytes(str(p.ty.dtype)) for p in func.params if _elements(p) == full] + [1])
    io_bytes = sum(_elements(p) * _bytes(str(p.ty.dtype)) for p in func.params)
    special = sum(
        math.prod(e for _, e in n.spatial) for n in nodes if n.kind is OpKind.EXPENSIVE_ELEMWISE
    )
    plans = []
    for vector in (8, 4, 2, 1):
        if vector * widest > 16 or cols % vector:
            continue
        for threads in (32, 64, 128, 256):
            if threads > 32 and threads // 2 >= cols // vector:
                continue  # half the block or more would have no column
            # rows of a chunk over threadIdx.y (an in-block reduction) only with scalar
            # columns: TVM's cross-thread reduction needs its loops innermost
            for rows in (1, 2, 4, 8, 16, 32) if vector == 1 else (1,):
                if threads * rows > 1024:
                    continue
                for chunks in _chunk_counts(reduced):
                    if chunks == 1 and vector > 1:
                        continue  # one phase: a thread per output element
                    if rows > 1 and not _exact(reduced, cols, chunks, rows, threads):
                        continue
                    plan = ColumnPlan(
                        threads, vector, chunks, reductions, outer, reduced, cols, 0.0, rows
                    )
                    lat = _estimate(hw, plan, io_bytes, special, widest)
                    plans.append(dataclasses.replace(plan, latency_us=lat))
    if not plans:
        raise IllegalPatternError("no column plan")
    return sorted(plans, key=lambda p: p.latency_us)


def _exact(reduced, cols, chunks, rows, threads) -> bool:
    """Whether rows over ``threadIdx.y`` leave the block unpredicated: TVM lowers a reduction
    over thread-bound loops through shared memory only then (a predicated one it leaves as
    every thread adding into the same element — a race)."""
    return reduced % chunks == 0 and (reduced // chunks) % rows == 0 and cols % threads == 0


def _unpredicated(sch, block) -> None:
    """Raise IllegalPatternError when ``block`` runs under a predicate (see :func:`_exact`)."""
    name = sch.get(block).name_hint
    found = [
        r.predicate for r, _ in iter_realizes(sch.mod["main"].body) if r.block.name_hint == name
    ]
    if any(not (isinstance(p, tvm.tirx.IntImm) and int(p) == 1) for p in found):
        raise IllegalPatternError(
            f"{name}: rows over threadIdx.y under a predicate (not a cross-thread reduction)"
        )


def _elements(param) -> int:
    return math.prod(int(d) for d in param.ty.shape)


def _chunk_counts(reduced: int) -> list[int]:
    """Chunk counts tried: powers of two leaving at least 4 rows per chunk (and 1), none
    empty (a chunk without rows would leave its partial unwritten)."""
    counts, c = [1], 2
    while reduced // c >= 4 and c <= 256:
        if math.ceil(reduced / c) * (c - 1) < reduced:
            counts.append(c)
        c *= 2
    return counts


def _estimate(hw: HardwareModel, plan: ColumnPlan, io_bytes, special, elem_bytes) -> float:
    """Estimated µs of the plan's kernels: each is ``N_wave × L_warp`` (a thread's chain of
    loads — 4 in flight — and the in-block reduction over ``plan.rows`` threads) against
    its DRAM traffic (:func:`~tvm_stitch.stitch.plan._latency`), plus a launch per kernel."""
    outer, reduced, cols, chunks = plan.outer, plan.reduced, plan.cols, plan.chunks
    threads, vector, rows_per_block = plan.threads, plan.vector, plan.rows
    n_red = len(plan.reductions)
    partial_bytes = chunks * outer * cols * 4 * n_red
    launch = hw.launch_overhead
    rows = math.ceil(reduced / chunks)

    # the in-block reduction over threadIdx.y (TVM's tree in shared memory, laid out
    # [column][row]): a barrier per halving, and shared-memory steps whose bank conflicts grow
    # with the rows (a warp's lanes are ``rows`` floats apart) — measured on the H200, plans
    # of 32 rows ran 2× slower than those of 16 (`benchmarks/stitch_plans.py`)
    tree = (
        n_red
        * (
            math.log2(rows_per_block) * hw.cpi_barrier
            + threads / hw.warp_size * rows_per_block * min(rows_per_block, 32) * hw.cpi_smem / 2
        )
        if rows_per_block > 1
        else 0.0
    )

    def phase(blocks, block_threads, chain, traffic, width, expensive=0.0, extra=0.0):
        regs = 32 + 2 * width * n_red
        occ = min(
            hw.max_blocks_per_sm,
            hw.max_threads_per_sm // block_threads,
            hw.registers_per_sm // (regs * block_threads),
        )
        waves = math.ceil(blocks / (hw.num_sms * occ))
        cycles = hw.mem_latency_cycles * (math.ceil(chain / 4) + 1) + chain * width * hw.cpi_light
        cycles += extra
        # Little's law: the bytes the resident threads keep in flight bound the bandwidth
        resident = min(blocks, hw.num_sms * occ) * block_threads
        in_flight = resident * 4 * width * elem_bytes
        bandwidth = min(hw.mem_bandwidth, in_flight * hw.clock_hz / hw.mem_latency_cycles)
        traffic *= hw.mem_bandwidth / bandwidth
        return _latency(hw, waves, cycles / hw.clock_hz, traffic, blocks, expensive)

    if chunks == 1:
        # one kernel: ``threads`` output elements per block, each reduced by its column of
        # ``rows_per_block`` threads
        blocks = math.ceil(outer * cols / threads)
        chain = math.ceil(reduced / rows_per_block)
        block_threads = threads * rows_per_block
        return (phase(blocks, block_threads, chain, io_bytes, 1, special, tree) + launch) * 1e6
    chain = math.ceil(rows / rows_per_block)
    tiles = outer * math.ceil(cols // vector / threads)
    first = phase(
        tiles * chunks,
        threads * rows_per_block,
        chain,
        io_bytes + partial_bytes,
        vector,
        extra=tree,
    )
    second = phase(math.ceil(outer * cols / 256), 256, chunks, partial_bytes + outer * cols * 4, 1)
    return (first + second + 2 * launch) * 1e6


def apply_column_plan(
    func: tvm.tirx.PrimFunc, plan: ColumnPlan, gpu: bool = True, point=None,
) -> tvm.tirx.PrimFunc:
    """The scheduled PrimFunc: one kernel per phase, the partials lifted to trailing outputs
    (:data:`PARTIALS_ATTR` says how many).  With ``gpu=False`` the same loops run on a CPU
    (blocks parallel, threads serial).  Raises IllegalPatternError when TVM refuses a step.

    The partials' buffers are sized by the plan: a function of symbolic shape (given with
    its ``point``, :func:`~.schedule.apply_plan`'s) is refused."""
    if point is not None:
        raise IllegalPatternError("a column pattern of symbolic shape (its partials are sized "
                                  "by the plan)")
    try:
        return _apply(func, plan, gpu)
    except IllegalPatternError:
        raise
    except Exception as err:
        raise IllegalPatternError(f"TVM refused the column schedule: {err}") from err


def _apply(func, plan, gpu):
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if not infos:
        raise IllegalPatternError("TVM could not normalise the pattern's loops")
    kinds = {sch.get(i.block_rv).name_hint: i.dom_kind() for i in infos}
    names = list(kinds)
    reductions = [n for n in names if "R" in kinds[n]]
    params = {p.name for p in func.params}
    outputs = [
        n for n in names if any(w.source.name in params for w in sch.get(sch.get_sblock(n)).writes)
    ]
    for n in outputs:
        block = sch.get_sblock(n)
        extent = math.prod(int(sch.get(lp).extent) for lp in sch.get_loops(block))
        if n not in reductions and extent != plan.outer * plan.cols:
            raise IllegalPatternError(f"{n} leaves the pattern outside its reduced space")
        if n not in reductions and sch.get_consumers(block):
            # an output the reductions also read would be written by the last kernel only
            raise IllegalPatternError(f"{n} is an output the pattern also reads")
    for n in reversed(names):
        if n in reductions or n in outputs:
            continue
        try:
            sch.compute_inline(sch.get_sblock(n))
        except Exception as err:
            raise IllegalPatternError(f"cannot recompute {n} where it is read: {err}") from err
    bind = sch.bind if gpu else cpu_bind(sch)
    # each reduction's loops: (outer, column, reduced), fused
    for n in reductions:
        block = sch.get_sblock(n)
        loops = sch.get_loops(block)
        spatial = kinds[n].count("S")
        if kinds[n] != "S" * spatial + "R" * (len(kinds[n]) - spatial):
            raise IllegalPatternError(f"{n}'s loops interleave spatial and reduced axes")
        if len(loops[spatial:]) > 1:
            sch.fuse(*loops[spatial:])
        if spatial > 2:
            sch.fuse(*loops[: spatial - 1])
    partials = []
    if plan.chunks > 1:
        rfs = []
        for n in reductions:
            k = sch.get_loops(sch.get_sblock(n))[-1]
            ko, _ = sch.split(k, [plan.chunks, None])
            rf = sch.rfactor(ko, 0)
            rfs.append(rf)
            partials.append(sch.get(rf).writes[0].source.name)
    # second phase: a thread per output element, the reductions' last step at its loop
    tx2 = _second_phase(sch, outputs, reductions, plan.threads if plan.chunks == 1 else 256, bind)
    for n in reductions:
        block = sch.get_sblock(n)
        if n not in outputs:
            sch.compute_at(block, tx2, preserve_unit_loops=True)
            if gpu:
                sch.set_scope(block, 0, "local")
        if plan.chunks == 1 and plan.rows > 1:
            # the column's rows over threadIdx.y: TVM's cross-thread reduction
            _, ty = sch.split(sch.get_loops(block)[-1], [None, plan.rows])
            bind(ty, "threadIdx.y")
            _unpredicated(sch, block)
    if plan.chunks > 1:
        _first_phase(sch, rfs, plan, bind, gpu)
    scheduled = finish(sch, gpu)
    return lift_partials(scheduled, partials)


def _second_phase(sch, outputs, reductions, threads, bind):
    """Bind the output blocks' spatial loops (fused; one thread per element, ``threads`` per
    block) and merge them across outputs; returns the thread loop."""
    bxs, txs = [], []
    for n in outputs:
        block = sch.get_sblock(n)
        loops = sch.get_loops(block)
        spatial = len(loops) - (1 if n in reductions else 0)
        flat = sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0]
        bx, tx = sch.split(flat, [None, threads])
        bxs.append(bx)
        txs.append(tx)
    extents = {int(sch.get(b).extent) for b in bxs}
    if len(extents) > 1:
        raise IllegalPatternError("outputs of different sizes")
    bx = sch.merge(*bxs) if len(bxs) > 1 else bxs[0]
    tx = sch.merge(*txs) if len(txs) > 1 else txs[0]
    bind(bx, "blockIdx.x")
    bind(tx, "threadIdx.x")
    return tx


def _first_phase(sch, rfs, plan, bind, gpu):
    """Every reduction's first phase in one kernel: blocks over (chunk, outer, column tile),
    ``threads`` × ``vector`` adjacent columns each, partial sums in registers."""
    nests = []
    for rf in rfs:
        loops = sch.get_loops(rf)
        if len(loops) == 4:
            o, c, ko, ki = loops
        else:
            c, ko, ki = loops
            o = None
        cv, v = sch.split(c, [None, plan.vector])
        co, tx = sch.split(cv, [None, plan.threads])
        if plan.rows > 1:  # reduction loops innermost: TVM's cross-thread reduction
            kio, ty = sch.split(ki, [None, plan.rows])
            order = [ko] + ([o] if o is not None else []) + [co, tx, v, ty, kio]
        else:
            order = [ko] + ([o] if o is not None else []) + [co, tx, ki, v]
        sch.reorder(*order)
        nests.append(order[: len(order) - (3 if plan.rows > 1 else 2)])
    merged = [sch.merge(*level) if len(level) > 1 else level[0] for level in zip(*nests)]
    bx = sch.fuse(*merged[:-1])
    bind(bx, "blockIdx.x")
    bind(merged[-1], "threadIdx.x")
    if plan.rows > 1:
        for rf in rfs:
            bind(sch.get_loops(rf)[-2], "threadIdx.y")
            _unpredicated(sch, rf)
        return
    for rf in rfs:
        store = sch.cache_write(rf, 0, "local")
        ki = sch.get_loops(rf)[-2]
        sch.reverse_compute_at(store, merged[-1], preserve_unit_loops=True)
        try:
            sch.decompose_reduction(rf, ki)
        except Exception:  # noqa: BLE001 - a predicated last chunk: the init stays in the loop
            pass
        if plan.vector > 1:
            sch.vectorize(sch.get_loops(store)[-1])
        if gpu:
            sch.annotate(ki, "pragma_unroll_explicit", 0)
            sch.annotate(ki, "pragma_auto_unroll_max_step", 8)


def lift_partials(func: tvm.tirx.PrimFunc, names) -> tvm.tirx.PrimFunc:
    """``func`` with the root-allocated buffers ``names`` (the first phase's partials) moved
    to trailing parameters: outputs Relax allocates.  :data:`PARTIALS_ATTR` counts them."""
    if not names:
        return func
    realize = func.body
    root = realize.block
    lifted = [b for b in root.alloc_buffers if b.name in names]
    kept = [b for b in root.alloc_buffers if b.name not in names]
    block = s_tir.SBlock(
        root.iter_vars,
        root.reads,
        root.writes,
        root.name_hint,
        root.body,
        root.init,
        kept,
        root.match_buffers,
        root.annotations,
    )
    body = s_tir.SBlockRealize(realize.iter_values, realize.predicate, block)
    out = tvm.tirx.PrimFunc([*func.params, *lifted], body, func.ret_type, func.attrs)
    return out.with_attr(PARTIALS_ATTR, len(lifted))
