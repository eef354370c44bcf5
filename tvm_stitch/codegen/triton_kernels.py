"""Triton kernels for MCFuser candidates: GEMM chains, attention, GEMM with fused epilogues.

Each kernel is one template whose ``tl.constexpr`` parameters realise a candidate of the
search space (``tvm_stitch.explore.tiling``): the grid binds the output's spatial loops, the
``n`` loop runs inside a block, and when the ``k`` loop has a single trip (``BLOCK_K >= K``) the
first operand's tile is loaded once per block, before the ``n`` loop — the extent-1 hoisting of
MCFuser §III-B.  Candidates a template cannot express are refused by :func:`chain_legality`.

Kernels are plain functions wrapped with ``triton.jit`` on first use (the device function they
share, ``_tile_product``, is jitted at import).  With ``TRITON_INTERPRET=1``
in the environment *when Triton is imported*, they run on the CPU with torch tensors (CI checks
their numerics that way, in a subprocess); otherwise they compile for the GPU, and
:func:`compile_ptx` compiles them ahead of time without one.
"""

from __future__ import annotations

import functools
import os

# Triton 3.9 warns that its default floating-point fusion will change; keep today's behaviour
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton
import triton.language as tl

GELU_NONE, GELU_ERF, GELU_TANH = 0, 1, 2


@triton.jit
def _erf_abs(x):
    """``erf(x)`` of float32 ``x`` to 1.1e-7 absolute error (up to 2.3e-7 with the GPU's
    ``ex2.approx``, two units at 1): ``±(1 − 2**R(|x|))`` with ``R`` a degree-8 polynomial
    fitting ``log2(erfc)`` on [0, 3.92] (weighted least squares, no constant term: exact at 0)
    — one ``ex2`` and eight FMAs, branch-free, about half of libdevice's ``erff``, whose two
    branches a warp of mixed signs and sizes runs both of. Values near 0 keep their absolute,
    not relative, accuracy: for sums such as GELU's ``1 + erf``
    (:func:`tvm_stitch.analysis.elem.offset_erf`). NaN stays NaN."""
    t = tl.minimum(tl.abs(x), 3.92, propagate_nan=tl.PropagateNan.ALL)
    p = -4.535461630e-05 * t + 4.454722512e-04
    p = p * t - 1.489320071e-03
    p = p * t - 7.748364005e-04
    p = p * t + 2.825386636e-02
    p = p * t - 1.484816968e-01
    p = p * t - 9.184163809e-01
    p = p * t - 1.627908587e00
    r = 1.0 - tl.exp2(p * t)
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


def interpreting() -> bool:
    """Whether ``triton.jit`` makes interpreted functions (``TRITON_INTERPRET``, read as Triton
    reads it), which run no inline PTX."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


if interpreting():
    @triton.jit
    def _cvt_f16x2(x):
        return x.to(tl.float16)

    @triton.jit
    def _cvt_bf16x2(x):
        return x.to(tl.bfloat16)
else:
    @triton.jit
    def _cvt_f16x2(x):
        """float32 ``x`` rounded to float16 (to nearest, even), two values an instruction
        (``cvt.rn.f16x2.f32``): Triton 3.6 rounds a float32 tile one value at a time and
        ptxas joins the halves with a ``PRMT`` each — 3 instructions a pair where this is 1
        (an attention's float16 logits, every key block). Exactly ``x.to(tl.float16)``."""
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.float16, is_pure=True, pack=2)

    @triton.jit
    def _cvt_bf16x2(x):
        """:func:`_cvt_f16x2` for bfloat16 (``cvt.rn.bf16x2.f32``, sm_80 and newer)."""
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _tile_product(
    acc,
    A,
    B,
    rm,
    rn,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    OPERAND: tl.constexpr = None,
    K_LO=0,
    K_HI=None,
):
    """``acc + A[rm, K_LO:K_HI] @ B[K_LO:K_HI, rn]``, the reduction over ``K`` (default: all
    of it) in steps of ``BLOCK_K`` (masked at ``K``).  Shared by the GEMM-chain and GEMM
    templates; inlined by Triton.  ``OPERAND``: the type both tiles are converted to before the
    product (an operand stored in another precision, e.g. a float32 activation of a float16
    matrix product).  ``K_LO``/``K_HI``: one split of a split-K product (``K_LO`` a multiple
    of ``BLOCK_K``)."""
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(K_LO, K if K_HI is None else K_HI, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            A + rm[:, None] * s_am + kk[None, :] * s_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            B + kk[:, None] * s_bk + rn[None, :] * s_bn,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if OPERAND is not None:
            a = a.to(OPERAND)
            b = b.to(OPERAND)
        acc += tl.dot(a, b, input_precision=DOT_PREC)
    return acc


@triton.jit
def _tile_product2(
    acc0,
    acc1,
    A,
    B0,
    B1,
    rm,
    rn,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_b0k,
    s_b0n,
    s_b1k,
    s_b1n,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    OPERAND: tl.constexpr = None,
    K_LO=0,
    K_HI=None,
):
    """``(acc0 + A @ B0, acc1 + A @ B1)`` over the same rows and columns, each ``A`` tile loaded
    once for both products (a gate and an up projection); ``OPERAND``, ``K_LO`` and ``K_HI``
    as for _tile_product."""
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(K_LO, K if K_HI is None else K_HI, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            A + rm[:, None] * s_am + kk[None, :] * s_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        mask_b = (kk[:, None] < K) & (rn[None, :] < N)
        b0 = tl.load(B0 + kk[:, None] * s_b0k + rn[None, :] * s_b0n, mask=mask_b, other=0.0)
        b1 = tl.load(B1 + kk[:, None] * s_b1k + rn[None, :] * s_b1n, mask=mask_b, other=0.0)
        if OPERAND is not None:
            a = a.to(OPERAND)
            b0 = b0.to(OPERAND)
            b1 = b1.to(OPERAND)
        acc0 += tl.dot(a, b0, input_precision=DOT_PREC)
        acc1 += tl.dot(a, b1, input_precision=DOT_PREC)
    return acc0, acc1


@triton.jit
def _tile_product_tma(
    acc,
    a_desc,
    b_desc,
    off_m,
    off_n,
    K,
    BLOCK_K: tl.constexpr,
    B_NK: tl.constexpr,
    OPERAND: tl.constexpr = None,
    DOT_PREC: tl.constexpr = None,
):
    """``acc + A[off_m:+BM, :K] @ B[:K, off_n:+BN]`` with both tiles brought in by TMA (tensor
    descriptors; out-of-bounds elements read as zero, so no masks).  ``B_NK``: B's descriptor
    is over (N, K) (a Linear weight) and its tiles are transposed in the product, else over
    (K, N).  ``OPERAND`` as for :func:`_tile_product`; ``DOT_PREC``: float32 products'
    precision (``ieee``: as PyTorch multiplies them)."""
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if B_NK:
            b = b_desc.load([off_n, k0]).T
        else:
            b = b_desc.load([k0, off_n])
        if OPERAND is not None:
            a = a.to(OPERAND)
            b = b.to(OPERAND)
        if DOT_PREC is None:  # Triton's default (a string default fails in Triton 3.6)
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def _split_arrive(counter, SPLIT_K: tl.constexpr):
    """Count one split of a split-K tile in: True for the last of its ``SPLIT_K`` splits to
    arrive, which also sets the counter back to zero for the next launch.  The barrier puts
    every thread's partial-tile stores before the count, whose release (gpu scope) publishes
    them to the last split; its acquire and the broadcast of the count order that split's
    reads after them (CUTLASS's semaphore protocol)."""
    tl.debug_barrier()
    last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    if last:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def _split_sum(ws, stride, rw, SPLIT_K: tl.constexpr):
    """The sum of a tile's ``SPLIT_K`` float32 partials (``ws + j * stride + rw``), in split
    order whatever order they arrived in: a split-K product is deterministic.  Read from L2
    (``.cg``): other SMs wrote them."""
    acc = tl.load(ws + rw, cache_modifier=".cg")
    for j in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws + j * stride + rw, cache_modifier=".cg")
    return acc


@triton.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Row and column tile of output tile number ``tile``: consecutive tiles walk ``GROUP_M``
    row tiles of one column band, so the B tiles they share are still in L2."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


def _gemm_chain(
    A,
    B,
    D,
    E,
    M,
    N,
    K,
    H,
    s_ab,
    s_am,
    s_ak,
    s_bb,
    s_bk,
    s_bn,
    s_db,
    s_dn,
    s_dh,
    s_eb,
    s_em,
    s_eh,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HOIST_A: tl.constexpr,
    DOT_PREC: tl.constexpr = "tf32",
):
    """``E[b] = (A[b] @ B[b]) @ D[b]``; grid = (m tiles, h tiles, batch)."""
    pid_m, pid_h, bid = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rk = tl.arange(0, BLOCK_K)
    A += bid * s_ab
    B += bid * s_bb
    D += bid * s_db
    E += bid * s_eb
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    if HOIST_A:  # the k loop has one trip: A's tile is loaded once, outside the n loop
        a_tile = tl.load(
            A + rm[:, None] * s_am + rk[None, :] * s_ak,
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        c = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if HOIST_A:
            b = tl.load(
                B + rk[:, None] * s_bk + rn[None, :] * s_bn,
                mask=(rk[:, None] < K) & (rn[None, :] < N),
                other=0.0,
            )
            c += tl.dot(a_tile, b, input_precision=DOT_PREC)
        else:
            c = _tile_product(c, A, B, rm, rn, M, N, K, s_am, s_ak, s_bk, s_bn, BLOCK_K, DOT_PREC)
        d = tl.load(
            D + rn[:, None] * s_dn + rh[None, :] * s_dh,
            mask=(rn[:, None] < N) & (rh[None, :] < H),
            other=0.0,
        )
        acc += tl.dot(
            c.to(d.dtype), d, input_precision=DOT_PREC
        )  # C is rounded to the input dtype, as bmm -> bmm does
    tl.store(
        E + rm[:, None] * s_em + rh[None, :] * s_eh,
        acc.to(E.dtype.element_ty),
        mask=(rm[:, None] < M) & (rh[None, :] < H),
    )


def _gemm_epilogue(
    A,
    B,
    C,
    Bias,
    Res,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    s_cm,
    s_cn,
    s_rm,
    s_rn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GELU: tl.constexpr,
    HAS_RES: tl.constexpr,
    GROUP_M: tl.constexpr,
    DOT_PREC: tl.constexpr = "tf32",
    PERSISTENT: tl.constexpr = False,
    NUM_SMS: tl.constexpr = 1,
):
    """``C = act(A @ B + bias) + residual`` with fp32 accumulation.

    The grid is one-dimensional (m tiles · n tiles, grouped by :func:`_tile_of`).  With
    ``PERSISTENT`` it is ``NUM_SMS`` programs that walk the tiles, loading through TMA
    (:func:`_tile_product_tma`; A and B must be contiguous along K), the software pipeline
    running across tiles.
    """
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    if PERSISTENT:
        a_desc = tl.make_tensor_descriptor(A, [M, K], [s_am, 1], [BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(B, [N, K], [s_bn, 1], [BLOCK_N, BLOCK_K])
        done = tl.program_id(0) - NUM_SMS
        for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True):
            pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc = _tile_product_tma(
                acc, a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_K, True,
                DOT_PREC=DOT_PREC,
            )
            done += NUM_SMS  # the epilogue's own counter keeps it apart from the prologue
            pid_m, pid_n = _tile_of(done, tiles_m, tiles_n, GROUP_M)
            _epilogue(acc, C, Bias, Res, pid_m, pid_n, M, N, s_cm, s_cn, s_rm, s_rn, BLOCK_M,
                      BLOCK_N, HAS_BIAS, GELU, HAS_RES)
    else:
        pid_m, pid_n = _tile_of(tl.program_id(0), tiles_m, tiles_n, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tile_product(acc, A, B, rm, rn, M, N, K, s_am, s_ak, s_bk, s_bn, BLOCK_K,
                            DOT_PREC)
        _epilogue(acc, C, Bias, Res, pid_m, pid_n, M, N, s_cm, s_cn, s_rm, s_rn, BLOCK_M,
                  BLOCK_N, HAS_BIAS, GELU, HAS_RES)


@triton.jit
def _epilogue(acc, C, Bias, Res, pid_m, pid_n, M, N, s_cm, s_cn, s_rm, s_rn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_BIAS: tl.constexpr,
              GELU: tl.constexpr, HAS_RES: tl.constexpr):
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(Bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if GELU == 1:  # erf form (the sum needs erf's absolute accuracy only)
        acc = 0.5 * acc * (1.0 + _erf_abs(acc * 0.7071067811865476))
    if GELU == 2:  # tanh form; tanh(u) = 2 sigmoid(2u) - 1
        u = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
        acc = 0.5 * acc * (1.0 + (2.0 * tl.sigmoid(2.0 * u) - 1.0))
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_RES:
        acc += tl.load(Res + rm[:, None] * s_rm + rn[None, :] * s_rn, mask=out_mask, other=0.0).to(
            tl.float32
        )
    tl.store(C + rm[:, None] * s_cm + rn[None, :] * s_cn, acc.to(C.dtype.element_ty), mask=out_mask)


def _attention(
    Q,
    Kt,
    V,
    O,
    Mask,
    M,
    N,
    DK,
    DH,
    HEADS,
    s_qb,
    s_qg,
    s_qm,
    s_qk,
    s_kb,
    s_kg,
    s_kn,
    s_kk,
    s_vb,
    s_vg,
    s_vn,
    s_vh,
    s_ob,
    s_og,
    s_om,
    s_oh,
    s_xb,
    s_xg,
    s_xm,
    s_xn,
    scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HAS_MASK: tl.constexpr,
    DOT_PREC: tl.constexpr = "tf32",
):
    """``O[b, g] = softmax(Q[b, g] @ K[b, g]^T * scale + mask[b, g]) @ V[b, g]``, online softmax.

    The whole head dimension is one tile (``BLOCK_K >= DK``): Q's tile is loaded once per block,
    hoisted out of the n loop; grid = (m tiles, batch · HEADS).  Every tensor has its own batch
    and head strides, so (batch, seq, heads, dim) layouts are read and written in place.
    """
    pid_m, pid = tl.program_id(0), tl.program_id(1)
    b, g = pid // HEADS, pid % HEADS
    Q += b * s_qb + g * s_qg
    Kt += b * s_kb + g * s_kg
    V += b * s_vb + g * s_vg
    O += b * s_ob + g * s_og
    Mask += b * s_xb + g * s_xg
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    rh = tl.arange(0, BLOCK_H)
    q = tl.load(
        Q + rm[:, None] * s_qm + rk[None, :] * s_qk,
        mask=(rm[:, None] < M) & (rk[None, :] < DK),
        other=0.0,
    )
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for n0 in range(0, N, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        k = tl.load(
            Kt + rk[:, None] * s_kk + rn[None, :] * s_kn,
            mask=(rk[:, None] < DK) & (rn[None, :] < N),
            other=0.0,
        )
        s = tl.dot(q, k, input_precision=DOT_PREC) * scale
        if HAS_MASK:
            s += tl.load(
                Mask + rm[:, None] * s_xm + rn[None, :] * s_xn,
                mask=(rm[:, None] < M) & (rn[None, :] < N),
                other=0.0,
            ).to(tl.float32)
        s = tl.where(rn[None, :] < N, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        v = tl.load(
            V + rn[:, None] * s_vn + rh[None, :] * s_vh,
            mask=(rn[:, None] < N) & (rh[None, :] < DH),
            other=0.0,
        )
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PREC)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(
        O + rm[:, None] * s_om + rh[None, :] * s_oh,
        out.to(O.dtype.element_ty),
        mask=(rm[:, None] < M) & (rh[None, :] < DH),
    )


#: the hand-written templates, by family (the names of ``tvm_stitch.config.FAMILIES``)
_SOURCES = {"chain": _gemm_chain, "gemm": _gemm_epilogue, "attention": _attention}


@functools.cache
def kernel(name: str):
    """The Triton kernel ``name`` (interpreted when ``TRITON_INTERPRET=1``)."""
    return triton.jit(_SOURCES[name])


# -- legality: which candidates the templates express ----------------------------------------------
def powers_of_two(cand) -> str | None:
    """Why ``cand``'s tiles cannot be Triton blocks (``tl.arange`` needs powers of two), or None."""
    odd = {x: t for x, t in cand.tile_dict.items() if t & (t - 1)}
    if odd:
        return f"tile sizes {odd} are not powers of two (Triton's tl.arange needs them)"
    return None


#: rows of one Hopper warpgroup's matrix instruction (wgmma): a GEMM tile of fewer rows leaves
#: the warpgroup's instruction unusable (Triton falls back to Ampere's mma)
WARPGROUP_ROWS = 64


#: the widest row or column tile of a GEMM: a 256x256 float32 accumulator already fills all of
#: 8 warps' registers (generated kernels also rely on it to leave out bounds checks)
GEMM_MAX_TILE = 256


def gemm_legality(spec, cand, accumulators: int = 1) -> str | None:
    """Why the GEMM template cannot run ``cand`` well enough to be worth measuring, or None.

    Tiles are powers of two of at most :data:`GEMM_MAX_TILE`, and a row tile holds at least a
    warpgroup's 64 rows when M has that many.  With two ``accumulators`` (a gate and an up
    projection) a program holds at most 128×64 outputs (the registers of one 128×128 tile).
    """
    reason = powers_of_two(cand)
    if reason:
        return reason
    big = max(cand.tile_dict["m"], cand.tile_dict["n"])
    if big > GEMM_MAX_TILE:
        return f"a {big}-wide tile: its accumulators spill registers"
    tiles = cand.tile_dict["m"] * cand.tile_dict["n"]
    if accumulators > 1 and tiles > 128 * 128 // accumulators:
        return f"{accumulators} accumulators of {tiles} elements spill registers"
    if spec.extents["m"] >= WARPGROUP_ROWS and cand.tile_dict["m"] < WARPGROUP_ROWS:
        return f"row tile {cand.tile_dict['m']}: a warpgroup's wgmma takes {WARPGROUP_ROWS} rows"
    return None


def num_warps(block_m: int, block_n: int) -> int:
    """Warps per program: 8 for tiles of 128x128 elements or more, else 4."""
    return 8 if block_m * block_n >= 128 * 128 else 4


def gemm_config(cand) -> dict:
    """Template parameters of the GEMM template for a single-product candidate."""
    t = cand.tile_dict
    return {"BLOCK_M": t["m"], "BLOCK_N": t["n"], "BLOCK_K": t["k"]}


#: the largest query or key tile of an attention kernel: beyond it the score and accumulator
#: tiles spill registers (generated kernels also rely on it to leave out bounds checks)
ATTENTION_MAX_TILE = 128


def attention_legality(spec, cand) -> str | None:
    """Why the attention template cannot run ``cand``, or None when it can.

    The template keeps the whole head dimension in one tile (``k`` and ``h`` have one trip; the
    launcher pads them to powers of two), and its ``m`` and ``n`` tiles must be powers of two of
    at most :data:`ATTENTION_MAX_TILE`.
    """
    from tvm_stitch.explore.tiling import trip_counts

    trips = trip_counts(spec, cand.tile_dict)
    if trips["k"] > 1 or trips["h"] > 1:
        return "attention keeps the whole head dimension in one tile"
    odd = {x: cand.tile_dict[x] for x in "mn" if cand.tile_dict[x] & (cand.tile_dict[x] - 1)}
    if odd:
        return f"m and n tiles {odd} are not powers of two"
    big = {x: cand.tile_dict[x] for x in "mn" if cand.tile_dict[x] > ATTENTION_MAX_TILE}
    return f"m and n tiles {big} exceed {ATTENTION_MAX_TILE} (registers)" if big else None


def attention_config(cand) -> dict:
    """Template parameters of the attention template (the head tiles come from the shapes)."""
    return {"BLOCK_M": cand.tile_dict["m"], "BLOCK_N": cand.tile_dict["n"]}


#: splits of k a split-K GEMM may use (``SPLIT_K``: programs per output tile)
SPLITS = (1, 2, 4, 8)


def precision(dtype) -> dict:
    """The templates' ``DOT_PREC``: float32 products stay IEEE float32 (Triton's default is
    TF32, ~1e-3 relative error); other dtypes keep the default."""
    return {"DOT_PREC": "ieee"} if "32" in str(dtype) else {}


def chain_legality(spec, cand) -> str | None:
    """Why the GEMM-chain template cannot run ``cand``, or None when it can.

    The template binds ``m`` (and ``h`` when it has several tiles) to the grid and runs ``n``
    around ``k`` inside a block.  It cannot keep accumulators for several ``h`` tiles across the
    ``n`` loop (Triton has no arrays of tiles), nor reduce over ``k`` outside ``n``, and its
    tiles must be powers of two.
    """
    from tvm_stitch.explore.tiling import trip_counts

    trips = trip_counts(spec, cand.tile_dict)
    expr = cand.expr
    reason = powers_of_two(cand)
    if reason:
        return reason
    if trips["h"] > 1 and "n" in expr.path("h")[:-1]:
        return f"{expr}: h has {trips['h']} tiles inside the n loop (needs several accumulators)"
    if trips["k"] > 1 and "k" in expr.path("n")[:-1]:
        return f"{expr}: the k reduction encloses n"
    return None


def chain_config(spec, cand) -> dict:
    """Template parameters realising a legal candidate."""
    from tvm_stitch.explore.tiling import trip_counts

    tiles = cand.tile_dict
    return {
        "BLOCK_M": tiles["m"],
        "BLOCK_N": tiles["n"],
        "BLOCK_K": tiles["k"],
        "BLOCK_H": tiles["h"],
        "HOIST_A": trip_counts(spec, tiles)["k"] == 1,
    }


# -- launchers (torch tensors: CPU ones under TRITON_INTERPRET=1) ----------------------------------
def run_gemm_chain(a, b, d, config: dict, **launch):
    """``(a @ b) @ d`` for 3-D tensors (batch, rows, cols) with one template instance."""
    import torch

    batch, m, k = a.shape
    n, h = b.shape[2], d.shape[2]
    e = torch.empty((batch, m, h), dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(h, config["BLOCK_H"]), batch)
    kernel("chain")[grid](
        a,
        b,
        d,
        e,
        m,
        n,
        k,
        h,
        *a.stride(),
        *b.stride(),
        *d.stride(),
        *e.stride(),
        **config,
        **{**precision(a.dtype), **launch},
    )
    return e


def run_gemm_epilogue(a, w, bias=None, residual=None, gelu=GELU_NONE, config=None, **launch):
    """``act(a @ w.T + bias) + residual`` for ``a`` (M, K) and a Linear weight ``w`` (N, K)."""
    import torch

    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, **(config or {})}
    if "PERSISTENT" in launch:  # the search passes it with the launch options
        cfg["PERSISTENT"] = launch.pop("PERSISTENT")
    m, k = a.shape
    n = w.shape[0]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    res = residual if residual is not None else c
    grid = (triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    if cfg.get("PERSISTENT"):
        rows = (a.stride(0) * a.element_size(), w.stride(0) * w.element_size())
        if a.stride(1) != 1 or w.stride(1) != 1 or any(r % 16 for r in rows):
            raise ValueError(
                "the persistent GEMM reads A and B through TMA: K contiguous, rows a multiple "
                "of 16 bytes"
            )
        _tma_allocator()
        if a.is_cuda:
            sms = torch.cuda.get_device_properties(a.device).multi_processor_count
            cfg.setdefault("NUM_SMS", sms)
        grid = (min(cfg.setdefault("NUM_SMS", 132), grid[0]),)
    kernel("gemm")[grid](
        a,
        w,
        c,
        bias if bias is not None else c,
        res,
        m,
        n,
        k,
        a.stride(0),
        a.stride(1),
        w.stride(1),
        w.stride(0),
        c.stride(0),
        c.stride(1),
        res.stride(0),
        res.stride(1),
        HAS_BIAS=bias is not None,
        GELU=gelu,
        HAS_RES=residual is not None,
        **cfg,
        **{**precision(a.dtype), **launch},
    )
    return c


def _tma_allocator():
    """Give Triton the scratch memory its on-device TMA descriptors need (torch tensors)."""
    import torch

    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )


def run_attention(q, k, v, mask=None, scale=None, config=None, out=None, **launch):
    """``softmax(q @ k^T * scale + mask) @ v`` per (batch[, head]).

    ``q`` is (B, M, K) or (B, G, M, K), ``k`` (…, N, K), ``v`` (…, N, H), any strides (a
    ``(batch, seq, heads, dim)`` tensor permuted to ``(batch, heads, seq, dim)`` is read in place).
    ``mask`` is additive and broadcastable to (…, M, N).  ``out`` (…, M, H), any strides, receives
    the result when given.
    """
    import torch

    four = q.dim() == 4
    if not four:
        q, k, v = q[:, None], k[:, None], v[:, None]
        out = out[:, None] if out is not None else None
        mask = mask[:, None] if mask is not None else None
    batch, heads, m, dk = q.shape
    n, dh = k.shape[2], v.shape[3]
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, **(config or {})}
    cfg["BLOCK_K"] = max(16, triton.next_power_of_2(dk))
    cfg["BLOCK_H"] = max(16, triton.next_power_of_2(dh))
    o = (
        out
        if out is not None
        else torch.empty((batch, heads, m, dh), dtype=q.dtype, device=q.device)
    )
    if mask is not None:
        mask = mask.expand(batch, heads, m, n)
        mask_strides = mask.stride()
    else:
        mask, mask_strides = o, (0, 0, 0, 0)
    grid = (triton.cdiv(m, cfg["BLOCK_M"]), batch * heads)
    kernel("attention")[grid](
        q,
        k,
        v,
        o,
        mask,
        m,
        n,
        dk,
        dh,
        heads,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *o.stride(),
        *mask_strides,
        float(scale if scale is not None else dk**-0.5),
        HAS_MASK=mask is not o,
        **cfg,
        **{**precision(q.dtype), **launch},
    )
    return o if four else o[:, 0]


def compile_ptx(
    name: str, signature: dict, constexprs: dict, arch: int = 90, options: dict | None = None
) -> str:
    """Compile kernel ``name`` ahead of time for ``sm_<arch>`` (no GPU needed); return its PTX.

    Parameters
    ----------
    signature : dict
        Argument name to Triton type (``"*fp16"``, ``"i32"``, ``"fp32"``) for every non-constexpr
        argument.
    constexprs : dict
        Values of the ``tl.constexpr`` arguments.
    options : dict, optional
        Triton compile options (``num_warps``, ``num_stages``, ...).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel(name)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = {**defaults, "DOT_PREC": "tf32", **constexprs}
    src = ASTSource(
        fn, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs
    )
    target = GPUTarget("cuda", arch, 32)
    return triton.compile(src, target=target, options=options or {}).asm["ptx"]
