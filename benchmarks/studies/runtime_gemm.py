"""Runtime GEMMs in the warp-specialized form (issue 48): Hugging Face BERT-base with 2 layers
(a padding mask, float16) compiled once with dynamic batch and length and static at each
shape, the GEMMs' tiles forced to each config (``ws2``: the warp-specialized Gluon form with 2
consumer warpgroups); error against PyTorch's float32 model and the GEMM kernels' own time.

    python benchmarks/studies/runtime_gemm.py [--shapes 8x512,1x128,3x77] [--configs ...]

A config is ``MxNxKwWsS``, then ``wsC`` (warp-specialized, C consumer warpgroups), ``kS``
(split k in S; static builds only) or ``p`` (the persistent Triton form; static builds only).
One JSON line per (config, shape): ``gemm_us`` (both GEMMs, per call), ``max_err``, and the
static build's beside them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dynamic import _hidden, _inputs, _model
from runtime_attention import forced, kernel_us


def _config(text):
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)(?:ws(\d+))?(?:k(\d+))?(p?)", text)
    bm, bn, bk, w, st, ws, split, persistent = m.groups()
    out = {"BLOCK_M": int(bm), "BLOCK_N": int(bn), "BLOCK_K": int(bk), "num_warps": int(w),
           "num_stages": int(st), "SPLIT_K": int(split or 1), "PERSISTENT": bool(persistent)}
    if ws:  # persistent: one program an SM (the H100's and H200's 132)
        out.update(WS=int(ws), NUM_SMS=132)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x512,1x128,3x77")
    parser.add_argument("--configs", default="tuner,64x128x64w4s4ws2,128x128x64w4s3")
    args = parser.parse_args(argv)

    import torch
    from torch.export import Dim

    import tvm_stitch

    model = _model(2, 768, torch.float16, "cuda")
    reference = _model(2, 768, torch.float32, "cuda")
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    dynamic = {"input_ids": dims, "attention_mask": dims}
    for name in args.configs.split(","):
        forced("gemm", None if name == "tuner" else _config(name))
        start = time.perf_counter()
        fn = tvm_stitch.from_torch(model, _inputs(2, 17, "cuda"), target="cuda", tune="model",
                                   dynamic_shapes=dynamic)
        compile_s = round(time.perf_counter() - start, 1)
        for b, s in shapes:
            inputs = _inputs(b, s, "cuda")
            with torch.no_grad():
                want = _hidden(reference(*inputs)).float()
                err = float((_hidden(fn(*inputs)).float() - want).abs().max())
                us, names = kernel_us(fn, inputs, "gemm")
                fixed = tvm_stitch.from_torch(model, inputs, target="cuda", tune="model")
                static_us, static_names = kernel_us(fixed, inputs, "gemm")
                static_err = float((_hidden(fixed(*inputs)).float() - want).abs().max())
            print(json.dumps({"config": name, "shape": f"{b}x{s}", "compile_s": compile_s,
                              "max_err": err, "gemm_us": round(us, 1), "kernels": names,
                              "static_err": static_err, "static_us": round(static_us, 1),
                              "static_kernels": static_names}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
