"""Weights bound into the module as constants against weights as parameters, same process.

    python benchmarks/studies/bound_weights.py bert-base -p batch=8 -p seq=512

A TVM user who deploys fixed weights binds them (``relax.transform.BindParams``) before
``tvm.compile``; the stitch pipeline then joins a banded GEMM's constants (Q, K and V) at
compile time, as ``lift_params`` joins parameters in ``<func>_transform_params``. Times (µs, the
VM's ``time_evaluator`` on a CUDA-graph build) and the error against the workload's reference
for: weights as parameters (default options), as parameters with ``lift_params``, and bound.
"""

from __future__ import annotations

import argparse

import tvm
from tvm_stitch.benchmarks.harness import bound, compare, compile_tvm, run_tvm, time_tvm, tvm_device


def main(argv=None) -> int:
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    params = {k: int(v) for k, v in (p.split("=") for p in args.param)}
    inst = get_workload(args.workload).instance(args.dtype, **params)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    dev = tvm_device(target)
    ref = inst.reference()
    builds = [("parameters", inst, {}), ("parameters, lift_params", inst, {"lift_params": True}),
              ("bound constants", bound(inst), {})]
    for label, case, options in builds:
        vm, seconds, note = compile_tvm(case, target, "stitch", options=options)
        vm_args, outs = run_tvm(vm, case, dev)
        err, ok = compare(outs, ref, inst.tolerance)
        print(f"{inst.name} {label:26s} {time_tvm(vm, case.func, vm_args, dev):9.1f} us  "
              f"max err {err:.1e} {'ok' if ok else 'WRONG'}  build {seconds:.0f} s {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
