"""Each implementation of a workload run alone for seconds, as a service runs it: its time per
call once the clock has settled, with the SM clock, power and energy per call that NVML reads
meanwhile (issue 49). Under a sustained load the H200 holds its 700 W limit by lowering its
clock, so an implementation that draws more power runs at a lower clock; the bench's turns
(40 ms each) are too short to tell which implementation the clock is lowered for.

    python3 benchmarks/studies/sustained.py -w llama-8b -p batch=4 -p seq=512 \\
        [--option lift_params=true] [--seconds 3] [--rounds 2] [--idle 2] [--graph]

Implementations: tvm-stitch (built with ``--option``'s options, timed in the VM's loop, or as
CUDA-graph replays with ``--graph``) and torch.compile (CUDA-graph replays). Each round runs
each implementation alone for ``--seconds`` in chunks of 50 ms, with the GPU idle for ``--idle``
seconds before each. A thread samples NVML every 5 ms. Printed per run:

* ``first``: the first chunk's µs per call (the GPU cool, its clock high);
* ``settled``: the median µs per call of the chunks of the last second;
* the median SM clock and the share of samples with the power cap among the clock's event
  reasons, over the last second;
* the power (the energy counter's increase over the last second) and the energy per call.
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    import torch
    import tvm
    from tvm_stitch.benchmarks.harness import (
        PowerMeter,
        Sampler,
        compare,
        compile_tvm,
        run_tvm,
        sustained,
        time_tvm,
        torch_outputs,
        torch_timer,
        tvm_graph_timer,
    )

    from tvm_stitch.cli import parse_options, parse_params
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-w", "--workload", required=True)
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--option", default="", help="the stitch build's options (k=v,...)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--graph", action="store_true",
                        help="time the stitch build as CUDA-graph replays")
    args = parser.parse_args(argv)
    params = parse_params(args.param)
    options = parse_options(args.option, "--option")
    meter = PowerMeter.open()
    if meter is None:
        raise SystemExit("error: NVML's energy counter cannot be read here (no GPU?)")

    inst = get_workload(args.workload).instance(args.dtype, **params)
    refs = inst.reference()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    timers = {}
    vm, _, _ = compile_tvm(inst, target, "stitch", use_cuda_graph=not args.graph,
                           options=options)
    dev = tvm.cuda(0)
    dargs, outs = run_tvm(vm, inst, dev)
    err, ok = compare(outs, refs, inst.tolerance)
    label = "tvm-stitch" + (f"[{args.option}]" if args.option else "")
    print(f"{label}: max error {err:.1e} {'ok' if ok else 'WRONG'}", flush=True)
    timers[label] = (tvm_graph_timer(vm, inst.func, dargs) if args.graph else
                     lambda budget, vm=vm, a=dargs: time_tvm(vm, inst.func, a, dev, budget))
    tdtype = getattr(torch, args.dtype)
    fn = torch.compile(inst.torch_fns.get("sdpa", inst.torch_fns["eager"])("cuda", tdtype))
    targs = inst.torch_args("cuda", tdtype)
    err, ok = compare(torch_outputs(fn, targs), refs, inst.tolerance)
    print(f"torch-compile: max error {err:.1e} {'ok' if ok else 'WRONG'}", flush=True)
    timers["torch-compile"] = torch_timer(fn, targs, "cuda")

    sampler = Sampler(meter)
    sampler.start()
    rows = []
    print(f"{'round':>5s}  {'impl':34s} {'first us':>9s} {'settled us':>10s} {'MHz':>6s} "
          f"{'capped':>6s} {'W':>6s} {'mJ/call':>8s}")
    for r in range(args.rounds):
        for name, timer in timers.items():
            time.sleep(args.idle)
            row = {"round": r, "impl": name, **sustained(timer, args.seconds, sampler)}
            rows.append(row)
            print(f"{r:5d}  {name:34s} {row['first_us']:9.1f} {row['us']:10.1f} "
                  f"{row.get('mhz') or 0:6.0f} {row.get('capped') or 0:6.2f} "
                  f"{row.get('watts') or 0:6.0f} {row.get('mj') or 0:8.3f}", flush=True)
    sampler.stop()
    step = sampler.counter_step()
    print(f"energy counter step: {step * 1e3:.1f} ms" if step else "energy counter: no steps")
    for name in timers:
        settled = [row["us"] for row in rows if row["impl"] == name]
        print(f"{name}: settled {statistics.median(settled):.1f} us (median of rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
