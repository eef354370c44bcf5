"""Fusion report: kernels, estimated global-memory bytes and fused groups of a pipeline.

The report runs a pipeline's passes up to and including fusion (and the reshape-to-view rewrite
of dataflow lowering, which removes copy kernels), then reads the entry function: every remaining
``call_tir`` is one kernel (dlight schedules each PrimFunc as one launch), its bytes are the global
tensors it reads (footprint) plus those it writes, and its group lists the op kinds of its blocks.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax

from .errors import error_line
from .graph import build_graph
from .graph.kernels import FusionReport, annotate, groups_of
from .pipeline import as_target, phases

logger = logging.getLogger("tvm_stitch.report")


def fused_module(mod: tvm.IRModule, target, pipeline: str = "stitch", **options) -> tvm.IRModule:
    """``mod`` after a pipeline's dispatch and fusion phases and the reshape-to-view rewrite."""
    target = as_target(target)
    seq = []
    plan = {"plan_only": True} if pipeline == "stitch" else {}
    for name, passes in phases(target, pipeline, **plan, **options):
        if name in ("dispatch", "fusion"):
            seq.extend(passes)
    seq.append(relax.transform.RewriteDataflowReshape())
    with target:
        return tvm.transform.Sequential(seq)(mod)


def fusion_report(
    mod: tvm.IRModule, target="llvm", pipeline: str = "stitch", **options
) -> FusionReport:
    """The fusion report of one pipeline on a module.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (not yet legalized).
    target : tvm.target.Target or str or dict
        ``llvm`` or a CUDA target.
    pipeline : {"stitch", "default"}
        tvm-stitch's pipeline or TVM's default for the target.
    **options
        Pipeline options (stitch only).

    Returns
    -------
    FusionReport
    """
    target = as_target(target)
    if pipeline == "stitch":
        options.setdefault("report", False)  # the report itself need not log
        options.setdefault("analyze", False)
    fused = fused_module(mod, target, pipeline, **options)
    graph = build_graph(fused, legalize=False)
    return FusionReport(pipeline, str(target.kind.name), annotate(groups_of(graph), fused))


def compare_pipelines(mod: tvm.IRModule, target="llvm") -> dict[str, FusionReport]:
    """Fusion reports of TVM's default pipeline and of the stitch pipeline, for the same module.

    Where TVM's own pipeline fails on the module (TVM 0.27 cannot legalize a ``full`` whose
    dtype came from PyTorch's ``triu`` mask, which the stitch pipeline canonicalizes first),
    the reason is logged and only the stitch pipeline's report is returned."""
    reports = {}
    try:
        reports["default"] = fusion_report(mod, target, "default")
    except Exception as err:  # noqa: BLE001 - TVM's pipeline, not ours: say so and go on
        logger.warning("TVM's default pipeline failed on this module: %s: %s",
                       type(err).__name__, error_line(err)[:200])
    reports["stitch"] = fusion_report(mod, target, "stitch")
    return reports


def nvcc_error(executable, arch: str = "sm_90a") -> str | None:
    """The first error ``nvcc`` reports on ``executable``'s CUDA C (TVM's kernels; Triton's are
    PTX already), or None where it compiles or no ``nvcc`` is on the path.  A TVM without a
    CUDA runtime only generates that source — the GPU host compiles it when the library is
    loaded — so this is how a CPU machine learns it would not."""
    from .codegen import check
    from .codegen.ptx import PREFIX

    # Triton's PTX travels as a prefixed "source"
    for source in _cuda_sources(executable):
        why = None if source.startswith(PREFIX) else check.nvcc_error(source, arch)
        if why:
            return why
    return None


def cuda_source(executable) -> str:
    """The generated CUDA C source of a compiled executable (empty when it has no CUDA module)."""
    return "\n".join(_cuda_sources(executable))


def _cuda_sources(executable) -> list[str]:
    """The source of each CUDA module of ``executable`` (its imports, walked depth first)."""
    stack, sources = [executable.mod], []
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            sources.append(module.inspect_source())
        stack.extend(module.imports)
    return sources
