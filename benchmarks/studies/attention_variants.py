"""Time variants of one generated attention kernel against SDPA, each in its own process.

    python benchmarks/studies/attention_variants.py [--dim 128] [--causal]

Generates the kernel tvm-stitch makes for ``torch-attention`` (4 × 16 heads × 512, float16), then
times it, with Triton's launcher and CUDA-graph replays, at the tilings and options listed in
``VARIANTS`` — among them Triton's automatic warp specialization of the key loop (``ws``: the loop
becomes ``tl.range(..., warp_specialize=True)``, TMA loads only, as Triton's Hopper pass needs) —
next to ``F.scaled_dot_product_attention`` on the same tensors.  Each variant runs in a child
process: a Triton pass that aborts costs that variant, not the study.  For deciding what the
search should offer, not a benchmark of the pipeline (``tvm-stitch bench zoo`` is).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

#: (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA, warp-specialized key loop)
VARIANTS = [
    (64, 64, 4, 3, False, False),
    (64, 64, 4, 3, True, False),
    (128, 64, 8, 3, True, False),
    (64, 64, 4, 3, True, True),
    (128, 64, 4, 3, True, True),
    (128, 64, 8, 3, True, True),
    (128, 128, 8, 2, True, True),
]


def kernel_source(dim: int, causal: bool) -> str:
    """The Triton source the stitch pipeline generates for the workload."""
    from tvm_stitch.report import fusion_report
    from tvm_stitch.workloads import get_workload

    cache = tempfile.mkdtemp()
    os.environ["TVM_STITCH_CACHE"] = cache
    inst = get_workload("torch-attention").instance("float16", dim=dim, causal=int(causal))
    fusion_report(inst.mod, "cuda", "stitch", tune="model")
    (path,) = glob.glob(f"{cache}/triton/stitch_attention_*.py")
    with open(path, encoding="utf-8") as f:
        return f.read()


def _child(path: str, variant: tuple, dim: int, causal: bool) -> dict:
    import torch
    import torch.nn.functional as F
    import triton

    bm, bn, warps, stages, tma, ws = variant
    spec = importlib.util.spec_from_file_location("attn_variant", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fn = next(getattr(mod, n) for n in dir(mod) if n.startswith("stitch_attention"))
    triton.set_allocator(lambda size, _align, _stream: torch.empty(size, dtype=torch.int8,
                                                                     device="cuda"))
    shape = (4, 16, 512, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    grid = (512 // bm, 64)
    consts = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=dim, BLOCK_H=dim, DOT_PREC="tf32", TMA=tma,
                  num_warps=warps, num_stages=stages)
    if "WS" in fn.arg_names:
        consts["WS"] = ws

    def run():
        fn[grid](q, k, v, o, **consts)

    run()
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    err = float((o.float() - ref.float()).abs().max())
    ours = triton.testing.do_bench_cudagraph(run) * 1e3
    sdpa = triton.testing.do_bench_cudagraph(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)) * 1e3
    return {"us": ours, "sdpa_us": sdpa, "err": err}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = _child(args.child[0], tuple(json.loads(args.child[1])), args.dim, args.causal)
        print("RESULT " + json.dumps(result))
        return 0
    text = kernel_source(args.dim, args.causal)
    # the key loop as a tl.range whose warp specialization is a constexpr of the launch
    text = text.replace("TMA: tl.constexpr):", "TMA: tl.constexpr, WS: tl.constexpr):", 1)
    loops = text.count("for n0 in range(")
    text = text.replace("for n0 in range(", "for n0 in tl.range(").replace(
        ", BLOCK_N):", ", BLOCK_N, warp_specialize=WS):")
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "attn_variant.py")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"attention 4x16x512 d{args.dim}{' causal' if args.causal else ''}: {loops} key loop(s)")
    print(f"{'BM':>4} {'BN':>4} {'warps':>5} {'stages':>6} {'TMA':>4} {'WS':>4} {'us':>8} "
          f"{'SDPA us':>8} {'ratio':>6} {'max err':>8}")
    for variant in VARIANTS:
        cmd = [sys.executable, "-m", "tvm_stitch.benchmarks.attention_variants", "--dim",
               str(args.dim), *(["--causal"] if args.causal else []), "--child", path,
               json.dumps(variant)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        cols = " ".join(f"{v!s:>4}" for v in variant[:2]) + f" {variant[2]:>5} " \
            f"{variant[3]:>6} {variant[4]!s:>4} {variant[5]!s:>4}"
        if line is None:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:90]
            print(f"{cols}  failed: {tail}")
            continue
        r = json.loads(line[len("RESULT "):])
        print(f"{cols} {r['us']:8.1f} {r['sdpa_us']:8.1f} {r['sdpa_us'] / r['us']:6.2f} "
              f"{r['err']:8.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
