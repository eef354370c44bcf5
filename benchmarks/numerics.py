"""Where two builds of a workload part ways: each kernel's output on one target against another's.

    python -m tvm_stitch.benchmarks.numerics llama-base -p batch=1 -p seq=256 \
        [--option compute_fp32=false] [--against llvm | --positions]

Both targets compile the same module with the same stitch options and run it on the workload's
arguments; the VM's instrument copies the last tensor argument of every call (a kernel's
destination) as it returns.  Calls are paired by symbol and occurrence, and each row gives the
largest difference from the reference target's output, relative to that output's largest
magnitude, with the reference's own error against PyTorch's float32 model at the end: the kernel
where the relative difference jumps is where the targets' numerics part.  Runs without CUDA
graphs (the instrument sees the calls a graph would replay).

``--positions`` builds no reference: it spreads the target's error against PyTorch's float32
model over the output's positions (axis 1: tokens), next to PyTorch's own float16 run, to tell
an error of every position from one of a few.
"""

from __future__ import annotations

import argparse
import collections

import numpy as np
import tvm

from tvm_stitch.pipeline import as_target

from .harness import compare, compile_tvm, device_args, tvm_device


def kernel_outputs(inst, target, options=None) -> list[tuple[str, np.ndarray]]:
    """``(symbol, output)`` of every VM call of ``inst`` built for ``target``, in call order.

    Returns the calls' destinations (the last tensor argument) and, as a last row named
    ``<outputs>``, the function's first result."""
    vm, _, _ = compile_tvm(inst, target, "stitch", use_cuda_graph=False, options=options)
    dev = tvm_device(as_target(target))
    rows = []

    def instrument(_func, symbol, before, _ret, *args):
        if not before:
            tensors = [a for a in args if isinstance(a, tvm.runtime.Tensor)]
            if tensors and not symbol.startswith("vm.builtin"):
                rows.append((symbol, tensors[-1].numpy().astype("float32", copy=False)))
        return 0  # VMInstrumentReturnKind.kNoOp

    vm.set_instrument(instrument)
    args = device_args(vm, inst, dev)
    out = vm[inst.func](*args)
    first = out[0] if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else out
    rows.append(("<outputs>", first.numpy().astype("float32")))
    return rows


def divergence(rows, reference) -> list[tuple[str, float, float]]:
    """``(symbol, max |Δ|, max |Δ| / max |reference|)`` for the calls both runs made."""
    seen = collections.Counter()
    ref = {}
    for symbol, value in reference:
        ref[(symbol, seen[symbol])] = value
        seen[symbol] += 1
    seen.clear()
    table = []
    for symbol, value in rows:
        key = (symbol, seen[symbol])
        seen[symbol] += 1
        other = ref.get(key)
        if other is None or other.shape != value.shape:
            continue
        diff = float(np.max(np.abs(value - other))) if value.size else 0.0
        scale = float(np.max(np.abs(other))) if other.size else 0.0
        table.append((f"{symbol}#{key[1]}", diff, diff / scale if scale else diff))
    return table


def position_errors(out: np.ndarray, ref: np.ndarray) -> str:
    """Percentiles of the largest error per position (axis 1) and the worst positions."""
    err = np.abs(out.astype("float32") - ref)
    per = err.reshape(err.shape[0], err.shape[1], -1).max(axis=(0, 2))
    q = np.percentile(per, [50, 90, 99, 100])
    worst = np.argsort(per)[::-1][:6]
    return (f"per-position max error p50 {q[0]:.3g} p90 {q[1]:.3g} p99 {q[2]:.3g} "
            f"max {q[3]:.3g}; worst positions " + ", ".join(f"{i}:{per[i]:.3g}" for i in worst))


def _positions(inst, target, options) -> None:
    import torch

    from .harness import run_tvm

    ref = inst.reference()[0]
    vm, _, _ = compile_tvm(inst, target, "stitch", options=options)
    _, outs = run_tvm(vm, inst, tvm_device(as_target(target)))
    print(f"{target}: {position_errors(outs[0], ref)}")
    device = "cuda" if as_target(target).kind.name == "cuda" else "cpu"
    fn = inst.torch_fns["eager"](device, torch.float16)
    with torch.no_grad():
        out = fn(*inst.torch_args(device, torch.float16))
    print(f"torch float16: {position_errors(out.float().cpu().numpy(), ref)}")


def main(argv=None) -> int:
    from tvm_stitch.cli import parse_options, parse_params
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--option", default="", help="stitch options KEY=VALUE[,KEY=VALUE]")
    parser.add_argument("--target", default="cuda")
    parser.add_argument("--against", default="llvm", help="the reference target")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--positions", action="store_true",
                        help="error per position, next to PyTorch float16 (no reference build)")
    args = parser.parse_args(argv)
    inst = get_workload(args.workload).instance(args.dtype, **parse_params(args.param))
    options = parse_options(args.option, "--option")
    if args.positions:
        _positions(inst, args.target, options)
        return 0
    refs = inst.reference()
    runs = {}
    for name in (args.target, args.against):
        runs[name] = rows = kernel_outputs(inst, name, options)
        err, ok = compare([rows[-1][1]], refs[:1], inst.tolerance)
        print(f"{name}: {len(rows) - 1} calls, error against PyTorch float32 {err:.3g} "
              f"({'within' if ok else 'outside'} tolerance)", flush=True)
    print(f"{'call':60s} {'max |d|':>10s} {'relative':>10s}")
    for symbol, diff, rel in divergence(runs[args.target], runs[args.against]):
        print(f"{symbol[:60]:60s} {diff:10.3g} {rel:10.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
