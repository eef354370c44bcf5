"""Compile on one machine, run on another.

:func:`save` writes a compiled workload to a folder, as a TVM deployment ships one: the
executable (``export_library``), its arguments (``args.npz``: inputs, then weights), the
float32 PyTorch reference of its outputs (``expected.npz``) and what it was (``meta.json``).
:func:`check` loads that folder where the kernels can run, runs the executable, compares it
with the reference and times it. It needs TVM's runtime only (``TVM_USE_RUNTIME_LIB=1``, or a
runtime-only TVM): neither Relax nor PyTorch nor the workloads are imported. For a CUDA target
the compiling machine needs no GPU: the stitch pipeline's Triton kernels are compiled to sm_90
PTX with tiles from the tuning database or the cost model (``tvm-stitch build`` / ``tvm-stitch
check``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np

FORMAT = 2
logger = logging.getLogger("tvm_stitch.library")


def prepare_args(vm, func: str, args: list, num_input: int | None) -> list:
    """The arguments of ``vm[func]`` for ``args`` (inputs, then weights, as the module before
    compilation took them): a module compiled with ``lift_params`` takes what its
    ``<func>_transform_params`` makes of the weights (computed here, once: keep the result for
    every call); any other module, ``args`` unchanged.

    Parameters
    ----------
    vm : tvm.runtime.vm.VirtualMachine
    func : str
        The entry function.
    args : list of tvm.runtime.Tensor
    num_input : int or None
        The entry's ``num_input`` attribute before compilation (how many of ``args`` are
        inputs); None when it had none (nothing was lifted).
    """
    name = f"{func}_transform_params"
    if num_input is None or not vm.module.implements_function(name):
        return list(args)
    return [*args[:num_input], *vm[name](list(args[num_input:]))]


def save(executable, folder, inst, target, workload: str, params: dict, seed: int = 0,
         compile_s: float | None = None) -> Path:
    """Write ``executable`` (compiled for ``target`` from ``inst``, the instance of ``workload``
    at ``params`` and ``seed``), its arguments and its reference outputs to ``folder``; returns
    the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(folder / "mod.so"))
    _save_arrays(folder / "args.npz", inst.args)
    _save_arrays(folder / "expected.npz", inst.reference())
    meta = {
        "format": FORMAT,
        "name": inst.name,
        "workload": workload,
        "dtype": inst.dtype,
        "params": dict(params),
        "seed": seed,
        "target": target.kind.name,
        "func": inst.func,
        "num_input": _num_input(inst.mod[inst.func]),
        "tolerance": list(inst.tolerance),
        "compile_s": compile_s,
    }
    (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    return folder


def load(folder) -> tuple[dict, list[np.ndarray], list[np.ndarray]]:
    """``(meta, args, expected)`` of a folder written by :func:`save`.

    Raises
    ------
    ValueError
        If the folder holds no saved workload, or one of another format.
    """
    folder = Path(folder)
    try:
        meta = json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{folder} is not a saved workload (meta.json: {err})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: format {meta.get('format')!r}, expected {FORMAT} "
                         "(build it again with this version: tvm-stitch build)")
    try:
        return meta, _load_arrays(folder / "args.npz"), _load_arrays(folder / "expected.npz")
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{folder}: unreadable arrays ({err})") from None


def check(folder) -> dict:
    """Load ``folder``'s executable on its target's device, run it on the saved arguments,
    compare with the saved reference and time it.

    Returns
    -------
    dict
        ``workload`` (the instance's name), ``time_us``, ``max_err`` and ``correct`` (within the
        dtype's tolerance).
    """
    import tvm
    from tvm.runtime.vm import VirtualMachine

    folder = Path(folder)
    meta, arrays, expected = load(folder)
    if meta["target"] == "cuda":
        _cuda_runtime()
    dev = tvm.cuda(0) if meta["target"] == "cuda" else tvm.cpu(0)
    if not dev.exist:
        raise RuntimeError(f"{folder} was compiled for {meta['target']}; no such device here")
    vm = VirtualMachine(tvm.runtime.load_module(str(folder / "mod.so")), dev)
    func = meta["func"]
    args = prepare_args(vm, func, [tvm.runtime.tensor(a, device=dev) for a in arrays],
                        meta["num_input"])
    out = vm[func](*args)
    outs = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
    err, ok = compare([o.numpy() for o in outs], expected, meta["tolerance"])
    return {"workload": meta["name"], "time_us": time_tvm(vm, func, args, dev), "max_err": err,
            "correct": ok}


def _cuda_runtime() -> None:
    """Load TVM's CUDA runtime where TVM loaded its core runtime only: a runtime-only TVM loads
    no backend (TVM's CUDA backend loads the same library, the same way, when it registers)."""
    from tvm.base import _LOADED_LIBS
    from tvm_ffi.libinfo import load_lib_ctypes

    if "tvm_runtime_cuda" in _LOADED_LIBS:
        return
    folder = Path(_LOADED_LIBS["tvm_runtime"]._name).resolve().parent
    try:
        _LOADED_LIBS["tvm_runtime_cuda"] = load_lib_ctypes(
            package="tvm", target_name="tvm_runtime_cuda", extra_lib_paths=[folder],
            mode="RTLD_LOCAL")
    except (OSError, RuntimeError) as err:  # no CUDA driver here: the device check says so
        logger.debug("TVM's CUDA runtime not loaded: %s", err)


def _num_input(func) -> int | None:
    value = (func.attrs or {}).get("num_input")
    return None if value is None else int(value)


def compare(outs: list[np.ndarray], refs: list[np.ndarray], tol) -> tuple[float, bool]:
    """Max absolute error and whether every output is within ``(rtol, atol)``."""
    rtol, atol = tol
    if len(outs) != len(refs):
        return float("inf"), False
    err, ok = 0.0, True
    for out, ref in zip(outs, refs):
        got = np.asarray(out, dtype="float32")
        if got.shape != ref.shape:
            return float("inf"), False
        diff = float(np.max(np.abs(got - ref))) if got.size else 0.0
        err = diff if math.isnan(diff) else max(err, diff)  # NaN is never hidden by max()
        ok = ok and bool(np.allclose(got, ref, rtol=rtol, atol=atol))
    return err, ok


def time_tvm(vm, func: str, args, dev, budget_ms: float = 200.0) -> float:
    """Median microseconds per call of ``vm[func](*args)``."""
    probe = vm.time_evaluator(func, dev, number=1, repeat=1)(*args).mean
    number = max(1, int(budget_ms / 10 / 1e3 / max(probe, 1e-7)))
    result = vm.time_evaluator(func, dev, number=number, repeat=10)(*args)
    return float(np.median(result.results)) * 1e6


def _save_arrays(path: Path, arrays) -> None:
    """``arrays`` in order; bfloat16 (ml_dtypes, which npz cannot name) as its bits."""
    named, dtypes = {}, []
    for i, array in enumerate(arrays):
        a = np.asarray(array)
        dtypes.append(a.dtype.name)
        named[f"a{i}"] = a.view(np.uint16) if a.dtype.name == "bfloat16" else a
    np.savez(path, dtypes=np.array(dtypes), **named)


def _load_arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        dtypes = [str(d) for d in data["dtypes"]]
        out = []
        for i, dtype in enumerate(dtypes):
            a = data[f"a{i}"]
            if dtype == "bfloat16":
                import ml_dtypes

                a = a.view(ml_dtypes.bfloat16)
            out.append(a)
    return out
