"""The ``gemm`` family's hand-written Triton template (``act(A·Wᵀ + bias) + residual``, persistent
by TMA or one program a tile): the kernel (:data:`TEMPLATE`, jitted by
:func:`tvm_stitch.codegen.triton_kernels.kernel`), the candidates it expresses, its parameters,
and its launcher (torch tensors: CPU ones under ``TRITON_INTERPRET=1``). The kernel benchmark's
template searches run it; generated kernels share its product loops
(:mod:`tvm_stitch.codegen.triton_kernels`)."""

from __future__ import annotations

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import (
    WARPGROUP_ROWS,
    _erf_abs,
    _tile_of,
    _tile_product,
    _tile_product_tma,
    _tma_allocator,
    kernel,
    powers_of_two,
    precision,
)

GELU_NONE, GELU_ERF, GELU_TANH = 0, 1, 2


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


TEMPLATE = _gemm_epilogue

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


def gemm_config(cand) -> dict:
    """Template parameters of the GEMM template for a single-product candidate."""
    t = cand.tile_dict
    return {"BLOCK_M": t["m"], "BLOCK_N": t["n"], "BLOCK_K": t["k"]}


#: splits of k a split-K GEMM may use (``SPLIT_K``: programs per output tile)
SPLITS = (1, 2, 4, 8)


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


