"""Every tunable of tvm-stitch in one place, with what it changes.

Pipelines take these as keyword options (``tvm_stitch.pipeline(target, analyze=False)``); unknown
options are an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Options of :func:`tvm_stitch.pipeline`.

    Attributes
    ----------
    analyze : bool
        Build the tensor dependency graph after legalization and log its summary (INFO level on
        the ``tvm_stitch`` logger).  Costs a walk over every TIR block; off for the fastest builds.
    report : bool
        Log the fusion report (kernels, bytes, groups) after fusion.
    triton_gemm : bool
        Run Linear layers (+ GELU or + residual) as searched Triton kernels (MCFuser, chains of
        length one).  Needs a GPU at compile time; without one the pass logs why and TVM keeps
        the layers.
    """

    analyze: bool = True
    report: bool = True
    triton_gemm: bool = True

    @classmethod
    def from_kwargs(cls, **options) -> PipelineOptions:
        """Validate keyword options; raise ``TypeError`` naming the unknown ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"unknown tvm_stitch.pipeline option(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**options)
