"""What each kernel adds to a CUDA-graph replay of a compiled workload, per option set.

    python -m tvm_stitch.benchmarks.timeline bert-base -p batch=8 -p seq=512 \
        --variant lift_params=true,fold_norms=true \
        --variant lift_params=true,fold_norms=true,dependent_launch=false

Each variant is compiled with Relax's CUDA graph (as the bench times it) and called under
CUPTI (``torch.profiler``). Kernels of one replay are ordered by start; a kernel *adds* the time
from the latest end before it to its own end (zero if it ends inside an earlier one) and *waits*
the time from that end to its own start (a launch gap; zero when launched early, as a dependent
launch is). The span of a replay is the sum of both over its kernels. Per kernel name: launches
per replay, mean CUPTI duration (which, for a dependently launched kernel, includes the time its
blocks wait for the kernel before), and the adds and waits per replay.

``--steady N`` also profiles N calls back to back (as the VM's ``time_evaluator`` makes them)
beside the ``time_evaluator`` figure: a call's span there, the idle time between calls and what
the largest kernels add. On the H100 (2026-11-26) BERT-base's calls follow each other with no
idle time, and each kernel adds 5-9% more than in a lone call; ``nvidia-smi`` sampled the SM
clock at 1740-1980 MHz during them, often with reason ``SwPowerCap`` (likely the cause; a lone
call runs at 1980).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import statistics

import tvm


def kernel_events(run) -> list[tuple]:
    """``(name, start, end)`` of every kernel ``run()`` launches, µs, ordered by start (CUPTI,
    through ``torch.profiler``; the device synchronized before and after)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
              if e.device_type.name == "CUDA" and e.device_time > 0]
    return sorted(events, key=lambda e: e[1])


def replay_events(vm, func: str, args, replays: int = 5) -> list[list[tuple]]:
    """``(name, start, end)`` of every kernel, µs, per call of ``vm[func](*args)`` (built with
    Relax's CUDA graph, as the bench times it: each call replays that graph)."""
    fn = vm[func]
    for _ in range(3):
        fn(*args)
    # one call per profile: calls never mix
    return [kernel_events(lambda: fn(*args)) for _ in range(replays)]


def steady_events(vm, func: str, args, calls: int) -> list[tuple]:
    """``(name, start, end)`` of every kernel of ``calls`` back-to-back calls of
    ``vm[func](*args)`` under one profile (no synchronization between them: as the VM's
    ``time_evaluator`` calls it)."""
    fn = vm[func]

    def run():
        for _ in range(calls):
            fn(*args)

    return kernel_events(run)


def steady_report(events: list[tuple], names: list[str], calls: int) -> str:
    """Per call of ``calls`` back-to-back calls' ``events``, each the kernels ``names`` of a
    lone call in their order: its span (first start to last end) and the idle time before it
    (from the previous call's last end). Events that are not ``calls`` such sequences (a
    kernel more or less, a name CUPTI reported otherwise) are not split: only the period."""
    n = len(names)
    if not events:
        return f"{calls} calls back to back: no kernel seen"
    chunks = [events[i:i + n] for i in range(0, len(events), n)] if n else []
    if len(events) != calls * n or any([e[0] for e in c] != names for c in chunks):
        total = max(e[2] for e in events) - events[0][1]
        return (f"{calls} calls back to back: {total / calls:.1f} us a call; not split "
                f"({len(events)} kernels, not {calls} x the {n} of a lone call in its order)")
    spans = [max(e[2] for e in c) - c[0][1] for c in chunks]
    gaps = [b[0][1] - max(e[2] for e in a) for a, b in itertools.pairwise(chunks)]
    period = (chunks[-1][0][1] - chunks[0][0][1]) / max(calls - 1, 1)
    tables = [attribute(c) for c in chunks]
    waits = statistics.median(sum(r[3] for r in t.values()) for t in tables)
    top = sorted(tables[0], key=lambda name: -tables[0][name][2])[:6]
    adds = ", ".join(f"{name[:24]} {statistics.median(t[name][2] for t in tables):.1f}"
                     for name in top)
    return (f"{calls} calls back to back: a call every {period:.1f} us; spans "
            f"{statistics.median(spans):.1f} (median; {min(spans):.1f}-{max(spans):.1f}), idle "
            f"between calls {statistics.median(gaps) if gaps else 0.0:.1f}, launch gaps inside "
            f"a call {waits:.1f} (medians); adds per call: {adds}")


def attribute(events: list[tuple]) -> dict:
    """Kernel name -> ``[launches, µs of duration, µs added, µs waited]`` of one replay."""
    table: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    end = events[0][1] if events else 0.0
    for name, start, stop in events:
        row = table[name]
        row[0] += 1
        row[1] += stop - start
        row[2] += max(0.0, stop - max(start, end))
        row[3] += max(0.0, start - end)
        end = max(end, stop)
    return table


def report(label: str, runs: list[list[tuple]], top: int) -> None:
    runs = [r for r in runs if r] or [[]]  # a call CUPTI saw no kernel of adds nothing
    tables = [attribute(r) for r in runs]
    spans = [max(e[2] for e in r) - r[0][1] if r else 0.0 for r in runs]
    names = {n for t in tables for n in t}
    mean = {n: [statistics.mean(t[n][i] if n in t else 0.0 for t in tables) for i in range(4)]
            for n in names}
    added = sum(v[2] for v in mean.values())
    waited = sum(v[3] for v in mean.values())
    print(f"{label}: span {statistics.median(spans):.1f} us per replay (median of {len(runs)}; "
          f"{' '.join(f'{s:.1f}' for s in spans)}), kernels add {added:.1f}, gaps {waited:.1f}, "
          f"{sum(v[0] for v in mean.values()):.0f} launches")
    print(f"  {'adds':>8s} {'waits':>7s} {'duration':>9s} {'launches':>8s}  kernel")
    for name, (n, dur, add, wait) in sorted(mean.items(), key=lambda kv: -kv[1][2])[:top]:
        print(f"  {add:8.1f} {wait:7.1f} {dur / max(n, 1):9.2f} {n:8.0f}  {name[:80]}")


def main(argv=None) -> int:
    from tvm_stitch.benchmarks.harness import compile_tvm, run_tvm, tvm_device

    from tvm_stitch.cli import parse_options
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("-p", "--param", action="append", default=[])
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                        help="stitch options of one build (repeat: one build each)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float16")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--steady", type=int, default=0, metavar="N",
                        help="also profile N calls back to back (spans, idle time between "
                        "them) beside the VM's time_evaluator figure")
    args = parser.parse_args(argv)
    params = {k: int(v) for k, v in (p.split("=") for p in args.param)}
    inst = get_workload(args.workload).instance(args.dtype, **params)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    dev = tvm_device(target)
    for variant in args.variant or [""]:
        options = parse_options(variant, "--variant")
        vm, _, note = compile_tvm(inst, target, "stitch", options=options)
        vm_args, _ = run_tvm(vm, inst, dev)
        runs = replay_events(vm, inst.func, vm_args, args.replays)
        report(f"{inst.name} [{variant or 'defaults'}]{' ' + note if note else ''}", runs,
               args.top)
        if args.steady:
            from tvm_stitch.benchmarks.harness import time_tvm

            names = [e[0] for e in runs[-1]]  # a lone call's kernels, in order
            print(f"  time_evaluator {time_tvm(vm, inst.func, vm_args, dev):.1f} us; "
                  + steady_report(steady_events(vm, inst.func, vm_args, args.steady), names,
                                  args.steady))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
