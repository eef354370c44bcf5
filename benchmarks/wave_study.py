"""Tiles whose sizes are not powers of two, for GEMMs whose power-of-two tiles fill the SMs
badly: a study of wave quantization on BERT's GEMMs at 4096 tokens.

    python -m tvm_stitch.benchmarks.wave_study [--json-out F] [--cases out,ffn2]

The GEMMs where Triton trails cuBLAS most are those whose power-of-two tiles leave SMs idle
in the last wave: a 4096 × 768 output is 192 tiles of 128 × 128 or 96 of 128 × 256 on 132
SMs (73% of the SMs' time busy either way), while FFN-in (4096 × 3072: 384 tiles of 128 × 256,
97%) runs at cuBLAS's speed. Triton's tensors are powers of two, but a program may hold two
accumulators:

- ``wide``: a BM × (BN1 + BN2) tile, two products per step of k sharing the A tile
  (128 × 192: 128 tiles of a 4096 × 768 output — one wave; 2304 columns: 384 tiles);
- ``tall``: a (BM1 + BM2) × BN tile, two products sharing the W tile (192 × 128: 22 × 6 = 132
  tiles of a 4096 × 768 output, the last row block two-thirds empty);
- ``pow2``: one accumulator (the stitch pipeline's persistent form, for comparison).

All persistent (one program per SM walking the tiles, ``flatten``), operands by host-made TMA
descriptors, ``C = A @ W^T`` in fp16 with fp32 accumulation; the output stored through
pointers from the accumulators (``store=ptr``) or by TMA (``store=tma``). Q/K/V as one
4096 × 2304 weight. Baseline: ``torch.matmul`` (cuBLAS) from the same run.
"""

from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import _tile_of

from .gemm_study import SHAPES as BERT_GEMMS
from .gemm_study import operands

#: BERT-base's four GEMMs at 4096 tokens (gemm_study's, without its 128-token ones)
SHAPES = {case: shape for case, shape in BERT_GEMMS.items() if "@" not in case}

#: (form, (BM1, BM2), (BN1, BN2), BLOCK_K, num_warps, num_stages); BM2 / BN2 = 0: one block
CONFIGS = [
    ("pow2", (128, 0), (256, 0), 64, 8, 4),
    ("pow2", (128, 0), (128, 0), 64, 8, 4),
    ("pow2", (128, 0), (128, 0), 64, 4, 4),
    ("wide", (128, 0), (128, 64), 64, 8, 3),
    ("wide", (128, 0), (128, 64), 64, 8, 4),
    ("wide", (128, 0), (64, 32), 64, 4, 4),
    ("wide", (128, 0), (64, 32), 64, 8, 4),
    ("wide", (64, 0), (128, 64), 64, 4, 4),
    ("tall", (128, 64), (128, 0), 64, 8, 3),
    ("tall", (128, 64), (128, 0), 64, 8, 4),
    ("tall", (128, 64), (64, 0), 64, 4, 4),
    ("tall", (128, 64), (256, 0), 64, 8, 3),
]


@triton.jit
def _store(C, c_desc, acc, off_m, off_n, M, N, BM: tl.constexpr, BN: tl.constexpr,
           TMA_STORE: tl.constexpr):
    if TMA_STORE:
        c_desc.store([off_m, off_n], acc.to(tl.float16))
    else:
        rm = off_m + tl.arange(0, BM)
        rn = off_n + tl.arange(0, BN)
        tl.store(C + rm[:, None] * N + rn[None, :], acc.to(tl.float16),
                 mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def gemm_two(a_desc, a2_desc, w_desc, w2_desc, C, c_desc, c2_desc, M, N, K,
             BM1: tl.constexpr, BM2: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr,
             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
             TMA_STORE: tl.constexpr):
    # BM2 > 0: rows split (two A blocks, one W block); BN2 > 0: columns split; else one product
    BLOCK_M: tl.constexpr = BM1 + BM2
    BLOCK_N: tl.constexpr = BN1 + BN2
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    tile_c = tl.program_id(0) - NUM_SMS
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True):
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BM1, BN1), dtype=tl.float32)
        if BM2 > 0:
            acc2 = tl.zeros((BM2, BN1), dtype=tl.float32)
        elif BN2 > 0:
            acc2 = tl.zeros((BM1, BN2), dtype=tl.float32)
        else:
            acc2 = tl.zeros((16, 16), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([off_m, k0])
            w = w_desc.load([off_n, k0])
            acc = tl.dot(a, w.T, acc)
            if BM2 > 0:
                a2 = a2_desc.load([off_m + BM1, k0])
                acc2 = tl.dot(a2, w.T, acc2)
            elif BN2 > 0:
                w2 = w2_desc.load([off_n + BN1, k0])
                acc2 = tl.dot(a, w2.T, acc2)
        tile_c += NUM_SMS
        pid_m, pid_n = _tile_of(tile_c, tiles_m, tiles_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        _store(C, c_desc, acc, off_m, off_n, M, N, BM1, BN1, TMA_STORE)
        if BM2 > 0:
            _store(C, c2_desc, acc2, off_m + BM1, off_n, M, N, BM2, BN1, TMA_STORE)
        elif BN2 > 0:
            _store(C, c2_desc, acc2, off_m, off_n + BN1, M, N, BM1, BN2, TMA_STORE)


def _tiles(m, n, bm, bn) -> int:
    return triton.cdiv(m, bm) * triton.cdiv(n, bn)


def run(json_out=None, echo=print, cases=None, only=None, once=False) -> list[dict]:
    """Time every config of :data:`CONFIGS` (whose label contains ``only``, if given) on the
    GEMMs of :data:`SHAPES` (those in ``cases``); ``once``: launch each once, no timing (for
    ``ncu``)."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tvm_stitch.tune.measure import time_torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case, (m, n, k) in SHAPES.items():
        if cases and case not in cases:
            continue
        a, w, wt, ref = operands(m, n, k)
        flops = 2 * m * n * k
        if once:
            torch.matmul(a, wt)
            base = float("nan")
        else:
            base = time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda")
        echo(f"{case} {m}x{n}x{k}: cuBLAS {base:.1f} us ({flops / base / 1e6:.0f} TFLOP/s)")
        best = {}
        for (form, (bm1, bm2), (bn1, bn2), bk, warps, stages), tma_store in (
                (c, s) for c in CONFIGS for s in (False, True)):
            bm, bn = bm1 + bm2, bn1 + bn2
            tiles = _tiles(m, n, bm, bn)
            out = torch.zeros(m, n, device="cuda", dtype=torch.float16)
            descs = (TensorDescriptor.from_tensor(a, [bm1, bk]),
                     TensorDescriptor.from_tensor(a, [max(bm2, 16), bk]),
                     TensorDescriptor.from_tensor(w, [bn1, bk]),
                     TensorDescriptor.from_tensor(w, [max(bn2, 16), bk]),
                     out,
                     TensorDescriptor.from_tensor(out, [bm1, bn1]),
                     TensorDescriptor.from_tensor(out, [bm2 or bm1, bn2 or bn1]))

            def call(descs=descs, tiles=tiles, bm1=bm1, bm2=bm2, bn1=bn1, bn2=bn2, bk=bk,
                     warps=warps, stages=stages, tma_store=tma_store, m=m, n=n, k=k):
                gemm_two[(min(sms, tiles),)](
                    *descs, m, n, k, BM1=bm1, BM2=bm2, BN1=bn1, BN2=bn2, BLOCK_K=bk,
                    GROUP_M=8, NUM_SMS=sms, TMA_STORE=tma_store, num_warps=warps,
                    num_stages=stages)

            label = (f"{form} {bm1}{'+' + str(bm2) if bm2 else ''}x"
                     f"{bn1}{'+' + str(bn2) if bn2 else ''}x{bk} w{warps}s{stages} "
                     f"store={'tma' if tma_store else 'ptr'}")
            if only and only not in label:
                continue
            try:
                call()
                if once:
                    continue
                err = (out.float() - ref).abs().max().item()
                us = time_torch(call, [], "cuda", budget_ms=20)
            except Exception as e:  # noqa: BLE001 - a config that fails is reported
                echo(f"  {label}: {type(e).__name__}: {str(e)[:160]}")
                continue
            waves = tiles / sms
            row = {"case": case, "shape": [m, n, k], "form": form, "label": label,
                   "tiles": tiles, "waves": waves, "us": us, "err": err, "cublas_us": base}
            rows.append(row)
            if json_out:
                with open(json_out, "a", encoding="utf-8") as f:
                    f.write(json.dumps(row) + "\n")
            echo(f"  {label:42s} {tiles:4d} tiles ({waves:4.2f} waves) {us:7.1f} us "
                 f"{base / us:5.2f}x cuBLAS  err {err:.2g}")
            if form not in best or us < best[form]["us"]:
                best[form] = row
        echo("  best: " + " | ".join(f"{f} {r['us']:.1f} ({r['cublas_us'] / r['us']:.2f}x, "
                                       f"{r['label']})" for f, r in best.items()))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out")
    parser.add_argument("--cases", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--only", help="configs whose label contains this, e.g. 'wide 128x128+64'")
    parser.add_argument("--once", action="store_true", help="launch each once (for ncu)")
    args = parser.parse_args(argv)
    run(args.json_out, cases=args.cases.split(",") if args.cases else None, only=args.only,
        once=args.once)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
