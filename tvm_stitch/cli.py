"""Command line: ``tvm-stitch run | report | bench | build | check | list``
(also ``python -m tvm_stitch``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys


def parse_params(items: list[str]) -> dict:
    """``["batch=8", "seq=512"]`` (``-p`` flags) -> a workload's integer parameters; anything
    else exits with an error naming the item."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not value.lstrip("-").isdigit():
            raise SystemExit(f"error: -p expects KEY=INTEGER, got {item!r}")
        out[key] = int(value)
    return out


def _instance(args):
    from tvm_stitch.workloads import get_workload

    dtype = args.dtype or ("float16" if args.target == "cuda" else "float32")
    try:
        return get_workload(args.workload).instance(dtype, **parse_params(args.param))
    except (KeyError, TypeError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None


def _need_gpu(target: str) -> None:
    """Running on ``cuda`` needs a GPU; building does not (``tvm-stitch report --target cuda``)."""
    if target != "cuda":
        return
    import tvm

    if not tvm.cuda(0).exist:
        raise SystemExit(
            "error: --target cuda runs kernels and needs a CUDA GPU; on this machine use "
            "`tvm-stitch report WORKLOAD --target cuda` (builds only)"
        )


def cmd_report(args) -> int:
    from tvm_stitch.report import compare_pipelines

    inst = _instance(args)
    reports = compare_pipelines(inst.mod, args.target)
    if getattr(args, "json", False):
        print(
            json.dumps(
                {
                    "workload": inst.name,
                    "target": args.target,
                    **{k: r.to_dict() for k, r in reports.items()},
                },
                indent=1,
            )
        )
        return 0
    print(f"fusion report: {inst.name}")
    for report in reports.values():
        print(report.format())
    return 0


def cmd_run(args) -> int:
    """The main job: one workload through both pipelines, report, numerics and timing.

    On a CPU it first shows what the stitch pipeline builds for the GPU (recognition and
    planning need none), then checks both pipelines against PyTorch on llvm."""
    from tvm_stitch.benchmarks import bench_instance
    from tvm_stitch.benchmarks.harness import format_table, measure_limits
    from tvm_stitch.console import filtered_stderr, say, step
    from tvm_stitch.pipeline import as_target
    from tvm_stitch.report import compare_pipelines

    _need_gpu(args.target)
    inst = _instance(args)
    target = as_target(args.target)
    on_cpu = target.kind.name == "llvm"
    if on_cpu:
        from tvm_stitch.workloads import get_workload

        gpu = get_workload(args.workload).instance("float16", **parse_params(args.param))
        say(f"tvm-stitch run {args.workload}: this machine runs llvm, and tvm-stitch builds for "
            "NVIDIA GPUs. So it shows (1) what the stitch pipeline makes of the model for a GPU "
            "(sm_90a, planned here: no GPU needed), then (2) both pipelines' numbers against "
            "PyTorch on llvm.\n\n")
        with step(f"(1) planning {gpu.name} for CUDA"), filtered_stderr():
            reports = compare_pipelines(gpu.mod, "cuda")
        for report in reports.values():
            print(report.format())
        before, after = reports.get("default"), reports["stitch"]
        summary = (
            f"{before.kernels} kernels become {after.kernels}, {before.bytes / 1e6:.2f} MB of "
            f"estimated traffic become {after.bytes / 1e6:.2f} MB"
            if before
            else f"{after.kernels} kernels (TVM's default pipeline failed: see the warning)"
        )
        print(f"=> on the GPU: {summary}\n")
        label = f"(2) checking {inst.name} on llvm, both pipelines against PyTorch"
    else:
        cmd_report(args)
        label = f"timing {inst.name} on {args.target}"
    limits = measure_limits("cuda" if target.kind.name == "cuda" else "cpu")
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: comparing the two TVM pipelines with each other only")
        inst.torch_fns.clear()
    with step(label), filtered_stderr():
        records = bench_instance("run", inst, target, limits,
                                 torch_baselines=bool(inst.torch_fns))
    print(format_table(records))
    if on_cpu:
        say("\n\nThe llvm timings are not the point: the stitch pipeline's kernels are GPU "
            "kernels, and on a CPU it leaves the model to TVM's own CPU schedules. What llvm "
            "shows is that both pipelines compute the model's numbers. On a GPU host: "
            f"tvm-stitch run {args.workload} --target cuda; or build here and run there: "
            f"tvm-stitch build {args.workload} --target cuda -o DIR, then tvm-stitch check DIR "
            "(which needs only TVM's runtime).")
    ours = [r for r in records if r.impl.startswith("tvm-stitch")]
    bad = [r.impl for r in ours if r.correct is not True]
    if bad:
        print(f"error: {', '.join(bad)} failed or gave wrong results")
        return 1
    return 0


def parse_options(text: str, flag: str = "--variant") -> dict:
    """``fold_norms=false,tune=model`` (given to ``flag``) -> pipeline options (booleans and
    integers parsed, checked); a tuple option lists its items with ``+``
    (``mcfuser=gemm+attention``; ``mcfuser=none`` for the empty tuple)."""
    import dataclasses

    from tvm_stitch.config import PipelineOptions

    tuples = {f.name for f in dataclasses.fields(PipelineOptions) if f.type in ("tuple", tuple)}
    out = {}
    for item in filter(None, text.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: {flag} takes KEY=VALUE pairs, got {item!r}")
        low = value.lower()
        if key in tuples:
            out[key] = () if low == "none" else tuple(filter(None, value.split("+")))
            continue
        out[key] = {"true": True, "false": False}.get(low, int(value) if value.isdigit() else value)

    try:
        PipelineOptions.from_kwargs(**out)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    return out


def cmd_bench(args) -> int:
    from tvm_stitch.benchmarks import run_study

    _need_gpu(args.target)
    records = run_study(
        args.study,
        args.target,
        workloads=args.workload,
        params=parse_params(args.param),
        dtype=args.dtype,
        torch_baselines=not args.no_torch,
        json_out=args.json_out,
        variants=[parse_options(v) for v in args.variant or ()],
        graph=args.graph,
    )
    return 1 if any(r.correct is False for r in records if r.impl.startswith("tvm")) else 0


def cmd_build(args) -> int:
    """Compile a workload (no GPU needed for ``--target cuda``) and save it for ``check``."""
    import time

    import tvm

    from tvm_stitch import library, pipeline
    from tvm_stitch.pipeline import as_target

    inst = _instance(args)
    target = as_target(args.target)
    start = time.perf_counter()
    graphs = {"relax.backend.use_cuda_graph": target.kind.name == "cuda"}
    with tvm.transform.PassContext(config=graphs):
        ex = tvm.compile(inst.mod, target, relax_pipeline=pipeline(target))
    seconds = time.perf_counter() - start
    folder = library.save(ex, args.output, inst, target, args.workload, parse_params(args.param),
                          compile_s=seconds)
    print(f"{inst.name}: compiled for {args.target} in {seconds:.1f} s, saved to {folder}")
    print(f"run it where the device is: tvm-stitch check {folder}")
    return 0


def cmd_check(args) -> int:
    """Load a folder written by ``build``, run it, compare with its references, time it."""
    from tvm_stitch import library

    try:
        res = library.check(args.folder)
    except (ValueError, RuntimeError) as err:
        raise SystemExit(f"error: {err}") from None
    print(
        f"{res['workload']}: {res['time_us']:.1f} us, max error {res['max_err']}, "
        f"{'correct' if res['correct'] else 'WRONG' if res['correct'] is False else 'unchecked'}"
    )
    return 1 if res["correct"] is False else 0


def cmd_list(_args) -> int:
    from tvm_stitch.benchmarks import STUDIES
    from tvm_stitch.workloads import WORKLOADS

    for w in WORKLOADS.values():
        shape = " ".join(f"{k}={v}" for k, v in w.defaults.items())
        print(f"{w.name:15s} {w.family:11s} {shape:40s} {w.description}")
    print(f"studies: {', '.join(STUDIES)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tvm-stitch", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log the passes' analyses")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, workload_required=True):
        if workload_required:
            p.add_argument("workload", help="workload name (see `tvm-stitch list`)")
        p.add_argument("--target", choices=["llvm", "cuda"], default="llvm")
        p.add_argument(
            "--dtype",
            choices=["float32", "float16", "bfloat16"],
            help="default: float16 on cuda, float32 on llvm",
        )
        p.add_argument(
            "-p",
            "--param",
            action="append",
            metavar="KEY=VALUE",
            help="shape parameter, e.g. -p batch=8 -p seq=512",
        )

    p = sub.add_parser(
        "run",
        help="compile a workload (default bert-tiny) through the stitch and "
        "default pipelines: fusion report, numerics, timing",
    )
    p.add_argument("workload", nargs="?", default="bert-tiny")
    common(p, workload_required=False)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="fusion report of the default and stitch pipelines")
    common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("bench", help="run a benchmark study")
    p.add_argument("study", help="bert, memory, gemm-chains or attention")
    common(p, workload_required=False)
    p.add_argument("-w", "--workload", action="append", help="only this workload (repeatable)")
    p.add_argument("--json-out", metavar="FILE", help="append JSON lines to FILE")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch baselines")
    p.add_argument("--variant", action="append", metavar="KEY=VALUE[,KEY=VALUE]",
                   help="also the stitch pipeline with these options, e.g. fold_norms=false")
    p.add_argument("--graph", action="store_true",
                   help="also time the TVM builds as CUDA-graph replays, as PyTorch is timed")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser(
        "build",
        help="compile a workload and save executable, inputs and references to a folder "
        "(for --target cuda no GPU is needed; run it with `check` on the GPU host)",
    )
    common(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder to write")
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("check", help="run a folder saved by `build`: numerics and time")
    p.add_argument("folder")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("list", help="list workloads and studies")
    p.set_defaults(func=cmd_list)

    args = parser.parse_args(argv)
    from tvm_stitch.console import quiet_warnings

    quiet_warnings()
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s"
    )
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
