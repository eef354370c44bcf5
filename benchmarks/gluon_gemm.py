"""A warp-specialized Hopper GEMM in Gluon with BERT's epilogues, against cuBLAS: a study.

    python -m tvm_stitch.benchmarks.gluon_gemm [--compile-only] [--quick] [--plain]
        [--sched pingpong coop coop3 coope] [--cases qkv out ffn1 ffn2]

``C = epilogue(A · Wᵀ)``, fp16, fp32 accumulation, W stored (N, K) as nn.Linear keeps it.
Triton's pipeliner issues a tile's epilogue after its last product in the same warps, so the
tensor cores idle while a GELU or a residual is computed and stored (BERT's FFN1 GEMM with its
erf GELU: 48.7 µs against 35.2 µs with a bias only, ``h100-hopper-gemm-2026-11-23.md``).  The
kernel here is persistent, with one **loading warp** bringing A and W tiles by TMA into a ring
of ``NB`` shared-memory slots and two **consumer warpgroups**, in one of two schedules:

- ``pingpong``: each consumer takes every other tile of the program (BM × BN each, the whole
  accumulator in one warpgroup), so one's epilogue runs while the other's products hold the
  tensor cores (CUTLASS's ``KernelTmaWarpSpecializedPingpong``);
- ``coop``: both take the same tile, 64 rows each (CUTLASS's cooperative schedule): wider
  tiles, the epilogue not overlapped;
- ``coop3``: three consumers of 64 rows on a 192-row tile (cuBLAS's 192 × 128: a 4096 × 768
  output in one wave of 132 tiles). The product alone (``--plain``) at 0.95–1.08× cuBLAS on an
  H200 (2026-11-26): the form :mod:`tvm_stitch.codegen.gluon_gemm` generates;
- ``coope`` / ``coope8``: ``coop``'s two consumers hand each product (16-bit) to an epilogue
  warpgroup of 4 or 8 warps through shared memory and go on with the next tile; the
  epilogue partition adds the bias (16-bit, as the generated epilogue does), the GELU, the
  residual, and stores by TMA (FFN1 with its GELU: ``coope8`` 36.5 µs against ``coop3``'s
  48.2 in one run, ``coope`` 39.1 against ``coop``'s 48.1 in another; H100, 2026-11-26): the
  generated form's launch option ``EW``.

The GELU's erf is the generated epilogue's (one ``ex2`` and eight FMAs); with libdevice's
``erf`` (before 2026-11-26) FFN1 took 60.9 µs in ``coop3``.

Output through shared memory and a TMA store (``store tma``) or from the accumulator's
registers with pointers (``store ptr``, what a generated epilogue writing any index map needs).
Epilogues as BERT has them: Q/K/V bias, FFN1 bias + erf GELU, out-projection and FFN2 bias +
residual.  Baselines from the same run: ``torch.matmul`` (cuBLAS, no epilogue), ``F.linear``
with the bias, and the eager epilogue after it (two kernels, as torch.compile leaves a GEMM with
a GELU or a residual: cuBLAS plus one fused elementwise kernel).
"""

from __future__ import annotations

import argparse
import itertools

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from tvm_stitch.codegen.gluon_attention import smem_layout
from tvm_stitch.errors import error_line

SHAPES = {  # (M, N, K, epilogue): 0 none, 1 bias, 2 bias + GELU, 3 bias + residual
    "qkv": (4096, 2304, 768, 1),
    "out": (4096, 768, 768, 3),
    "ffn1": (4096, 3072, 768, 2),
    "ffn2": (4096, 768, 3072, 3),
}

#: (schedule, BM, BN, BK, NB): BM is a consumer's rows in ``pingpong``, the tile's (two
#: consumers of BM/2) in ``coop``
CONFIGS = [
    ("pingpong", 128, 128, 64, 4),
    ("pingpong", 128, 128, 64, 3),
    ("pingpong", 64, 256, 64, 4),
    ("pingpong", 128, 64, 64, 6),
    ("coop", 128, 256, 64, 3),
    ("coop", 128, 128, 64, 5),
    ("pingpong", 64, 128, 64, 6),
    # deeper rings, no room left for the output's staging tiles (pointer stores only)
    ("pingpong", 128, 128, 64, 6),
    ("pingpong", 64, 256, 64, 5),
    ("coop", 128, 256, 64, 4),
    # three consumer warpgroups of 64 rows on one 192-row tile (cuBLAS's nvjet 192 x 128
    # form): 4096 rows are 22 row tiles, 768 columns 6 of 128 -- 132 tiles, one wave
    ("coop3", 192, 128, 64, 4),
    ("coop3", 192, 128, 64, 5),
    ("coop3", 192, 128, 128, 2),
    # two consumers of 64 rows and an epilogue warpgroup taking their 16-bit products from
    # shared memory (the consumers go on with the next tile's products meanwhile)
    ("coope", 128, 128, 64, 4),
    ("coope", 128, 128, 64, 3),
    ("coope", 128, 128, 64, 5),
    ("coope8", 128, 128, 64, 4),
    ("coope8", 128, 128, 64, 5),
]
MAXNREG, CONSUMER_REGS, LOAD_REGS = 168, 240, 24
#: three consumer warpgroups and the loading warp (padded to a warpgroup: 512 threads) share
#: 64 K registers: 128 each at launch, then 160 per consumer and 24 for the loader
MAXNREG3, CONSUMER_REGS3 = 128, 160
#: ``coope``: two consumers, the epilogue warpgroup and the loading warp's (512 threads)
CONSUMER_REGS_E, EPI_REGS = 176, 136


def consumers(sched: str) -> int:
    """Consumer warpgroups on one tile beyond the first (0 for ``pingpong``'s own tiles)."""
    return {"pingpong": 0, "coop": 1, "coop3": 2, "coope": 1, "coope8": 1}[sched]

# TMA's copies, renamed after Triton 3.6: the text works with either
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gluon.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: gl.constexpr):
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_m = gl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@gluon.jit
def _load(a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K, BM: gl.constexpr,
          BN: gl.constexpr, BK: gl.constexpr, NB: gl.constexpr, COOP: gl.constexpr):
    # the loading warp: every k step of the program's tiles, in order, into the ring
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    g = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, 8)
        for kk in range(k_steps):
            slot = g % NB
            mbarrier.wait(empty.index(slot), ((g // NB) & 1) ^ 1)
            mbarrier.expect(ready.index(slot),
                            (COOP + 1) * a_desc.block_type.nbytes + w_desc.block_type.nbytes)
            for half in gl.static_range(COOP + 1):
                _tma_load(
                    a_desc, [pid_m * BM + half * (BM // (COOP + 1)), kk * BK],
                    ready.index(slot), a_smem.index(slot * (COOP + 1) + half))
            _tma_load(w_desc, [pid_n * BN, kk * BK], ready.index(slot),
                                            w_smem.index(slot))
            g += 1


@gluon.jit
def _consume(a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N, K,
             CI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
             NB: gl.constexpr, COOP: gl.constexpr, STORE_TMA: gl.constexpr,
             EPI: gl.constexpr, EW: gl.constexpr, c_full, c_empty):
    ROWS: gl.constexpr = BM // (COOP + 1)
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BN, 16])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    k_steps = gl.cdiv(K, BK)
    # pingpong: this consumer's tiles are every other one of the program's; coop: all of them
    IS_COOP: gl.constexpr = COOP > 0
    first = 0 if IS_COOP else CI
    step = 1 if IS_COOP else 2
    j = first
    for t in range(gl.program_id(0) + first * gl.num_programs(0), tiles_m * tiles_n,
                   step * gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, 8)
        g = j * k_steps
        acc = gl.zeros([ROWS, BN], gl.float32, acc_l)
        if not IS_COOP:
            # pingpong: the consumers' product loops take turns (the other's epilogue runs
            # meanwhile), which also keeps each within one phase of the ring's barriers
            mbarrier.wait(turn.index(CI), ((j // 2) & 1) ^ CI ^ 1)
        for kk in range(k_steps):
            slot = (g + kk) % NB
            mbarrier.wait(ready.index(slot), ((g + kk) // NB) & 1)
            acc = warpgroup_mma(a_smem.index(slot * (COOP + 1) + CI * IS_COOP),
                                w_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            if kk > 0:
                mbarrier.arrive(empty.index((g + kk - 1) % NB), count=1)
        if not IS_COOP:
            mbarrier.arrive(turn.index(1 - CI), count=1)
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((g + k_steps - 1) % NB), count=1)
        j += step
        if EW:
            # ``coope``: the product (16-bit) to the epilogue warpgroup, which does the rest
            mbarrier.wait(c_empty.index(CI), ((j - 1) & 1) ^ 1)
            c_smem.index(CI).store(acc.to(gl.float16))
            mbarrier.arrive(c_full.index(CI), count=1)
        else:
            row0 = pid_m * BM + CI * IS_COOP * ROWS
            rm = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, acc_l))
            rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
            inside = (rm < M)[:, None] & (rn < N)[None, :]
            if EPI >= 1:
                acc = acc + gl.load(bias + rn, mask=rn < N, other=0.0).to(gl.float32)[None, :]
            if EPI == 2:
                acc = 0.5 * acc * (1.0 + _erf(acc * 0.7071067811865476))
            if EPI == 3:
                acc = acc + gl.load(res + rm[:, None] * N + rn[None, :], mask=inside,
                                    other=0.0).to(gl.float32)
            out = acc.to(gl.float16)
            if STORE_TMA:
                tma.store_wait(0)
                c_smem.index(CI).store(out)
                fence_async_shared()
                _tma_store(c_desc, [row0, pid_n * BN], c_smem.index(CI))
            else:
                gl.store(C + rm[:, None] * N + rn[None, :], out, mask=inside)
    if STORE_TMA:
        tma.store_wait(0)


@gluon.jit
def _erf(x):
    # the generated epilogue's erf (tvm_stitch.codegen.triton_kernels._erf_abs): one ex2 and
    # eight FMAs, 1.1e-7 absolute
    t = gl.minimum(gl.abs(x), 3.92)
    p = -4.535461630e-05 * t + 4.454722512e-04
    p = p * t - 1.489320071e-03
    p = p * t - 7.748364005e-04
    p = p * t + 2.825386636e-02
    p = p * t - 1.484816968e-01
    p = p * t - 9.184163809e-01
    p = p * t - 1.627908587e00
    r = 1.0 - gl.exp2(p * t)
    return gl.where(x != x, x, gl.where(x < 0, -r, r))  # noqa: PLR0124 - NaN stays NaN


@gluon.jit
def _epilogue_wg(c_smem, o_smem, c_full, c_empty, c_desc, bias, res, M, N, BM: gl.constexpr,
                 BN: gl.constexpr, EPI: gl.constexpr, EPI_WARPS: gl.constexpr):
    # ``coope``: the epilogue warpgroup -- each consumer's 16-bit product from shared memory,
    # the epilogue as the generated one computes it (16-bit sums, the erf in float32), the
    # output stored by TMA from its own staging tile (two, alternating)
    ROWS: gl.constexpr = BM // 2
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [EPI_WARPS, 1], [1, 0])
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN)
    n = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, 8)
        rn = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
        if EPI >= 1:
            b = gl.load(bias + rn, mask=rn < N, other=0.0)
        for ci in gl.static_range(2):
            mbarrier.wait(c_full.index(ci), n & 1)
            x = c_smem.index(ci).load(layout)
            mbarrier.arrive(c_empty.index(ci), count=1)
            row0 = pid_m * BM + ci * ROWS
            rm = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
            if EPI >= 1:
                x = x + b[None, :]
            if EPI == 2:
                e = _erf((x * 0.7071067811865476).to(gl.float32)).to(gl.float16)
                x = x * (0.5 + e * 0.5)
            if EPI == 3:
                x = x + gl.load(res + rm[:, None] * N + rn[None, :],
                                mask=(rm < M)[:, None] & (rn < N)[None, :], other=0.0)
            tma.store_wait(1)  # this staging tile's store, two stores ago, has left
            o_smem.index(ci).store(x)
            fence_async_shared()
            _tma_store(c_desc, [row0, pid_n * BN], o_smem.index(ci))
        n += 1
    tma.store_wait(0)


@gluon.jit
def _consume1(a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N, K,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NB: gl.constexpr,
              COOP: gl.constexpr, STORE_TMA: gl.constexpr, EPI: gl.constexpr,
              EW: gl.constexpr, c_full, c_empty):
    _consume(a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N, K, 1, BM,
             BN, BK, NB, COOP, STORE_TMA, EPI, EW, c_full, c_empty)


@gluon.jit
def _consume2(a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N, K,
              BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NB: gl.constexpr,
              COOP: gl.constexpr, STORE_TMA: gl.constexpr, EPI: gl.constexpr,
              EW: gl.constexpr, c_full, c_empty):
    _consume(a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N, K, 2, BM,
             BN, BK, NB, COOP, STORE_TMA, EPI, EW, c_full, c_empty)


@gluon.jit
def gemm_ws(a_desc, w_desc, c_desc, C, bias, res, M, N, K, BM: gl.constexpr, BN: gl.constexpr,
            BK: gl.constexpr, NB: gl.constexpr, COOP: gl.constexpr, STORE_TMA: gl.constexpr,
            EPI: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr,
            EW: gl.constexpr = 0, EPI_REGS: gl.constexpr = 0, EPI_WARPS: gl.constexpr = 4):
    ROWS: gl.constexpr = BM // (COOP + 1)
    a_smem = gl.allocate_shared_memory(gl.float16, [NB * (COOP + 1), ROWS, BK], a_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.float16, [NB, BN, BK], w_desc.layout)
    # the output's staging tiles, one per consumer (a token one without TMA stores)
    c_smem = gl.allocate_shared_memory(gl.float16, [3 if COOP == 2 else 2,
                                                    ROWS if STORE_TMA else 8, BN], c_desc.layout)
    bar_l: gl.constexpr = mbarrier.MBarrierLayout()
    ready = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    empty = gl.allocate_shared_memory(gl.int64, [NB, 1], bar_l)
    for i in gl.static_range(NB):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=COOP + 1)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    if EW:  # ``coope``: two consumers and an epilogue warpgroup
        c_full = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        c_empty = gl.allocate_shared_memory(gl.int64, [2, 1], bar_l)
        for i in gl.static_range(2):
            mbarrier.init(c_full.index(i), count=1)
            mbarrier.init(c_empty.index(i), count=1)
        o_smem = gl.allocate_shared_memory(gl.float16, [2, ROWS, BN], c_desc.layout)
        gl.warp_specialize([
            (_consume, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N,
                        K, 0, BM, BN, BK, NB, 1, 1, 0, 1, c_full, c_empty)),
            (_consume1, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M,
                         N, K, BM, BN, BK, NB, 1, 1, 0, 1, c_full, c_empty)),
            (_epilogue_wg, (c_smem, o_smem, c_full, c_empty, c_desc, bias, res, M, N, BM, BN,
                            EPI, EPI_WARPS)),
            (_load, (a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K, BM, BN, BK, NB,
                     1)),
        ], [4, EPI_WARPS, 1], [CONSUMER_REGS, EPI_REGS, LOAD_REGS])
    elif COOP == 2:  # ``coop3``: a third consumer warpgroup
        gl.warp_specialize([
            (_consume, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N,
                        K, 0, BM, BN, BK, NB, COOP, STORE_TMA, EPI, 0, turn, turn)),
            (_consume1, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M,
                         N, K, BM, BN, BK, NB, COOP, STORE_TMA, EPI, 0, turn, turn)),
            (_consume2, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M,
                         N, K, BM, BN, BK, NB, COOP, STORE_TMA, EPI, 0, turn, turn)),
            (_load, (a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K, BM, BN, BK, NB,
                     COOP)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOAD_REGS])
    else:
        gl.warp_specialize([
            (_consume, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M, N,
                        K, 0, BM, BN, BK, NB, COOP, STORE_TMA, EPI, 0, turn, turn)),
            (_consume1, (a_smem, w_smem, ready, empty, turn, c_smem, c_desc, C, bias, res, M,
                         N, K, BM, BN, BK, NB, COOP, STORE_TMA, EPI, 0, turn, turn)),
            (_load, (a_desc, w_desc, a_smem, w_smem, ready, empty, M, N, K, BM, BN, BK, NB,
                     COOP)),
        ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


def launch(a, w, c, bias, res, sched, bm, bn, bk, nb, store_tma, epi, sms):
    """``c = epilogue(a @ w.T)`` by :func:`gemm_ws` on ``min(sms, tiles)`` programs."""
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    coop = consumers(sched)
    rows = bm // (coop + 1)
    m, k = a.shape
    n = w.shape[0]
    a_desc = TensorDescriptor.from_tensor(a, [rows, bk], smem_layout(rows, bk, "float16"))
    w_desc = TensorDescriptor.from_tensor(w, [bn, bk], smem_layout(bn, bk, "float16"))
    c_desc = TensorDescriptor.from_tensor(c, [rows, bn], smem_layout(rows, bn, "float16"))
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    maxnreg, regs = _registers(coop)
    ew = {}
    if sched == "coope":  # 512 threads: 176 registers per consumer, 136 for the epilogue's
        maxnreg, regs, ew = MAXNREG3, CONSUMER_REGS_E, {"EW": 1, "EPI_REGS": EPI_REGS}
    if sched == "coope8":  # 640 threads: 160 for the second consumer, 80 for the epilogue's 8
        # warps (the first consumer, Gluon's default partition, gets the rest: 136)
        maxnreg, regs, ew = 96, 160, {"EW": 1, "EPI_REGS": 80, "EPI_WARPS": 8}
    return gemm_ws[grid](a_desc, w_desc, c_desc, c, bias, res, m, n, k, BM=bm, BN=bn, BK=bk,
                         NB=nb, COOP=coop, STORE_TMA=int(store_tma), EPI=epi,
                         CONSUMER_REGS=regs, LOAD_REGS=LOAD_REGS, num_warps=4,
                         maxnreg=maxnreg, **ew)


def _registers(coop):
    """The launch's register cap and its consumers' registers for ``coop`` + 1 consumers."""
    if coop == 2:
        return MAXNREG3, CONSUMER_REGS3
    return MAXNREG, CONSUMER_REGS


def compile_only(scheds=None) -> None:
    """Every config compiled to sm_90a PTX here (no GPU): shared memory, wgmma, TMA counts."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import compile as triton_compile
    from triton.experimental.gluon._runtime import GluonASTSource

    for (sched, bm, bn, bk, nb), store_tma in itertools.product(CONFIGS, (True, False)):
        if (scheds and sched not in scheds) or (sched.startswith("coope") and not store_tma):
            continue
        coop = consumers(sched)
        rows = bm // (coop + 1)
        maxnreg, regs = _registers(coop)
        consts = dict(BM=bm, BN=bn, BK=bk, NB=nb, COOP=coop, STORE_TMA=int(store_tma), EPI=2,
                      CONSUMER_REGS=regs, LOAD_REGS=LOAD_REGS, EW=0, EPI_REGS=0)
        consts["EPI_WARPS"] = 4
        if sched == "coope":
            maxnreg = MAXNREG3
            consts.update(CONSUMER_REGS=CONSUMER_REGS_E, EW=1, EPI_REGS=EPI_REGS)
        if sched == "coope8":
            maxnreg = 96
            consts.update(CONSUMER_REGS=160, EW=1, EPI_REGS=80, EPI_WARPS=8)
        boxes = dict(a_desc=(rows, bk), w_desc=(bn, bk), c_desc=(rows, bn))
        sig = {}
        for name in gemm_ws.arg_names:
            if name in boxes:
                sig[name] = f"tensordesc<fp16[{boxes[name][0]},{boxes[name][1]}]," \
                            f"{smem_layout(*boxes[name], 'float16')!r}>"
            elif name in consts:
                sig[name] = "constexpr"
            else:
                sig[name] = "*fp16" if name in ("C", "bias", "res") else "i32"
        attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(gemm_ws.arg_names)
                 if name in ("C", "bias", "res", "N", "K")}
        try:
            kern = triton_compile(GluonASTSource(gemm_ws, sig, consts, attrs),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4, "maxnreg": maxnreg})
        except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
            print(f"{sched} {bm}x{bn}x{bk} NB {nb} store_tma {store_tma}: "
                  f"{error_line(e)[:200]}")
            continue
        ptx = kern.asm["ptx"]
        print(f"{sched} {bm}x{bn}x{bk} NB {nb} store_tma {store_tma}: smem "
              f"{kern.metadata.shared} B, wgmma {ptx.count('wgmma.mma_async')}, setmaxnreg "
              f"{ptx.count('setmaxnreg')}, tma loads {ptx.count('cp.async.bulk.tensor.2d.shared')}")


def run(quick=False, only=None, baselines=True, cases=None, scheds=None,
        plain=False) -> list[dict]:
    """Time every config and epilogue on the GPU next to the PyTorch baselines of the same run."""
    import torch
    import torch.nn.functional as F

    from tvm_stitch.tune.measure import time_torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case, (m, n, k, epilogue) in SHAPES.items():
        if cases and case not in cases:
            continue
        epi = 0 if plain else epilogue  # plain: the product alone, against cuBLAS's
        torch.manual_seed(0)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        res = torch.randn(m, n, device="cuda", dtype=torch.float16)
        wt = w.t().contiguous()

        def torch_ref(x=a, w=w, bias=bias, res=res, epi=epi):
            y = F.linear(x, w, bias if epi else None)
            if epi == 2:
                y = F.gelu(y)
            elif epi == 3:
                y = y + res
            return y

        ref = torch_ref().float()
        base = {"matmul": time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda")}
        if baselines:
            base["linear"] = time_torch(lambda x, w=w, bias=bias: F.linear(x, w, bias), [a],
                                        "cuda")
            if epi >= 2:
                base["linear+epi"] = time_torch(torch_ref, [a], "cuda")
        flops = 2 * m * n * k
        line = " ".join(f"{key} {us:.1f}" for key, us in base.items())
        print(f"{case} {m}x{n}x{k} epilogue {epi}: {line} us "
              f"(matmul {flops / base['matmul'] / 1e6:.0f} TFLOP/s)")
        configs = CONFIGS[:3] if quick else CONFIGS
        if only is not None:
            configs = [CONFIGS[only]]
        for (sched, bm, bn, bk, nb), store_tma in itertools.product(configs, (True, False)):
            if (scheds and sched not in scheds) or (sched.startswith("coope") and not store_tma):
                continue
            c = torch.empty(m, n, device="cuda", dtype=torch.float16)

            def call(c=c, cfg=(sched, bm, bn, bk, nb, store_tma), ops=(a, w), more=(bias, res),
                     epi=epi):
                return launch(*ops, c, *more, *cfg, epi, sms)

            try:
                kern = call()
                torch.cuda.synchronize()
                err = float((c.float() - ref).abs().max())
                us = time_torch(call, [], "cuda", budget_ms=30)
            except Exception as e:  # noqa: BLE001 - a config that fails is reported
                print(f"  {sched} {bm}x{bn}x{bk} NB {nb} store_tma {store_tma}: "
                      f"{type(e).__name__}: {error_line(e)[:160]}")
                continue
            row = dict(case=case, sched=sched, tile=[bm, bn, bk, nb], store_tma=store_tma,
                       us=us, err=err, **{f"{key}_us": v for key, v in base.items()})
            rows.append(row)
            ratio = " ".join(f"{key} {v / us:.2f}x" for key, v in base.items())
            print(f"  {sched:8s} {bm}x{bn}x{bk} NB {nb} store {'tma' if store_tma else 'ptr'}: "
                  f"{us:6.1f} us ({flops / us / 1e6:4.0f} TFLOP/s) {ratio} err {err:.1e} "
                  f"regs {getattr(kern, 'n_regs', '?')} spills {getattr(kern, 'n_spills', '?')}")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--config", type=int, help="only CONFIGS[i] (a crash ends one process)")
    parser.add_argument("--no-baselines", action="store_true", help="cuBLAS's matmul only")
    parser.add_argument("--cases", nargs="*", help=f"some of {list(SHAPES)}")
    parser.add_argument("--sched", nargs="*", help="some of pingpong, coop, coop3, coope, coope8")
    parser.add_argument("--plain", action="store_true", help="no epilogue: the product only")
    args = parser.parse_args(argv)
    if args.compile_only:
        compile_only(args.sched)
    else:
        run(args.quick, args.config, not args.no_baselines, args.cases, args.sched, args.plain)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
