"""Two builds of the stitch pipeline (two versions of tvm-stitch) timed in the same run.

    python benchmarks/studies/same_run.py build DIR [CASE ...]     # with one version importable
    python benchmarks/studies/same_run.py time DIR_A DIR_B [--rounds 3]

``build`` compiles each case (``WORKLOAD[:KEY=VALUE,...]``, float16, CUDA; default: BERT-base at
1×128, 8×512, 32×128 and the zoo's GPU cases) with the stitch pipeline as ``tvm-stitch bench``
does (Relax's CUDA graph on) and exports each library to DIR. ``time`` loads the libraries of
both folders in one process, checks each against the workload's float32 PyTorch reference and
times them alternately on one GPU (TVM's ``time_evaluator``, the median of ``--rounds``
alternations), so the figures share the GPU, its clocks and the process. Used to check that a
refactor left the kernels' speed where it was.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CASES = [
    "bert-base:batch=1,seq=128",
    "bert-base:batch=8,seq=512",
    "bert-base:batch=32,seq=128",
    "hf-bert-base:batch=1,seq=128",
    "gpt2-base:batch=1,seq=256",
    "llama-base:batch=1,seq=256",
    "vit-base:batch=1",
    *(f"torch-attention:batch=4,heads=16,seq=512,dim={d},causal={c}"
      for d in (64, 128) for c in (0, 1)),
]


def _instance(case: str):
    from tvm_stitch.workloads import get_workload

    name, _, spec = case.partition(":")
    params = {k: int(v) for k, v in (kv.split("=") for kv in spec.split(",") if kv)}
    return get_workload(name).instance("float16", **params)


def _file(case: str) -> str:
    return case.replace(":", "_").replace(",", "_").replace("=", "") + ".so"


def build(folder: Path, cases: list[str]) -> None:
    import tvm

    import tvm_stitch

    folder.mkdir(parents=True, exist_ok=True)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    for case in cases:
        inst = _instance(case)
        start = time.perf_counter()
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True}):
            ex = tvm.compile(inst.mod, target, relax_pipeline=tvm_stitch.pipeline(target))
        ex.export_library(str(folder / _file(case)))
        print(json.dumps({"case": case, "compile_s": round(time.perf_counter() - start, 1)}),
              flush=True)


def _time(vm, func, args, dev) -> float:
    import numpy as np

    vm[func](*args)
    dev.sync()
    result = vm.time_evaluator(func, dev, number=20, repeat=10, min_repeat_ms=50)(*args)
    return float(np.median(result.results)) * 1e6


def time_both(a: Path, b: Path, cases: list[str], rounds: int) -> None:
    import numpy as np
    import tvm
    from tvm.runtime.vm import VirtualMachine
    from tvm_stitch.benchmarks.harness import compare

    import tvm_stitch  # noqa: F401 - the hook that loads Triton PTX
    from tvm_stitch.library import prepare_args

    dev = tvm.cuda(0)
    print(f"{'case':58s} {'A us':>9s} {'B us':>9s} {'B/A':>6s}  max err A / B")
    for case in cases:
        if not (a / _file(case)).exists() or not (b / _file(case)).exists():
            print(f"{case:58s} missing a build")
            continue
        inst = _instance(case)
        ref = inst.reference()
        runs = {}
        for side, folder in (("A", a), ("B", b)):
            vm = VirtualMachine(tvm.runtime.load_module(str(folder / _file(case))), dev)
            args = prepare_args(vm, inst.func, [tvm.runtime.tensor(x, device=dev)
                                                for x in inst.args], None)
            out = vm[inst.func](*args)
            outs = list(out) if type(out).__name__ in ("Array", "list", "tuple") else [out]
            err, ok = compare([o.numpy() for o in outs], ref, inst.tolerance)
            runs[side] = (vm, args, err, ok, [])
        for _ in range(rounds):
            for vm, args, _, _, times in runs.values():
                times.append(_time(vm, inst.func, args, dev))
        ta = statistics.median(runs["A"][4])
        tb = statistics.median(runs["B"][4])
        errs = " / ".join(f"{r[2]:.1e}{'' if r[3] else ' WRONG'}" for r in runs.values())
        print(f"{case:58s} {ta:9.1f} {tb:9.1f} {tb / ta:6.3f}  {errs}", flush=True)
        print(json.dumps({"case": case, "a_us": ta, "b_us": tb, "a_times": runs["A"][4],
                          "b_times": runs["B"][4], "a_err": runs["A"][2],
                          "b_err": runs["B"][2], "ok": bool(runs["A"][3] and runs["B"][3]),
                          "finite": bool(np.isfinite([ta, tb]).all())}), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build")
    p.add_argument("folder", type=Path)
    p.add_argument("cases", nargs="*")
    p = sub.add_parser("time")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("cases", nargs="*")
    p.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.folder, args.cases or CASES)
    else:
        time_both(args.a, args.b, args.cases or CASES, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
