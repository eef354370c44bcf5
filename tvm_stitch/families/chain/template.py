"""The ``chain`` family's hand-written Triton template (``(A·B)·D``, A hoisted when k takes one
tile): the kernel (:data:`TEMPLATE`, jitted by
:func:`tvm_stitch.codegen.triton_kernels.kernel`), the candidates it expresses, its parameters,
and its launcher (torch tensors: CPU ones under ``TRITON_INTERPRET=1``). The kernel benchmark's
template searches run it; generated kernels share its product loops
(:mod:`tvm_stitch.codegen.triton_kernels`)."""

from __future__ import annotations

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import (
    _tile_product,
    kernel,
    powers_of_two,
    precision,
)


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


TEMPLATE = _gemm_chain


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


