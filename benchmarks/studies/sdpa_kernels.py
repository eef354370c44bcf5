"""PyTorch's SDPA kernels on an encoder's attention with a padding mask, timed by CUPTI.

    python benchmarks/studies/sdpa_kernels.py [--batch 8] [--heads 12] [--seq 512] [--dim 64]

The baseline of issue 11's "BERT-base's attention no slower than PyTorch's SDPA kernel": BERT
adds a padding mask to its logits (``[batch, 1, 1, seq]``, 0 or a large negative), so SDPA runs
with ``attn_mask`` (which rules out FlashAttention's kernel: cuDNN's or the memory-efficient
one), and without a mask for reference.  Each case is run in a loop under ``torch.profiler``;
the kernel time per call (CUPTI, like ``profile_tvm --cupti`` for the stitch executable) and
the kernels' names are printed.
"""

from __future__ import annotations

import argparse


def kernel_time(fn, runs: int = 50) -> tuple[float, list[str]]:
    """Mean CUDA kernel time per call of ``fn`` (µs) and the names of its kernels."""
    import torch
    from tvm_stitch.benchmarks.profile_tvm import cupti_kernels

    for _ in range(5):
        fn()
    totals, _ = cupti_kernels(fn, torch.cuda.synchronize, runs)
    return sum(us for us, _ in totals.values()), sorted(name[:90] for name in totals)


def main(argv=None) -> int:
    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--dim", type=int, default=64)
    args = parser.parse_args(argv)
    b, h, s, d = args.batch, args.heads, args.seq, args.dim
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
    lengths = torch.randint(s // 2, s + 1, (b,), device="cuda")
    keep = torch.arange(s, device="cuda")[None, :] < lengths[:, None]
    additive = torch.where(keep, 0.0, -10000.0).to(torch.float16)[:, None, None, :]
    cases = {
        "padding mask (additive, as BERT)": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=additive),
        "padding mask (boolean)": lambda: F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep[:, None, None, :]),
        "no mask": lambda: F.scaled_dot_product_attention(q, k, v),
    }
    print(f"SDPA {b}x{h}x{s}x{d} float16, torch {torch.__version__}")
    for label, fn in cases.items():
        us, names = kernel_time(fn)
        print(f"  {label:34s} {us:7.1f} us of kernels per call: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
