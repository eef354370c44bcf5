"""tvm-stitch's Relax passes (installed as ``tvm_stitch.passes``).

Each pass is thin: it asks the engine (``tvm_stitch``) for an analysis or a plan and rewrites the
module.  ``tvm_stitch.pipeline()`` places them around TVM's own passes.
"""

from .analyze import AnalyzeTensorGraph, ReportFusion
from .canonicalize import BoundSymbolicShapes, FoldStaticShapes, finite_fills
from .check import CheckKernels, RecordKernels
from .graphs import StageInputs
from .launch import LaunchDependently
from .mcfuser import FuseMBCI
from .precision import AccumulateFloat32, AsBFloat16, ComputeFloat32, HalfActivations
from .stitch import StitchFusion, StitchSchedule
from .views import InjectiveViews

__all__ = [
    "AccumulateFloat32",
    "AnalyzeTensorGraph",
    "AsBFloat16",
    "BoundSymbolicShapes",
    "CheckKernels",
    "ComputeFloat32",
    "FoldStaticShapes",
    "FuseMBCI",
    "HalfActivations",
    "InjectiveViews",
    "LaunchDependently",
    "RecordKernels",
    "ReportFusion",
    "StageInputs",
    "StitchFusion",
    "StitchSchedule",
    "finite_fills",
]
