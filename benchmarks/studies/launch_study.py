"""How TVM's own kernels are launched, compared in one process: BERT-base (``lift_params``)
compiled three times and timed in turns, so clock drift between processes does not decide.

    python benchmarks/studies/launch_study.py [8x512 32x128 1x128] [--rounds 4]

``plain``: TVM's kernels launched as TVM launches them; ``one-wave`` (the pipeline's choice,
:class:`~tvm_stitch.passes.LaunchDependently`): those of at most one block per SM launched
dependently; ``all``: every one of them.  The generated kernels are launched dependently in all
three.
"""

from __future__ import annotations

import argparse

import tvm


def main(argv=None) -> int:
    from tvm_stitch.benchmarks.harness import compile_tvm, run_tvm, time_tvm, tvm_device
    from tvm_stitch.passes import launch

    from tvm_stitch.codegen.dependent import dependent_kernels
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=["8x512", "32x128", "1x128"])
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    dev = tvm_device(target)
    modes = {
        "plain": lambda func, release, blocks: None,
        "one-wave": dependent_kernels,
        "all": lambda func, release, blocks: dependent_kernels(func, release),
    }
    chosen = launch.dependent_kernels
    for shape in args.shapes:
        batch, seq = map(int, shape.split("x"))
        inst = get_workload("bert-base").instance("float16", batch=batch, seq=seq)
        vms = {}
        try:
            for name, fn in modes.items():
                launch.dependent_kernels = fn  # what the pass calls for each PrimFunc
                vm, _, _ = compile_tvm(inst, target, "stitch", options={"lift_params": True})
                vms[name] = (vm, run_tvm(vm, inst, dev)[0])
        finally:
            launch.dependent_kernels = chosen
        times = {name: [] for name in vms}
        for _ in range(args.rounds):
            for name, (vm, vm_args) in vms.items():
                times[name].append(time_tvm(vm, inst.func, vm_args, dev))
        for name, ts in times.items():
            ordered = sorted(ts)
            print(f"bert-base {shape} {name:9s} median {ordered[len(ts) // 2]:8.1f} us  "
                  f"rounds {' '.join(f'{t:.1f}' for t in ts)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
