"""The ``attention`` family's hand-written Triton template (``softmax(Q·Kᵀ·scale + mask)·V``,
flash-style): the kernel (:data:`TEMPLATE`, jitted by
:func:`tvm_stitch.codegen.triton_kernels.kernel`), the candidates it expresses, its parameters,
and its launcher (torch tensors: CPU ones under ``TRITON_INTERPRET=1``). The kernel benchmark's
template searches run it; generated kernels share its product loops
(:mod:`tvm_stitch.codegen.triton_kernels`)."""

from __future__ import annotations

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import (
    kernel,
    precision,
)


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


TEMPLATE = _attention


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


