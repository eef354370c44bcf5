"""One compile for every batch and length (issue 48): Hugging Face BERT through ``from_torch``
with dynamic dims, against static builds of each shape and ``torch.compile(dynamic=True)``.

    python benchmarks/dynamic.py [--target cuda] [--shapes 1x128,8x512,...] [--static 1x128,...]
                                 [--model bert|gpt2] [--layers N] [--hidden H]
                                 [--tune model|measure]

The model (``BertModel``, or ``GPT2Model`` with ``--model gpt2``; random weights, eager
attention, a padding mask: the second sequence of a batch shorter than the others) is exported
once with ``Dim("batch", 1..64)`` and ``Dim("seq", 1..512)`` and compiled once (its compile
time printed); then at each shape:

- numerics against PyTorch eager (float32 on llvm; float16 on CUDA, PyTorch's own float16 error
  against float32 beside it);
- on CUDA, time per call (CUDA events, median of 5 runs of back-to-back calls) of the dynamic
  build, of a static build of that shape (``--static`` shapes only: each is a compile), of
  PyTorch eager and of ``torch.compile(dynamic=True)`` (compiled once, dims marked dynamic).

On llvm nothing is timed: the CPU run checks that one build serves every shape.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _model(layers: int, hidden: int, dtype, device, name: str = "bert"):
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(n_embd=hidden, n_layer=layers, n_head=hidden // 64,
                                         attn_implementation="eager")
        return transformers.GPT2Model(config).eval().to(device=device, dtype=dtype)
    config = transformers.BertConfig(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        intermediate_size=4 * hidden, attn_implementation="eager")
    return transformers.BertModel(config).eval().to(device=device, dtype=dtype)


def _inputs(b: int, s: int, device):
    import torch

    gen = torch.Generator().manual_seed(b * 1000 + s)
    ids = torch.randint(0, 30000, (b, s), generator=gen)
    mask = torch.ones(b, s, dtype=torch.long)
    if b > 1 and s > 2:
        mask[1, s - s // 3:] = 0  # the second sequence padded
    return ids.to(device), mask.to(device)


def _time(fn, args, runs: int = 5, calls: int = 20) -> float:
    """Microseconds per call: median over ``runs`` of ``calls`` calls back to back."""
    import torch

    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    out = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return float(np.median(out))


def _hidden(out):
    return out[0] if isinstance(out, (tuple, list)) else getattr(out, "last_hidden_state", out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="llvm", choices=["llvm", "cuda"])
    parser.add_argument("--shapes", default="1x128,8x512,32x128,3x77,17x301")
    parser.add_argument("--static", default="", help="shapes also built static (CUDA)")
    parser.add_argument("--model", default="bert", choices=["bert", "gpt2"],
                        help="BertModel (a padding mask) or GPT2Model (causal, a padding mask)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--tune", default="model", choices=["model", "measure"])
    parser.add_argument("--no-compile", action="store_true", help="no torch.compile baseline")
    parser.add_argument("--profile", action="store_true",
                        help="CUDA: the dynamic build's kernels at each shape, and the static "
                             "build's (torch.profiler)")
    parser.add_argument("--no-graphs", action="store_true",
                        help="CUDA: builds without CUDA graphs (one launch per kernel)")
    args = parser.parse_args(argv)

    import torch
    from torch.export import Dim

    import tvm_stitch

    cuda = args.target == "cuda"
    device = "cuda" if cuda else "cpu"
    dtype = torch.float16 if cuda else torch.float32
    model = _model(args.layers, args.hidden, dtype, device, args.model)
    reference = (_model(args.layers, args.hidden, torch.float32, device, args.model) if cuda
                 else model)
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",") if s]
    static = {tuple(map(int, s.split("x"))) for s in args.static.split(",") if s}
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=1, max=512)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    options = {"tune": args.tune, "cuda_graph": not args.no_graphs} if cuda else {}
    ids, mask = _inputs(2, 17, device)

    start = time.perf_counter()
    fn = tvm_stitch.from_torch(model, (ids,), example_kwargs={"attention_mask": mask},
                               target=args.target, dynamic_shapes=dims, **options)
    compile_s = time.perf_counter() - start
    print(json.dumps({"build": "dynamic", "compile_s": round(compile_s, 1),
                      "inputs": [str(i) for i in fn.inputs]}), flush=True)
    compiled = None
    if cuda and not args.no_compile:
        compiled = torch.compile(model, dynamic=True)

    for b, s in shapes:
        ids, mask = _inputs(b, s, device)
        row = {"shape": f"{b}x{s}"}
        with torch.no_grad():
            want = _hidden(reference(ids, attention_mask=mask)).float()
            got = _hidden(fn(ids, mask)).float()
            row["max_err"] = float((got - want).abs().max())
            if cuda:
                eager = _hidden(model(ids, attention_mask=mask)).float()
                row["torch_fp16_err"] = float((eager - want).abs().max())
                row["dynamic_us"] = _time(fn, (ids, mask))
                row["eager_us"] = _time(lambda i, m: model(i, attention_mask=m), (ids, mask))
                if compiled is not None:
                    row["compile_dynamic_us"] = _time(
                        lambda i, m: compiled(i, attention_mask=m), (ids, mask))
                if (b, s) in static:
                    start = time.perf_counter()
                    fixed = tvm_stitch.from_torch(model, (ids,),
                                                  example_kwargs={"attention_mask": mask},
                                                  target="cuda", **options)
                    row["static_compile_s"] = round(time.perf_counter() - start, 1)
                    row["static_us"] = _time(fixed, (ids, mask))
                    row["static_err"] = float((_hidden(fixed(ids, mask)).float() - want)
                                              .abs().max())
        print(json.dumps(row), flush=True)
        if cuda and args.profile:
            _profile(fn, (ids, mask), f"{b}x{s}")
            if (b, s) in static:
                _profile(fixed, (ids, mask), f"{b}x{s} static")
    return 0


def kernel_times(fn, args, calls: int = 5, warmup: int = 1) -> dict:
    """``{kernel name: (µs a call, launches a call)}`` of ``fn(*args)`` from torch.profiler
    (CUPTI sees TVM's and Triton's kernels), over ``calls`` calls after ``warmup``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(warmup):
            fn(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn(*args)
            torch.cuda.synchronize()
    totals, counts = {}, {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            totals[e.name] = totals.get(e.name, 0.0) + e.device_time / calls
            counts[e.name] = counts.get(e.name, 0) + 1
    return {name: (totals[name], counts[name] // calls) for name in totals}


def _profile(fn, args, label: str, calls: int = 5) -> None:
    """A build's kernels at one shape: time per call by kernel name (the 25 largest)
    and in all (:func:`kernel_times`)."""
    times = kernel_times(fn, args, calls)
    top = sorted(times.items(), key=lambda kv: -kv[1][0])[:25]
    print(json.dumps({"profile": label,
                      "kernels_per_call": sum(n for _, n in times.values()),
                      "gpu_us": round(sum(t for t, _ in times.values()), 1),
                      "top": [[name[:60], round(t, 1), n] for name, (t, n) in top]}),
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
