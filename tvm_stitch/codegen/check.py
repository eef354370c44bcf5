"""Whether TVM can lower, generate and compile kernels — asked ahead of the build, so that a
kernel it cannot build costs that kernel and not the model.

:func:`lower` runs what ``tvm.tirx.build`` runs before code generation (the target's TIR
pipeline, the host/device split, the finalizing passes); :func:`failing` also generates the
device code and compiles it: with NVRTC where TVM has a CUDA runtime (it compiles while it
generates), else with ``nvcc`` where one is on the path (a machine without a GPU), else not at
all (the generated source only).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import tvm
from tvm.tirx.build import codegen_build, split_host_device_mods

from tvm_stitch.errors import error_summary


def lower(mod: tvm.IRModule, target: tvm.target.Target) -> dict:
    """``mod``'s PrimFuncs lowered as ``tvm.tirx.build`` lowers them, up to code generation.

    Returns
    -------
    dict
        ``{target: device IRModule}`` (empty for a CPU target, whose code is all host code).

    Raises
    ------
    Exception
        TVM's own error where a pass refuses a function.
    """
    if target.host is None:
        target = target.with_host("llvm" if target.kind.name != "llvm" else target)
    mod = tvm.tirx.transform.BindTarget(target)(mod)
    pipeline, finalize_host, finalize_device = tvm.tirx.get_default_tir_pipeline(target)
    host, devices = split_host_device_mods(pipeline(mod))
    finalize_host()(host)
    return {t: finalize_device()(device) for t, device in devices.items()}


def build_error(funcs: dict, target: tvm.target.Target) -> str | None:
    """The first error lowering, generating or compiling the device code of ``funcs``
    (``{name: PrimFunc}``) raises, in one line; None where all of it succeeds."""
    funcs = {name: f.with_attr("global_symbol", name) for name, f in funcs.items()}
    try:
        for device_target, device in lower(tvm.IRModule(funcs), target).items():
            module = codegen_build(device, device_target)
            if device_target.kind.name == "cuda" and not tvm.runtime.enabled("cuda"):
                why = nvcc_error(module.inspect_source(), _arch(device_target))
                if why:
                    return why
    except Exception as err:  # noqa: BLE001 - TVM's refusal is the answer
        return error_summary(err)
    return None


def failing(funcs: dict, target: tvm.target.Target) -> dict:
    """``{name: why}`` for the functions of ``funcs`` that cannot be built for ``target``:
    all are built together, and one by one only where that fails."""
    if not funcs or build_error(funcs, target) is None:
        return {}
    out = {}
    for name, func in funcs.items():
        why = build_error({name: func}, target)
        if why:
            out[name] = why
    return out


def _arch(target: tvm.target.Target) -> str:
    arch = target.attrs.get("arch")
    return str(arch) if arch else "sm_90a"


def nvcc_error(source: str, arch: str = "sm_90a") -> str | None:
    """The first error ``nvcc`` reports compiling ``source`` to PTX for ``arch``; None where it
    compiles or no ``nvcc`` is on the path."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cu"
        path.write_text(source)
        res = subprocess.run([nvcc, f"-arch={arch}", "-ptx", str(path), "-o",
                              str(path.with_suffix(".ptx"))], capture_output=True, text=True,
                             check=False)
    if res.returncode == 0:
        return None
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln]
    return (errors or [res.stderr.strip() or "nvcc failed"])[0]
