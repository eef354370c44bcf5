"""Numerics of the Triton templates under Triton's interpreter (run with TRITON_INTERPRET=1).

``tests/test_triton_kernels.py`` runs this file in a subprocess (the interpreter must be chosen
before Triton is imported) and reads the JSON it prints: one record per case.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tvm_stitch.codegen import triton_kernels as tk  # noqa: E402
from tvm_stitch.explore.tiling import Candidate, ChainSpec, TilingExpr  # noqa: E402
from tvm_stitch.families.attention import template as attention  # noqa: E402
from tvm_stitch.families.chain import template as chain  # noqa: E402
from tvm_stitch.families.gemm import template as gemm  # noqa: E402

TOL = {torch.float32: 1e-4, torch.float16: 2e-2}
records = []


def check(name, got, ref, dtype):
    err = (got.float() - ref.float()).abs().max().item()
    scale = max(1.0, ref.float().abs().max().item())
    records.append({"case": name, "max_err": err, "ok": err <= TOL[dtype] * scale})


torch.manual_seed(0)
for dtype in (torch.float32, torch.float16):
    # GEMM chains at irregular shapes, from search-space candidates
    for batch, m, n, k, h, expr, tiles in [
        (2, 45, 37, 40, 29, "mhnk", {"m": 16, "n": 16, "k": 16, "h": 16}),
        (1, 70, 33, 48, 24, "mn(k,h)", {"m": 32, "n": 16, "k": 64, "h": 32}),  # k, h dead
        (3, 17, 50, 64, 80, "mhnk", {"m": 16, "n": 32, "k": 64, "h": 32}),  # A hoisted
    ]:
        spec = ChainSpec.gemm_chain(batch, m, n, k, h)
        e = TilingExpr(("m", "n"), (("k",), ("h",))) if "(" in expr else TilingExpr(tuple(expr))
        cand = Candidate(e, tuple(tiles.items()))
        assert chain.chain_legality(spec, cand) is None
        cfg = chain.chain_config(spec, cand)
        a, b, d = (
            torch.randn(s, dtype=dtype) * 0.5 for s in ((batch, m, k), (batch, k, n), (batch, n, h))
        )
        ref = (a.float() @ b.float()).to(dtype).float() @ d.float()
        check(
            f"chain {expr} {batch}x{m}x{n}x{k}x{h} hoist={cfg['HOIST_A']} {dtype}",
            chain.run_gemm_chain(a, b, d, cfg),
            ref,
            dtype,
        )

    # attention: with and without an additive mask, K != H, N not a multiple of the tile
    for heads, m, n, dk, dh, masked in [
        (3, 33, 47, 40, 24, True),
        (2, 64, 50, 64, 64, False),
        (1, 20, 70, 80, 32, True),
    ]:
        q, kk, v = (
            torch.randn(s, dtype=dtype) for s in ((heads, m, dk), (heads, n, dk), (heads, n, dh))
        )
        mask = None
        scores = q.float() @ kk.float().transpose(1, 2) / dk**0.5
        if masked:
            mask = torch.where(torch.rand(heads, 1, n) < 0.2, -10000.0, 0.0).to(dtype)
            scores = scores + mask.float()
        ref = torch.softmax(scores, -1) @ v.float()
        got = attention.run_attention(q, kk, v, mask, config={"BLOCK_M": 16, "BLOCK_N": 32})
        check(f"attention {heads}x{m}x{n}x{dk}x{dh} mask={masked} {dtype}", got, ref, dtype)

    # BERT's layout: (batch, seq, heads, dim) read and written in place, (batch, 1, 1, seq) mask
    b, seq, heads, dim = 2, 37, 3, 32
    qkv = [torch.randn(b, seq, heads * dim, dtype=dtype) for _ in range(3)]
    q4, k4, v4 = (t.view(b, seq, heads, dim).permute(0, 2, 1, 3) for t in qkv)
    mask = torch.where(torch.rand(b, 1, 1, seq) < 0.25, -10000.0, 0.0).to(dtype)
    out = torch.empty(b, seq, heads * dim, dtype=dtype)
    attention.run_attention(
        q4,
        k4,
        v4,
        mask,
        out=out.view(b, seq, heads, dim).permute(0, 2, 1, 3),
        config={"BLOCK_M": 16, "BLOCK_N": 16},
    )
    scores = q4.float() @ k4.float().transpose(-1, -2) / dim**0.5 + mask.float()
    ref = (torch.softmax(scores, -1) @ v4.float()).permute(0, 2, 1, 3).reshape(b, seq, -1)
    check(f"attention bert-layout {b}x{seq}x{heads}x{dim} {dtype}", out, ref, dtype)

    # GEMM + epilogues (a Linear layer: weight is (N, K))
    x, w = torch.randn(33, 70, dtype=dtype), torch.randn(50, 70, dtype=dtype) * 0.2
    bias, res = torch.randn(50, dtype=dtype), torch.randn(33, 50, dtype=dtype)

    def linear(xx, ww, gelu, residual, bias=bias, res=res):
        y = xx.float() @ ww.float().T + bias.float()
        if gelu:
            y = F.gelu(y, approximate="tanh" if gelu == gemm.GELU_TANH else "none")
        return y + res.float() if residual else y

    # persistent programs walking several tiles each, operands read through TMA (rows of A and
    # B a multiple of 16 bytes: K = 72)
    x72, w72 = torch.cat([x, x[:, :2]], 1), torch.cat([w, w[:, :2]], 1)
    tiles = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16}
    for gelu, residual in [
        (gemm.GELU_NONE, False),
        (gemm.GELU_ERF, False),
        (gemm.GELU_TANH, True),
        (gemm.GELU_NONE, True),
    ]:
        for label, (xx, ww), config in (
            ("bias", (x, w), tiles),
            ("persistent", (x72, w72), {**tiles, "PERSISTENT": True, "NUM_SMS": 2}),
        ):
            got = gemm.run_gemm_epilogue(xx, ww, bias, res if residual else None, gelu, config)
            check(f"gemm {label} gelu={gelu} residual={residual} {dtype}", got,
                  linear(xx, ww, gelu, residual), dtype)


# erf to absolute accuracy (GELU's 1 + erf): against float64 over the range where it bends,
# beyond the clamp (3.92), and at zeros, infinities and NaN
@triton.jit
def _erf_kernel(x_ptr, y_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(y_ptr + i, tk._erf_abs(tl.load(x_ptr + i)))


specials = [0.0, -0.0, 1e-30, -1e-3, 3.91, 3.92, 3.93, 30.0, float("inf"), -float("inf"),
            float("nan")]
xs = torch.cat([torch.linspace(-6, 6, 8192 - len(specials)), torch.tensor(specials)])
ys = torch.empty_like(xs)
_erf_kernel[(1,)](xs, ys, n=8192)
exact = torch.erf(xs.double())
err = (ys.double() - exact)[~exact.isnan()].abs().max().item()
minus_zero = ys[8192 - len(specials) + 1]
records.append({"case": "erf absolute", "max_err": err,
                "ok": err <= 1.2e-7 and bool(ys[-1].isnan()) and bool(minus_zero.signbit())})

json.dump(records, sys.stdout)
