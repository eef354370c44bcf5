"""Compile on one machine, run on another.

:func:`save` writes a compiled workload to a folder — the executable (``export_library``) and
what the workload was (name, shape, dtype, seed: its arguments are rebuilt from them, so a folder
holding BERT-base is the size of its kernels, not of its weights) — and :func:`check` loads that
folder where the kernels can run, rebuilds the arguments, runs the executable, compares it with
the workload's float32 PyTorch reference and times it.  For a CUDA target the compiling machine
needs no GPU: the stitch pipeline's Triton kernels are compiled to sm_90 PTX with tiles from the
tuning database or the cost model (``tvm-stitch build`` / ``tvm-stitch check``).
"""

from __future__ import annotations

import json
from pathlib import Path

import tvm

FORMAT = 1


def save(
    executable,
    folder,
    target,
    workload: str,
    dtype: str,
    params: dict,
    seed: int = 0,
    compile_s: float | None = None,
) -> Path:
    """Write ``executable``, compiled for ``target`` from the instance of ``workload`` at
    ``dtype``, ``params`` and ``seed``, to ``folder``; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(folder / "mod.so"))
    meta = {
        "format": FORMAT,
        "workload": workload,
        "dtype": dtype,
        "params": dict(params),
        "seed": seed,
        "target": target.kind.name,
        "compile_s": compile_s,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return folder


def load(folder) -> tuple[dict, object]:
    """``(meta, instance)`` of a folder written by :func:`save`.

    Raises
    ------
    ValueError
        If the folder holds no saved workload, or one of another format.
    """
    from tvm_stitch.workloads import get_workload

    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder} is not a saved workload (meta.json: {err})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: format {meta.get('format')!r}, expected {FORMAT}")
    inst = get_workload(meta["workload"]).instance(meta["dtype"], meta["seed"], **meta["params"])
    return meta, inst


def check(folder) -> dict:
    """Load ``folder``'s executable on its target's device, run it on the workload's arguments,
    compare with the reference and time it.

    Returns
    -------
    dict
        ``workload`` (the instance's name), ``time_us``, ``max_err`` and ``correct`` (within the
        dtype's tolerance).
    """
    from tvm import relax

    from tvm_stitch.benchmarks.harness import compare, run_tvm, time_tvm

    folder = Path(folder)
    meta, inst = load(folder)
    dev = tvm.cuda(0) if meta["target"] == "cuda" else tvm.cpu(0)
    if not dev.exist:
        raise RuntimeError(f"{folder} was compiled for {meta['target']}; no such device here")
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(folder / "mod.so")), dev)
    args, outs = run_tvm(vm, inst, dev)
    err, ok = compare(outs, inst.reference(), inst.tolerance)
    return {
        "workload": inst.name,
        "time_us": time_tvm(vm, inst.func, args, dev),
        "max_err": err,
        "correct": ok,
    }
