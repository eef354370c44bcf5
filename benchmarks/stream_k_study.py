"""Stream-K against data-parallel tiles on BERT's GEMMs: does sharing the k iterations evenly
over the SMs recover what wave quantization costs 768-column GEMMs? (issue 11, item 1)

    python -m tvm_stitch.benchmarks.stream_k_study [--json-out F] [--cases ffn2,out]

At 4096 tokens a 4096×768 output is 96 tiles of 128×256 (73% of 132 SMs busy) or 192 of
128×128 (1.45 waves). Stream-K (Osama et al., PPoPP 2023) gives each of ``P`` persistent
programs an equal share of all tiles' k iterations, ``ceil(tiles · k_steps / P)``; a tile whose
iterations two or three programs share is finished by the last of them to arrive, which adds
the others' float32 partials from a workspace **in program order** (deterministic) — the
semaphore protocol of the generated split-K GEMMs (``triton_kernels._split_arrive``), with a
count known per tile. Operands through TMA (host descriptors), no epilogue: the comparison is
``torch.matmul`` (cuBLAS) and the same kernel with one tile per program (``data-parallel``).
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
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
CONFIGS = [
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (128, 128, 128, 8, 3),
]


@triton.jit
def stream_k(a_desc, w_desc, c, ws, cnt, M, N, K, PER: tl.constexpr, SLOTS: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             GROUP_M: tl.constexpr):
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    steps = tl.cdiv(K, BLOCK_K)
    total = tiles_m * tiles_n * steps
    pid = tl.program_id(0)
    it = pid * PER
    end = tl.minimum(it + PER, total)
    rw = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    while it < end:
        tile = it // steps
        k_lo = it - tile * steps
        k_hi = tl.minimum(steps, k_lo + end - it)
        pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kk in range(k_lo, k_hi):
            a = a_desc.load([pid_m * BLOCK_M, kk * BLOCK_K])
            w = w_desc.load([pid_n * BLOCK_N, kk * BLOCK_K])
            acc = tl.dot(a, w.T, acc)
        done = k_hi - k_lo == steps
        if k_hi - k_lo < steps:  # a shared tile: its programs in order, the last one finishes
            first = tile * steps // PER
            count = ((tile + 1) * steps - 1) // PER - first + 1
            slots = ws + tile * (SLOTS * BLOCK_M * BLOCK_N)
            tl.store(slots + (pid - first) * (BLOCK_M * BLOCK_N) + rw, acc)
            tl.debug_barrier()
            done = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu") == count - 1
            if done:
                tl.atomic_xchg(cnt + tile, 0, sem="relaxed", scope="gpu")
                acc = tl.load(slots + rw, cache_modifier=".cg")
                for j in range(1, count):
                    acc += tl.load(slots + j * (BLOCK_M * BLOCK_N) + rw, cache_modifier=".cg")
        if done:
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16),
                     mask=(rm < M)[:, None] & (rn < N)[None, :])
        it += k_hi - k_lo


def run(json_out=None, echo=print, cases=None) -> list[dict]:
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    from tvm_stitch.tune.measure import time_torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for case, (m, n, k) in SHAPES.items():
        if cases and case not in cases:
            continue
        a, w, wt, ref = operands(m, n, k, k**0.5)
        base = time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda")
        parts = [f"cuBLAS {base:6.1f} us"]
        for bm, bn, bk, warps, stages in CONFIGS:
            tiles, steps = triton.cdiv(m, bm) * triton.cdiv(n, bn), triton.cdiv(k, bk)
            descs = (TensorDescriptor.from_tensor(a, [bm, bk]),
                     TensorDescriptor.from_tensor(w, [bn, bk]))
            for variant, programs in (("data-parallel", tiles), ("stream-k", min(sms, tiles))):
                per = triton.cdiv(tiles * steps, programs)
                slots = triton.cdiv(steps, per) + 1
                ws = torch.empty(tiles * slots * bm * bn if per % steps else 1, device="cuda")
                cnt = torch.zeros(tiles, device="cuda", dtype=torch.int32)
                c = torch.empty(m, n, device="cuda", dtype=torch.float16)

                def call(descs=descs, c=c, ws=ws, cnt=cnt, per=per, slots=slots, bm=bm,
                         bn=bn, bk=bk, warps=warps, stages=stages, programs=programs,
                         mnk=(m, n, k)):
                    stream_k[(programs,)](*descs, c, ws, cnt, *mnk, PER=per, SLOTS=slots,
                                          BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
                                          num_warps=warps, num_stages=stages)

                try:
                    call()
                    torch.cuda.synchronize()
                    err = (c.float() - ref).abs().max().item()
                    left = int(cnt.abs().sum().item())
                    us = time_torch(call, [], "cuda", budget_ms=20)
                except Exception as e:  # noqa: BLE001 - a config that fails is reported
                    echo(f"  {case} {variant} {bm}x{bn}x{bk}: {type(e).__name__}: {str(e)[:120]}")
                    continue
                row = {"case": case, "shape": [m, n, k], "variant": variant,
                       "config": [bm, bn, bk, warps, stages], "programs": programs, "us": us,
                       "err": err, "counters_left": left, "cublas_us": base}
                rows.append(row)
                parts.append(f"{variant} {bm}x{bn}x{bk} w{warps}s{stages} {us:6.1f} "
                             f"({base / us:4.2f}x, err {err:.2g}{', COUNTERS' if left else ''})")
                if json_out:
                    with open(json_out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
        echo(f"{case:5s} {m}x{n}x{k}: " + "\n    ".join(parts))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out")
    parser.add_argument("--cases", help=f"comma-separated, of {', '.join(SHAPES)}")
    args = parser.parse_args(argv)
    run(args.json_out, cases=args.cases.split(",") if args.cases else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
