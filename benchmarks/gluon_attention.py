"""Study: a Hopper attention kernel in Gluon with FlashAttention-3's intra-warpgroup overlap.

    python -m tvm_stitch.benchmarks.gluon_attention [--dim 128] [--causal] [--baseline]  # GPU host
    PYTHONPATH=<triton 3.6> python -m tvm_stitch.benchmarks.gluon_attention --compile-only  # here

Gluon is experimental and its API moves between releases: this is written against Triton 3.6,
the GPU host's (Triton 3.9 renamed ``async_copy_global_to_shared``); ``--compile-only`` compiles
every variant to sm_90a PTX on a machine without a GPU, given that Triton
(``pip install --target DIR triton==3.6.0``).

Triton's pipeliner waits for an attention's products right after issuing them (its asynchronous
``wgmma`` rule only covers loop-carried accumulators), so each warpgroup runs Q·Kᵀ, the softmax
and P·V in series.  Gluon issues ``wgmma`` asynchronously under the kernel's control: here the
product Q·Kⱼᵀ and the previous block's P·Vⱼ₋₁ are in flight together, and the softmax of block j
runs while P·Vⱼ₋₁ is still on the tensor cores (FlashAttention-3, Algorithm 2).  K and V arrive
by ``cp.async`` into a ring of ``NB`` swizzled shared-memory slots, ``NB - 2`` blocks ahead.

A persistent form (``attention_fwd_persistent``: each program runs its tiles' key blocks as one
sequence, the next tile's Q, K₀, V₀ loading during the current tile's last block) is timed too.

For deciding whether the generated attention should take this form (issue 10: head dim 128 at
0.83× SDPA with Triton's pipeline), not a benchmark of the pipeline (``tvm-stitch bench zoo``).
Findings: ``benchmarks/results/h100-gluon-attention-2026-11-24.md``.
"""

from __future__ import annotations

import argparse

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from tvm_stitch.errors import error_line

LOG2E = 1.4426950408889634

#: (BLOCK_M, BLOCK_N, ring slots, warps)
VARIANTS = [(64, 64, 3, 4), (64, 32, 3, 4), (128, 64, 3, 8)]
#: persistent, non-causal: (BLOCK_M, BLOCK_N, warps, programs per SM)
PERSISTENT = [(64, 64, 4, 2), (128, 64, 8, 1)]


@gluon.constexpr_function
def _load_layout(d, num_warps):
    """16-byte vectors along the head dimension, rows across the rest of the warp."""
    tpw_d = min(32, d // 8)
    return gl.BlockedLayout([1, 8], [32 // tpw_d, tpw_d], [num_warps, 1], [1, 0])


@gluon.constexpr_function
def _mma_layout(n, num_warps):
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                     instr_shape=[16, n, 16])


@gluon.constexpr_function
def _smem_layout(rows, cols):
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.float16)


@gluon.jit
def _load_block(k_ptrs, v_ptrs, k_smem, v_smem, j, n_blocks,
                s_kn, s_vn, BN: gl.constexpr, NB: gl.constexpr):
    # one commit group per block index, empty past the last block (uniform group counting)
    if j < n_blocks:
        async_copy.async_copy_global_to_shared(k_smem.index(j % NB), k_ptrs + j * BN * s_kn)
        async_copy.async_copy_global_to_shared(v_smem.index(j % NB), v_ptrs + j * BN * s_vn)
    async_copy.commit_group()


@gluon.jit
def _masked(s, m0, n0, m_rows, n_cols, CAUSAL: gl.constexpr):
    """The products with the causal mask applied where the diagonal crosses the block; the
    scale is applied by the caller as one FMA with the running maximum (scale > 0)."""
    if CAUSAL:
        if n0 + n_cols.shape[0] - 1 > m0:
            keep = gl.expand_dims(m0 + m_rows, 1) >= gl.expand_dims(n0 + n_cols, 0)
            s = gl.where(keep, s, float("-inf"))
    return s


@gluon.jit
def attention_fwd(Q, K, V, O, qk_scale, H, N_CTX,
                  s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ob, s_oh, s_om,
                  BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NB: gl.constexpr,
                  CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    gl.static_assert(NB >= 3, "block j+NB-2 is loaded while block j-1's V is still read")
    ld: gl.constexpr = _load_layout(D, num_warps)
    s_l: gl.constexpr = _mma_layout(BN, num_warps)
    o_l: gl.constexpr = _mma_layout(D, num_warps)
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)

    pid_m = gl.program_id(0)
    pid = gl.program_id(1)
    b = pid // H
    h = pid % H
    m0 = pid_m * BM

    q_smem = gl.allocate_shared_memory(gl.float16, [BM, D], _smem_layout(BM, D))
    k_smem = gl.allocate_shared_memory(gl.float16, [NB, BN, D], _smem_layout(BN, D))
    v_smem = gl.allocate_shared_memory(gl.float16, [NB, BN, D], _smem_layout(BN, D))

    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    keys = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    q_ptrs = Q + b * s_qb + h * s_qh + gl.expand_dims(m0 + rows, 1) * s_qm + gl.expand_dims(cols, 0)
    k_ptrs = K + b * s_kb + h * s_kh + gl.expand_dims(keys, 1) * s_kn + gl.expand_dims(cols, 0)
    v_ptrs = V + b * s_vb + h * s_vh + gl.expand_dims(keys, 1) * s_vn + gl.expand_dims(cols, 0)

    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(N_CTX, m0 + BM), BN)
    else:
        n_blocks = gl.cdiv(N_CTX, BN)
    async_copy.async_copy_global_to_shared(q_smem, q_ptrs)  # joins block 0's group
    for i in gl.static_range(NB - 1):
        _load_block(k_ptrs, v_ptrs, k_smem, v_smem, i, n_blocks, s_kn, s_vn, BN, NB)

    m_rows = gl.arange(0, BM, layout=gl.SliceLayout(1, s_l))
    n_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
    s_zero = gl.zeros([BM, BN], gl.float32, s_l)

    # block 0: Q·K₀ᵀ and its softmax; its P·V₀ goes out with Q·K₁ᵀ
    async_copy.wait_group(NB - 2)
    fence_async_shared()
    gl.thread_barrier()
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    s = _masked(s, m0, 0, m_rows, n_cols, CAUSAL)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_prev = gl.convert_layout(p.to(gl.float16), p_l)
    acc = gl.zeros([BM, D], gl.float32, o_l)

    for j in range(1, n_blocks):
        # block j is in; block j-2's slot is free (its P·V was waited for last iteration)
        async_copy.wait_group(NB - 3)
        fence_async_shared()
        gl.thread_barrier()
        _load_block(k_ptrs, v_ptrs, k_smem, v_smem, j + NB - 2, n_blocks, s_kn, s_vn, BN, NB)
        s_tok = warpgroup_mma(q_smem, k_smem.index(j % NB).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p_prev, v_smem.index((j - 1) % NB), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        # the softmax of block j while P·Vⱼ₋₁ runs
        s = _masked(s, m0, j * BN, m_rows, n_cols, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
        p_prev = gl.convert_layout(p.to(gl.float16), p_l)

    o_tok = warpgroup_mma(p_prev, v_smem.index((n_blocks - 1) % NB), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok, ))
    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_l)), 1)
    o = gl.convert_layout(o.to(gl.float16), ld)
    o_ptrs = O + b * s_ob + h * s_oh + gl.expand_dims(m0 + rows, 1) * s_om + gl.expand_dims(cols, 0)
    gl.store(o_ptrs, o)


@gluon.jit
def _tile_base(tile, MB: gl.constexpr, H, BM: gl.constexpr, s_b, s_h, s_m):
    """Offset of a tile's first row: tiles run over query blocks first, then heads."""
    bh = tile // MB
    return (bh // H) * s_b + (bh % H) * s_h + (tile % MB) * BM * s_m


@gluon.jit
def _load_persistent(Q, K, V, q_smem, k_smem, v_smem, g, total, pid, G, H,
                     q_off, k_off, v_off, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
                     MB: gl.constexpr, NBLK: gl.constexpr, BM: gl.constexpr,
                     BN: gl.constexpr):
    # block g of this program's sequence (tile g // NBLK, key block g % NBLK); a tile's first
    # block brings its Q into the other Q slot.  One commit group per block.
    tile = pid + (g // NBLK) * G
    j = g % NBLK
    bh = tile // MB
    b = bh // H
    h = bh % H
    q_ptrs = Q + _tile_base(tile, MB, H, BM, s_qb, s_qh, s_qm) + q_off
    if (g < total) & (j == 0):
        async_copy.async_copy_global_to_shared(q_smem.index((g // NBLK) % 2), q_ptrs)
    if g < total:
        async_copy.async_copy_global_to_shared(
            k_smem.index(g % 2), K + b * s_kb + h * s_kh + j * BN * s_kn + k_off)
        async_copy.async_copy_global_to_shared(
            v_smem.index(g % 3), V + b * s_vb + h * s_vh + j * BN * s_vn + v_off)
    async_copy.commit_group()


@gluon.jit
def _store_tile(O, acc, l_i, tile, o_off, H, s_ob, s_oh, s_om, MB: gl.constexpr,
                BM: gl.constexpr, o_l: gl.constexpr, ld: gl.constexpr):
    # stored from the accumulator's own layout: a layout conversion would need shared memory
    # beside the rings (a second program per SM would no longer fit)
    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_l)), 1)
    gl.store(O + _tile_base(tile, MB, H, BM, s_ob, s_oh, s_om) + o_off, o.to(gl.float16))


@gluon.jit
def attention_fwd_persistent(Q, K, V, O, qk_scale, H, N_CTX,
                             s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn,
                             s_ob, s_oh, s_om, T,
                             BM: gl.constexpr, BN: gl.constexpr, D: gl.constexpr,
                             MB: gl.constexpr, NBLK: gl.constexpr, num_warps: gl.constexpr):
    """Non-causal attention, persistent: program ``pid`` takes tiles pid, pid + G, ... and runs
    their key blocks as one sequence, so the next tile's Q, K₀ and V₀ load during the current
    tile's last block and its output is stored while the next tile's first product runs.
    Rings: Q 2 slots, K 2, V 3 (V is read one iteration after K)."""
    ld: gl.constexpr = _load_layout(D, num_warps)
    s_l: gl.constexpr = _mma_layout(BN, num_warps)
    o_l: gl.constexpr = _mma_layout(D, num_warps)
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    pid = gl.program_id(0)
    G = gl.num_programs(0)
    total = gl.cdiv(T - pid, G) * NBLK

    q_smem = gl.allocate_shared_memory(gl.float16, [2, BM, D], _smem_layout(BM, D))
    k_smem = gl.allocate_shared_memory(gl.float16, [2, BN, D], _smem_layout(BN, D))
    v_smem = gl.allocate_shared_memory(gl.float16, [3, BN, D], _smem_layout(BN, D))
    rows = gl.arange(0, BM, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    keys = gl.arange(0, BN, layout=gl.SliceLayout(1, ld))
    q_off = gl.expand_dims(rows, 1) * s_qm + gl.expand_dims(cols, 0)
    o_rows = gl.arange(0, BM, layout=gl.SliceLayout(1, o_l))
    o_cols = gl.arange(0, D, layout=gl.SliceLayout(0, o_l))
    o_off = gl.expand_dims(o_rows, 1) * s_om + gl.expand_dims(o_cols, 0)
    k_off = gl.expand_dims(keys, 1) * s_kn + gl.expand_dims(cols, 0)
    v_off = gl.expand_dims(keys, 1) * s_vn + gl.expand_dims(cols, 0)
    s_zero = gl.zeros([BM, BN], gl.float32, s_l)

    _load_persistent(Q, K, V, q_smem, k_smem, v_smem, 0, total, pid, G, H, q_off, k_off, v_off,
                     s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, MB, NBLK, BM, BN)
    async_copy.wait_group(0)
    fence_async_shared()
    gl.thread_barrier()
    _load_persistent(Q, K, V, q_smem, k_smem, v_smem, 1, total, pid, G, H, q_off, k_off, v_off,
                     s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, MB, NBLK, BM, BN)
    s = warpgroup_mma(q_smem.index(0), k_smem.index(0).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(0, deps=(s, ))
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_prev = gl.convert_layout(p.to(gl.float16), p_l)
    acc = gl.zeros([BM, D], gl.float32, o_l)

    for g in range(1, total):
        async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()
        _load_persistent(Q, K, V, q_smem, k_smem, v_smem, g + 1, total, pid, G, H, q_off,
                         k_off, v_off, s_qb, s_qh, s_qm, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, MB,
                         NBLK, BM, BN)
        first = g % NBLK == 0
        s_tok = warpgroup_mma(q_smem.index((g // NBLK) % 2), k_smem.index(g % 2).permute((1, 0)),
                              s_zero, use_acc=False, is_async=True)
        o_tok = warpgroup_mma(p_prev, v_smem.index((g - 1) % 3), acc, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        row_max = gl.max(s, 1) * qk_scale
        m_new = gl.where(first, row_max, gl.maximum(m_i, row_max))
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.where(first, 0.0, gl.exp2(m_i - m_new))
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        if first:  # the previous tile is complete
            _store_tile(O, acc, l_i, pid + (g // NBLK - 1) * G, o_off, H, s_ob, s_oh, s_om, MB,
                        BM, o_l, ld)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
        p_prev = gl.convert_layout(p.to(gl.float16), p_l)

    o_tok = warpgroup_mma(p_prev, v_smem.index((total - 1) % 3), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok, ))
    _store_tile(O, acc, l_i, pid + (total // NBLK - 1) * G, o_off, H, s_ob, s_oh, s_om, MB, BM,
                o_l, ld)



# --- warp-specialized: one loading warp, two consumer warpgroups (FlashAttention-3) ----------


@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX,
               BN: gl.constexpr, NB: gl.constexpr):
    """TMA loads: the tile's two Q halves, then K and V blocks into an ``NB``-slot ring; a
    slot is refilled once both consumers have arrived on its 'empty' barrier."""
    q_bar, k_ready, k_empty, v_ready, v_empty, _turn = bars
    HALF: gl.constexpr = q_desc.block_type.shape[0]
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, 0], q_bar, q_smem.index(0))
    tma.async_copy_global_to_shared(q_desc, [row0 + HALF, 0], q_bar, q_smem.index(1))
    kv0 = row0 - row0 % N_CTX
    for j in range(n_blocks):
        slot = j % NB
        phase = (j // NB) & 1
        mbarrier.wait(k_empty.index(slot), phase ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kv0 + j * BN, 0], k_ready.index(slot),
                                        k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase ^ 1)
        mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [kv0 + j * BN, 0], v_ready.index(slot),
                                        v_smem.index(slot))


@gluon.jit
def _ws_consumer(o_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX, qk_scale,
                 C: gl.constexpr, BN: gl.constexpr, D: gl.constexpr, NB: gl.constexpr,
                 CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup's 64 query rows (half ``C`` of the tile), FlashAttention-3's in-warpgroup
    overlap; with ``PINGPONG`` the two warpgroups issue their products in turns, so one's
    softmax runs while the other's products occupy the tensor cores."""
    q_bar, k_ready, k_empty, v_ready, v_empty, turn = bars
    HALF: gl.constexpr = 64
    s_l: gl.constexpr = _mma_layout(BN, 4)
    o_l: gl.constexpr = _mma_layout(D, 4)
    p_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_l, k_width=2)
    q = q_smem.index(C)
    m0 = row0 % N_CTX + C * HALF
    m_rows = gl.arange(0, HALF, layout=gl.SliceLayout(1, s_l))
    n_cols = gl.arange(0, BN, layout=gl.SliceLayout(0, s_l))
    s_zero = gl.zeros([HALF, BN], gl.float32, s_l)

    mbarrier.wait(q_bar, 0)
    if PINGPONG:
        mbarrier.wait(turn.index(C), C ^ 1)
    mbarrier.wait(k_ready.index(0), 0)
    s = warpgroup_mma(q, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - C), count=1)
    s = warpgroup_mma_wait(0, deps=(s, ))
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _masked(s, m0, 0, m_rows, n_cols, CAUSAL)
    m_i = gl.max(s, 1) * qk_scale
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
    l_i = gl.sum(p, 1)
    p_prev = gl.convert_layout(p.to(gl.float16), p_l)
    acc = gl.zeros([HALF, D], gl.float32, o_l)

    for j in range(1, n_blocks):
        slot = j % NB
        prev = (j - 1) % NB
        if PINGPONG:
            mbarrier.wait(turn.index(C), (j & 1) ^ C ^ 1)
        mbarrier.wait(k_ready.index(slot), (j // NB) & 1)
        s_tok = warpgroup_mma(q, k_smem.index(slot).permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        mbarrier.wait(v_ready.index(prev), ((j - 1) // NB) & 1)
        o_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index(1 - C), count=1)
        s = warpgroup_mma_wait(1, deps=(s_tok, ))
        mbarrier.arrive(k_empty.index(slot), count=1)
        s = _masked(s, m0, j * BN, m_rows, n_cols, CAUSAL)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
        alpha = gl.exp2(m_i - m_new)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = warpgroup_mma_wait(0, deps=(o_tok, ))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
        p_prev = gl.convert_layout(p.to(gl.float16), p_l)

    last = (n_blocks - 1) % NB
    mbarrier.wait(v_ready.index(last), ((n_blocks - 1) // NB) & 1)
    o_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(o_tok, ))
    mbarrier.arrive(v_empty.index(last), count=1)
    o = acc / gl.expand_dims(gl.convert_layout(l_i, gl.SliceLayout(1, o_l)), 1)
    # the output leaves through this warpgroup's Q slot (Q is no longer read)
    q.store(o.to(gl.float16))
    fence_async_shared()
    tma.async_copy_shared_to_global(o_desc, [row0 + C * HALF, 0], q)
    tma.store_wait(0)


@gluon.jit
def _ws_consumer1(o_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX, qk_scale,
                  BN: gl.constexpr, D: gl.constexpr, NB: gl.constexpr, CAUSAL: gl.constexpr,
                  PINGPONG: gl.constexpr):
    _ws_consumer(o_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX, qk_scale, 1, BN,
                 D, NB, CAUSAL, PINGPONG)


@gluon.jit
def attention_fwd_ws(q_desc, k_desc, v_desc, o_desc, qk_scale, N_CTX, Qp, Kp, Vp, ROWS,
                     BN: gl.constexpr, D: gl.constexpr, NB: gl.constexpr, CAUSAL: gl.constexpr,
                     PINGPONG: gl.constexpr, LOAD_REGS: gl.constexpr,
                     CONSUMER_REGS: gl.constexpr, DEVICE_DESC: gl.constexpr,
                     num_warps: gl.constexpr):
    """Q, K, V, O as [batch·heads·seq, D] with TMA descriptors (seq a multiple of 128); a
    program takes 128 query rows: the default partition and one worker warpgroup consume 64
    rows each, a one-warp worker loads."""
    gl.static_assert(num_warps == 4, "the default partition is one consumer warpgroup")
    BM: gl.constexpr = 128
    row0 = gl.program_id(1) * N_CTX + gl.program_id(0) * BM
    if CAUSAL:
        n_blocks = gl.cdiv(gl.minimum(N_CTX, row0 % N_CTX + BM), BN)
    else:
        n_blocks = gl.cdiv(N_CTX, BN)

    if DEVICE_DESC:  # made on the device, as the pipeline's generated kernels do
        q_desc = tma.make_tensor_descriptor(Qp, [ROWS, D], [D, 1], [64, D], _smem_layout(64, D))
        k_desc = tma.make_tensor_descriptor(Kp, [ROWS, D], [D, 1], [BN, D], _smem_layout(BN, D))
        v_desc = tma.make_tensor_descriptor(Vp, [ROWS, D], [D, 1], [BN, D], _smem_layout(BN, D))
    q_smem = gl.allocate_shared_memory(gl.float16, [2, 64, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(gl.float16, [NB, BN, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(gl.float16, [NB, BN, D], v_desc.layout)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_l)
    k_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    k_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    v_ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    v_empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NB):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=2)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(v_empty.index(i), count=2)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    bars = (q_bar, k_ready, k_empty, v_ready, v_empty, turn)

    gl.warp_specialize([
        (_ws_consumer, (o_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX, qk_scale,
                        0, BN, D, NB, CAUSAL, PINGPONG)),
        (_ws_consumer1, (o_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks, N_CTX, qk_scale,
                         BN, D, NB, CAUSAL, PINGPONG)),
        (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, bars, row0, n_blocks,
                      N_CTX, BN, NB)),
    ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


#: warp-specialized: (BLOCK_N, ring slots, ping-pong, launch maxnreg, consumer regs, loader regs)
WS_VARIANTS = [(128, 2, True, 168, 240, 24), (128, 2, False, 168, 240, 24),
               (64, 4, True, 168, 240, 24), (128, 3, True, 168, 240, 24)]


def launch_persistent(q, k, v, o, bm, bn, warps, programs_per_sm=2):
    """The persistent kernel on one grid of ``programs_per_sm`` programs per SM."""
    import torch

    batch, heads, seq, d = q.shape
    tiles = seq // bm * batch * heads
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(tiles, programs_per_sm * sms),)
    return attention_fwd_persistent[grid](
        q, k, v, o, LOG2E / d ** 0.5, heads, seq, *q.stride()[:3], *k.stride()[:3],
        *v.stride()[:3], *o.stride()[:3], tiles, BM=bm, BN=bn, D=d, MB=seq // bm,
        NBLK=seq // bn, num_warps=warps)


def launch_ws(q, k, v, o, bn, nb, pingpong, maxnreg, consumer_regs, load_regs, causal,
              device_desc=False):
    """The warp-specialized kernel; contiguous [batch, heads, seq, d] tensors, seq % 128 == 0."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    batch, heads, seq, d = q.shape

    def desc(t, rows):
        return TensorDescriptor.from_tensor(t.view(-1, d), [rows, d], _smem_layout(rows, d))

    grid = (seq // 128, batch * heads)
    return attention_fwd_ws[grid](
        desc(q, 64), desc(k, bn), desc(v, bn), desc(o, 64), LOG2E / d ** 0.5, seq, q, k, v,
        batch * heads * seq, BN=bn, D=d, NB=nb, CAUSAL=causal, PINGPONG=pingpong,
        LOAD_REGS=load_regs, CONSUMER_REGS=consumer_regs, DEVICE_DESC=device_desc, num_warps=4,
        maxnreg=maxnreg)


def launch(q, k, v, o, bm, bn, nb, warps, causal):
    """``o = softmax(q·kᵀ/√d)·v`` for contiguous [batch, heads, seq, d] float16 tensors."""
    batch, heads, seq, d = q.shape
    scale = LOG2E / d ** 0.5
    grid = (seq // bm, batch * heads)
    return attention_fwd[grid](q, k, v, o, scale, heads, seq,
                        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *o.stride()[:3],
                        BM=bm, BN=bn, D=d, NB=nb, CAUSAL=causal, num_warps=warps)


def _compile(fn, consts: dict, scalars: tuple, descs: dict | None = None, options=None):
    """``fn`` compiled to sm_90a with ``consts``: pointers and strides taken 16-byte aligned (as
    Triton's launcher specializes them on the GPU), ``scalars`` not; ``descs`` maps tensor
    descriptor parameters to their block shapes."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = {}
    descs = descs or {}
    for name in fn.arg_names:
        if name in descs:
            rows, cols = descs[name]
            sig[name] = f"tensordesc<fp16[{rows},{cols}],{_smem_layout(rows, cols)!r}>"
        elif name in consts:
            sig[name] = "constexpr"
        elif name in ("Q", "K", "V", "O"):
            sig[name] = "*fp16"
        else:
            sig[name] = "fp32" if name == "qk_scale" else "i32"
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if sig[name] not in ("constexpr",) and name not in scalars and name not in descs}
    return triton_compile(GluonASTSource(fn, sig, consts, attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": consts["num_warps"], **(options or {})})


def compile_only(dim: int, causal: bool) -> None:
    """Compile every variant to sm_90a PTX on this machine (no GPU) and print its resources."""
    for bm, bn, nb, warps in VARIANTS:
        consts = dict(BM=bm, BN=bn, D=dim, NB=nb, CAUSAL=causal, num_warps=warps)
        k = _compile(attention_fwd, consts, ("qk_scale", "H", "N_CTX"))
        ptx = k.asm["ptx"]
        print(f"{bm}x{bn} NB={nb} warps={warps}: smem {k.metadata.shared} B, "
              f"wgmma {ptx.count('wgmma.mma_async')}, cp.async {ptx.count('cp.async.cg')}, "
              f"wait_group {ptx.count('wgmma.wait_group')}, st.shared {ptx.count('st.shared')}, "
              f"bar.sync {ptx.count('bar.sync')}, ex2 {ptx.count('ex2.approx')}")
    for bn, nb, pingpong, maxnreg, consumer_regs, load_regs in WS_VARIANTS:
        consts = dict(BN=bn, D=dim, NB=nb, CAUSAL=causal, PINGPONG=pingpong, LOAD_REGS=load_regs,
                      CONSUMER_REGS=consumer_regs, DEVICE_DESC=False, num_warps=4)
        descs = dict(q_desc=(64, dim), k_desc=(bn, dim), v_desc=(bn, dim), o_desc=(64, dim))
        k = _compile(attention_fwd_ws, consts, ("qk_scale", "N_CTX", "ROWS"), descs,
                     {"maxnreg": maxnreg})
        ptx = k.asm["ptx"]
        print(f"warp-specialized BN={bn} NB={nb} pingpong={pingpong}: smem {k.metadata.shared} B, "
              f"wgmma {ptx.count('wgmma.mma_async')}, setmaxnreg {ptx.count('setmaxnreg')}, "
              f"tma {ptx.count('cp.async.bulk.tensor')}, mbarrier waits "
              f"{ptx.count('mbarrier.try_wait')}")
    if causal:
        return
    for bm, bn, warps, _per_sm in PERSISTENT:
        consts = dict(BM=bm, BN=bn, D=dim, MB=512 // bm, NBLK=512 // bn, num_warps=warps)
        k = _compile(attention_fwd_persistent, consts, ("qk_scale", "H", "N_CTX", "T"))
        print(f"persistent {bm}x{bn} warps={warps}: smem {k.metadata.shared} B")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--ws-only", action="store_true",
                        help="time only the warp-specialized variants")
    parser.add_argument("--baseline", action="store_true",
                        help="also time the stitch pipeline's Triton kernel (64x64, 4 warps)")
    args = parser.parse_args(argv)
    if args.compile_only:
        compile_only(args.dim, args.causal)
        return 0
    import torch
    import torch.nn.functional as F
    import triton

    shape = (4, 16, 512, args.dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
    sdpa = triton.testing.do_bench_cudagraph(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)) * 1e3
    print(f"attention 4x16x512 d{args.dim}{' causal' if args.causal else ''}: SDPA {sdpa:.1f} us")
    if args.baseline:
        import os
        import tempfile

        from tvm_stitch.benchmarks import attention_variants as av

        path = os.path.join(tempfile.mkdtemp(), "attn_stitch.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(av.kernel_source(args.dim, args.causal))
        r = av._child(path, (64, 64, 4, 3, False, False), args.dim, args.causal)
        print(f"  stitch's Triton kernel (64x64, 4 warps, 3 stages): {r['us']:6.1f} us  SDPA/ours "
              f"{r['sdpa_us'] / r['us']:5.2f} (SDPA {r['sdpa_us']:.1f} in its run)  max err "
              f"{r['err']:.1e}")
    def report(label, run):
        o = torch.empty_like(q)
        try:
            kernel = run(o)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - a variant that does not compile is reported
            print(f"  {label}: failed: {error_line(e)[:120]}")
            return
        err = float((o.float() - ref.float()).abs().max())
        us = triton.testing.do_bench_cudagraph(lambda: run(o)) * 1e3
        print(f"  {label}: {us:6.1f} us  SDPA/ours {sdpa / us:5.2f}  max err {err:.1e}  "
              f"registers {getattr(kernel, 'n_regs', '?')}, spills "
              f"{getattr(kernel, 'n_spills', '?')}")

    for bm, bn, nb, warps in [] if args.ws_only else VARIANTS:
        report(f"BM {bm:>3} BN {bn:>3} NB {nb} warps {warps}",
               lambda o, c=(bm, bn, nb, warps): launch(q, k, v, o, *c, args.causal))
    import torch as _torch

    triton.set_allocator(lambda size, align, stream: _torch.empty(size, dtype=_torch.int8,
                                                                  device="cuda"))
    for bn, nb, pingpong, maxnreg, cregs, lregs in WS_VARIANTS[:1]:
        report(f"warp-specialized BN {bn:>3} NB {nb}, descriptors made on the device",
               lambda o, c=(bn, nb, pingpong, maxnreg, cregs, lregs): launch_ws(
                   q, k, v, o, *c, args.causal, device_desc=True))
    for bn, nb, pingpong, maxnreg, cregs, lregs in WS_VARIANTS:
        report(f"warp-specialized BN {bn:>3} NB {nb} pingpong {pingpong} regs {cregs}/{lregs}",
               lambda o, c=(bn, nb, pingpong, maxnreg, cregs, lregs): launch_ws(
                   q, k, v, o, *c, args.causal))
    if not args.causal and not args.ws_only:
        for bm, bn, warps, per_sm in PERSISTENT:
            report(f"persistent BM {bm:>3} BN {bn:>3} warps {warps}, {per_sm} per SM",
                   lambda o, c=(bm, bn, warps, per_sm): launch_persistent(q, k, v, o, *c))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
