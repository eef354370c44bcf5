"""tvm-stitch: cross-operator fusion for transformer inference on NVIDIA GPUs, as a TVM extension.

>>> import tvm, tvm_stitch
>>> ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))
>>> ex = tvm.compile(mod, target, relax_pipeline="stitch")      # the same, by name
>>> tvm_stitch.fusion_report(mod, target).kernels
>>> fn = tvm_stitch.from_torch(model, example_inputs, target="cuda")   # from PyTorch
"""

from __future__ import annotations

import importlib.util
import os
import sys

__version__ = "0.1.0"


def _attach_source_subpackage(name: str, folder: str) -> None:
    """Make ``tvm_stitch.<name>`` importable from the source tree's top-level ``<folder>/``.

    An installed wheel (or an editable install) maps ``passes/`` to ``tvm_stitch.passes`` and
    ``benchmarks/`` to ``tvm_stitch.benchmarks`` itself; running from a checkout with only the repo
    root on ``PYTHONPATH`` (the GPU host) needs this.
    """
    full = f"{__name__}.{name}"
    if full in sys.modules or importlib.util.find_spec(full) is not None:
        return
    init = os.path.join(os.path.dirname(os.path.dirname(__file__)), folder, "__init__.py")
    if not os.path.exists(init):
        return
    spec = importlib.util.spec_from_file_location(
        full, init, submodule_search_locations=[os.path.dirname(init)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    spec.loader.exec_module(module)


from .frontend import from_torch  # noqa: E402
from .hardware import HardwareModel, UnsupportedTargetError  # noqa: E402
from .pipeline import default_pipeline, phases, pipeline, register  # noqa: E402
from .report import FusionReport, compare_pipelines, fusion_report  # noqa: E402

_attach_source_subpackage("passes", "passes")
_attach_source_subpackage("benchmarks", "benchmarks")
from . import passes  # noqa: E402
from .codegen import ptx  # noqa: E402

register()
ptx.install()  # libraries compiled without a CUDA runtime hold Triton PTX: load it as such

__all__ = [
    "FusionReport",
    "HardwareModel",
    "UnsupportedTargetError",
    "compare_pipelines",
    "default_pipeline",
    "from_torch",
    "fusion_report",
    "passes",
    "phases",
    "pipeline",
]
