"""Kernel plans for stitched patterns and FusionStitching's latency-evaluator.

A pattern is one PrimFunc (``FuseTIR`` merged its ops) whose blocks all live in one row space.
Its ops are light elementwise, expensive elementwise or row reductions.  **Sub-roots** are the
reductions (always) and, when the plan says so, expensive elementwise ops whose result several
passes read, computed once instead of once per pass: kept in shared memory (block composition),
or — when each thread reads back only the columns it computed (rows cached in registers) — in
the thread's registers.  Every other op is inlined
into its consumers: **thread composition**, values stay in registers, schedules derived from the
sub-root's by index propagation (``compute_inline``).  Between a sub-root and its consumers the
plan picks one composition for the whole kernel:

* ``warp`` — one row per warp (32 lanes over the columns), several rows per block; reductions
  are register shuffles (``__shfl_*``) and their results stay in registers: no shared memory,
  no barrier;
* ``block`` — one row per thread block of ``threads`` threads; reductions go through shared
  memory with barriers.

The latency-evaluator (``L = N_wave × L_warp``; occupancy from estimated registers and shared
memory; instruction counts × CPI per op class, plus the row's memory traffic at the SM's share
of DRAM bandwidth) enumerates compositions, thread counts and the expensive-op choice and keeps
the cheapest.  Patterns whose blocks do not share the row space (a column reduction, a
transpose) need inter-block communication and are refused with the reason.
"""

from __future__ import annotations

import dataclasses
import math

import tvm

from tvm_stitch.graph.classify import OpKind
from tvm_stitch.graph.tdg import prim_func_nodes
from tvm_stitch.graph.tir_walk import iter_sblocks
from tvm_stitch.hardware import HardwareModel

from .smem import SmemRequest, allocate


class IllegalPatternError(ValueError):
    """The pattern needs inter-block communication or has a shape the plans cannot cover."""


@dataclasses.dataclass(frozen=True)
class Op:
    """One block of the pattern."""

    name: str
    kind: OpKind
    elements: int  # iterations of the block (its whole domain)
    flops: int
    dtype: str
    output: str = ""
    reads: tuple = ()


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """A schedule for one pattern and its estimated latency.

    Attributes
    ----------
    composition : {"warp", "block", "thread"}
        ``thread``: a pattern without reductions, every op inlined (thread composition only).
    threads : int
        Threads per row (32 for ``warp``); threads per block for ``thread``.
    rows_per_block : int
    subroots : tuple of str
        Blocks kept as sub-roots (reductions, and expensive ops kept in shared memory).
    inlined : tuple of str
        Blocks recomputed by their consumers (thread composition).
    latency_us : float
        The latency-evaluator's estimate.
    smem_requested, smem_allocated : int
        Shared-memory bytes per block before and after reuse along the dominance tree.
    occupancy : int
        Resident blocks per SM.
    vector : int
        Elements per thread per access (``vector × bytes ≤ 16``: 128-bit loads and stores).
    cached : int
        Elements of row inputs each thread keeps in registers (0: the row is streamed from
        global memory once per pass).
    epilogue : tuple of str
        Layout ops (reshape, transpose) the output is written through.
    registers : tuple of str
        Expensive elementwise sub-roots kept in each thread's registers (its own columns).
    part_rows : tuple of (str, int)
        For a kernel packing patterns (:func:`_packed`), each block's pattern's row count
        (``rows`` is the most of them); empty for one pattern.
    """

    composition: str
    threads: int
    rows_per_block: int
    subroots: tuple
    inlined: tuple
    latency_us: float
    smem_requested: int
    smem_allocated: int
    occupancy: int
    rows: int
    cols: int
    vector: int = 1
    cached: int = 0
    epilogue: tuple = ()
    registers: tuple = ()
    part_rows: tuple = ()

    def describe(self) -> str:
        if self.composition == "thread":
            return (
                f"thread composition, {self.threads} threads/block, {len(self.inlined)} ops "
                f"inlined, {self.vector} elements/thread ({self.vector}-wide accesses), "
                f"{self.occupancy} blocks/SM, est {self.latency_us:.1f} us"
            )
        return (
            f"{self.composition} composition, {self.threads} threads/row x "
            f"{self.rows_per_block} rows/block, sub-roots {list(self.subroots)}, "
            f"{len(self.inlined)} ops inlined, {self.vector}-wide accesses, "
            f"{self.cached} elements/thread in registers, "
            + (f"{list(self.registers)} kept in registers, " if self.registers else "")
            + f"smem {self.smem_allocated}/{self.smem_requested} B, "
            f"{self.occupancy} blocks/SM, est {self.latency_us:.1f} us"
        )


def pattern_ops(func: tvm.tirx.PrimFunc) -> tuple[list[Op], int, int]:
    """The ops of a stitched PrimFunc and its row space ``(rows, cols)``; the trailing layout
    ops (reshape, transpose: the plan's ``epilogue``) are left out.

    Raises
    ------
    IllegalPatternError
        When a block is a column reduction, a transpose/gather or compute-intensive, when
        blocks do not share the leading (row) dimensions, or when the trailing layout ops
        drop the unit column of rows of one element.
    """
    return _packed(prim_func_nodes(func, "p"))[:3]


def _packed(nodes) -> tuple[list[Op], int, int, tuple, tuple]:
    """:func:`_pattern` of each independent pattern packed in the nodes (no tensor joins
    them): their ops in program order, the most rows and the widest row of any (a thread block
    takes a row of each pattern that has that many), each block's pattern's row count
    (``(name, rows)`` pairs; empty for one pattern), and the trailing layout ops each pattern
    writes through (:func:`_epilogue`)."""
    parts = _components(nodes)
    epilogue = tuple(name for part in parts for name in _epilogue(part))
    if len(parts) == 1:
        return (*_pattern(nodes), (), epilogue)
    found = [_pattern(part) for part in parts]
    # each part's ops follow its nodes (its trailing layout ops have none)
    op_of = {id(n): op for part, (ops, _, _) in zip(parts, found) for n, op in zip(part, ops)}
    ops = [op_of[id(n)] for n in nodes if id(n) in op_of]
    part_rows = tuple((n.name.split("/")[-1], r) for part, (_, r, _) in zip(parts, found)
                      for n in part)
    rows, cols = max(r for _, r, _ in found), max(c for _, _, c in found)
    return ops, rows, cols, part_rows, epilogue


def _components(nodes) -> list[list]:
    """The nodes in groups that no tensor joins, each in program order."""
    owner = list(range(len(nodes)))

    def find(k):
        while owner[k] != k:
            owner[k] = owner[owner[k]]
            k = owner[k]
        return k

    producer = {n.output: k for k, n in enumerate(nodes)}
    for k, n in enumerate(nodes):
        for m in n.inputs:
            if m.tensor in producer:
                owner[find(k)] = find(producer[m.tensor])
    parts: dict[int, list] = {}
    for k, n in enumerate(nodes):
        parts.setdefault(find(k), []).append(n)
    return list(parts.values())


def _pattern(nodes) -> tuple[list[Op], int, int]:
    """:func:`pattern_ops` of a PrimFunc's tensor-graph nodes."""
    layout = nodes[len(nodes) - len(_epilogue(nodes)):]
    nodes = nodes[: len(nodes) - len(layout)]
    if layout and nodes[-1].out_shape[-1:] == (1,) and layout[-1].out_shape[-1:] != (1,):
        # rows of one element (a GEMV's dot products kept as (rows, 1)) written through layout
        # ops that drop the unit column (a squeeze): the output's innermost loop is then rows,
        # and the reduction's sub-root was computed across them
        raise IllegalPatternError(
            f"{layout[-1].name} makes rows of {nodes[-1].out_shape[-1:]} elements "
            f"{layout[-1].out_shape[-1:]}")
    if not nodes:
        raise IllegalPatternError("no analysable blocks")
    ops = []
    produced = {n.output for n in nodes}
    reduces = any(n.kind is OpKind.ROW_REDUCE for n in nodes)
    for n in nodes:
        kind = n.kind
        if reduces and _input_transpose(n, produced):
            # an input read through a transpose: inlined into its readers (index propagation);
            # the loads follow the permutation (not coalesced, not cached in registers).  A
            # transpose without a reduction stays TVM's (its schedule tiles it in shared memory)
            kind = OpKind.LIGHT_ELEMWISE
        elif n.kind is OpKind.COLUMN_REDUCE:
            raise IllegalPatternError(
                f"{n.name} is a column reduction: rows would span thread blocks"
            )
        if kind not in (
            OpKind.LIGHT_ELEMWISE,
            OpKind.EXPENSIVE_ELEMWISE,
            OpKind.ROW_REDUCE,
            OpKind.BROADCAST,
        ):
            raise IllegalPatternError(f"{n.name} is {n.kind.value} ({n.detail})")
        elements = math.prod(e for _, e in n.spatial + n.reduction) or 1
        reads = tuple(m.tensor for m in n.inputs)
        ops.append(Op(n.name.split("/")[-1], kind, elements, n.flops, n.out_dtype, n.output, reads))
    out = nodes[-1].out_shape
    if len(out) < 1:
        raise IllegalPatternError("scalar output")
    rows = math.prod(out[:-1]) if len(out) > 1 else 1
    cols = out[-1]
    reduced = {math.prod(e for _, e in n.spatial) for n in nodes if n.kind is OpKind.ROW_REDUCE}
    if len(reduced) > 1:
        raise IllegalPatternError(f"reductions over different row counts {sorted(reduced)}")
    if reduced and math.prod(out) == next(iter(reduced)):
        # one value per row (a reduction without keepdims, or what is computed from it):
        # every output axis is a row axis, as for a (..., rows, 1) output
        rows, cols = math.prod(out), 1
    for n, op in zip(nodes, ops):
        lead = n.out_shape[: len(out) - 1]
        if math.prod(lead) != rows and math.prod(n.out_shape) not in (rows, rows * cols):
            if op.kind in (OpKind.LIGHT_ELEMWISE, OpKind.EXPENSIVE_ELEMWISE, OpKind.BROADCAST):
                continue  # e.g. a weight's cast: recomputed by its consumers (inlined)
            raise IllegalPatternError(
                f"{n.name} writes {n.out_shape}, outside the row space {out[:-1]}"
            )
    return ops, rows, cols


def _input_transpose(node, produced) -> bool:
    """A transpose of the function's inputs (nothing in the pattern produces what it reads)."""
    return (
        node.kind is OpKind.INJECTIVE
        and node.detail == "transpose"
        and all(m.tensor not in produced for m in node.inputs)
    )


def _epilogue(nodes) -> tuple:
    """Names of the trailing layout ops (reshape, transpose: injective, as many elements out as
    in) after the pattern's last row op.  The output is written through them: each element
    goes straight to its place in the permuted tensor (``reverse_compute_inline``)."""
    tail = []
    for n in reversed(nodes):
        if n.kind is not OpKind.INJECTIVE or len(n.inputs) != 1:
            break
        if math.prod(n.out_shape) != math.prod(e for _, e in n.spatial):
            break
        tail.append(n.name.split("/")[-1])
    if len(tail) == len(nodes):
        return ()  # only layout ops: nothing to write through
    return tuple(reversed(tail))


def _bytes(dtype: str) -> int:
    return max(1, tvm.runtime.DataType(dtype).bits // 8)


def evaluate(
    ops,
    rows,
    cols,
    io_bytes,
    hw: HardwareModel,
    composition,
    threads,
    rows_per_block,
    keep,
    vector=1,
    cached_regs=0,
    reread_bytes=0,
    registers=(),
) -> tuple[float, int, int, int]:
    """Latency (µs), resident blocks per SM, smem requested and allocated, for one candidate.

    ``vector`` is the elements per access; ``cached_regs`` the registers per thread that hold
    the row inputs (0: the row is streamed from global memory once per pass, and each pass
    after the first re-reads ``reread_bytes`` from L2); ``registers`` the expensive ops whose
    results each thread keeps (computed once, one float32 register per element).
    """
    warp = hw.warp_size
    block_threads = threads * rows_per_block
    # shared memory: reduction partials (one slot per warp per row) and kept expensive results
    requests = []
    for i, op in enumerate(ops):
        if op.kind is OpKind.ROW_REDUCE and composition == "block":
            # the row's result and one partial per warp (with one warp per row, the shuffles
            # leave the result in every lane's registers: no shared memory)
            slots = 1 + block_threads // warp
            requests.append(SmemRequest(op.name, i, slots * rows_per_block * 4, last_use(ops, i)))
        elif op.name in keep:
            requests.append(SmemRequest(op.name, i, cols * rows_per_block * 4, last_use(ops, i)))
    requested = sum(r.size for r in requests)
    allocated = allocate(requests).total
    if allocated > hw.smem_per_block_default:
        return math.inf, 0, requested, allocated
    # registers: addresses, accumulators, the sub-roots' scalars and the cached row
    regs = 32 + 2 * len(requests) + cached_regs
    regs += sum(
        math.ceil(op.elements / max(rows, 1) / threads) for op in ops if op.name in registers
    )
    if regs > hw.max_registers_per_thread:
        return math.inf, 0, requested, allocated
    occ = min(
        hw.max_blocks_per_sm,
        hw.max_threads_per_sm // block_threads,
        hw.registers_per_sm // (regs * block_threads),
        hw.smem_per_sm // max(1, allocated) if allocated else hw.max_blocks_per_sm,
    )
    if occ == 0:
        return math.inf, 0, requested, allocated
    blocks = math.ceil(rows / rows_per_block)
    waves = math.ceil(blocks / (hw.num_sms * occ))
    # instructions one warp issues for its share of a row
    cpi = {
        "light": hw.cpi_light,
        "expensive": hw.cpi_expensive,
        "shuffle": hw.cpi_shuffle,
        "barrier": hw.cpi_barrier,
        "smem": hw.cpi_smem,
    }
    cycles = 0.0
    special = 0  # expensive evaluations, each a special-function-unit result
    for op in ops:
        per_row = op.elements / max(rows, 1)
        per_lane = math.ceil(per_row / threads)
        once = op.name in keep or op.name in registers or op.kind is OpKind.ROW_REDUCE
        recompute = 1 if once else _uses(op, ops)
        cls = "expensive" if op.kind is OpKind.EXPENSIVE_ELEMWISE else "light"
        cycles += per_lane * cpi[cls] * recompute
        if cls == "expensive":
            special += op.elements * recompute
        if op.kind is OpKind.ROW_REDUCE:
            cycles += math.log2(min(warp, threads)) * cpi["shuffle"]
            if composition == "block":
                cycles += (
                    2 * cpi["barrier"] + math.log2(max(2, block_threads // warp)) * cpi["smem"]
                )
        if op.name in keep:
            cycles += cpi["barrier"] + per_lane * cpi["smem"]
    # one global round trip per pass over the row (re-read by every sub-root unless cached),
    # each pass issuing one load per vector
    passes = 1 if cached_regs else 1 + sum(1 for op in ops if op.kind is OpKind.ROW_REDUCE)
    cycles += passes * (hw.mem_latency_cycles + math.ceil(cols / (threads * vector)) * cpi["light"])
    l_warp = cycles / hw.clock_hz
    traffic = io_bytes + (passes - 1) * reread_bytes / hw.l2_bandwidth_ratio
    lat = _latency(hw, waves, l_warp, traffic, blocks, special)
    return lat * 1e6, occ, requested, allocated


def _latency(
    hw: HardwareModel, waves: int, l_warp: float, traffic: float, blocks: int, special: float = 0
) -> float:
    """Seconds: ``L = N_wave × L_warp`` when the warps' dependent chain dominates; otherwise the
    DRAM traffic at the device's bandwidth, combined (in quadrature: they overlap only in part)
    with the SMs' per-block overhead and the special-function units' time for ``special``
    expensive evaluations — the terms that decide between plans of equal traffic."""
    l_mem = traffic / hw.mem_bandwidth
    l_blocks = math.ceil(blocks / hw.num_sms) * hw.block_overhead_cycles / hw.clock_hz
    l_sfu = special / (hw.num_sms * hw.sfu_per_sm * hw.clock_hz)
    return max(waves * l_warp, math.hypot(l_mem, l_blocks, l_sfu))


def last_use(ops, i: int) -> int:
    """Position of the last op that reads op ``i``'s result (through inlined elementwise ops:
    a value recomputed inside a later op keeps its inputs alive until then)."""
    last = i
    for j in range(i + 1, len(ops)):
        if ops[i].output in ops[j].reads:
            last = max(last, j if ops[j].kind is OpKind.ROW_REDUCE else last_use(ops, j))
            last = max(last, j)
    return last


def _uses(op, ops) -> int:
    """How often an inlined elementwise op is recomputed: once per reduction pass after it."""
    idx = ops.index(op)
    return 1 + sum(1 for o in ops[idx + 1 :] if o.kind is OpKind.ROW_REDUCE and o is not op)


def candidate_plans(func: tvm.tirx.PrimFunc, hw: HardwareModel) -> list[KernelPlan]:
    """Every plan the latency-evaluator considers for ``func``, cheapest first.

    The enumeration covers the composition (warp: 8/4/2/1 rows per block, or 16 lanes per row
    for rows of at most 256 elements; block: 64–1024 threads per row), keeping an expensive
    elementwise op in shared memory or recomputing it, and caching the row inputs in registers
    or streaming them (with 128-bit accesses where the row length allows).  Candidates that
    do not fit the SM get an infinite estimate.

    Raises
    ------
    IllegalPatternError
        See :func:`pattern_ops`.
    """
    nodes = prim_func_nodes(func, "p")
    # each packed pattern writes through its own trailing layout ops
    ops, rows, cols, part_rows, epilogue = _packed(nodes)
    counts = {r for _, r in part_rows} or {rows}
    io_bytes = sum(math.prod(int(d) for d in p.shape) * _bytes(str(p.dtype)) for p in func.params)
    widest = max([_bytes(str(p.dtype)) for p in func.params] + [1])
    if not any(o.kind is OpKind.ROW_REDUCE for o in ops):
        # thread composition: every block elementwise (a layout op is TVM's business)
        if epilogue:
            raise IllegalPatternError(f"{epilogue[-1]} is a layout op after elementwise ops")
        return _elementwise_plans(ops, rows, cols, io_bytes, widest, hw)
    row_inputs, widths = _row_params(func, counts)
    widths.add(cols)
    reread = sum(r * b * w for b, w, r in row_inputs)
    expensive = [
        o.name for o in ops if o.kind is OpKind.EXPENSIVE_ELEMWISE and o.elements >= rows * cols
    ][:2]
    keeps = [()] + [(e,) for e in expensive]
    # expensive ops that several passes read: with the row cached they may stay in registers
    by_name = {o.name: o for o in ops}
    reused = tuple(e for e in expensive if _uses(by_name[e], ops) > 1)
    candidates = []
    for keep in keeps:
        for rpb in (8, 4, 2, 1):  # on a tie, more warps per block hide more latency
            if not keep:  # a kept (shared) result needs barriers: block composition only
                candidates.append(("warp", 32, rpb, keep))
        if not keep and cols <= 256:  # short rows: half a warp per row, two rows per warp
            candidates += [("warp", 16, 16, keep), ("warp", 16, 8, keep)]
        for threads in (64, 128, 256, 512, 1024):
            if threads // 2 < cols or threads == 64:
                candidates.append(("block", threads, 1, keep))
    plans = []
    subroots0 = tuple(o.name for o in ops if o.kind is OpKind.ROW_REDUCE)
    for comp, threads, rpb, keep in candidates:
        vector = vector_width(widths, threads, widest)
        variants = [(False, ())]
        if vector and row_inputs:
            # rows cached in registers; then the reused expensive ops may stay there too
            variants = [(True, ())] + ([(True, reused)] if reused and not keep else [])
            variants.append((False, ()))
        for cache, in_regs in variants:
            regs = sum(math.ceil(w // threads * b / 4) for b, w, _ in row_inputs) if cache else 0
            lat, occ, req, alloc = evaluate(
                ops,
                rows,
                cols,
                io_bytes,
                hw,
                comp,
                threads,
                rpb,
                keep,
                vector or 1,
                regs,
                reread,
                in_regs,
            )
            subroots = subroots0 + tuple(keep) + in_regs
            inlined = tuple(o.name for o in ops[:-1] if o.name not in subroots)
            cached = sum(w // threads for _, w, _ in row_inputs) if cache else 0
            plans.append(
                KernelPlan(
                    comp,
                    threads,
                    rpb,
                    subroots,
                    inlined,
                    lat,
                    req,
                    alloc,
                    occ,
                    rows,
                    cols,
                    vector or 1,
                    cached,
                    epilogue,
                    in_regs,
                    part_rows,
                )
            )
    # stable: on a tie the earlier candidate (more warps per block, cached rows) wins
    return sorted(plans, key=lambda p: p.latency_us)


def _elementwise_plans(ops, rows, cols, io_bytes, widest, hw: HardwareModel) -> list[KernelPlan]:
    """Thread composition for a pattern without reductions: every op inlined into the output,
    each thread computes ``vector`` consecutive elements (128-bit accesses), one element range
    per thread over the flattened output."""
    vector = vector_width([cols], 1, widest)
    total = rows * cols
    per_element = sum(
        (hw.cpi_expensive if o.kind is OpKind.EXPENSIVE_ELEMWISE else hw.cpi_light)
        * o.elements
        / total
        for o in ops
    )
    regs = 32 + vector * max(1, widest // 2)
    plans = []
    for threads in (256, 128, 512):
        occ = min(
            hw.max_blocks_per_sm,
            hw.max_threads_per_sm // threads,
            hw.registers_per_sm // (regs * threads),
        )
        blocks = math.ceil(total / (threads * vector))
        waves = math.ceil(blocks / (hw.num_sms * occ))
        l_warp = (hw.mem_latency_cycles + vector * per_element) / hw.clock_hz
        special = sum(o.elements for o in ops if o.kind is OpKind.EXPENSIVE_ELEMWISE)
        latency = _latency(hw, waves, l_warp, io_bytes, blocks, special)
        inlined = tuple(o.name for o in ops[:-1])
        plans.append(
            KernelPlan(
                "thread",
                threads,
                1,
                (),
                inlined,
                latency * 1e6,
                0,
                0,
                occ,
                rows,
                cols,
                vector,
                0,
            )
        )
    return sorted(plans, key=lambda p: p.latency_us)


def plan_pattern(func: tvm.tirx.PrimFunc, hw: HardwareModel) -> KernelPlan:
    """The cheapest of :func:`candidate_plans`.

    Raises
    ------
    IllegalPatternError
        See :func:`pattern_ops`, or when no candidate fits the SM.
    """
    best = candidate_plans(func, hw)[0]
    if not math.isfinite(best.latency_us):
        raise IllegalPatternError("no candidate fits the SM's shared memory and registers")
    return best


def vector_width(widths, threads: int, widest_bytes: int) -> int:
    """Elements per access (≤ 16 bytes) such that ``threads`` threads cover every row width
    exactly (no predicate); 0 when a width is not a multiple of ``threads``."""
    for v in (8, 4, 2, 1):
        if v * widest_bytes <= 16 and all(w % (threads * v) == 0 for w in widths):
            return v
    return 0


def _row_params(func: tvm.tirx.PrimFunc, counts) -> tuple[list, set]:
    """The parameters over the pattern's rows (any of the row ``counts`` of the patterns it
    packs): ``(inputs, widths)`` where ``inputs`` lists ``(element bytes, row width, rows)``
    of those only read (candidates for the register cache) and ``widths`` the row widths of
    all of them (packed patterns may differ)."""
    written = {r.source.name for block, _ in iter_sblocks(func.body) for r in block.writes}
    inputs, widths = [], set()
    for p in func.params:
        shape = [int(d) for d in p.shape]
        if len(shape) < 2 or math.prod(shape[:-1]) not in counts:
            continue
        widths.add(shape[-1])
        if p.name not in written:
            inputs.append((_bytes(str(p.dtype)), shape[-1], math.prod(shape[:-1])))
    return inputs, widths
