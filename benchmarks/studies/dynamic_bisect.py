"""Which part of a dynamic build is wrong on the GPU: BERT (2 layers, hidden 768) with dynamic
batch and length built with parts of the stitch pipeline switched off, each against PyTorch.

    python benchmarks/studies/dynamic_bisect.py [--shapes 1x128,3x77]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = {
    "full": {},
    "no-triton": {"mcfuser": ()},
    "no-stitch": {"stitch": False},
    "neither": {"mcfuser": (), "stitch": False},
    "no-symbolic-elementwise": {},  # thread compositions of symbolic shape left to TVM
    "no-symbolic-rows": {},  # row patterns of symbolic shape not formed
}


_ORIGINALS = {}


def _patch(name):
    """The variants that switch off one symbolic schedule (monkeypatched: a study)."""
    from tvm_stitch.stitch import schedule

    _ORIGINALS.setdefault("e", schedule._elementwise)
    _ORIGINALS.setdefault("a", schedule.apply_plan)
    schedule._elementwise, schedule.apply_plan = _ORIGINALS["e"], _ORIGINALS["a"]
    if name == "no-symbolic-elementwise":
        original = schedule._elementwise

        def elementwise(sch, outputs, plan, bind, gpu, staged=True):
            if not staged:
                raise schedule.IllegalPatternError("study: symbolic elementwise off")
            return original(sch, outputs, plan, bind, gpu, staged)

        schedule._elementwise = elementwise
    if name == "no-symbolic-rows":
        original_apply = schedule.apply_plan

        def apply(func, plan, gpu=True, point=None):
            if point is not None and plan.composition != "thread":  # a symbolic function's
                raise schedule.IllegalPatternError("study: symbolic rows off")
            return original_apply(func, plan, gpu, point)

        schedule.apply_plan = apply


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="1x128,3x77")
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args(argv)
    import torch
    from dynamic import _hidden, _inputs, _model
    from torch.export import Dim

    import tvm_stitch

    model = _model(2, 768, torch.float16, "cuda")
    reference = _model(2, 768, torch.float32, "cuda")
    batch, seq = Dim("batch", min=1, max=64), Dim("seq", min=1, max=512)
    dims = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    ids, mask = _inputs(2, 17, "cuda")
    for name, options in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        _patch(name)
        start = time.perf_counter()
        try:
            fn = tvm_stitch.from_torch(model, (ids,), example_kwargs={"attention_mask": mask},
                                       target="cuda", dynamic_shapes=dims, tune="model",
                                       **options)
        except Exception as err:  # noqa: BLE001 - the study reports it
            print(json.dumps({"variant": name, "failed": repr(err)[:300]}), flush=True)
            continue
        row = {"variant": name, "compile_s": round(time.perf_counter() - start, 1)}
        for shape in args.shapes.split(","):
            b, s = map(int, shape.split("x"))
            i, m = _inputs(b, s, "cuda")
            with torch.no_grad():
                want = _hidden(reference(i, attention_mask=m)).float()
                got = _hidden(fn(i, m)).float()
            row[shape] = float((got - want).abs().max())
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
