"""TVM's own GPU kernels launched dependently, like the generated ones.

The Triton kernels tvm-stitch embeds are launched with programmatic dependent launch (sm_90):
each waits for the grid before it on the device, so its launch and block start-up overlap that
grid.  A kernel TVM generates (a LayerNorm, a gather, an input's copy) is launched plainly: the
stream serialises it, and the kernel after it cannot be launched before it has finished either.
``LaunchDependently`` gives TVM's kernels of at most one block per SM the same launch
(:func:`tvm_stitch.codegen.dependent.dependent_kernels`).  Larger ones stay plain: launched early,
their blocks would crowd onto the SMs the kernel before frees first, and their early release
would let the next GEMM's blocks take whole SMs while they still had waves to run (BERT-base
8×512 on an H100, same process: all TVM kernels dependent 1790.7 µs, releasing the next launch
only 1791.4, plain 1729.7; at 1×128, where every one of them fits in a wave, 329.4 against
335.4 plain).  Those figures released the next launch at each kernel's start; with the release
at exit (the default since) the rule was not measured again.
"""

from __future__ import annotations

import logging

import tvm

from tvm_stitch.codegen.dependent import dependent_kernels
from tvm_stitch.config import DEFAULT_LAUNCH_DEPENDENTS

from .module import replace_functions

logger = logging.getLogger("tvm_stitch.launch")


@tvm.transform.module_pass(opt_level=0, name="StitchLaunchDependently")
class LaunchDependently:
    """Launch the module's scheduled GPU kernels of at most ``max_blocks`` blocks with
    programmatic dependent launch.

    Run after scheduling (every kernel bound to threads) and after reshapes became views (a
    function that waits is no longer one TVM recognizes as a reshape), for an sm_90 or newer
    CUDA target.

    Parameters
    ----------
    launch_dependents : {"start", "exit"}
        When a kernel lets the next one be launched (see
        :class:`~tvm_stitch.config.PipelineOptions`).
    max_blocks : int, optional
        The largest grid launched dependently (the pipeline: the device's SMs); None: any.
    """

    def __init__(self, launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS,
                 max_blocks: int | None = None):
        self.launch_dependents = launch_dependents
        self.max_blocks = max_blocks

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tvm.tirx.PrimFunc):
                new = dependent_kernels(func, self.launch_dependents, self.max_blocks)
                if new is not None:
                    updates[gv] = new
        logger.info("%d of TVM's kernel functions launched dependently (at most %s blocks)",
                    len(updates), self.max_blocks)
        return replace_functions(mod, updates)
