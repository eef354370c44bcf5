"""Compile time of Hugging Face BERT-base through ``from_torch`` on the GPU (issue 48, item 4):
cold (an empty tuning database, empty Triton and tvm-stitch caches), warm (the same ones
again, filled: the model built again) and kept (the executable the cold compile kept, loaded:
``tvm_stitch.executables``), each in a fresh process.

    python benchmarks/compile_time.py [--shape 8x512] [--workers 0,1] [--dynamic]

``--workers``: how many Triton kernels compile side by side (``TVM_STITCH_COMPILE_WORKERS``;
0: one a core, the default; 1: one after the other), each value a cold and a warm compile in
its own folders. ``--dynamic``: the build for every batch 1-64 and length 1-512 instead of the
static shape. One JSON line per compile: the seconds of ``from_torch`` (export and import, then
the compile), the pipeline's slowest phases, and the error against PyTorch at the shape.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time


def _one(shape: str, dynamic: bool) -> dict:
    """A compile in this process: ``from_torch`` of BERT-base at ``shape``, timed."""
    import torch
    from torch.export import Dim
    from tvm_stitch.benchmarks.dynamic import _hidden, _inputs, _model

    import tvm_stitch

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    for name in ("tvm_stitch.frontend", "tvm_stitch.pipeline", "tvm_stitch.mcfuser"):
        logging.getLogger(name).setLevel(logging.INFO)
        logging.getLogger(name).addHandler(Keep())
    b, s = map(int, shape.split("x"))
    model = _model(12, 768, torch.float16, "cuda")
    ids, mask = _inputs(b, s, "cuda")
    dims = None
    if dynamic:
        d = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
        dims = {"input_ids": d, "attention_mask": d}
    start = time.perf_counter()
    fn = tvm_stitch.from_torch(model, (ids,), example_kwargs={"attention_mask": mask},
                               target="cuda", dynamic_shapes=dims)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        want = _hidden(model(ids, attention_mask=mask)).float()
        err = float((_hidden(fn(ids, mask)).float() - want).abs().max())
    return {"from_torch_s": round(seconds, 1), "max_err_vs_torch_fp16": err,
            "log": [x for x in lines if x.startswith(("from_torch", "stitch pipeline", "tuning"))]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="8x512")
    parser.add_argument("--workers", default="0,1")
    parser.add_argument("--dynamic", action="store_true")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.shape, args.dynamic)), flush=True)
        return 0
    for workers in (int(w) for w in args.workers.split(",")):
        root = tempfile.mkdtemp(prefix="tvm-stitch-compile-")
        env = {**os.environ, "TVM_STITCH_TUNING_DB": f"{root}/tuning.json",
               "TRITON_CACHE_DIR": f"{root}/triton", "TVM_STITCH_CACHE": f"{root}/stitch"}
        if workers:
            env["TVM_STITCH_COMPILE_WORKERS"] = str(workers)
        else:
            env.pop("TVM_STITCH_COMPILE_WORKERS", None)
        for state in ("cold", "warm", "kept"):
            cmd = [sys.executable, "-m", "tvm_stitch.benchmarks.compile_time", "--one",
                   "--shape", args.shape, *(["--dynamic"] if args.dynamic else [])]
            # warm: built again from the filled caches; kept: the executable the cold
            # compile kept, loaded (tvm_stitch.executables)
            run_env = {**env, "TVM_STITCH_EXECUTABLES": "0" if state == "warm" else "1"}
            start = time.perf_counter()
            out = subprocess.run(cmd, check=False, env=run_env, capture_output=True, text=True)
            row = {"shape": args.shape, "dynamic": args.dynamic,
                   "workers": workers or os.cpu_count(), "state": state,
                   "process_s": round(time.perf_counter() - start, 1)}
            result = [x for x in out.stdout.splitlines() if x.startswith("{")]
            if out.returncode or not result:
                row["error"] = (out.stderr or out.stdout).strip().splitlines()[-3:]
            else:
                row.update(json.loads(result[-1]))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
