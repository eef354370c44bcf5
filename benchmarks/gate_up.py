"""SwiGLU's gate × up as one generated kernel (issue 49, item 1) against cuBLAS on the
concatenated weights followed by PyTorch's SiLU × up, on the GPU.

    python -m tvm_stitch.benchmarks.gate_up [--shapes 1x2048,4x512] [--model llama-8b]

For each batch × length the zoo model's (default: two LLaMA-3-8B-shaped layers) gate × up
GEMM is generated twice — over its two weights (two products a k step) and over one weight
whose rows take turns, gate then up (``lift_params``' interleave: one product of twice the
columns, split after the loop) — and each is searched on the GPU (measured). Printed beside,
from the same run: ``x @ [W_gate; W_up]ᵀ`` by cuBLAS alone and followed by ``silu(g) * u``,
as µs and TFLOP/s (the products' 2·M·2N·K), and the device's dense float16 peak.
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1x2048,4x512")
    parser.add_argument("--model", default="llama-8b")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from tvm_stitch.benchmarks.harness import generated_gemms

    from tvm_stitch.hardware import HardwareModel
    from tvm_stitch.tune.kernels import tune_generated
    from tvm_stitch.tune.measure import time_torch

    hw = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
    peak = round(hw.peak_flops_fp16 / 1e12)
    for shape in args.shapes.split(","):
        b, s = map(int, shape.split("x"))
        row = {"shape": shape}
        for joined in (False, True):
            gemms = generated_gemms(args.model, "float16", joined=joined, layers=1, batch=b,
                                    seq=s)
            (match, source, shapes, _), = [g for g in gemms
                                           if len(g[0].segments[0].products) == 2]
            if joined and not match.paired:
                print(json.dumps({"shape": shape, "paired": "not paired (see the log)"}))
                return 1
            tuned = tune_generated(match, source, shapes, {}, hw, on_device=True)
            label = "paired" if match.paired else "two_products"
            row[f"{label}_us"] = tuned.time * 1e6
            row[f"{label}_config"] = tuned.config
        m, k, n = b * s, match.frame.extents["k"], match.segments[0].n
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(2 * n, k, device="cuda", dtype=torch.float16) / k**0.5

        def cublas(x_, w_):
            return x_ @ w_.T

        def swiglu(x_, w_, n=n):
            y = x_ @ w_.T
            return F.silu(y[:, :n]) * y[:, n:]

        row["cublas_us"] = time_torch(cublas, [x, w], "cuda")
        row["cublas_silu_up_us"] = time_torch(swiglu, [x, w], "cuda")
        flops = 2 * m * 2 * n * k
        row["tflops"] = {key[:-3]: round(flops / row[key] / 1e6, 1)
                         for key in list(row) if key.endswith("_us")}
        row["paired_vs_cublas_silu_up"] = round(row["cublas_silu_up_us"] / row["paired_us"], 3)
        row["peak_tflops"] = peak
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
