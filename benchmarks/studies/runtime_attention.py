"""Why the attention kernel with runtime lengths is slow (issue 48): a BERT-base attention
(12 heads of 64, an additive padding mask made from a 0/1 mask) compiled once with dynamic
batch and length, and static at each shape, with the attention's tiles forced to each of a
few configs; the attention kernel's own time (torch.profiler) at each shape.

    python benchmarks/studies/runtime_attention.py [--shapes 8x512,1x128,32x128]
                                                   [--configs 128x32w4s2,128x64w4s2,...]

Prints one JSON line per (build, config, shape): ``kernel_us`` (the attention kernel, per
call) and ``tflops`` (4·b·h·m·n·d over it); ``config: "tuner"`` is the tuner's own choice.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamic import kernel_times

HEADS, HEAD = 12, 64


def _module():
    import torch

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            b, s, _ = q.shape

            def heads(x):
                return x.view(b, s, HEADS, HEAD).transpose(1, 2)

            ext = (1.0 - mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
            scores = heads(q) @ heads(k).transpose(-1, -2) / HEAD ** 0.5 + ext
            out = scores.softmax(-1) @ heads(v)
            return out.transpose(1, 2).reshape(b, s, HEADS * HEAD)

    return Attention().eval()


def _inputs(b, s):
    import torch

    gen = torch.Generator().manual_seed(b * 1000 + s)
    q, k, v = (torch.randn(b, s, HEADS * HEAD, generator=gen).half().cuda() for _ in range(3))
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1:
        mask[1, s - s // 3:] = 0
    return q, k, v, mask.cuda()


def _config(text):
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)s(\d+)", text)
    bm, bn, w, st = map(int, m.groups())
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}


def forced(family, config):
    """The tuner's configs of ``family``'s kernels with their tiles, warps, stages and forms
    replaced by ``config`` (None: the tuner's own)."""
    from tvm_stitch.tune import policy

    original = policy.KernelTuner.__dict__.get("_original_config") or policy.KernelTuner.config
    policy.KernelTuner._original_config = original

    def chosen(self, match, source, shapes, constants, like=None, **kwargs):
        got = original(self, match, source, shapes, constants, like, **kwargs)
        if config is None or match.family != family:
            return got
        keep = {k: v for k, v in got.items() if not k.startswith("BLOCK_")
                and k not in ("num_warps", "num_stages", "WS", "PERSISTENT", "TMA")}
        return {**keep, **config}

    policy.KernelTuner.config = chosen


def kernel_us(fn, args, part: str, calls=20):
    """µs a call of the kernels whose names hold ``part``, and their names."""
    times = kernel_times(fn, args, calls, warmup=3)
    mine = {name: t for name, (t, _) in times.items() if part in name}
    return sum(mine.values()), sorted({name[:50] for name in mine})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x512,1x128,32x128")
    parser.add_argument("--configs", default="tuner,128x32w4s2,128x64w4s2,128x64w8s2,"
                                             "128x128w8s2,64x64w4s3")
    parser.add_argument("--no-static", dest="static", action="store_false",
                        help="no static build of each shape")
    args = parser.parse_args(argv)

    import torch
    from torch.export import Dim

    import tvm_stitch

    model = _module()
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=1, max=512)
    dims = {0: batch, 1: seq}
    dynamic = {"q": dims, "k": dims, "v": dims, "mask": dims}
    for name in args.configs.split(","):
        config = None if name == "tuner" else _config(name)
        forced("attention", config)
        start = time.perf_counter()
        try:
            fn = tvm_stitch.from_torch(model, _inputs(2, 17), target="cuda", tune="model",
                                       dynamic_shapes=dynamic)
        except Exception as err:  # noqa: BLE001 - a config the kernel cannot take: go on
            print(json.dumps({"build": "dynamic", "config": name, "error": repr(err)[:300]}))
            continue
        compile_s = time.perf_counter() - start
        for b, s in shapes:
            inputs = _inputs(b, s)
            with torch.no_grad():
                want = model(*inputs).float()
                err = float((fn(*inputs).float() - want).abs().max())
                us, names = kernel_us(fn, inputs, "attention")
                row = {"build": "dynamic", "config": name, "shape": f"{b}x{s}",
                       "compile_s": round(compile_s, 1), "max_err": err,
                       "kernel_us": round(us, 1),
                       "tflops": round(4 * b * HEADS * s * s * HEAD / us / 1e6, 1),
                       "kernels": names}
                if args.static:
                    fixed = tvm_stitch.from_torch(model, inputs, target="cuda", tune="model")
                    us, names = kernel_us(fixed, inputs, "attention")
                    row.update(static_us=round(us, 1), static_kernels=names,
                               static_err=float((fixed(*inputs).float() - want).abs().max()))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
