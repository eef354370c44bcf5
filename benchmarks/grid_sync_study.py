"""A GEMM that also normalizes its rows after a grid-wide barrier, against the GEMM and a
LayerNorm kernel: does a one-wave kernel (SOUFFLE §6.4: a kernel whose programs fit one wave
may synchronize the grid) beat a second launch at 128 tokens?

    python -m tvm_stitch.benchmarks.grid_sync_study [--json-out F]

BERT's residual GEMMs with the LayerNorm after them (out-projection 128×768×768 and FFN out
128×768×3072, bias and residual in the epilogue), one output tile per program (the tiles must
fit one wave: at most one program per SM):

- ``two kernels``: the GEMM stores its rows, a row-wise LayerNorm kernel normalizes them (what
  the stitch pipeline runs today: a generated GEMM, then FusionStitching's LayerNorm);
- ``one kernel``: each program keeps its tile in registers, stores the tile's row means and
  squared deviations (Chan's pieces), counts itself in on a grid-wide counter and waits for
  every program, combines its rows' pieces (every program in the same order: deterministic),
  normalizes its tile and stores it — one write of the output, no second launch. A second
  counter brings the first back to zero for the next launch.

Each variant runs 20 times back to back in one CUDA graph (as BERT's kernels run), µs per run;
PyTorch's ``F.linear`` + add + ``F.layer_norm`` from the same graph timing for reference.
"""

from __future__ import annotations

import argparse
import json

import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import _tile_product_tma

SHAPES = {"out-proj": (128, 768, 768), "ffn-out": (128, 768, 3072)}
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): tiles ≤ 132 at 128 × 768
CONFIGS = [
    (64, 32, 128, 4, 3),
    (64, 64, 128, 4, 3),
    (32, 32, 128, 4, 3),
    (64, 16, 256, 4, 3),
    (16, 64, 128, 4, 3),
    (32, 64, 128, 4, 3),
]
REPS = 20


@triton.jit
def gemm_ln(a_desc, w_desc, bias, res, gamma, beta, y, out, part, cnt, N, K, eps,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            TILES_N: tl.constexpr, FUSE: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = N // BLOCK_N
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _tile_product_tma(acc, a_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_K,
                            True)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    x = acc + tl.load(bias + rn).to(tl.float32)[None, :]
    x = (x + tl.load(res + rm[:, None] * N + rn[None, :]).to(tl.float32)).to(tl.float16)
    if not FUSE:
        tl.store(y + rm[:, None] * N + rn[None, :], x)
    else:
        x = x.to(tl.float32)
        mean = tl.sum(x, axis=1) / BLOCK_N
        dev = x - mean[:, None]
        tl.store(part + (rm * TILES_N + pid_n) * 2, mean)
        tl.store(part + (rm * TILES_N + pid_n) * 2 + 1, tl.sum(dev * dev, axis=1))
        # every program's pieces stored before the count (release), read after it (acquire)
        tl.debug_barrier()
        tl.atomic_add(cnt, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        while seen < tl.num_programs(0):
            seen = tl.atomic_add(cnt, 0, sem="acquire", scope="gpu")
        j = tl.arange(0, TILES_N)
        valid = (j < tiles_n)[None, :]
        at = (rm[:, None] * TILES_N + j[None, :]) * 2
        means = tl.load(part + at, mask=valid, other=0.0, cache_modifier=".cg")
        sq = tl.load(part + at + 1, mask=valid, other=0.0, cache_modifier=".cg")
        mu = tl.sum(means, axis=1) / tiles_n
        spread = tl.where(valid, means - mu[:, None], 0.0)
        var = (tl.sum(sq, axis=1) + BLOCK_N * tl.sum(spread * spread, axis=1)) / N
        norm = (x - mu[:, None]) * tl.rsqrt(var + eps)[:, None]
        norm = norm * tl.load(gamma + rn).to(tl.float32)[None, :]
        norm += tl.load(beta + rn).to(tl.float32)[None, :]
        tl.store(out + rm[:, None] * N + rn[None, :], norm.to(tl.float16))
        # the last program out sets both counters back to zero (no one waits on them now)
        tl.debug_barrier()
        if tl.atomic_add(cnt + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(cnt + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def layernorm(y, gamma, beta, out, M, N, eps, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rm = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rm < M)[:, None] & (cols < N)[None, :]
    x = tl.load(y + rm[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mu = tl.sum(x, axis=1) / N
    dev = tl.where(mask, x - mu[:, None], 0.0)
    rstd = tl.rsqrt(tl.sum(dev * dev, axis=1) / N + eps)
    g = tl.load(gamma + cols, mask=cols < N, other=0.0).to(tl.float32)
    b = tl.load(beta + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(out + rm[:, None] * N + cols[None, :],
             (dev * rstd[:, None] * g[None, :] + b[None, :]).to(tl.float16), mask=mask)


def _variants(t, tiles, bm, bn, bk, warps, stages, eps):
    """The study's three launches over the tensors ``t`` (a dict) for one tile config."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    (m, k), n = t["a"].shape, t["w"].shape[0]
    part = torch.empty(m * triton.next_power_of_2(n // bn) * 2, device="cuda")
    descs = (TensorDescriptor.from_tensor(t["a"], [bm, bk]),
             TensorDescriptor.from_tensor(t["w"], [bn, bk]))
    common = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, TILES_N=triton.next_power_of_2(n // bn),
                  num_warps=warps, num_stages=stages)

    def gemm(fuse):
        gemm_ln[(tiles,)](*descs, t["bias"], t["res"], t["gamma"], t["beta"], t["y"], t["out"],
                          part, t["cnt"], n, k, eps, FUSE=fuse, **common)

    def norm():
        layernorm[(triton.cdiv(m, 4),)](t["y"], t["gamma"], t["beta"], t["out"], m, n, eps,
                                        ROWS=4, BLOCK=triton.next_power_of_2(n), num_warps=4)

    return {"two kernels": lambda: (gemm(False), norm()), "gemm alone": lambda: gemm(False),
            "one kernel": lambda: gemm(True)}


def _repeated(fn):
    return lambda: [fn() for _ in range(REPS)]


def run(json_out=None, echo=print) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from tvm_stitch.tune.measure import time_torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows, eps = [], 1e-12
    for case, (m, n, k) in SHAPES.items():
        torch.manual_seed(0)
        t = {"a": torch.randn(m, k, device="cuda", dtype=torch.float16),
             "w": torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5,
             "res": torch.randn(m, n, device="cuda", dtype=torch.float16),
             "y": torch.empty(m, n, device="cuda", dtype=torch.float16),
             "out": torch.empty(m, n, device="cuda", dtype=torch.float16),
             "cnt": torch.zeros(2, device="cuda", dtype=torch.int32)}
        for name in ("bias", "gamma", "beta"):
            t[name] = torch.randn(n, device="cuda", dtype=torch.float16)
        x = (t["a"].float() @ t["w"].float().T + t["bias"].float() + t["res"].float()).half()
        want = F.layer_norm(x.float(), (n,), t["gamma"].float(), t["beta"].float(), eps)
        base = time_torch(_repeated(lambda t=t, n=n: F.layer_norm(
            F.linear(t["a"], t["w"], t["bias"]) + t["res"], (n,), t["gamma"], t["beta"], eps)),
            [], "cuda") / REPS
        for bm, bn, bk, warps, stages in CONFIGS:
            tiles = (m // bm) * (n // bn)
            if tiles > sms:
                continue
            for name, fn in _variants(t, tiles, bm, bn, bk, warps, stages, eps).items():
                t["out"].zero_()
                fn()
                torch.cuda.synchronize()
                err = 0.0 if name == "gemm alone" else (t["out"].float() - want).abs().max().item()
                left = t["cnt"].tolist()
                us = time_torch(_repeated(fn), [], "cuda") / REPS
                row = {"case": case, "shape": [m, n, k], "variant": name,
                       "config": [bm, bn, bk, warps, stages], "tiles": tiles, "us": us,
                       "err": err, "counters_left": left, "torch_us": base}
                rows.append(row)
                echo(f"{case:8s} {bm}x{bn}x{bk} w{warps}s{stages} ({tiles:3d} tiles) {name:11s} "
                     f"{us:6.2f} us  err {err:.2g}  counters {left}  | torch {base:6.2f}")
                if json_out:
                    with open(json_out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(row) + "\n")
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    run(args.json_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
