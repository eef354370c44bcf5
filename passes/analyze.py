"""Analysis passes: they read the module and leave it unchanged.

``AnalyzeTensorGraph`` runs right after ``LegalizeOps`` and builds the tensor dependency graph
(SOUFFLE §5); ``ReportFusion`` runs after ``FuseTIR`` and summarises the kernels fusion produced.
Both log at INFO level on the ``tvm_stitch`` logger and hand their result to an optional callback,
which is how notebooks and tests get at them without re-running the pipeline.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import tvm
from tvm import relax

from tvm_stitch.graph import TensorDependencyGraph, build_graph
from tvm_stitch.graph.kernels import FusionReport, annotate, groups_of

logger = logging.getLogger("tvm_stitch")


@tvm.transform.module_pass(opt_level=0, name="StitchAnalyzeTensorGraph")
class AnalyzeTensorGraph:
    """Build the tensor dependency graph of the legalized module.

    Parameters
    ----------
    callback : callable, optional
        Called with the :class:`~tvm_stitch.graph.TensorDependencyGraph`.
    """

    def __init__(self, callback: Callable[[TensorDependencyGraph], None] | None = None):
        self.callback = callback

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        try:
            graph = build_graph(mod, legalize=False)
        except Exception as err:  # noqa: BLE001 - an analysis must never break a build
            logger.warning("tensor graph analysis skipped: %s", err)
            return mod
        shared = graph.shared_tensors()
        logger.info(
            "tensor graph: %d nodes %s; %d shared tensors (%d temporal, %d spatial, %d both); "
            "%d bindings left out",
            len(graph),
            graph.kind_counts(),
            len(shared),
            sum(r.kind == "temporal" for r in shared),
            sum(r.kind == "spatial" for r in shared),
            sum(r.kind == "both" for r in shared),
            len(graph.skipped),
        )
        if self.callback is not None:
            self.callback(graph)
        return mod


@tvm.transform.module_pass(opt_level=0, name="StitchReportFusion")
class ReportFusion:
    """Summarise the kernels left after fusion (one per ``call_tir``).

    Parameters
    ----------
    callback : callable, optional
        Called with the :class:`~tvm_stitch.report.FusionReport`.
    """

    def __init__(self, callback: Callable[[FusionReport], None] | None = None):
        self.callback = callback

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        try:
            viewed = relax.transform.RewriteDataflowReshape()(mod)
            graph = build_graph(viewed, legalize=False)
        except Exception as err:  # noqa: BLE001 - a report must never break a build
            logger.warning("fusion report skipped: %s", err)
            return mod
        target = tvm.target.Target.current(allow_none=True)
        groups = annotate(groups_of(graph), mod)
        report = FusionReport("stitch", target.kind.name if target else "?", groups)
        logger.info("%s", report.format())
        if self.callback is not None:
            self.callback(report)
        return mod
