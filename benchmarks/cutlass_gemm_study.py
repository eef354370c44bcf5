"""Do CUTLASS 3's SM90 GEMMs with 2-CTA clusters reach cuBLAS on BERT's GEMMs? A study (issue 11).

    bash benchmarks/cutlass_gemm/build.sh                  # on the CPU machine: nvcc, ~5 min
    python -m tvm_stitch.benchmarks.cutlass_gemm_study [--m 4096] [--cases out,ffn1] [--swizzle 1,2]

Our Triton and Gluon GEMMs trail cuBLAS most where cuBLAS runs clusters of two CTAs whose TMA
loads multicast an operand to both (``nvjet_…_1x2``): Triton 3.6, on the GPU host, offers no
multicast. CUTLASS does. ``benchmarks/cutlass_gemm/gemm.cu`` instantiates warp-specialized
(cooperative and ping-pong) kernels with and without clusters, each with BERT's epilogues as
CUTLASS's fused epilogues (bias; bias + erf GELU; bias + residual read as the source C); this
script times them against ``torch.matmul`` (cuBLAS, no epilogue), ``F.linear`` and ``F.linear``
followed by the epilogue, all in one process, from CUDA-graph replays, and checks each output
against the float32 product. A study, not a code path of the pipeline: if CUTLASS closes the gap,
it becomes a form the GEMM search measures.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os

LIB = os.path.join(os.path.dirname(__file__), "cutlass_gemm", "libstitch_cutlass.so")
#: BERT-base's GEMMs: (N, K, epilogue)
CASES = {
    "qkv": (2304, 768, "bias"),
    "out": (768, 768, "res"),
    "ffn1": (3072, 768, "gelu"),
    "ffn2": (768, 3072, "res"),
}


def time_torch(fn, args, device="cuda", budget_ms: float = 200.0) -> float:
    """Median microseconds per call from CUDA-graph replays, as
    :func:`tvm_stitch.tune.measure.time_torch` times them; a copy so that the study runs where
    TVM is not installed (it needs only PyTorch and the built library)."""
    import statistics

    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    number = max(1, int(budget_ms / 10 / max(start.elapsed_time(end), 1e-4)))
    samples = []
    for _ in range(10):
        start.record()
        for _ in range(number):
            graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / number)
    return statistics.median(samples) * 1e3


def _launcher(fn, a, w, bias, res, d, swizzle):
    """A call of one CUTLASS configuration on these tensors (raises when CUTLASS refuses)."""
    import torch

    m, k = a.shape
    n = w.shape[0]
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 4 + [ctypes.c_void_p]

    def call():
        rc = fn(a.data_ptr(), w.data_ptr(), bias.data_ptr(), res.data_ptr(), d.data_ptr(),
                m, n, k, swizzle, torch.cuda.current_stream().cuda_stream)
        if rc:
            raise RuntimeError(f"CUTLASS refused ({rc})")
    return call


def _case(lib, configs, case, m, swizzles, plain) -> list[dict]:
    import torch
    import torch.nn.functional as F

    n, k, epi = CASES[case]
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
    wt = w.t().contiguous()
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    res = torch.randn(m, n, device="cuda", dtype=torch.float16)
    d = torch.empty(m, n, device="cuda", dtype=torch.float16)
    prod = a.float() @ w.float().t()
    refs = {"plain": prod, "bias": prod + bias.float(),
            "gelu": F.gelu(prod + bias.float()), "res": prod + bias.float() + res.float()}
    base = {
        "matmul": time_torch(lambda x: torch.matmul(x, wt), [a], "cuda"),
        "linear": time_torch(lambda x: F.linear(x, w, bias), [a], "cuda"),
    }
    if epi == "gelu":
        base["linear+epi"] = time_torch(lambda x: F.gelu(F.linear(x, w, bias)), [a], "cuda")
    elif epi == "res":
        base["linear+epi"] = time_torch(lambda x: F.linear(x, w, bias) + res, [a], "cuda")
    flops = 2 * m * n * k
    print(f"{case} {m}x{n}x{k} + {epi}: " + ", ".join(
        f"{b} {us:.1f} us" for b, us in base.items())
        + f" (cuBLAS {flops / base['matmul'] / 1e6:.0f} TFLOP/s)", flush=True)
    rows = []
    for fusion in ([epi, "plain"] if plain else [epi]):
        for config in configs:
            for swizzle in swizzles:
                call = _launcher(getattr(lib, f"stitch_cutlass_{fusion}_{config}"),
                                 a, w, bias, res, d, swizzle)
                try:
                    call()
                    torch.cuda.synchronize()
                    err = (d.float() - refs[fusion]).abs().max().item()
                    us = time_torch(call, [], "cuda", budget_ms=30)
                except Exception as e:  # noqa: BLE001 - a refused configuration is reported
                    print(f"  {fusion:5s} {config} s{swizzle}: {e}", flush=True)
                    continue
                row = dict(case=case, fusion=fusion, config=config, swizzle=swizzle, us=us,
                           err=err, **{f"{b}_us": v for b, v in base.items()})
                rows.append(row)
                print(f"  {fusion:5s} {config:22s} s{swizzle}: {us:6.1f} us "
                      f"({flops / us / 1e6:4.0f} TFLOP/s) matmul {base['matmul'] / us:.2f}x "
                      f"linear {base['linear'] / us:.2f}x err {err:.1e}", flush=True)
    return rows


def run(lib_path: str, m: int, cases: list[str], swizzles: list[int], plain: bool) -> list[dict]:
    """Rows ``{case, fusion, config, swizzle, us, err, <baseline>_us}`` of every configuration."""
    import torch

    lib = ctypes.CDLL(lib_path)
    lib.stitch_cutlass_configs.restype = ctypes.c_char_p
    configs = lib.stitch_cutlass_configs().decode().split()
    torch.manual_seed(0)
    rows = []
    for case in cases:
        rows += _case(lib, configs, case, m, swizzles, plain)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", default=LIB)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--swizzle", default="1")
    parser.add_argument("--plain", action="store_true", help="also the product alone")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    if not os.path.exists(args.lib):
        parser.error(f"{args.lib} is missing: build it with benchmarks/cutlass_gemm/build.sh")
    rows = run(args.lib, args.m, args.cases.split(","),
               [int(s) for s in args.swizzle.split(",")], args.plain)
    if args.json_out:
        with open(args.json_out, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
