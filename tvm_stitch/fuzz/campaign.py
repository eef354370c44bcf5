"""A seeded fuzzing campaign over many processes (``python -m tvm_stitch.fuzz``).

Prints one line per failure and a summary (programs, how many were float16, how many reduce
without ``keepdims``, outcomes by status); with ``--out DIR`` writes each failure, shrunk, to
``DIR/failures.jsonl`` and its TVMScript to ``DIR/<seed>.py``.  Exits 1 when any program failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import time
from pathlib import Path


def _quiet() -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("tvm_stitch").setLevel(logging.WARNING)


def _one(task):
    seed, opts = task
    _quiet()
    from tvm_stitch.fuzz import check, generate

    program = generate(seed, opts["dtype"])
    start = time.time()
    try:
        outcome = check(program, cuda=opts["cuda"], gpu=opts["gpu"], nvcc=opts["nvcc"])
        status, detail = outcome.status, outcome.detail
    except Exception as err:  # noqa: BLE001 - the checker itself failed: report, go on
        status, detail = "checker", repr(err)[:500]
    return {
        "seed": seed,
        "status": status,
        "detail": detail,
        "seconds": round(time.time() - start, 2),
        "dtype": program.dtype,
        "reduces": program.has_reduction,
        "no_keepdims": program.reduces_without_keepdims,
        "program": program.to_json(),
    }


def _shrink(row: dict, opts: dict) -> dict:
    """``row`` with its program shrunk to a reproducer of the same status."""
    from tvm_stitch.fuzz import Program, check, minimize

    program = Program.from_json(row["program"])

    def fails(p):
        return check(p, cuda=opts["cuda"], gpu=opts["gpu"], nvcc=opts["nvcc"]).status == \
            row["status"]

    small = minimize(program, fails, budget=opts["budget"])
    outcome = check(small, cuda=opts["cuda"], gpu=opts["gpu"], nvcc=opts["nvcc"])
    return {**row, "minimized": small.to_json(), "minimized_detail": outcome.detail,
            "describe": small.describe(), "script": small.module().script()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_stitch.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=200, help="programs (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    parser.add_argument("--jobs", type=int, default=max(1, multiprocessing.cpu_count()),
                        help="processes (default: one per core)")
    parser.add_argument("--dtype", choices=("float32", "float16"), default=None,
                        help="every program in this dtype (default: 40%% float16)")
    parser.add_argument("--cuda", action="store_true",
                        help="also build for sm_90a here and compile its CUDA C with nvcc")
    parser.add_argument("--no-nvcc", dest="nvcc", action="store_false",
                        help="with --cuda: do not run nvcc")
    parser.add_argument("--gpu", action="store_true",
                        help="also build for the local GPU (NVRTC compiles every kernel), run "
                        "there and compare")
    parser.add_argument("--minimize", type=int, default=3, metavar="N",
                        help="shrink the first N failures of each status (default 3)")
    parser.add_argument("--budget", type=int, default=150,
                        help="checks a shrink may spend (default 150)")
    parser.add_argument("--out", type=Path, help="write failures and reproducers here")
    args = parser.parse_args(argv)
    opts = {"dtype": args.dtype, "cuda": args.cuda, "gpu": args.gpu,
            "nvcc": args.nvcc, "budget": args.budget}
    tasks = [(s, opts) for s in range(args.seed, args.seed + args.count)]
    start, rows = time.time(), []
    ctx = multiprocessing.get_context("spawn")  # TVM's thread pool does not survive a fork
    with ctx.Pool(args.jobs, maxtasksperchild=50) as pool:
        for row in pool.imap_unordered(_one, tasks):
            rows.append(row)
            if row["status"] not in ("ok", "skipped"):
                print(f"seed {row['seed']}: {row['status']}: {row['detail']}", flush=True)
            if len(rows) % 100 == 0 and len(rows) < len(tasks):
                print(f"{len(rows)} of {len(tasks)} programs checked "
                      f"({time.time() - start:.0f} s)", flush=True)
    rows.sort(key=lambda r: r["seed"])
    failures = [r for r in rows if r["status"] not in ("ok", "skipped")]
    if args.out and failures:
        _quiet()
        args.out.mkdir(parents=True, exist_ok=True)
        shrunk, per_status = [], collections.Counter()
        for failure in failures:
            per_status[failure["status"]] += 1
            row = failure
            if per_status[row["status"]] <= args.minimize:
                row = _shrink(failure, opts)
                (args.out / f"{row['seed']}.py").write_text(
                    f"# {row['status']}: {row['minimized_detail']}\n'''\n{row['describe']}\n'''"
                    f"\n{row['script']}")
            shrunk.append(row)
        with open(args.out / "failures.jsonl", "w") as f:
            for row in shrunk:
                f.write(json.dumps(row) + "\n")
    _summary(rows, time.time() - start)
    return 1 if failures else 0


def _summary(rows, seconds) -> None:
    n = len(rows)
    statuses = collections.Counter(r["status"] for r in rows)
    half = sum(r["dtype"] == "float16" for r in rows)
    no_keep = sum(r["no_keepdims"] for r in rows)
    reduces = sum(r["reduces"] for r in rows)
    print(f"{n} programs in {seconds:.0f} s: {half} float16 ({100 * half / max(n, 1):.0f}%), "
          f"{reduces} with reductions, {no_keep} reducing without keepdims "
          f"({100 * no_keep / max(n, 1):.0f}%)")
    print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())))
    failed = n - statuses.get("ok", 0) - statuses.get("skipped", 0)
    print(f"{n - failed} passed, {failed} failed")

