"""The generated attention's warp-specialized Hopper form, printed in Gluon (FlashAttention-3).

Triton's pipeliner waits for both products of an attention right after issuing them, so one
warpgroup runs Q·Kᵀ, the softmax and P·V in series and the tensor cores idle during the softmax
(head dim 128: 0.84× PyTorch's SDPA, ``docs/results/h100-gluon-attention-2026-11-24.md``).
Gluon, Triton's lower-level language, states the schedule itself.  The kernel printed here:

* **persistent**: a program per SM walks tiles of 128 query rows of one (batch, head), the
  longest causal rows first; in each, two **consumer warpgroups** take 64 rows each and one
  **loading warp** brings the two Q halves, then K and V blocks, by TMA into a ring of ``NB``
  shared-memory slots (``empty``/``ready`` mbarriers per slot and operand, Q's own pair), so the
  next tile's loads overlap the current tile's last products;
* each consumer issues Q·Kⱼᵀ and the previous block's P·Vⱼ₋₁ together as asynchronous
  ``wgmma``, computes block j's softmax while P·Vⱼ₋₁ runs, and rescales the output after
  (FlashAttention-3's in-warpgroup overlap);
* the two consumers issue their products in turns (**ping-pong**, two mbarriers), so one's
  softmax runs while the other's products hold the tensor cores;
* Q, K and V are read through **TMA descriptors the host makes** (:class:`Descriptor`: each
  operand as one flat [rows, row length] matrix, a tile's box a (row, column) offset in it);
  descriptors made on the device cost 5 µs of 21 at head dim 128 on the H100;
* the output leaves in 16-byte pieces through shared memory (from the accumulator's layout,
  4-byte pieces, the kernel took 30% longer).

Everything the generated Triton attention expresses stays: the recognized logits ``g(s)``
(scale, additive, boolean or ``where`` masks read in place), causal block skipping with the
mask evaluated only where the diagonal crosses a block, K/V shared by groups of query heads,
sequence lengths no tile divides (TMA fills rows past the ends with zeros, the logits of keys
past the sequence are masked, rows past it are not stored), and the output epilogue, printed
by the same :class:`~tvm_stitch.codegen.elem_printer.ElemPrinter` with Gluon's names.

The form is a launch option of the attention search (``WS``, with ``BLOCK_M`` 128 and
``num_stages`` the ring's slots), measured against the Triton form on the GPU; the tuning
database carries the choice to compiles without one.  :func:`ws_legality` says when it
applies (16-bit Q/K/V that TMA reads as flat matrices, power-of-two head dims up to 128).
Gluon has no interpreter: its numerics are tested on the GPU host, its compilation to sm_90a
PTX on any machine.
"""

from __future__ import annotations

import re

from tvm_stitch.codegen.elem_printer import ElemPrinter, write_output
from tvm_stitch.codegen.kernel_text import (
    Descriptor,
    UnsupportedKernelError,
    extra_views,
    gluon_line,
    gluon_version,
    hoisted,
    plus,
    pointer_args,
    pow2,
)
from tvm_stitch.families.attention.cost import WS_ROWS  # query rows: two warpgroups of 64
from tvm_stitch.families.attention.recognize import visible_logits
from tvm_stitch.families.attention.triton import (
    attention_tma,
    empty_rows_denominator,
    scaled_logits,
    softmax_exp2,
)

#: widest head tile: a consumer holds a 64×n float32 score tile and a 64×d output tile in
#: registers (240 per thread)
WS_MAX_HEAD = 128
#: registers per thread: the launch's limit, the consumers' and the loading warp's after
#: ``setmaxnreg`` (3 warpgroups: 2 × 240 + 24 ≤ 65536 / 128)
WS_MAXNREG, WS_CONSUMER_REGS, WS_LOAD_REGS = 168, 240, 24
#: ``(BLOCK_N, ring slots)`` the search measures (head dim 128 on the H100: 128 × 2 takes
#: 160 KB of shared memory for Q and the ring, plus 32 KB to store the output from)
WS_TILES = ((128, 2), (64, 3), (64, 4))


def _flat_rows(view, step: int) -> int:
    """Rows of ``view``'s buffer read as a matrix of rows of ``step`` elements (after its
    offset)."""
    return (view.numel - view.offset) // step


def _unflattened(match) -> str | None:
    """Why one of Q, K, V cannot be read as boxes of a flat [rows, row length] matrix, or None.

    The host makes the descriptors once per launch, so they cannot depend on the (batch, head)
    of a tile: each operand's rows (query or key positions) must be rows of one
    matrix whose row length is the row stride, every head's head-dim slice inside one such row,
    and the box exactly the head dim (a power of two, nothing of a neighbour read into it)."""
    ext = match.frame.extents
    batch, heads = ext.get("b", 1), ext.get("h", 1)
    for role, rows_axis, inner, n_heads in (("q", "m", "k", heads),
                                             ("k", "n", "k", heads // match.group),
                                             ("v", "n", "d", heads // match.group)):
        view = match.views[role]
        width = ext[inner]
        if width != pow2(width):
            return f"{role}'s head dim {width} is not a power of two of at least 16"
        step = view.stride.get(rows_axis, 0)
        sb, sh = view.stride.get("b", 0), view.stride.get("h", 0)
        last_row = _flat_rows(view, step) - 1 if step > 0 else -1
        for b in range(batch):
            for h in range(n_heads):
                start = b * sb + h * sh
                if start % step + width > step:
                    return f"{role}'s head slice crosses a row of its flat matrix"
                if start // step + ext[rows_axis] - 1 > last_row:
                    return f"{role}'s rows run past its buffer"
    return None


def ws_descriptors(match) -> list[Descriptor]:
    """The kernel's Q, K and V descriptors (arguments ``q_desc``, ``k_desc``, ``v_desc``)."""
    out = []
    for role, box in (("q", (64, "BLOCK_K")), ("k", ("BLOCK_N", "BLOCK_K")),
                      ("v", ("BLOCK_N", "BLOCK_H"))):
        view = match.views[role]
        step = view.stride["m" if role == "q" else "n"]
        out.append(Descriptor(f"{role}_desc", view.tensor, view.dtype, view.offset,
                              _flat_rows(view, step), step, step, box))
    return out


def ws_legality(match) -> str | None:
    """Why the warp-specialized Gluon form cannot compute ``match``, or None when it can.

    Q, K and V are 16-bit floats TMA can read (:func:`~.triton.attention_tma`), and both
    head tiles are at most :data:`WS_MAX_HEAD` elements."""
    if match.family != "attention":
        return "not an attention"
    why = gluon_version()
    if why:
        return why
    dtypes = {match.views[r].dtype for r in ("q", "k", "v")}
    if not dtypes <= {"float16", "bfloat16"} or len(dtypes) != 1:
        return f"Q, K, V hold {sorted(dtypes)}, not one 16-bit float type"
    ext = match.frame.extents
    if max(pow2(ext["k"]), pow2(ext["d"])) > WS_MAX_HEAD:
        return f"a head dimension above {WS_MAX_HEAD} (registers of two warpgroups)"
    return attention_tma(match, host=True) or _unflattened(match)


_HEADER = '''"""Generated by tvm_stitch.families.attention.gluon: {describe}"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait,
)

# TMA's load (renamed async_load after Triton 3.6): the text stays the same across versions
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.constexpr_function
def _acc_layout(n):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, n, 16])


@gluon.constexpr_function
def _row_layout(n):
    return gl.BlockedLayout([1, 8], [32 // min(32, n // 8), min(32, n // 8)], [4, 1], [1, 0])


@gluon.constexpr_function
def _smem_layout(rows, cols):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.{dtype})


@gluon.jit
def _sigmoid(x):
    return 1.0 / (1.0 + gl.exp(-x))


@gluon.jit
def _load(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, BLOCK_N: gl.constexpr,
          NB: gl.constexpr):
    # the loading warp, over the program's tiles: a tile's two Q halves once the consumers are
    # done with the last tile's, then K and V block by block into the ring; a slot is refilled
    # once both consumers have arrived on its 'empty' barrier
    q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    g = 0
    i = 0
    for t in range(gl.program_id(0), {tiles}, gl.num_programs(0)):
        b, h, hk, pid_m, first, n_blocks = _tile(t, BLOCK_N)
        q_row, q_col, k_row, k_col, v_row, v_col = _coords(b, h, hk, pid_m)
        mbarrier.wait(q_empty, (i & 1) ^ 1)
        mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
        _tma_load(q_desc, [q_row, q_col], q_bar, q_smem.index(0))
        _tma_load(q_desc, [q_row + 64, q_col], q_bar, q_smem.index(1))
        for j in range(n_blocks):
            slot = g % NB
            phase = (g // NB) & 1
            mbarrier.wait(k_empty.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [k_row + (first + j) * BLOCK_N, k_col], k_ready.index(slot),
                      k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [v_row + (first + j) * BLOCK_N, v_col], v_ready.index(slot),
                      v_smem.index(slot))
            g += 1
        i += 1
'''

_CONSUMER = '''

@gluon.jit
def _tile(t, BLOCK_N: gl.constexpr):
    # tile t: (batch, head, K/V head, query block, first key block it reads, blocks it reads)
{tile}


@gluon.jit
def _coords(b, h, hk, pid_m):
    # a tile's Q, K and V boxes as (row, column) of the flat descriptors
{coords}


@gluon.jit
def _logit_inputs(rm, n0, cols, b, h, {ptrs}):
    # what the logits read besides the products (masks): issued before the products, so
    # their latency is the products', not the softmax's
    rn = n0 + cols
{inputs}
    return {input_names}


@gluon.jit
def _softmax(s, inputs, m_i, l_i, rm, m0, n0, b, h, {ptrs}, BLOCK_N: gl.constexpr):
    {input_names} = inputs
{logits}
    m_new = gl.maximum(m_i, gl.max(z, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    p = gl.exp2({exp2_z})
    alpha = gl.exp2({exp2_m})
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _consume(q_smem, k_smem, v_smem, bars, {ptrs}, C: gl.constexpr, BLOCK_N: gl.constexpr,
             BLOCK_H: gl.constexpr, NB: gl.constexpr):
    # one consumer warpgroup: 64 query rows (half C) of each of the program's tiles
    q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    S_L: gl.constexpr = _acc_layout(BLOCK_N)
    O_L: gl.constexpr = _acc_layout(BLOCK_H)
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    q = q_smem.index(C)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    s_zero = gl.zeros([64, BLOCK_N], gl.float32, S_L)
    g = 0  # key blocks consumed (ring slots and phases)
    u = 0  # turns taken (ping-pong phases)
    i = 0
    for t in range(gl.program_id(0), {tiles}, gl.num_programs(0)):
        b, h, hk, pid_m, first, n_blocks = _tile(t, BLOCK_N)
        m0 = pid_m * 128 + C * 64
        rm = m0 + gl.arange(0, 64, layout=gl.SliceLayout(1, S_L))
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))

        # block 0: Q·K₀ᵀ and its softmax; its P·V₀ goes out with Q·K₁ᵀ
        mbarrier.wait(q_bar, i & 1)
        mbarrier.wait(turn.index(C), (u & 1) ^ C ^ 1)
        slot = g % NB
        mbarrier.wait(k_ready.index(slot), (g // NB) & 1)
        inputs = _logit_inputs(rm, first * BLOCK_N, cols, b, h, {ptrs})
        s = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                          is_async=True)
        mbarrier.arrive(turn.index(1 - C), count=1)
        u += 1
        s = warpgroup_mma_wait(0, deps=(s, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        p, m_i, l_i, alpha = _softmax(s, inputs, m_i, l_i, rm, m0, first * BLOCK_N, b, h, {ptrs},
                                      BLOCK_N)
        p_prev = gl.convert_layout(p.to(gl.{dtype}), P_L)
        acc = gl.zeros([64, BLOCK_H], gl.float32, O_L)

        for j in range(1, n_blocks):
            slot = (g + j) % NB
            prev = (g + j - 1) % NB
            # this warpgroup's turn to issue: Q·Kⱼᵀ and P·Vⱼ₋₁, then the other's
            mbarrier.wait(turn.index(C), (u & 1) ^ C ^ 1)
            mbarrier.wait(k_ready.index(slot), ((g + j) // NB) & 1)
            inputs = _logit_inputs(rm, (first + j) * BLOCK_N, cols, b, h, {ptrs})
            s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_ready.index(prev), ((g + j - 1) // NB) & 1)
            o_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
            mbarrier.arrive(turn.index(1 - C), count=1)
            u += 1
            s = warpgroup_mma_wait(1, deps=(s_tok, ))
            mbarrier.arrive(k_empty.index(slot), count=1)
            # block j's softmax while P·Vⱼ₋₁ runs
            p, m_i, l_i, alpha = _softmax(s, inputs, m_i, l_i, rm, m0, (first + j) * BLOCK_N, b, h,
                                          {ptrs},
                                          BLOCK_N)
            acc = warpgroup_mma_wait(0, deps=(o_tok, ))
            mbarrier.arrive(v_empty.index(prev), count=1)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, O_L)), 1)
            p_prev = gl.convert_layout(p.to(gl.{dtype}), P_L)

        mbarrier.arrive(q_empty, count=1)  # the tile's Q is read: the next one may come in
        last = (g + n_blocks - 1) % NB
        mbarrier.wait(v_ready.index(last), ((g + n_blocks - 1) // NB) & 1)
        o_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(v_empty.index(last), count=1)
        g += n_blocks
        i += 1
        o = acc / gl.expand_dims(gl.convert_layout({den}, gl.SliceLayout(1, O_L)), 1)
        # stored in 16-byte pieces, rows whole per warp (through shared memory): straight from
        # the accumulator's layout, 4-byte pieces, the kernel takes 30% longer (H100, d128)
        ST_L: gl.constexpr = _row_layout(BLOCK_H)
        o = gl.convert_layout(o, ST_L)
        rm = m0 + gl.arange(0, 64, layout=gl.SliceLayout(1, ST_L))
        rh = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(0, ST_L))
{store}


@gluon.jit
def _consume1(q_smem, k_smem, v_smem, bars, {ptrs}, BLOCK_N: gl.constexpr,
              BLOCK_H: gl.constexpr, NB: gl.constexpr):
    _consume(q_smem, k_smem, v_smem, bars, {ptrs}, 1, BLOCK_N, BLOCK_H, NB)


@gluon.jit
def {name}({ptrs}, q_desc, k_desc, v_desc, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
           BLOCK_K: gl.constexpr, BLOCK_H: gl.constexpr, NB: gl.constexpr,
           NUM_SMS: gl.constexpr):
    # persistent: program p takes tiles p, p + programs, ...; Q, K and V come as TMA
    # descriptors of flat [rows, row length] matrices made on the host (ws_descriptors):
    # every tile's box is a (row, column) offset in them, rows past the end read as zeros
    gl.static_assert(BLOCK_M == 128, "two consumer warpgroups of 64 rows")
    gl.static_assert(gl.num_warps() == 4, "the default partition is one consumer warpgroup")
    q_smem = gl.allocate_shared_memory(gl.{dtype}, [2, 64, BLOCK_K], _smem_layout(64, BLOCK_K))
    k_smem = gl.allocate_shared_memory(gl.{dtype}, [NB, BLOCK_N, BLOCK_K],
                                       _smem_layout(BLOCK_N, BLOCK_K))
    v_smem = gl.allocate_shared_memory(gl.{dtype}, [NB, BLOCK_N, BLOCK_H],
                                       _smem_layout(BLOCK_N, BLOCK_H))
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    k_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    k_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    v_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    v_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(NB):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    bars = (q_bar, q_empty, k_ready, k_empty, v_ready, v_empty, turn)
    gl.warp_specialize([
        (_consume, (q_smem, k_smem, v_smem, bars, {ptrs}, 0, BLOCK_N, BLOCK_H, NB)),
        (_consume1, (q_smem, k_smem, v_smem, bars, {ptrs}, BLOCK_N, BLOCK_H, NB)),
        (_load, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, BLOCK_N, NB)),
    ], [4, 1], [{consumer_regs}, {load_regs}])
'''


def _indent(lines, depth=1) -> str:
    return "\n".join("    " * depth + gluon_line(x) for x in lines)


def attention_ws_source(match, name: str) -> str:
    """The Gluon module text of ``match``'s warp-specialized attention kernel ``name``.

    Its arguments are the Triton form's pointers (inputs ``I0..``, outputs ``O0..``), the
    descriptors of :func:`ws_descriptors`, and the
    constexprs ``BLOCK_M`` (128), ``BLOCK_N``, ``BLOCK_K``, ``BLOCK_H`` (the padded head dims)
    and ``NB`` (ring slots); it launches with 4 warps and ``maxnreg`` :data:`WS_MAXNREG`.
    """
    why = ws_legality(match)
    if why:
        raise UnsupportedKernelError(why)
    pointers, inputs, outputs = pointer_args(match)
    ptrs = ", ".join([f"I{i}" for i in range(len(inputs))] + [f"O{i}" for i in range(len(outputs))])
    ext = match.frame.extents
    m, n, dh = ext["m"], ext["n"], ext["d"]
    heads = ext.get("h", 1)
    q, kv, vv = (match.views[r] for r in ("q", "k", "v"))
    dtype = q.dtype
    extras = extra_views(match)
    rows_bound = m % WS_ROWS != 0
    keys_bound = n % WS_ROWS != 0  # key tiles (64 or 128) divide 128

    # the logits of one (64 × BLOCK_N) block: z = g(s) · log2(e) / c (scaled_logits)
    masks = {}
    if rows_bound:
        masks["m"] = f"(rm < {m})[:, None]"
    if keys_bound:
        masks["n"] = f"(rn < {n})[None, :]"
    tiles = {"b": "b", "h": "h", "m": "rm[:, None]", "n": "rn[None, :]"}

    visible = visible_logits(match)
    # log2(e) joins the logits' scale, which comes out of the row maxima (one FMA a logit
    # where bounded; else exp2((z − max)·log2 e))
    (score, *rest), scale, fused = scaled_logits(
        match.score, *([visible] if visible else []), product=match.score_tensor)
    visible = rest[0] if rest else None
    exp2_z, exp2_m = softmax_exp2(scale, fused)

    def logits(score, prefix="g"):
        # temporaries of the two branches of a causal block test are named apart: Triton
        # unifies a name both branches assign, and only ``z`` is both branches' result
        printer = ElemPrinter(tiles, masks, pointers, extras,
                              {match.score_tensor: ("s", "float32")}, prefix=prefix)
        z = printer.expr(score)
        if keys_bound:
            z = f"gl.where((rn < {n})[None, :], {z}, float('-inf'))"
        # the products rounded to 16 bits (a model computing its logits in float16) through an
        # add: ptxas serializes every wgmma of a kernel that converts an accumulator
        # register straight to f16x2 (C7514); s + 0.0 is s but for the sign of a zero
        lines = [re.sub(r"\bs\.to\(", "(s + 0.0).to(", x) for x in printer.lines]
        return hoisted([*lines, f"z = {z}"])

    pre, body = logits(score)
    if visible is not None:
        # keys past the diagonal of some row of the block: the mask; else the logits without it
        pre_v, body_v = logits(visible, "v")
        pre += pre_v
        edges = [*([f"n0 + BLOCK_N - 1 > m0 + {match.causal}"] if match.causal is not None
                   else []),
                 *([f"n0 < m0{plus(63 + match.window)}"] if match.window is not None
                   else [])]
        body = [f"if {' or '.join(edges)}:", *["    " + x for x in body],
                "else:", *["    " + x for x in body_v]]
    input_names = ", ".join(["rn", *(line.split(" = ", 1)[0] for line in pre)])
    logits_text = _indent(body)

    out_tiles = {"b": "b", "h": "h", "m": "rm[:, None]", "d": "rh[None, :]"}
    out_masks = {}
    if rows_bound:
        out_masks["m"] = f"(rm < {m})[:, None]"
    if dh != pow2(dh):
        out_masks["d"] = f"(rh < {dh})[None, :]"
    store_lines = write_output(match, pointers, out_tiles, out_masks, "o")

    tiles_m = -(-m // WS_ROWS)
    if match.runtime:  # counted at call time from the query count (an argument)
        tiles_m = f"(({m} + {WS_ROWS - 1}) // {WS_ROWS})"
    pairs = ext.get("b", 1) * heads  # (batch, head) pairs
    # the tiles a program walks: a module constant, or counted in the partitions at run time
    tiles = f"({ext.get('b', 1)} * {heads} * {tiles_m})" if match.runtime else "TILES"
    first = "0"
    if match.causal is not None:
        # tiles cost their key blocks, so the longest rows go first, and key blocks past the
        # block's last row's diagonal are skipped; see :func:`causal_order`
        last = f"{tiles_m} - 1" if match.runtime else tiles_m - 1
        order = causal_order(pairs, tiles)
        pid_m = f"{last} - i // {pairs}"
        blocks = (f"gl.cdiv(gl.maximum(gl.minimum({n}, (pid_m + 1) * 128 + {match.causal}), 1), "
                  "BLOCK_N)")
    else:
        order = [f"bh = t // {tiles_m}"]
        pid_m, blocks = f"t % {tiles_m}", f"gl.cdiv({n}, BLOCK_N)"
    if match.window is not None:  # and the blocks before the block's first row's window
        first = f"gl.maximum(pid_m * 128{plus(match.window)}, 0) // BLOCK_N"
        blocks = f"{blocks} - first"
    tile = [*order, f"b = bh // {heads}", f"h = bh % {heads}",
            f"hk = h // {match.group}" if match.group > 1 else "hk = h",
            f"pid_m = {pid_m}", f"first = {first}", f"return b, h, hk, pid_m, first, {blocks}"]
    coords = []
    for role, view, head, rows in (("q", q, "h", "pid_m * 128"), ("k", kv, "hk", "0"),
                                   ("v", vv, "hk", "0")):
        step = view.stride["m" if role == "q" else "n"]
        sb, sh = view.stride.get("b", 0), view.stride.get("h", 0)
        start = f"(b * {sb} + {head} * {sh})"
        coords += [f"{role}_row = {start} // {step} + {rows}", f"{role}_col = {start} % {step}"]
    coords.append("return q_row, q_col, k_row, k_col, v_row, v_col")
    header = _HEADER.format(describe=match.describe(outputs=True), dtype=dtype, tiles=tiles)
    if not match.runtime:
        header += f"TILES = gl.constexpr({tiles_m * pairs})\n"
    return header + _CONSUMER.format(
        name=name, ptrs=ptrs, dtype=dtype, logits=logits_text,
        exp2_z=exp2_z.format(m="gl.expand_dims(m_safe, 1)"), exp2_m=exp2_m,
        store=_indent(store_lines, 2), den=empty_rows_denominator(match, "gl"),
        inputs=_indent(pre) if pre else "    pass", input_names=input_names,
        tile=_indent(tile), coords=_indent(coords),
        consumer_regs=WS_CONSUMER_REGS, load_regs=WS_LOAD_REGS, tiles=tiles,
    )


def causal_order(heads: int, tiles: str) -> list[str]:
    """Lines mapping a persistent program's tile counter ``t`` to ``i``, the tile's place in
    order of cost, and ``bh``, its (batch, head): causal tiles cost their key blocks.

    Tiles go by query block, the last (longest) first, the ``heads`` (batch, head) pairs of a
    block side by side, so a group's query heads run together and read their K/V from L2.
    Programs take them in turns, and every other full round in reverse (a snake), so each
    program's sum of costs is near the mean.  Head-major order with the rounds in one
    direction left the slowest program 20 % above the mean at 32 heads × 4 blocks of 2048
    tokens on 132 SMs, this order 3 %."""
    return ["nprog = gl.num_programs(0)", "r = t // nprog", "i = t",
            f"if r % 2 == 1 and (r + 1) * nprog <= {tiles}:",
            "    i = r * nprog + nprog - 1 - t % nprog", f"bh = i % {heads}"]


ws_source = attention_ws_source  # the family's warp-specialized form (:mod:`tvm_stitch.families`)


def ws_launch_options(config: dict) -> dict:
    """Triton's compile options of the warp-specialized attention: 4 warps per partition and
    the register limit they divide (the ring's slots are its constexpr ``NB``)."""
    return {"num_warps": 4, "maxnreg": WS_MAXNREG}
