"""How well the cost model ranks and chooses (issue 11's model targets).

Offline, from tuning databases recorded on the GPU (every candidate the search measured is kept)::

    python -m tvm_stitch.benchmarks.model_study --db a.json --db b.json

For each database, every kernel's measured candidates are predicted by the analytical model and
by the model corrected on the *other* databases (never on the one predicted), and the Spearman
rank correlation of prediction and measurement is printed per kernel and pooled over the
compile, with the measured time of the model's favourite over the best measured.

The model-only choice against the measured search's: the model (corrected on ``--train``) picks
tiles and launch for each GEMM of a workload, generated as the pipeline generates it, on any
machine; on the GPU host both configurations of the same kernel are timed back to back, the
measured choice read from ``--db``::

    python -m tvm_stitch.benchmarks.model_study --choose bert-base -p batch=8 -p seq=512 \\
        --train a.json --choices choices.json
    python -m tvm_stitch.benchmarks.model_study --measure bert-base -p batch=8 -p seq=512 \\
        --choices choices.json --db b.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

import tvm

from tvm_stitch.cost.model import CostModel, Workload, analytical, samples, spearman
from tvm_stitch.hardware import HardwareModel

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _records(path) -> dict:
    return json.loads(open(path).read())["records"]


def rank_study(paths, hw) -> list[dict]:
    """Per kernel of each database: Spearman of the analytical and the corrected model, and the
    model's favourite's measured time over the best measured."""
    dbs = {p: _records(p) for p in paths}
    rows = []
    for path, records in dbs.items():
        model = CostModel(hw)
        model.fit([s for other, r in dbs.items() if other != path for s in samples(r, hw.arch)])
        pooled = {"analytical": [], "corrected": [], "measured": []}
        for rec in records.values():
            ms = [m for m in rec.get("measurements", ()) if math.isfinite(m["time_s"])]
            if len(ms) < 3:
                continue
            w = Workload.from_dict(rec["workload"])
            meas = [m["time_s"] for m in ms]
            ana = [analytical(w, m["tiles"], m["launch"], hw) for m in ms]
            fit = [model.predict(w, m["tiles"], m["launch"]) for m in ms]
            pooled["analytical"] += ana
            pooled["corrected"] += fit
            pooled["measured"] += meas
            rows.append(
                {
                    "db": path,
                    "kernel": rec["workload"].get("kernel", "?"),
                    "n": len(ms),
                    "analytical": spearman(ana, meas),
                    "corrected": spearman(fit, meas),
                    "pick_analytical": meas[ana.index(min(ana))] / min(meas),
                    "pick_corrected": meas[fit.index(min(fit))] / min(meas),
                    "top8_analytical": _best_of_top(ana, meas, 8),
                    "top8_corrected": _best_of_top(fit, meas, 8),
                    "corrected_on": model.fitted_on,
                }
            )
        rows.append(
            {
                "db": path,
                "kernel": "(pooled)",
                "n": len(pooled["measured"]),
                "analytical": spearman(pooled["analytical"], pooled["measured"]),
                "corrected": spearman(pooled["corrected"], pooled["measured"]),
                "corrected_on": model.fitted_on,
            }
        )
    return rows


def _best_of_top(pred, meas, k) -> float:
    """The best measured time among the ``k`` candidates ``pred`` ranks first, over the best
    measured at all: what one round of the search (which measures the model's top ``k``)
    would have found."""
    top = sorted(range(len(pred)), key=pred.__getitem__)[:k]
    return min(meas[i] for i in top) / min(meas)


def _gemm_kernels(workload, params, hw):
    """``(key, match, source, shapes)`` of each GEMM kernel the pipeline generates for
    ``workload`` (recognized with every family, as the pass does)."""
    from tvm_stitch.analysis.recognize import FAMILIES, recognize
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until
    from tvm_stitch.tune.database import TuningDatabase
    from tvm_stitch.tune.policy import tuning_key
    from tvm_stitch.workloads import get_workload

    inst = get_workload(workload).instance("float16", **params)
    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    keys = TuningDatabase.__new__(TuningDatabase)  # only its key()
    seen = {}
    for match in recognize(graph, FAMILIES).matches:
        if match.family != "gemm":
            continue
        source = kernel_source(match)
        shapes = {
            t: (graph.tensors[t].shape, graph.tensors[t].dtype)
            for t in [*source.inputs, *source.outputs]
        }
        seen.setdefault(tuning_key(keys, match, source, hw), (match, source, shapes))
    return seen


def choose(workload, params, train, hw) -> dict:
    """The cost model's choice (corrected on ``train``) for each GEMM kernel: key -> config."""
    from tvm_stitch.tune.kernels import tune_generated

    model = CostModel(hw)
    model.fit([s for p in train for s in samples(_records(p), hw.arch)])
    return {
        key: tune_generated(match, source, shapes, hw=hw, on_device=False, cost=model).config
        for key, (match, source, shapes) in _gemm_kernels(workload, params, hw).items()
    }


def measure_study(workload, params, choices, db_path, hw) -> list[dict]:
    """The model's choices (:func:`choose`, possibly made on another machine) against the
    measured search's from ``db_path``, timed back to back (needs the GPU)."""
    from tvm_stitch.tune.database import TuningDatabase
    from tvm_stitch.tune.kernels import generated_runner

    db = TuningDatabase(db_path)
    rows = []
    for key, (match, source, shapes) in _gemm_kernels(workload, params, hw).items():
        rec = db.get(key)
        if rec is None or key not in choices:
            print(f"{match.describe()}: no measured or no model choice; skipped")
            continue
        run = generated_runner(match, source, shapes, hw=hw)
        times, used = {}, {}
        for name, config in (("measured", rec["config"]), ("model", choices[key])):
            times[name], used[name] = _time_as_built(run, config)
        rows.append(
            {
                "kernel": match.describe(),
                "measured_config": used["measured"],
                "model_config": used["model"],
                "measured_us": times["measured"],
                "model_us": times["model"],
                "ratio": times["model"] / times["measured"],
            }
        )
    return rows


def _time_as_built(run, config) -> tuple[float, dict]:
    """Microseconds of ``run(config)`` and the config timed: with fewer pipeline stages while
    the kernel needs more shared memory than a block has, as the pass builds it."""
    from tvm_stitch.tune.measure import time_torch

    while True:
        try:
            return time_torch(run(config), [], "cuda", budget_ms=100), config
        except Exception as err:  # Triton's OutOfResources (re-raised otherwise)
            if "shared memory" not in str(err) or config.get("num_stages", 3) <= 1:
                raise
            config = {**config, "num_stages": config.get("num_stages", 3) - 1}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", action="append", default=[], help="tuning database file")
    parser.add_argument("--choose", metavar="WORKLOAD", help="write the model's choices")
    parser.add_argument("--measure", metavar="WORKLOAD", help="time model vs measured choices")
    parser.add_argument("--choices", metavar="FILE", help="the model's choices (--choose)")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--train", action="append", default=[], help="databases to correct on")
    parser.add_argument("--json-out", metavar="FILE")
    args = parser.parse_args(argv)
    hw = HardwareModel.from_target(CUDA)
    params = {k: int(v) for k, v in (p.split("=") for p in args.param)}
    if args.choose:
        choices = choose(args.choose, params, args.train, hw)
        with open(args.choices, "w") as f:
            json.dump(choices, f, indent=1)
        for key, config in choices.items():
            print(key.split("|")[0], config)
        return 0
    if args.measure:
        choices = json.loads(open(args.choices).read())
        rows = measure_study(args.measure, params, choices, args.db[0], hw)
        for r in rows:
            print(
                f"{r['kernel']:48s} measured {r['measured_us']:7.1f} us  model "
                f"{r['model_us']:7.1f} us  ({r['ratio']:.2f}x)  model {r['model_config']}"
            )
        if rows:
            geo = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rows))
            print(
                f"model-only over measured: geomean {geo:.3f}x, worst "
                f"{max(r['ratio'] for r in rows):.2f}x"
            )
    else:
        rows = rank_study(args.db, hw)
        for r in rows:
            picks = ""
            if "pick_analytical" in r:
                picks = (
                    f"  favourite/best: analytical {r['pick_analytical']:.2f}x, "
                    f"corrected {r['pick_corrected']:.2f}x; best of top 8: "
                    f"{r['top8_analytical']:.2f}x, {r['top8_corrected']:.2f}x"
                )
            print(
                f"{r['db'].rsplit('/', 1)[-1]:22s} {r['kernel'][:46]:46s} n={r['n']:4d}  "
                f"spearman analytical {r['analytical']:5.2f} corrected {r['corrected']:5.2f}"
                + picks
            )
    if args.json_out:
        with open(args.json_out, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
