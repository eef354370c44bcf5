"""Where a compiled workload spends its time: every VM call timed (synchronised), grouped, ranked.

python -m tvm_stitch.benchmarks.profile_tvm bert-base -p batch=32 -p seq=128 [--pipeline stitch]
    [--option fold_norms=true] [--cupti | --ncu]

``--ncu`` only runs the compiled function and then the workload's PyTorch baseline (SDPA where it
has one) twice each, for ``ncu`` to profile from outside (``run_gpu.sh ncu:WORKLOAD``).
"""

from __future__ import annotations

import argparse
import collections
import time

import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.workloads import get_workload

from .harness import device_args


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("-p", "--param", action="append", default=[])
    parser.add_argument("--pipeline", choices=["stitch", "default"], default="stitch")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a stitch pipeline option, e.g. fold_norms=true")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--target", choices=["cuda", "llvm"], default="cuda")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None,
                        help="default: float16 on cuda, float32 on llvm")
    parser.add_argument(
        "--cupti", action="store_true", help="GPU time of every kernel (torch.profiler, CUDA)"
    )
    parser.add_argument(
        "--ncu", action="store_true", help="run it and the PyTorch baseline twice, for ncu"
    )
    parser.add_argument(
        "--baseline", action="store_true",
        help="with --cupti: torch.compile's kernels too (the workload's SDPA form where it has one)"
    )
    args = parser.parse_args(argv)
    params = {k: int(v) for k, v in (p.split("=") for p in args.param)}
    cuda = args.target == "cuda"
    dtype = args.dtype or ("float16" if cuda else "float32")
    inst = get_workload(args.workload).instance(dtype, **params)
    target = (
        tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}) if cuda else tvm.target.Target("llvm")
    )
    from tvm_stitch.cli import parse_options

    options = parse_options(",".join(args.option), "--option")
    pipe = (
        tvm_stitch.pipeline(target, **options)
        if args.pipeline == "stitch"
        else (tvm_stitch.default_pipeline(target))
    )
    ex = tvm.compile(inst.mod, target, relax_pipeline=pipe)
    dev = tvm.cuda(0) if cuda else tvm.cpu(0)
    vm = relax.VirtualMachine(ex, dev)
    vm_args = device_args(vm, inst, dev)
    vm[inst.func](*vm_args)  # warm up (and tune/compile nothing more)
    if args.cupti:
        _cupti(vm, inst, vm_args, dev, args.top)
        return _compiled_cupti(inst, dtype, args.top) if args.baseline else 0
    if args.ncu:
        return _ncu_runs(vm, inst, vm_args, dev)
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    started: dict[str, float] = {}

    def instrument(func, symbol, before_run, ret_value, *call_args):
        dev.sync()  # each call timed on its own: slower than a real run, but attributable
        if before_run:
            started[symbol] = time.perf_counter()
        else:
            totals[symbol][0] += (time.perf_counter() - started.pop(symbol)) * 1e6
            totals[symbol][1] += 1
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(instrument)
    vm[inst.func](*vm_args)
    total = sum(t for t, _ in totals.values())
    calls = sum(n for _, n in totals.values())
    print(f"{inst.name} ({args.pipeline}): {total:.0f} us in {calls} calls")
    for name, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{us:10.1f} us {100 * us / total:5.1f}%  {n:4d} calls  {name}")
    return 0


def cupti_kernels(run, sync, runs: int = 5) -> tuple[dict, tuple]:
    """Kernel name -> ``[µs per run, launches in all runs]`` of ``run()`` called ``runs``
    times, as CUPTI sees them (TVM's, Triton's and PyTorch's kernels alike), and the µs per
    run the GPU was busy and spanned (:func:`_busy`)."""
    from tvm_stitch.benchmarks.timeline import kernel_events

    def calls():
        for _ in range(runs):
            run()
        sync()

    events = kernel_events(calls)
    totals: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name, start, end in events:
        totals[name][0] += (end - start) / runs
        totals[name][1] += 1
    return totals, _busy([(start, end) for _, start, end in events], runs)


def _busy(spans: list, runs: int) -> tuple:
    """µs per run the GPU ran at least one kernel (overlapping kernels counted once), and from
    the first kernel's start to the last one's end: their difference is the time between
    kernels (launch gaps, and whatever separates the runs)."""
    from tvm_stitch.benchmarks.timeline import attribute

    if not spans:
        return 0.0, 0.0
    events = [("", start, stop) for start, stop in sorted(spans)]
    busy = sum(row[2] for row in attribute(events).values())  # what each kernel adds
    span = max(stop for _, stop in spans) - events[0][1]
    return busy / runs, span / runs


def _cupti(vm, inst, vm_args, dev, top: int, runs: int = 5) -> int:
    """Kernel times as CUPTI sees them (TVM's and Triton's kernels alike), per run."""
    _print_kernels(inst.name, cupti_kernels(lambda: vm[inst.func](*vm_args), dev.sync, runs),
                   top, runs)
    return 0


def _compiled_cupti(inst, dtype: str, top: int, runs: int = 5) -> int:
    """:func:`_cupti` of the workload's PyTorch form under ``torch.compile``, for a kernel by
    kernel comparison with the same run's TVM figures."""
    import torch

    fn = torch.compile(inst.torch_fns.get("sdpa", inst.torch_fns["eager"])(
        "cuda", getattr(torch, dtype)))
    args = inst.torch_args("cuda", getattr(torch, dtype))
    with torch.no_grad():
        for _ in range(3):  # compiled, autotuned and warm
            fn(*args)
        torch.cuda.synchronize()
        found = cupti_kernels(lambda: fn(*args), torch.cuda.synchronize, runs)
    _print_kernels(f"{inst.name} torch.compile", found, top, runs)
    return 0


def _print_kernels(name: str, found, top: int, runs: int) -> None:
    totals, (busy, span) = found
    total = sum(t for t, _ in totals.values())
    calls = sum(n for _, n in totals.values()) // runs
    print(f"{name}: {total:.1f} us of kernels in {calls} launches per run (CUPTI); the GPU "
          f"busy {busy:.1f} us of {span:.1f} from first start to last end")
    for kernel, (us, n) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{us:10.1f} us {100 * us / total:5.1f}%  {n // runs:4d} calls  {kernel[:90]}")


def _ncu_runs(vm, inst, vm_args, dev, runs: int = 2) -> int:
    import torch

    for _ in range(runs):
        vm[inst.func](*vm_args)
    dev.sync()
    make = inst.torch_fns.get("sdpa", inst.torch_fns["eager"])
    fn = make("cuda", torch.float16)
    args = inst.torch_args("cuda", torch.float16)
    with torch.no_grad():
        for _ in range(runs):
            fn(*args)
    torch.cuda.synchronize()
    print(f"{inst.name}: ran {runs} times, then its PyTorch baseline {runs} times")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
