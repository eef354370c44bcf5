"""The differential check of one program: the stitch pipeline against TVM's default pipeline.

Stages, each a way to fail (the :class:`Outcome`'s ``status``):

``build``     the stitch pipeline fails to build for ``llvm`` where TVM's default builds
``fallback``  a stitch pass caught an error and left work to TVM (a ``WARNING`` on a
              ``tvm_stitch`` logger): a crash the build survived, counted as one
``mismatch``  the two ``llvm`` executables disagree beyond the dtype's tolerance, and the stitch
              result is further from a float64 build of the same program than TVM's is
``cuda``      the stitch pipeline fails to build for ``sm_90a`` (no GPU needed), or a fallback
              there
``nvcc``      ``nvcc`` rejects the CUDA C of that build (TVM's kernels; Triton's are PTX,
              compiled while building)
``gpu``       on a machine with a GPU: the CUDA build fails to load or run, or disagrees with
              the ``llvm`` default build as above

A program TVM's default pipeline cannot build or run is ``skipped``: there is nothing to
compare with.  Errors are measured on each output as ``max |a - ref| / max(1, max |ref|)``
over the reference's finite elements.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging

import numpy as np

from .programs import Program

#: normalized error within which two builds agree
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "float64": 1e-9}
#: a stitch result may be this much further from float64 than TVM's default result is
SLACK = 2.0
CUDA = {"kind": "cuda", "arch": "sm_90a"}
#: the CPU builds compared: LLVM's optimizations off, which halves the time of a program's
#: four builds and runs (both pipelines alike; the TIR each lowers is what is compared)
LLVM = {"kind": "llvm", "opt-level": 0}
STAGES = ("build", "fallback", "mismatch", "cuda", "nvcc", "gpu")


@dataclasses.dataclass
class Outcome:
    """The result of :func:`check`: ``status`` is ``ok``, ``skipped`` or a stage of
    :data:`STAGES`; ``detail`` says what failed; ``error`` is the largest normalized error
    met (``llvm``, and ``gpu`` where run)."""

    status: str
    detail: str = ""
    error: float = 0.0


class _Warnings(logging.Handler):
    """Collects ``WARNING`` records of the ``tvm_stitch`` loggers."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _warnings():
    handler = _Warnings()
    root = logging.getLogger("tvm_stitch")
    root.addHandler(handler)
    try:
        yield handler.records
    finally:
        root.removeHandler(handler)


def build(mod, target, pipeline: str, **options):
    """``tvm.compile`` with the ``stitch`` or ``default`` pipeline."""
    import tvm

    import tvm_stitch
    from tvm_stitch.pipeline import as_target, default_pipeline

    target = as_target(target)
    pipe = (tvm_stitch.pipeline(target, **options) if pipeline == "stitch"
            else default_pipeline(target))
    return tvm.compile(mod, target, relax_pipeline=pipe)


def run(executable, args, device=None) -> list[np.ndarray]:
    """The outputs of ``main`` on ``args`` (numpy arrays in, numpy arrays out)."""
    import tvm
    from tvm import relax

    device = device or tvm.cpu()
    vm = relax.VirtualMachine(executable, device)
    out = vm["main"](*[tvm.runtime.tensor(a, device=device) for a in args])
    outs = list(out) if type(out).__name__ in ("Array", "list", "tuple") else [out]
    return [o.numpy() for o in outs]


def error(got: list, ref: list) -> float:
    """The largest normalized error of ``got`` against ``ref``; ``inf`` where shapes differ, an
    element is not finite where the reference's is, or a non-float output differs."""
    worst = 0.0
    for mine, theirs in zip(got, ref, strict=True):
        if mine.shape != theirs.shape:
            return np.inf
        if not np.issubdtype(theirs.dtype, np.floating):
            if not np.array_equal(mine, theirs):
                return np.inf
            continue
        a, r = mine.astype("float64"), theirs.astype("float64")
        finite = np.isfinite(r)
        if not np.isfinite(a[finite]).all():
            return np.inf
        if not finite.any():
            continue
        scale = max(1.0, float(np.abs(r[finite]).max()))
        worst = max(worst, float(np.abs(a[finite] - r[finite]).max()) / scale)
    return worst


def _agrees(program: Program, got, default, reference) -> tuple[bool, float]:
    """Whether ``got`` agrees with TVM's ``default`` outputs, and its error: within the dtype's
    tolerance of them, or — judged against the float64 ``reference()`` — no further from it
    than :data:`SLACK` times TVM's own error."""
    err = error(got, default)
    if err <= TOLERANCE[program.dtype]:
        return True, err
    ref = reference()
    mine, theirs = error(got, ref), error(default, ref)
    return mine <= max(TOLERANCE[program.dtype], SLACK * theirs), mine


def _line(err: BaseException) -> str:
    from tvm_stitch.errors import error_summary

    return error_summary(err)[:500]


def check(program: Program, cuda: bool = False, gpu: bool = False, nvcc: bool = True
          ) -> Outcome:
    """Build and compare ``program`` (see the module's docstring).

    Parameters
    ----------
    program : Program
    cuda : bool
        Also build for ``sm_90a`` here (and compile its CUDA C with ``nvcc`` where ``nvcc``
        is on the path and ``nvcc`` is set).
    gpu : bool
        Build for the local GPU instead (NVRTC compiles every kernel), run there and compare.
    nvcc : bool
        Compile the ``sm_90a`` build's CUDA C with ``nvcc`` (without ``gpu``).
    """
    mod = program.module()
    args = program.arguments()
    try:
        default = run(build(mod, LLVM, "default"), args)
    except Exception as err:  # noqa: BLE001 - nothing to compare with
        return Outcome("skipped", f"TVM's default pipeline: {_line(err)}")
    cache = {}

    def reference():
        if "ref" not in cache:
            wide = program.module("float64")
            cache["ref"] = run(build(wide, LLVM, "default"), program.arguments("float64"))
        return cache["ref"]

    with _warnings() as warned:
        try:
            ex = build(mod, LLVM, "stitch")
        except Exception as err:  # noqa: BLE001 - the finding
            return Outcome("build", _line(err))
    if warned:
        return Outcome("fallback", "llvm: " + warned[0])
    try:
        got = run(ex, args)
    except Exception as exc:  # noqa: BLE001 - the finding
        return Outcome("build", f"running the llvm build: {_line(exc)}")
    ok, err = _agrees(program, got, default, reference)
    if not ok:
        return Outcome("mismatch", f"llvm: normalized error {err:.3g}", err)
    if cuda or gpu:
        failed = _check_cuda(program, mod, args, default, reference, gpu, nvcc)
        if failed is not None:
            return failed
    return Outcome("ok", error=err)


def _check_cuda(program, mod, args, default, reference, gpu: bool, nvcc: bool
                ) -> Outcome | None:
    """The stitch build for ``sm_90a`` (status ``cuda``, or ``gpu`` on a GPU): a failure, a
    fallback, then ``nvcc`` on its CUDA C (a machine without a GPU: the GPU's NVRTC compiled
    every kernel already) or the run on the GPU against TVM's ``llvm`` outputs."""
    import tvm

    from tvm_stitch.report import nvcc_error

    stage = "gpu" if gpu else "cuda"
    with _warnings() as warned:
        try:
            ex = build(mod, CUDA, "stitch", tune="model")
            got = run(ex, args, tvm.cuda(0)) if gpu else None
        except Exception as err:  # noqa: BLE001 - the finding
            return Outcome(stage, _line(err))
    if warned:
        return Outcome(stage, "fallback: " + warned[0])
    if not gpu:
        why = nvcc_error(ex) if nvcc else None
        return Outcome("nvcc", why) if why else None
    ok, err = _agrees(program, got, default, reference)
    return None if ok else Outcome("gpu", f"normalized error {err:.3g} on the GPU", err)
