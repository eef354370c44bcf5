"""FusionStitching's latency-evaluator against the GPU: every candidate plan of each memory
pattern, built and timed as a bare kernel.

    python -m tvm_stitch.benchmarks.stitch_plans [--dtype float16] [--top 8] [--json-out F]
        [-w WORKLOAD ...]

For each memory pattern of the benchmark study (``memory`` on CUDA) the stitched PrimFunc is
taken after ``FuseTIR``; its candidate plans (:func:`tvm_stitch.stitch.plan.candidate_plans`,
cheapest estimate first, at most ``--top``; for column patterns
:func:`tvm_stitch.stitch.columns.column_plans`, and a spread over the rest) are applied, built
for the GPU in parallel and timed with the kernel's own ``time_evaluator`` (no VM, no Relax
call).  Printed per pattern: estimate and measurement per plan; the measured time of the plan
the evaluator picks over the best measured one; the rank correlation of estimates and
measurements.  Needs a GPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os

import numpy as np
import tvm

from tvm_stitch.cost.model import spearman
from tvm_stitch.errors import error_line
from tvm_stitch.graph.classify import OpKind
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.pipeline import phases
from tvm_stitch.stitch.columns import ColumnPlan, apply_column_plan, column_plans, is_column_pattern
from tvm_stitch.stitch.plan import candidate_plans, pattern_ops
from tvm_stitch.stitch.schedule import apply_plan
from tvm_stitch.workloads import get_workload

from .bench import MEMORY_SHAPES_GPU

TARGET = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _label(plan, reductions=frozenset()) -> str:
    """Short form of a plan; ``keep`` names the sub-roots that are not ``reductions``."""
    if isinstance(plan, ColumnPlan):
        rows = f"x{plan.rows}r" if plan.rows > 1 else ""
        return f"column P={plan.chunks} {plan.threads}t{rows} v{plan.vector}"
    if plan.composition == "thread":
        return f"thread {plan.threads}t v{plan.vector}"
    keep = [s for s in plan.subroots if s not in reductions]
    return (
        f"{plan.composition} {plan.threads}t x{plan.rows_per_block} v{plan.vector}"
        f"{' cached' if plan.cached else ''}{' keep ' + ','.join(keep) if keep else ''}"
    )


def pattern_funcs(inst):
    """The stitched (or elementwise) PrimFuncs of a workload, unscheduled."""
    seq = [
        p
        for name, group in phases(TARGET, "stitch")
        if name in ("dispatch", "fusion")
        for p in group
        if p.info.name != "StitchSchedule"
    ]
    with TARGET:
        mod = tvm.transform.Sequential(seq)(inst.mod)
    out = []
    for gv, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            out.append((gv.name_hint, func))
    return out


def _build(func, plan):
    if isinstance(plan, ColumnPlan):
        scheduled = apply_column_plan(func, plan, gpu=True)
    else:
        scheduled = apply_plan(func, plan, gpu=True)
    scheduled = scheduled.with_attr("global_symbol", "main")
    params = [[int(d) for d in p.ty.shape] for p in scheduled.params]
    dtypes = [str(p.ty.dtype) for p in scheduled.params]
    return tvm.compile(tvm.IRModule({"main": scheduled}), target=TARGET), params, dtypes


def _plans(func, hw, top):
    """The plans measured: the ``top`` cheapest estimates; for a column pattern also a
    spread over the rest (every kind of plan, for the rank correlation)."""
    if is_column_pattern(func):
        plans = column_plans(func, hw)
        step = max(1, (len(plans) - top) // 24)
        return plans[:top] + plans[top::step]
    return [p for p in candidate_plans(func, hw) if math.isfinite(p.latency_us)][:top]


def sweep(dtype: str, top: int, hw: HardwareModel, only=()) -> list[dict]:
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    results = []
    for name, kw in MEMORY_SHAPES_GPU:
        if only and name not in only:
            continue
        inst = get_workload(name).instance(dtype, **kw)
        for fname, func in pattern_funcs(inst):
            try:
                plans = _plans(func, hw, top)
            except Exception:  # noqa: BLE001 - not a pattern the planner handles
                continue
            if not fname.startswith("stitched_") and plans[0].composition != "thread":
                continue
            reductions = (
                set(plans[0].reductions)
                if isinstance(plans[0], ColumnPlan)
                else {o.name for o in pattern_ops(func)[0] if o.kind is OpKind.ROW_REDUCE}
            )
            with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 4) as pool:
                built = list(pool.map(lambda p, f=func: _try_build(f, p), plans))
            rows = []
            for plan, rt in zip(plans, built):
                if isinstance(rt, str):
                    rows.append((plan, math.nan, rt))
                    continue
                lib, shapes, dtypes = rt
                args = [
                    tvm.runtime.tensor(rng.standard_normal(shape).astype(dt), dev)
                    for shape, dt in zip(shapes, dtypes)
                ]
                timer = lib.mod.time_evaluator("main", dev, number=100, repeat=7)
                rows.append((plan, timer(*args).median * 1e6, ""))
            measured = [r[1] for r in rows if math.isfinite(r[1])]
            best = min(measured) if measured else math.nan
            est = [r[0].latency_us for r in rows if math.isfinite(r[1])]
            rec = {
                "workload": f"{name} {'x'.join(str(v) for v in kw.values())} {dtype}",
                "func": fname,
                "chosen_us": rows[0][1],
                "best_us": best,
                "chosen_over_best": rows[0][1] / best if best else math.nan,
                "spearman": spearman(est, measured),
                "plans": [
                    {"plan": _label(p, reductions), "est_us": p.latency_us, "us": t, "error": e}
                    for p, t, e in rows
                ],
            }
            results.append(rec)
            print(
                f"\n{rec['workload']} ({fname}): chosen {rec['chosen_us']:.2f} us, best "
                f"{best:.2f} us ({rec['chosen_over_best']:.2f}x), spearman {rec['spearman']:.2f}"
            )
            for p, t, e in rows:
                label = _label(p, reductions)
                print(f"  {label:42s} est {p.latency_us:7.1f}  measured {t:7.2f}  {e}")
    return results


def _try_build(func, plan):
    try:
        return _build(func, plan)
    except Exception as err:  # noqa: BLE001 - reported next to the plan
        return f"build failed: {type(err).__name__}: {error_line(err)[:80]}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    parser.add_argument("--top", type=int, default=8, help="plans per pattern, cheapest first")
    parser.add_argument("--json-out", help="append one JSON line per pattern")
    parser.add_argument("-w", "--workload", action="append", default=[], help="only these")
    args = parser.parse_args(argv)
    results = sweep(args.dtype, args.top, HardwareModel.from_target(TARGET), args.workload)
    ratios = [r["chosen_over_best"] for r in results if math.isfinite(r["chosen_over_best"])]
    if ratios:
        geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        print(f"\nchosen plan over best measured plan: geomean {geo:.2f}x, max {max(ratios):.2f}x")
    if args.json_out:
        with open(args.json_out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
