"""Triton PTX in executables compiled where TVM has no CUDA runtime.

A TVM built without CUDA (the CPU machine) makes every CUDA module from source: its code generator
keeps the kernels' CUDA text and the receiving GPU host compiles it when the library is loaded,
through the ``tvm_callback_cuda_compile`` hook, which may hand back PTX.  A Triton kernel has PTX,
not CUDA text, so its module keeps :data:`PREFIX` + the PTX as "source", and :func:`install`
(run by ``import tvm_stitch``) wraps the hook so that such a source is handed back as the PTX it
holds; any other source goes to the hook it wraps.  Loaded without tvm_stitch imported, the
prefix makes the compile fail with a message saying so, rather than run something else.
"""

from __future__ import annotations

import functools
import threading

PREFIX = "#error tvm-stitch: Triton PTX, import tvm_stitch before loading this library\n"
_COMPILE = "tvm_callback_cuda_compile"
_POSTPROC = "tvm_callback_cuda_postproc"
_pending = threading.local()
#: a kernel argument that is a TMA descriptor the host makes (a CUtensorMap passed by value)
TENSORMAP = "tensormap"


def as_source(ptx: str) -> str:
    """The module "source" holding ``ptx``."""
    return PREFIX + ptx


@functools.cache  # once: a second wrapping would wrap the first
def install() -> None:
    """Wrap TVM's CUDA compile hook (PTX sources are handed back as PTX) and its source
    post-processing hook (which :func:`build_module` uses to put the PTX in)."""
    import tvm.support.nvcc  # noqa: F401 - registers TVM's compile hook, wrapped here
    import tvm_ffi

    compile_cuda = tvm_ffi.get_global_func(_COMPILE, allow_missing=True)
    postproc = tvm_ffi.get_global_func(_POSTPROC, allow_missing=True)

    def compile_hook(code, *rest):
        text = str(code)
        if text.startswith(PREFIX):
            return text[len(PREFIX) :].encode()
        return compile_cuda(code, *rest)

    def postproc_hook(code, target):
        ptx = getattr(_pending, "ptx", None)
        if ptx is not None:
            return as_source(ptx)
        return postproc(code, target) if postproc is not None else code

    if compile_cuda is not None:
        tvm_ffi.register_global_func(_COMPILE, compile_hook, override=True)
    tvm_ffi.register_global_func(_POSTPROC, postproc_hook, override=True)


def build_module(ptx: str, symbol: str, arg_types: list, tags: list):
    """A CUDA module holding ``ptx`` (kernel ``symbol``) made by TVM's own CUDA code generator,
    for a TVM without a CUDA runtime: the generator is given an empty kernel of the same
    signature and launch tags (so the module's function table is TVM's own), and its source is
    replaced by the PTX.  ``export_library`` saves it; a GPU host with tvm_stitch imported
    loads it."""
    import tvm
    import tvm_ffi

    install()
    from tvm.tirx.script.builder import ir as T

    # a TMA descriptor passed by value: TVM's generator marks it in the function table
    params = [tvm.tirx.Var(f"arg{i}", T.handle("tensormap").ty if t == TENSORMAP else t)
              for i, t in enumerate(arg_types)]
    func = tvm.tirx.PrimFunc(params, tvm.tirx.Evaluate(0)).with_attrs(
        {
            "global_symbol": symbol,
            "calling_conv": 2,  # a device kernel launched from the host
            "tirx.kernel_launch_params": tags,
            "tirx.noalias": True,
        }
    )
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    _pending.ptx = ptx
    try:
        return tvm_ffi.get_global_func("target.build.cuda")(tvm.IRModule({symbol: func}), target)
    finally:
        _pending.ptx = None


def spill_bytes(ptx: str, arch: str = "sm_90a") -> int | None:
    """Bytes of spill stores ``ptxas -v`` reports for ``ptx`` (the ``ptxas`` Triton compiles
    with), or None where it cannot say (no ``ptxas``, or it failed)."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            ptxas = get_ptxas(90).path  # Triton 3.5+: the ptxas of an architecture
        except TypeError:
            ptxas = get_ptxas().path
        with tempfile.TemporaryDirectory() as folder:
            src = Path(folder) / "kernel.ptx"
            src.write_text(ptx)
            out = subprocess.run([ptxas, f"-arch={arch}", "-v", str(src), "-o",
                                  str(Path(folder) / "kernel.cubin")],
                                 capture_output=True, text=True, check=False, timeout=120)
    except Exception:  # noqa: BLE001 - any: the spills are unknown
        return None
    found = re.findall(r"(\d+) bytes spill stores", out.stderr)
    return sum(map(int, found)) if out.returncode == 0 and found else None

