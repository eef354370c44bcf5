"""Which Triton GEMM formulation reaches cuBLAS on this GPU: a sweep, before choosing templates.

    python -m tvm_stitch.benchmarks.gemm_study [--json-out F] [--quick] [--descriptors]
        [--cases ffn1,qkv]

Formulations (all ``C = A @ W^T``, fp16, fp32 accumulation, W stored (N, K) as nn.Linear keeps it):

- ``ptr``: pointer loads with masks (the template the tuner measures today);
- ``tma``: TMA tensor descriptors made on the device (``tl.make_tensor_descriptor``), one tile
  per program;
- ``tma_p``: the same, persistent (one program per SM walking the tiles, ``flatten`` so the
  pipeline runs across tiles);
- ``splitk``: ``tma`` with the K loop split over ``SPLIT`` programs adding into an fp32 output
  (for few rows: every SM pulls its share of the weights);
- ``--descriptors``: ``tma_p`` against ``tma_ph`` (the descriptors made by the host and passed
  by value) and ``tma_ph_ws`` (with Triton's warp specialization of the tile loop); FFN1 also
  with BERT's erf GELU epilogue (``_gelu``: the template's, its erf to absolute accuracy,
  ``_erf_abs``; ``_gelu_libdevice``: libdevice's ``erff``): does the specialization overlap
  it, what does the erf's form cost? (Session 14 also tried the epilogue on two column halves
  of the tile, one after the other: no gain, 49.1 vs 48.2 µs.)

The product loops and tile order are the templates' own (``_tile_product``,
``_tile_product_tma``, ``_tile_of``).  Each formulation runs a fixed list of tile configs on
BERT-base's four GEMMs at 4096 tokens and at 128 tokens (batch 1); the best of each is printed
next to ``torch.matmul`` (cuBLAS) from the same run, in µs and TFLOP/s.
"""

from __future__ import annotations

import argparse
import itertools
import json

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import (
    _epilogue,
    _tile_of,
    _tile_product,
    _tile_product_tma,
)

SHAPES = {
    "qkv": (4096, 2304, 768),
    "out": (4096, 768, 768),
    "ffn1": (4096, 3072, 768),
    "ffn2": (4096, 768, 3072),
    "qkv@128": (128, 2304, 768),
    "out@128": (128, 768, 768),
    "ffn1@128": (128, 3072, 768),
    "ffn2@128": (128, 768, 3072),
}

#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
CONFIGS = [
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (128, 128, 64, 8, 3),
    (128, 128, 64, 4, 3),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 8, 3),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 256, 64, 4, 3),
    (64, 64, 64, 4, 4),
    (64, 64, 128, 4, 4),
    (64, 32, 128, 4, 4),
    (256, 128, 64, 8, 3),
]


@triton.jit
def _store_tile(C, acc, pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.float16),
             mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def gemm_ptr(A, W, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _tile_product(acc, A, W, rm, rn, M, N, K, K, 1, 1, K, BLOCK_K, "tf32")
    _store_tile(C, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def gemm_tma(A, W, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _tile_product_tma(acc, a_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_K,
                            True)
    _store_tile(C, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def _persistent(a_desc, w_desc, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                WS: tl.constexpr, GELU: tl.constexpr = 0):
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tile_c = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True,
                         warp_specialize=WS):
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _tile_product_tma(acc, a_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K,
                                BLOCK_K, True)
        tile_c += NUM_SMS
        pid_m, pid_n = _tile_of(tile_c, tiles_m, tiles_n, GROUP_M)
        # GELU: the template's epilogue (bias and residual off, its erf form 1: GELU_ERF)
        if GELU == 2:  # libdevice's erf, branches and all
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
            _store_tile(C, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
        elif GELU:  # BERT's FFN1 epilogue: does warp specialization overlap it?
            _epilogue(acc, C, C, C, pid_m, pid_n, M, N, N, 1, N, 1, BLOCK_M, BLOCK_N, False,
                      1, False)
        else:
            _store_tile(C, acc, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


@triton.jit
def gemm_tma_p(A, W, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    _persistent(a_desc, w_desc, C, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS, False)


@triton.jit
def gemm_tma_ph(a_desc, w_desc, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
                WS: tl.constexpr, GELU: tl.constexpr = 0):
    # ``tma_p`` with descriptors the host makes (Triton's launcher passes them by value), and
    # with Triton's automatic warp specialization of the tile loop (``WS``)
    _persistent(a_desc, w_desc, C, M, N, K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_SMS, WS,
                GELU)


@triton.jit
def gemm_splitk(A, W, C, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT: tl.constexpr):
    a_desc = tl.make_tensor_descriptor(A, [M, K], [K, 1], [BLOCK_M, BLOCK_K])
    w_desc = tl.make_tensor_descriptor(W, [N, K], [K, 1], [BLOCK_N, BLOCK_K])
    pid_m, pid_n = _tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    part = tl.program_id(1)
    per = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(part * per, tl.minimum((part + 1) * per, tl.cdiv(K, BLOCK_K))):
        a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        w = w_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
        acc = tl.dot(a, w.T, acc)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.atomic_add(C + rm[:, None] * N + rn[None, :], acc,
                  mask=(rm < M)[:, None] & (rn < N)[None, :], sem="relaxed")


def operands(m: int, n: int, k: int, w_scale: float = 16.0) -> tuple:
    """``(a, w, wt, ref)`` on the GPU for ``C = A @ W^T``: float16 ``A`` (m, k) and ``W`` (n, k)
    (seeded; ``W`` divided by ``w_scale``), ``W^T`` contiguous for ``torch.matmul`` (cuBLAS)
    and the float32 reference — the studies' common set-up."""
    import torch

    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / w_scale
    return a, w, w.t().contiguous(), a.float() @ w.float().t()


def run(json_out=None, quick=False, echo=print, descriptors=False, cases=None) -> list[dict]:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tvm_stitch.tune.measure import time_torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda",
                                                                 dtype=torch.int8))
    rows = []
    configs = CONFIGS[:4] if quick else CONFIGS
    shapes = {c: v for c, v in SHAPES.items() if not (descriptors and "@" in c)
              and (not cases or c in cases)}
    for case, (m, n, k) in shapes.items():
        a, w, wt, ref = operands(m, n, k)
        flops = 2 * m * n * k
        base = time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda")
        best = {}
        for bm, bn, bk, warps, stages in configs:
            if m <= 128 and bm > 128:
                continue
            tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
            variants = {
                "ptr": (gemm_ptr, (tiles,), {}),
                "tma": (gemm_tma, (tiles,), {}),
                "tma_p": (gemm_tma_p, (min(sms, tiles),), {"NUM_SMS": sms}),
            }
            if descriptors:  # device- vs host-made descriptors, and warp specialization
                host = (TensorDescriptor.from_tensor(a, [bm, bk]),
                        TensorDescriptor.from_tensor(w, [bn, bk]))
                variants = {"tma_p": variants["tma_p"]}
                gelus = (0, 1, 2) if case == "ffn1" else (0,)
                for ws, gelu in itertools.product((False, True), gelus):
                    label = ["", "_gelu", "_gelu_libdevice"][gelu]
                    variants[f"tma_ph{'_ws' if ws else ''}{label}"] = (
                        gemm_tma_ph, (min(sms, tiles),),
                        {"NUM_SMS": sms, "WS": ws, "GELU": gelu, "host": host})
            if m <= 512:
                for split in (2, 3, 4, 6):
                    variants[f"splitk{split}"] = (gemm_splitk, (tiles, split), {"SPLIT": split})
            for name, (fn, grid, extra) in variants.items():
                out = torch.zeros(m, n, device="cuda",
                                  dtype=torch.float32 if "splitk" in name else torch.float16)

                def call(fn=fn, grid=grid, extra=extra, out=out, bm=bm, bn=bn, bk=bk,
                         warps=warps, stages=stages, a=a, w=w, m=m, n=n, k=k):
                    extra = dict(extra)
                    ops = extra.pop("host", (a, w))
                    fn[grid](*ops, out, m, n, k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                             GROUP_M=8, num_warps=warps, num_stages=stages, **extra)

                try:
                    call()
                    if "splitk" in name:
                        out.zero_()
                        call()
                    want = ref if "gelu" not in name else torch.nn.functional.gelu(ref)
                    err = (out.float() - want).abs().max().item()
                    us = time_torch(call, [], "cuda", budget_ms=20)
                except Exception as e:  # noqa: BLE001 - a config that fails is reported
                    echo(f"  {case} {name} {bm}x{bn}x{bk} w{warps}s{stages}: "
                         f"{type(e).__name__}: {str(e)[:120]}")
                    continue
                family = "splitk" if "splitk" in name else name
                row = {"case": case, "shape": [m, n, k], "variant": name,
                       "config": [bm, bn, bk, warps, stages], "us": us, "err": err,
                       "cublas_us": base}
                rows.append(row)
                if json_out:
                    with open(json_out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
                if family not in best or us < best[family]["us"]:
                    best[family] = row
        parts = [f"cuBLAS {base:7.1f} us ({flops / base / 1e6:5.0f} TFLOP/s)"]
        for family, row in best.items():
            parts.append(f"{family} {row['us']:7.1f} ({base / row['us']:4.2f}x, "
                         f"{row['variant']} {'x'.join(map(str, row['config']))}, "
                         f"err {row['err']:.2g})")
        echo(f"{case:9s} {m}x{n}x{k}: " + " | ".join(parts))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--descriptors", action="store_true",
                        help="4096 tokens only: persistent TMA with device- vs host-made "
                             "descriptors, and Triton's warp specialization")
    parser.add_argument("--cases", help=f"comma-separated, of {', '.join(SHAPES)}")
    args = parser.parse_args(argv)
    run(args.json_out, args.quick, descriptors=args.descriptors,
        cases=args.cases.split(",") if args.cases else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
