"""Study: an attention's float16 logits rounded two values an instruction, or one at a time.

    python -m tvm_stitch.benchmarks.paired_rounding [-p batch=8 -p seq=512] [--model bert-base]

BERT rounds its logits to float16 (``(q·kᵀ).half() · 0.125 + mask``) every key block.  Triton
3.6 rounds a float32 tile one value at a time (``cvt.rn.f16.f32``) and ptxas joins the halves
with a ``PRMT`` each; the generated attention now rounds pairs (``cvt.rn.f16x2.f32``,
:func:`tvm_stitch.codegen.triton_kernels._cvt_f16x2`).  This times both forms of the model's
attention kernel, same inputs and process, at four of the tilings the search offers,
CUDA-graph replays, and checks their outputs are the same bits.  For deciding the printer's
form, not a benchmark of the pipeline (``tvm-stitch bench bert`` is).
"""

from __future__ import annotations

import argparse


def main(argv=None) -> int:
    import torch
    import tvm

    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen.triton_gen import attention_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.hardware import HardwareModel
    from tvm_stitch.pipeline import run_until
    from tvm_stitch.tune.kernels import generated_runner
    from tvm_stitch.tune.measure import time_torch
    from tvm_stitch.workloads import get_workload

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("-p", "--param", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--tiles", default="64,64,4,3;64,64,4,2;128,64,8,3;64,128,4,3",
                        help="BLOCK_M,BLOCK_N,warps,stages;...")
    args = parser.parse_args(argv)
    params = {k: int(v) for k, v in (p.split("=", 1) for p in args.param)}
    params = params or {"batch": 8, "seq": 512}
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    hw = HardwareModel.from_target(target)
    inst = get_workload(args.model).instance("float16", **params)
    graph = build_graph(run_until(inst.mod, target, "StitchFuseMBCI"), legalize=False)
    match = recognize(graph, ("attention",)).matches[0]
    forms = {}
    for paired in (True, False):
        source = attention_source(match, f"stitch_paired_study_{int(paired)}", paired=paired)
        shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
                  for t in [*source.inputs, *source.outputs]}
        forms[paired] = (source, generated_runner(match, source, shapes, hw=hw))
    for a, b in zip(forms[True][1].inputs, forms[False][1].inputs):
        b.copy_(a)  # the same inputs
    print(f"{match.describe()} ({torch.cuda.get_device_name()}), µs a launch")
    print(f"{'tiles':>16} {'pairs':>8} {'one at a time':>14} {'ratio':>6}  same bits")
    for spec in args.tiles.split(";"):
        bm, bn, warps, stages = (int(x) for x in spec.split(","))
        config = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        if forms[True][0].tma:
            config["TMA"] = False
        times, outs = {}, {}
        for _ in range(2):  # in turns: the clock moves between them alike
            for paired, (_, run) in forms.items():
                fn = run(config)
                times.setdefault(paired, []).append(time_torch(fn, (), "cuda"))
                torch.cuda.synchronize()
                outs[paired] = [o.clone() for o in run.outputs]
        t1, t0 = min(times[True]), min(times[False])
        same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(outs[True], outs[False]))
        print(f"{spec:>16} {t1:8.2f} {t0:14.2f} {t0 / t1:6.3f}  {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
