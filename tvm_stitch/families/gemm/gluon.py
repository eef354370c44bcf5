"""The generated GEMM's warp-specialized Hopper form, printed in Gluon (CUTLASS's cooperative
schedule, cuBLAS's ``192 × 128`` tiles).

Triton's tiles are powers of two, and at 4096 tokens a 768-column output is 96 tiles of
128 × 256 or 192 of 128 × 128 on 132 SMs: 73% of the SMs busy, or a second wave a third full.
cuBLAS runs such GEMMs as 192 × 128 tiles (``nvjet_sm90_hsh_192x128``: three consumer
warpgroups of 64 rows, one wave of 128–132 tiles; ``h100-joined-weights-2026-11-25.md``).
Gluon states the program itself, so the form printed here is:

* **persistent**: a program per SM walks the output tiles (row tiles grouped by ``GROUP_M``
  so consecutive tiles share B's columns in L2);
* a tile is ``CONSUMERS`` × ``BLOCK_M`` rows (``BLOCK_M`` = 64, one warpgroup's ``wgmma``)
  by ``BLOCK_N`` columns: each of ``CONSUMERS`` **consumer warpgroups** (2 or 3; launch option
  ``WS``) multiplies its own 64 rows of A by the tile's B, which all of them read from the same
  shared memory;
* one **loading warp** brings each k step's A pieces and B tile by TMA (host-made descriptors,
  :class:`~tvm_stitch.codegen.kernel_text.Descriptor`, the Triton form's own) into a ring of
  ``NB`` slots (``ready``/``empty`` mbarriers; a slot is refilled once every consumer has
  arrived on it), running ahead into the next tile while the consumers compute an epilogue;
* each consumer keeps one ``wgmma`` in flight (it waits for the previous one, then frees its
  slot), and registers move to the consumers (``setmaxnreg``);
* the **epilogue** is the Triton form's, printed by the same
  :class:`~tvm_stitch.codegen.elem_printer.ElemPrinter` with Gluon's names; the loads that do
  not depend on the product (bias, residual) are issued before the product loop, their
  latency hidden by it, and the output leaves through shared memory by a **TMA store**
  (from the accumulator's registers with pointers the kernel took 1.4× longer; H200, call 2
  of 2026-11-26);
* **a folded normalization** (``fold_norms`` through the weights): the GEMM writing the
  normalized row also writes its moments in pieces (a row sum per tile, the Triton form's
  layout), and its readers load the pieces before their product loop and combine them into
  row statistics after it, in the partition's own layout (:func:`_row_statistics`); column
  vectors beyond a bias are held across the products in one register a thread
  (:func:`_compact_columns`);
* **bands** (Q, K and V): over their joined weights (``lift_params``) one B descriptor read at
  the tile's band's columns; over weights of their own (the model's parameters as given) a B
  descriptor a band, the loading warp choosing the tile's band's (BERT-base's Q/K/V at 4096
  tokens 25.7 µs either way, H100, session 35); each band's own epilogue and output
  descriptor;
* or an **epilogue partition** (launch option ``EW``: 4 or 8 warps with two consumers, 4
  with three): a consumer casts its product to the output's type, leaves it in shared
  memory and goes on with the next tile's products while the partition reads it, runs the
  epilogue and stores by TMA from staging tiles of its own (``c_full``/``c_empty``
  mbarriers per consumer; or through pointers, launch option ``PTR_STORE``, which frees the
  staging tiles' shared memory for a ring slot more) — the tensor cores no longer wait for a
  GELU (BERT's FFN-in: 36.9 µs against the consumers' own epilogue's 44.9 and the Triton
  form's 40.7; H100, 2026-11-26).  The consumers stage the value the model rounds to the
  output's type (:func:`staged_product`: the product cast, or a folded normalization's
  ``rstd · (P - mean · c) + d`` computed beside it), so nothing is rounded twice
  (:func:`staging_legality`).

Standalone on an H200 (a retired study, ``docs/results/h100-gluon-gemm-2026-11-25.md``,
192 × 128 × 64 with 4 slots): BERT's four GEMMs at 4096 tokens 0.95–1.08× cuBLAS, where the
Triton form's best are 0.80–1.0×.

The form is a launch option of the GEMM search (``WS``: the consumer count, with ``BLOCK_M``
64, ``num_stages`` the ring's slots and ``EW`` the epilogue partition's warps), measured
against the Triton forms; the tuning database carries the choice.  :func:`ws_legality` says
when it applies.  Gluon has no interpreter: the numerics are tested on the GPU host, the
compilation to sm_90a PTX on any machine.
"""

from __future__ import annotations

import re

from tvm_stitch.analysis.elem import Leaf, Op, leaves, reductions, replace, walk
from tvm_stitch.codegen.elem_printer import ElemPrinter, row_statistics, store
from tvm_stitch.codegen.kernel_text import (
    Descriptor,
    UnsupportedKernelError,
    cdiv,
    extra_views,
    gluon_line,
    gluon_version,
    hoisted,
    pointer_args,
    tma_unreadable,
)
from tvm_stitch.families.gemm.gluon_launch import (
    WS_GEMM_EPILOGUE_REGS,
    WS_GEMM_LOAD_REGS,
    WS_GEMM_MAX_N,
    WS_GEMM_REGS,
    WS_GEMM_TILES,
)
from tvm_stitch.families.gemm.triton import n_axis_of, tma_descriptors, tma_layout


def ws_legality(match) -> str | None:
    """Why the warp-specialized Gluon form cannot compute the GEMM ``match``, or None.

    One product per band (or a gate and an up interleaved, ``paired``: one product of twice
    the columns, split after the loop), A and B 16-bit floats of one type that TMA reads as
    they are (the persistent Triton form's :func:`~.triton.tma_layout`; bands are consecutive
    columns of one B, as Q, K and V joined, or B tensors of their own, each read through a
    descriptor of its own; no computed A), products in float32, and one 16-bit row
    output per band that TMA stores (a staging tile per consumer, shared by the bands: one
    dtype). Epilogues may read row statistics (a normalization folded through the weights)
    and a one-band GEMM may write row moments beside its row (the two phases of a folded
    normalization's reduction)."""
    if match.family != "gemm":
        return "not a GEMM"
    why = gluon_version()
    if why:
        return why
    layout = tma_layout(match, apart=True)
    if isinstance(layout, str):
        return f"TMA cannot read the operands: {layout}"
    dtypes = {match.views["a"].dtype, match.views["b0.0"].dtype, match.dtype}
    if not dtypes <= {"float16", "bfloat16"} or len(dtypes) != 1:
        return f"operands hold {sorted(dtypes)}, not one 16-bit float type"
    if match.acc_dtype != "float32":
        return f"{match.acc_dtype} accumulators"
    for si, seg in enumerate(match.segments):
        rows = [o for o in seg.outputs if not o.chunk]
        if len(rows) != 1:
            return f"{len(rows)} outputs of a band (one TMA staging tile per consumer)"
        if len(rows) != len(seg.outputs) and len(match.segments) > 1:
            return f"band {si} of {len(match.segments)} writes row moments"
        # a tile's columns must be whole pieces (its sum goes to its first piece)
        if any(tiles[1] % o.chunk for o in seg.outputs if o.chunk for tiles in WS_GEMM_TILES):
            return "row moments in pieces no column tile holds whole"
        # stores from the accumulator's registers took 1.4x the time (H200, 2026-11-26)
        why = tma_unreadable(_row_view(match, si), n_axis_of(match.views[f"b{si}.0"]), "m")
        if why:
            return f"TMA cannot store band {si}'s output: it {why}"
    dtypes = {_row_view(match, si).dtype for si in range(len(match.segments))}
    if len(dtypes) != 1:
        return f"bands write {sorted(dtypes)} (one staging tile per consumer)"
    if dtypes - {"float16", "bfloat16"}:
        # three 64 x 128 float32 staging tiles and the ring do not fit in shared memory
        return f"{dtypes.pop()} outputs (staging tiles sized for 16-bit ones)"
    return None


def _row(seg) -> int:
    """The index of a band's row output (its others are row moments)."""
    return next(oi for oi, o in enumerate(seg.outputs) if not o.chunk)


def _row_view(match, si: int):
    return match.views[f"out{si}.{_row(match.segments[si])}"]


def staging_legality(match) -> str | None:
    """Why the consumers cannot hand ``match``'s products to an epilogue partition (``EW``)
    as 16-bit tiles, or None: every band's outputs read its product only inside one value
    cast to the output's type (:func:`staged_product`; as a 16-bit model's GEMM computes
    it), so the consumers stage exactly what the model rounds and nothing is rounded twice.
    Bands (one staging tile for all) stage their product merely cast."""
    why = ws_legality(match)
    if why:
        return why
    if match.paired:
        return "gate and up: two products to stage"
    for si, seg in enumerate(match.segments):
        dtype = _row_view(match, si).dtype
        product = staged_product(seg, dtype)
        if product is None:
            return f"band {si} reads its product other than inside one value cast to {dtype}"
        if len(match.segments) > 1 and not isinstance(product.args[0], Leaf):
            return f"band {si} of {len(match.segments)} computes on its product before the cast"
    return None


def staged_product(seg, dtype: str):
    """The value a consumer stages for a band's epilogue partition: the one subexpression
    ``cast(dtype, E)`` (by structure; the innermost such cast, as the model rounds its
    product) holding every read of the band's products, ``E`` what
    the consumer computes beside them (a folded normalization's ``rstd · (P - mean · c) + d``
    over row statistics and column sums; most often the product alone); None when the
    products are read otherwise (in a wider type, or in two different values)."""
    accumulators = set(seg.accumulators)
    found = {}

    def rounds(e) -> bool:  # a cast to dtype of a value reading the products
        return isinstance(e, Op) and e.op == "cast" and e.dtype == dtype \
            and _reads(e.args[0], accumulators)

    def inside(e) -> bool:
        if rounds(e) and not any(rounds(x) for x in walk(e.args[0])):
            found.setdefault(e.key(), e)
            return True
        if isinstance(e, Leaf):
            return e.tensor not in accumulators
        return all(inside(a) for a in e.children())

    if not all(inside(o.elem) for o in seg.outputs) or len(found) != 1:
        return None
    return next(iter(found.values()))


def _unstaged(elem, product, accumulators: set):
    """``elem`` reading the staged 16-bit tile (as its product, cast) in place of the value
    ``product``."""
    read = next(x for x in leaves(product) if x.tensor in accumulators)
    staged, key = Leaf(read.tensor, read.index, product.dtype), product.key()
    return replace(elem, lambda e: staged if isinstance(e, Op) and e.key() == key else None)


def tile_read(match):
    """The one read of a one-band epilogue that TMA brings into a consumer's staging tile
    while it computes the products (a residual), as its view, or None.

    The read must be of the output's 16-bit type at the output's positions (rows along ``m``,
    contiguous columns along the band's column axis, nothing else varying), TMA-readable, and
    its tensor read nowhere else in the epilogue: the consumers then read it from shared memory
    in their accumulator's layout, in place of 4-byte pieces of global memory (BERT's
    out-projection and FFN-out read their residual so)."""
    if len(match.segments) != 1:
        return None
    out = _row_view(match, 0)
    n_axis = n_axis_of(match.views["b0.0"])
    elem = match.segments[0].outputs[_row(match.segments[0])].elem
    reads = {}
    for leaf in leaves(elem):
        reads.setdefault(leaf.tensor, set()).add(leaf.key())
    for key, view in extra_views(match).items():
        if (view.dtype != out.dtype or len(reads.get(view.tensor, ())) != 1
                or view.tensor == out.tensor or key not in reads[view.tensor]
                or {a for a, st in view.strides if st} != {"m", n_axis}
                or tma_unreadable(view, n_axis, "m")):
            continue
        return view
    return None


def ws_descriptors(match) -> tuple:
    """The kernel's descriptors: A's and B's (:func:`~.triton.tma_descriptors`: the Triton
    form's, or a B descriptor a band where the bands read B tensors of their own), then each
    band's output (``o<band>_desc``, boxes of a consumer's rows)."""
    m = match.frame.extents["m"]
    outs = []
    for si, seg in enumerate(match.segments):
        view = _row_view(match, si)
        outs.append(Descriptor(f"o{si}_desc", seg.outputs[_row(seg)].tensor, view.dtype,
                               view.offset, m, seg.n, view.stride["m"], ("BLOCK_M", "BLOCK_N")))
    view = tile_read(match)
    if view is not None:  # brought by TMA into the consumers' staging tiles (tile_read)
        outs.append(Descriptor("r0_desc", view.tensor, view.dtype, view.offset, m,
                               match.segments[0].n, view.stride["m"], ("BLOCK_M", "BLOCK_N")))
    return (*tma_descriptors(match, apart=True), *outs)


_TEXT = '''"""Generated by tvm_stitch.families.gemm.gluon: {describe}"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)
from triton.language import PropagateNan

# TMA's copies (renamed after Triton 3.6): the text works with either
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
_NAN_ALL = gl.constexpr(PropagateNan.ALL)  # Gluon's minimum takes Triton's enum


@gluon.constexpr_function
def _acc_layout(n):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.jit
def _sigmoid(x):
    return 1.0 / (1.0 + gl.exp(-x))


@gluon.jit
def _erf_abs(x):
    # tvm_stitch.codegen.triton_kernels._erf_abs: erf to 1.1e-7 absolute, one ex2, 8 FMAs;
    # the sign by its bit, NaN kept by the minimum
    t = gl.minimum(gl.abs(x), 3.92, propagate_nan=_NAN_ALL)
    p = -4.535461630e-05 * t + 4.454722512e-04
    p = p * t - 1.489320071e-03
    p = p * t - 7.748364005e-04
    p = p * t + 2.825386636e-02
    p = p * t - 1.484816968e-01
    p = p * t - 9.184163809e-01
    p = p * t - 1.627908587e00
    r = 1.0 - gl.exp2(p * t)
    sign = x.to(gl.uint32, bitcast=True) & 0x80000000
    return (r.to(gl.uint32, bitcast=True) | sign).to(gl.float32, bitcast=True)


@gluon.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_m = gl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@gluon.jit
def _load(a_desc, b_desc{bs}, a_smem, b_smem, ready, empty, BLOCK_M: gl.constexpr,
          BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr,
          NB: gl.constexpr, CONSUMERS: gl.constexpr):
    # the loading warp: every k step of the program's tiles, in order, into the ring
    tiles_m = gl.cdiv({m}, CONSUMERS * BLOCK_M)
{tiles_n}
    g = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, GROUP_M)
{off_n}
        for kk in range(gl.cdiv({k}, BLOCK_K)):
            slot = g % NB
            mbarrier.wait(empty.index(slot), ((g // NB) & 1) ^ 1)
            mbarrier.expect(ready.index(slot),
                            CONSUMERS * a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            for c in gl.static_range(CONSUMERS):
                _tma_load(a_desc, [(pid_m * CONSUMERS + c) * BLOCK_M, kk * BLOCK_K],
                          ready.index(slot), a_smem.index(slot * CONSUMERS + c))
{b_load}
            g += 1


@gluon.jit
def _consume({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full, c_empty,
             C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NB: gl.constexpr,
             CONSUMERS: gl.constexpr, EW: gl.constexpr):
    # consumer warpgroup C: rows C * BLOCK_M .. of each of the program's tiles
    ACC_L: gl.constexpr = _acc_layout(BLOCK_N)
{pair_layout}{stat_layout}    tiles_m = gl.cdiv({m}, CONSUMERS * BLOCK_M)
{tiles_n}
    k_steps = gl.cdiv({k}, BLOCK_K)
    g = 0  # ring steps consumed
    n = 0  # tiles
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, GROUP_M)
        row0 = (pid_m * CONSUMERS + C) * BLOCK_M
        rm = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC_L))
        cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ACC_L))
        if EW == 0:
            # the epilogue's reads that do not depend on the product, in flight during it
{hoisted}
{tile_load}
        acc0 = gl.zeros([BLOCK_M, {acc_cols}], gl.float32, {acc_layout})
        for kk in range(k_steps):
            slot = (g + kk) % NB
            mbarrier.wait(ready.index(slot), ((g + kk) // NB) & 1)
            acc0 = warpgroup_mma(a_smem.index(slot * CONSUMERS + C), {b_operand}, acc0,
                                 is_async=True)
            acc0 = warpgroup_mma_wait(1, deps=(acc0, ))
            if kk > 0:
                mbarrier.arrive(empty.index((g + kk - 1) % NB), count=1)
        acc0 = warpgroup_mma_wait(0, deps=(acc0, ))
        mbarrier.arrive(empty.index((g + k_steps - 1) % NB), count=1)
        g += k_steps
{split}        if EW:
            # the product as the output's type to the epilogue partition, which runs the
            # epilogue while this warpgroup goes on with the next tile's products
{product_store}
            mbarrier.arrive(c_full.index(C), count=1)
        else:
{epilogue_head}
{epilogue}
        n += 1
    tma.store_wait(0)


@gluon.jit
def _consume1({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full, c_empty,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              GROUP_M: gl.constexpr, NB: gl.constexpr, CONSUMERS: gl.constexpr,
              EW: gl.constexpr):
    _consume({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full, c_empty, 1,
             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)


@gluon.jit
def _consume2({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full, c_empty,
              BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
              GROUP_M: gl.constexpr, NB: gl.constexpr, CONSUMERS: gl.constexpr,
              EW: gl.constexpr):
    _consume({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full, c_empty, 2,
             BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)


@gluon.jit
def _epilogue({ptrs}, {out_descs}, c_smem, o_smem, c_full, c_empty, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, CONSUMERS: gl.constexpr,
              EW: gl.constexpr, PTR_STORE: gl.constexpr):
    # the epilogue partition (EW warps): each consumer's 16-bit product from shared memory,
    # the epilogue, the output by TMA from a staging tile of its own per consumer (PTR_STORE:
    # through pointers, 16 bytes a thread, no staging tile)
    ACC_L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [EW, 1], [1, 0])
{staged_stat_layout}    tiles_m = gl.cdiv({m}, CONSUMERS * BLOCK_M)
{tiles_n}
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ACC_L))
    n = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, GROUP_M)
        for C in gl.static_range(CONSUMERS):
            row0 = (pid_m * CONSUMERS + C) * BLOCK_M
            rm = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACC_L))
{staged_hoisted}
            mbarrier.wait(c_full.index(C), n & 1)
            acc16 = c_smem.index(C).load(ACC_L)
            mbarrier.arrive(c_empty.index(C), count=1)
            tma.store_wait(CONSUMERS - 1)  # this staging tile's last store has left
{staged_epilogue}
        n += 1
    tma.store_wait(0)


@gluon.jit
def {name}({ptrs}, a_desc, b_desc{bs}, {out_descs}, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
           BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NB: gl.constexpr,
           CONSUMERS: gl.constexpr, NUM_SMS: gl.constexpr, EW: gl.constexpr,
           PTR_STORE: gl.constexpr):
    # persistent (min(NUM_SMS, tiles) programs); A, B and the output as TMA descriptors made
    # on the host (rows past the ends read as zeros, stores clipped at them); EW: the warps
    # of an epilogue partition (0: the consumers run the epilogue)
    gl.static_assert(BLOCK_M == 64, "a consumer warpgroup's wgmma takes 64 rows")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    a_smem = gl.allocate_shared_memory(gl.{dtype}, [NB * CONSUMERS, BLOCK_M, BLOCK_K],
                                       a_desc.layout)
    b_smem = gl.allocate_shared_memory(gl.{dtype}, [NB, {b_tile}], b_desc.layout)
    c_smem = gl.allocate_shared_memory(gl.{out_dtype}, [CONSUMERS, BLOCK_M, BLOCK_N],
                                       o0_desc.layout)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    for i in gl.static_range(NB):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=CONSUMERS)
{tile_barrier}
    if EW:
{epilogue_partition}
    elif CONSUMERS == 3:
        gl.warp_specialize([
            (_consume, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, r_bar, empty,
                        0, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
            (_consume1, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, r_bar,
                         empty, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
            (_consume2, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, r_bar,
                         empty, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
            (_load, (a_desc, b_desc{bs}, a_smem, b_smem, ready, empty, BLOCK_M, BLOCK_N, BLOCK_K,
                     GROUP_M, NB, CONSUMERS)),
        ], [4, 4, 1], [{regs3}, {regs3}, {load_regs}])
    else:
        gl.warp_specialize([
            (_consume, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, r_bar, empty,
                        0, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
            (_consume1, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, r_bar,
                         empty, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
            (_load, (a_desc, b_desc{bs}, a_smem, b_smem, ready, empty, BLOCK_M, BLOCK_N, BLOCK_K,
                     GROUP_M, NB, CONSUMERS)),
        ], [4, 1], [{regs2}, {load_regs}])
'''


_EPILOGUE_PARTITION = '''\
        c_full = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], bar_l)
        c_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], bar_l)
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(c_full.index(i), count=1)
            mbarrier.init(c_empty.index(i), count=1)
        if PTR_STORE:
            o_smem = c_smem  # unused: the partition stores through pointers
        else:
            o_smem = gl.allocate_shared_memory(gl.{out_dtype}, [CONSUMERS, BLOCK_M, BLOCK_N],
                                               o0_desc.layout)
{branches}'''

_EPILOGUE_BRANCH = '''        {head}:
            gl.warp_specialize([
                (_consume, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty, c_full,
                            c_empty, 0, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB, CONSUMERS, EW)),
{consumers}\
                (_epilogue, ({ptrs}, {out_descs}, c_smem, o_smem, c_full, c_empty, BLOCK_M,
                             BLOCK_N, GROUP_M, CONSUMERS, EW, PTR_STORE)),
                (_load, (a_desc, b_desc{bs}, a_smem, b_smem, ready, empty, BLOCK_M, BLOCK_N,
                         BLOCK_K, GROUP_M, NB, CONSUMERS)),
            ], [{warps}, 1], [{regs}, {load_regs}])
'''

_EPILOGUE_CONSUMER = '''\
                (_consume{c}, ({ptrs}, {out_descs}, a_smem, b_smem, c_smem, ready, empty,
                              c_full, c_empty, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NB,
                              CONSUMERS, EW)),
'''


def gemm_ws_source(match, name: str, hoist: bool = True) -> str:
    """The Gluon module text of ``match``'s warp-specialized GEMM kernel ``name``.

    Its arguments are the Triton form's pointers (inputs ``I0..``, outputs ``O0..``), the
    descriptors of :func:`ws_descriptors` and the constexprs ``BLOCK_M`` (64: a consumer's
    rows), ``BLOCK_N``, ``BLOCK_K``, ``GROUP_M``, ``NB`` (ring slots), ``CONSUMERS`` (2 or 3),
    ``NUM_SMS``, ``EW`` (an epilogue partition's warps, 4 or 8, where
    :func:`staging_legality` allows one; else 0) and ``PTR_STORE`` (that partition stores
    through pointers, not by TMA from a staging tile); it launches with 4 warps and the register
    limit of :data:`~.gluon_launch.WS_GEMM_REGS` (:data:`~.gluon_launch.WS_GEMM_EPILOGUE_REGS`
    with ``EW``), on ``min(NUM_SMS, tiles)`` programs.  ``hoist``: a one-band
    epilogue's reads that do not depend on the product are issued before the product loop.
    """
    why = ws_legality(match)
    if why:
        raise UnsupportedKernelError(why)
    pointers, inputs, outputs = pointer_args(match)
    ptrs = ", ".join([f"I{i}" for i in range(len(inputs))] + [f"O{i}" for i in range(len(outputs))])
    ext = match.frame.extents
    m, k = ext["m"], ext["k"]
    segments = match.segments
    b_nk, _ = tma_layout(match, apart=True)
    # B's descriptors: one (joined bands, or one band), else one a band (b_desc, b1_desc, ...);
    # those after b_desc are the kernel's further arguments
    b_descs = tma_descriptors(match, apart=True)[1:]
    joined = len(b_descs) == 1
    b_more = "".join(f", {d.name}" for d in b_descs[1:])
    # a band's tiles start at its first column; tiles_n: every band's
    counts = [f"t{si} = gl.cdiv({seg.n}, BLOCK_N)" for si, seg in enumerate(segments)]
    tiles_n = [*counts, "tiles_n = " + " + ".join(f"t{si}" for si in range(len(segments)))]
    firsts = ["0"] + [" + ".join(f"t{j}" for j in range(si)) for si in range(1, len(segments))]
    heads = [f"if pid_n < {firsts[1]}:" if len(segments) > 1 else None]
    heads += [f"elif pid_n < {firsts[si + 1]}:" for si in range(1, len(segments) - 1)]
    heads += ["else:"] if len(segments) > 1 else []
    # B's column of the tile, by band: in the one B (consecutive columns), or in the band's
    # own B, whose descriptor the loading warp chooses by band
    off_n, b_load = [], []
    column = 0
    b_box = "[off_n, kk * BLOCK_K]" if b_nk else "[kk * BLOCK_K, off_n]"
    for si, seg in enumerate(segments):
        local = f"(pid_n - ({firsts[si]})) * BLOCK_N" if si else "pid_n * BLOCK_N"
        local = f"{column} + {local}" if si and joined else local
        if match.paired:  # the gate's and up's rows in turn: twice the columns of B
            local = f"2 * {local}"
        off_n += [heads[si], f"    off_n = {local}"] if heads[si] else [f"off_n = {local}"]
        column += seg.n
        load = (f"_tma_load({b_descs[0 if joined else si].name}, {b_box}, "
                "ready.index(slot), b_smem.index(slot))")
        b_load = [load] if joined else [*b_load, heads[si], f"    {load}"]
    # rows past m are read as zeros and never stored; the epilogue's own reads are masked
    # (a tile of CONSUMERS × 64 rows divides no power of two), columns past a band's end too;
    # printed twice: in the consumers, and in an epilogue partition reading staged products
    staging = staging_legality(match)
    tiled = tile_read(match)  # a residual TMA brings into the staging tile
    pointers_x = extra_views(match)
    products = {si: staged_product(seg, _row_view(match, si).dtype)
                for si, seg in enumerate(segments)} if not staging else {}
    # row statistics (a normalization folded through the weights): their pieces loaded
    # before the products, combined after them (in a partition's own layout, then the
    # accumulator's), by each partition that reads them
    consumer_stats = _row_statistics(match, reductions(*(o.elem for o in match.all_outputs)))
    # what the consumers stage, if they compute more than the product's cast (one band)
    product = products.get(0) if len(segments) == 1 else None
    if product is not None and isinstance(product.args[0], Leaf):
        product = None
    product_stats = _row_statistics(match, reductions(product))
    staged_elems = [_unstaged(o.elem, products[si], set(seg.accumulators))
                    for si, seg in enumerate(segments) for o in seg.outputs] if products else []
    staged_stats = _row_statistics(match, reductions(*staged_elems))
    pre, epilogue, staged_pre, staged_epilogue = [], [], [], []
    product_pre, product_store = [], [
        "mbarrier.wait(c_empty.index(C), (n & 1) ^ 1)",
        f"c_smem.index(C).store(acc0.to(gl.{_row_view(match, 0).dtype}))"]
    for si, seg in enumerate(segments):
        local = f"(pid_n - ({firsts[si]}))" if si else "pid_n"
        n_axis = n_axis_of(match.views[f"b{si}.0"])  # each band has its own column axis
        tiles = {"b": "0", "m": "rm[:, None]", n_axis: "rn[None, :]"}
        masks = {"m": f"(rm < {m})[:, None]"}
        if seg.n % WS_GEMM_MAX_N:
            masks[n_axis] = f"(rn < {seg.n})[None, :]"
        view = _row_view(match, si)
        accumulators = set(seg.accumulators)
        first = [f"rn = {local} * BLOCK_N + cols"]
        if product is not None:
            # the consumers compute the staged value (the product and what it reads beside)
            acc = {t: (f"acc{i}", match.acc_dtype) for i, t in enumerate(seg.accumulators)}
            printer = ElemPrinter(tiles, masks, pointers, pointers_x, acc, prefix="p_",
                                  reduced=product_stats[2])
            value = printer.expr(product)
            reads, body = hoisted(printer.lines, ("acc0", *product_stats[2].values()))
            reads, late = _compact_columns(reads, local)
            product_pre = [*product_stats[0], *first, *reads]
            product_store = [*product_stats[1], *late, *body,
                             "mbarrier.wait(c_empty.index(C), (n & 1) ^ 1)",
                             f"c_smem.index(C).store(({value}).to(gl.{view.dtype}))"]
        for staged in (False, True):
            if staged and staging:
                continue  # the epilogue partition is refused (staging says why)
            acc = {t: ("acc16" if staged else f"acc{i}", view.dtype if staged else match.acc_dtype)
                   for i, t in enumerate(seg.accumulators)}
            if tiled is not None and not staged:  # read from the staging tile after the products
                acc[tiled.tensor] = ("r0", tiled.dtype)
            elems = [o.elem for o in seg.outputs]
            if staged:  # the staged value read from the staged 16-bit tile
                elems = [_unstaged(e, products[si], accumulators) for e in elems]
            reduced = (staged_stats if staged else consumer_stats)[2]
            printer = ElemPrinter(tiles, masks, pointers, pointers_x, acc, prefix=f"e{si}_",
                                  reduced=reduced)
            values = [printer.expr(e) for e in elems]
            elem, value = elems[_row(seg)], values[_row(seg)]
            body = printer.lines
            if hoist and len(segments) == 1:
                # the consumers combine the statistics after the products: what reads them
                # stays there too
                after = "acc16" if staged else ("acc0", "acc1", "r0", *reduced.values())
                reads, body = hoisted(body, after)
                if not staged:  # held across the products: in few registers
                    reads, late = _compact_columns(reads, local)
                    body = [*late, *body]
                (staged_pre if staged else pre)[:] = [*first, *reads]
            else:
                body = [*first, *body]
            staging_tile = "o_smem.index(C)" if staged else "c_smem.index(C)"
            output = _broadcast(value, elem, acc)
            tma_store = [
                f"{staging_tile}.store(({output}).to(gl.{view.dtype}))",
                "fence_async_shared()",
                f"_tma_store(o{si}_desc, [row0, {local} * BLOCK_N], {staging_tile})",
            ]
            if staged:  # the partition's rows of 16-byte pieces store through pointers too
                tma_store = ["if PTR_STORE:", "    " + store(printer, f"({output})", view),
                             "else:", *("    " + line for line in tma_store)]
            body += tma_store
            for oi, out in enumerate(seg.outputs):
                if out.chunk:
                    body += _moment_store(out, values[oi], pointers[out.tensor], m, seg.n,
                                          f"mo{oi}")
            out = staged_epilogue if staged else epilogue
            out += [heads[si], *("    " + line for line in body)] if heads[si] else body
    out_descs = ", ".join([f"o{si}_desc" for si in range(len(segments))]
                          + (["r0_desc"] if tiled is not None else []))
    if tiled is not None:
        tile_load = [
            "tma.store_wait(0)  # the staging tile's last store has left: it takes the read",
            "mbarrier.expect(c_full.index(C), r0_desc.block_type.nbytes)",
            "_tma_load(r0_desc, [row0, pid_n * BLOCK_N], c_full.index(C), c_smem.index(C))",
        ]
        epilogue_head = ["mbarrier.wait(c_full.index(C), n & 1)",
                         "r0 = c_smem.index(C).load(ACC_L)"]
        tile_barrier = [
            "r_bar = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], bar_l)  # tile reads",
            "for i in gl.static_range(CONSUMERS):",
            "    mbarrier.init(r_bar.index(i), count=1)",
        ]
    else:
        tile_load = []
        epilogue_head = ["tma.store_wait(0)  # the staging tile's last store has left"]
        tile_barrier = ["r_bar = ready  # no tile read by TMA: unused"]

    def block(lines, depth):
        pad = "    " * depth
        return "\n".join(pad + gluon_line(x, erf_abs=True) for x in lines) or pad + "pass"

    out_dtype = _row_view(match, 0).dtype
    columns = "2 * BLOCK_N" if match.paired else "BLOCK_N"
    if staging:
        partition = f"        gl.static_assert(EW == 0, {staging!r})"
    else:
        branches = [_EPILOGUE_BRANCH.format(
            head=("if" if i == 0 else "elif") + f" CONSUMERS == {consumers} and EW == {warps}",
            ptrs=ptrs, out_descs=out_descs, bs=b_more,
            consumers="".join(_EPILOGUE_CONSUMER.format(c=c, ptrs=ptrs, out_descs=out_descs)
                              for c in range(1, consumers)),
            warps=", ".join(["4"] * (consumers - 1) + [str(warps)]),
            regs=", ".join([str(regs[1])] * (consumers - 1) + [str(regs[2])]),
            load_regs=WS_GEMM_LOAD_REGS)
            for i, ((consumers, warps), regs) in enumerate(WS_GEMM_EPILOGUE_REGS.items())]
        branches.append("        else:\n            gl.static_assert(False, \"(CONSUMERS, EW): "
                        f"{sorted(WS_GEMM_EPILOGUE_REGS)}\")\n")
        partition = _EPILOGUE_PARTITION.format(out_dtype=out_dtype,
                                               branches="".join(branches)).rstrip("\n")
    return _TEXT.format(
        describe=match.describe(outputs=True), name=name, ptrs=ptrs, out_descs=out_descs,
        m=m, k=k, dtype=match.dtype, out_dtype=out_dtype,
        tiles_n=block(tiles_n, 1), off_n=block(off_n, 2), b_load=block(b_load, 3),
        bs=b_more,
        b_tile=f"{columns}, BLOCK_K" if b_nk else f"BLOCK_K, {columns}",
        acc_cols=columns, acc_layout="PAIR_L" if match.paired else "ACC_L",
        pair_layout=_PAIR_LAYOUT if match.paired else "", split=_PAIR_SPLIT if match.paired
        else "",
        b_operand="b_smem.index(slot).permute((1, 0))" if b_nk else "b_smem.index(slot)",
        hoisted=block(consumer_stats[0] + pre, 3),
        epilogue=block(consumer_stats[1] + epilogue, 3),
        tile_load="\n".join(
            [block(tile_load, 3)] * bool(tile_load)
            + ["        else:  # EW: the staged value's reads\n" + block(product_pre, 3)]
            * bool(product_pre)),
        product_store=block(product_store, 3),
        epilogue_head=block(epilogue_head, 3), tile_barrier=block(tile_barrier, 1),
        staged_hoisted=block(staged_stats[0] + staged_stats[1] + staged_pre, 3),
        staged_epilogue=block(staged_epilogue, 3),
        epilogue_partition=partition,
        # a row statistic's pieces: a consumer's (4 warps) or the epilogue partition's (EW)
        # rows of them (only where the kernel reads statistics: the text of a kernel without
        # them, and so its tuning records' keys, stay as they were)
        stat_layout=_STAT_LAYOUT.format(warps=4) if consumer_stats[0] else "",
        staged_stat_layout=_STAT_LAYOUT.format(warps="EW") if staged_stats[0] else "",
        regs2=WS_GEMM_REGS[2][1], regs3=WS_GEMM_REGS[3][1], load_regs=WS_GEMM_LOAD_REGS,
    )


#: a paired GEMM's accumulator (the gate's and up's columns in turn, 2 * BLOCK_N) and its
#: split into the two, each in the accumulator layout the epilogue is printed in
_PAIR_LAYOUT = "    PAIR_L: gl.constexpr = _acc_layout(2 * BLOCK_N)  # gate and up in turn\n"
_PAIR_SPLIT = ("        acc0, acc1 = gl.split(gl.reshape(acc0, [BLOCK_M, BLOCK_N, 2]))\n"
               "        acc0 = gl.convert_layout(acc0, ACC_L)\n"
               "        acc1 = gl.convert_layout(acc1, ACC_L)\n")

_STAT_LAYOUT = ("    STAT_L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [{warps}, 1], [1, 0])"
                "  # row statistics\n")


#: the most pieces a row of a statistic whose loads stay in flight during the products
LATE_PIECES = 16


def _row_statistics(match, used) -> tuple[list, list, dict]:
    """Lines loading (before the products) and combining (after them) the row statistics
    of ``match`` in ``used`` (:func:`~tvm_stitch.analysis.elem.reductions` of what a
    partition prints, inner statistics included), and key -> name: each partition's own, in
    its ``STAT_L`` layout, then its accumulator's
    (:func:`~tvm_stitch.codegen.elem_printer.row_statistics`). Statistics of more than
    :data:`LATE_PIECES` pieces a row (few rows, narrow pieces: 48 at 128 tokens of BERT-base)
    are combined before the products too: their loaded pieces would hold 32 registers a thread
    across them."""
    keys = {r.key() for r in used}
    needed = [r for r in match.statistics if r.key() in keys]  # inner ones first
    if not needed:
        return [], [], {}
    m = match.frame.extents["m"]
    issue, combine, names = row_statistics(
        needed, {"b": "0", "m": "rs[:, None]"}, {"m": f"(rs < {m})[:, None]"},
        pointer_args(match)[0], extra_views(match),
        arange="gl.arange(0, {n}, layout=gl.SliceLayout(0, STAT_L))",
        full="gl.full([BLOCK_M], {value}, {dtype}, layout=gl.SliceLayout(1, STAT_L))")
    issue = ["rs = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, STAT_L))", *issue]
    combine += [f"{name} = gl.convert_layout({name}, gl.SliceLayout(1, ACC_L))"
                for name in names.values()]
    if any(r.extent > LATE_PIECES for r in needed):
        return [*issue, *combine], [], names
    return issue, combine, names


#: a consumer's column vectors held across its products, one register a thread each (in the
#: accumulator's layout a 128-column float32 vector takes 32)
_COLUMN_LAYOUT = "gl.BlockedLayout([1], [32], [4], [0])"


def _compact_columns(reads: list[str], local: str) -> tuple[list[str], list[str]]:
    """Hoisted lines ``reads`` with their loads of column vectors (bias, column sums) in a
    layout of one register a thread, and the lines that, after the products, bring them to
    the accumulator's layout (through shared memory) and compute what depends on them --
    where more than one such vector would be held across the products (one, a bias: 16
    registers a thread, its latency hidden, as measured for BERT's GEMMs).  Kernels with
    several column vectors and no statistics (none in today's workloads) get this layout too:
    a change of their text, so of their tuning records' keys."""
    columns = [line for line in reads if ".load(" in line and "rn[None, :]" in line
               and not re.search(r"\brm\b", line)]
    if len(columns) <= 1:
        return reads, []
    moved = {line.split(" = ", 1)[0] for line in columns}
    keep, late = [f"rc = {local} * BLOCK_N + gl.arange(0, BLOCK_N, layout={_COLUMN_LAYOUT})"], []
    for line in reads:
        name, expr = line.split(" = ", 1)
        if line in columns:
            expr = re.sub(r"\(rn < (\d+)\)\[None, :\]", r"(rc < \1)", expr)
            keep.append(f"{name} = {expr.replace('rn[None, :]', 'rc')}")
            late.append(f"{name} = gl.convert_layout({name}, gl.SliceLayout(0, ACC_L))[None, :]")
        elif any(re.search(rf"\b{x}\b", expr) for x in moved):
            moved.add(name)
            late.append(line)
        else:
            keep.append(line)
    return keep, late


def _moment_store(out, value: str, pointer: str, m: int, n: int, name: str) -> list[str]:
    """Lines storing the row moment ``out`` of a tile (the first phase of a folded
    normalization's reduction; its readers add the pieces): ``value``'s sum over the tile's
    columns in the first of the ``BLOCK_N // chunk`` pieces the tile owns, zeros in the
    others (the Triton form's ``_moment_store``, in the rows' own layout)."""
    c = out.chunk
    chunks = cdiv(n, c)
    v = f"{value}.to(gl.float32)"
    if n % WS_GEMM_MAX_N:  # a tile may reach past the row: those columns add nothing
        v = f"gl.where((rn < {n})[None, :], {v}, 0.0)"
    first = f"pid_n * (BLOCK_N // {c})"
    return [
        f"{name} = gl.sum({v}, axis=1)",
        f"{name}_at = {pointer} + rm * {chunks} + {first}",
        f"gl.store({name}_at, {name}, mask=rm < {m})",
        f"for piece in gl.static_range(1, BLOCK_N // {c}):",
        f"    gl.store({name}_at + piece, gl.zeros_like({name}), "
        f"mask=(rm < {m}) & ({first} + piece < {chunks}))",
    ]


def _broadcast(value: str, elem, accumulators) -> str:
    """The output tile: ``value`` over the whole tile — as printed when it reads the product
    (a tile already); else (a bias alone, a constant) added to a tile of zeros."""
    if _reads(elem, set(accumulators)):
        return value
    return f"{value} + gl.zeros([BLOCK_M, BLOCK_N], gl.{elem.dtype}, ACC_L)"


def _reads(elem, tensors: set) -> bool:
    """Whether the element expression ``elem`` reads one of ``tensors``."""
    if isinstance(elem, Leaf):
        return elem.tensor in tensors
    return any(_reads(a, tensors) for a in getattr(elem, "args", ()))


ws_source = gemm_ws_source  # the family's warp-specialized form (see :mod:`tvm_stitch.families`)


def ws_launch_options(config: dict) -> dict:
    """Triton's compile options of the warp-specialized GEMM: 4 warps per partition and the
    register limit its partitions divide (with an epilogue partition, ``EW``, its own)."""
    from tvm_stitch.families.gemm.gluon_launch import WS_GEMM_EPILOGUE_REGS, WS_GEMM_REGS

    if config.get("EW"):
        key = (int(config["WS"]), int(config["EW"]))
        return {"num_warps": 4, "maxnreg": WS_GEMM_EPILOGUE_REGS[key][0]}
    return {"num_warps": 4, "maxnreg": WS_GEMM_REGS[int(config["WS"])][0]}
