"""What the row and column schedules share: thread bindings on a CPU, and the check that ends a
GPU schedule."""

from __future__ import annotations

import tvm

from tvm_stitch.graph.tir_walk import iter_sblocks

from .plan import IllegalPatternError


def cpu_bind(sch):
    """Thread bindings on a CPU: blocks run in parallel, threads become serial loops."""

    def bind(loop, tag):
        if tag == "blockIdx.x":
            sch.parallel(loop)

    return bind


def finish(sch, gpu: bool) -> tvm.tirx.PrimFunc:
    """The scheduled function; on a GPU every block must run under ``blockIdx`` (a block left
    outside would run on the host, over device memory)."""
    if gpu:
        for block, loops in iter_sblocks(sch.mod["main"].body):
            tags = {
                str(lp.thread_binding.thread_tag) for lp in loops if lp.thread_binding is not None
            }
            if not any(t.startswith("blockIdx") for t in tags):
                raise IllegalPatternError(f"{block.name_hint} is not bound to thread blocks")
    return sch.mod["main"].with_attr("tirx.is_scheduled", True)
