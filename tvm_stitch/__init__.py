"""tvm-stitch: cross-operator fusion for transformer inference on NVIDIA GPUs, as a TVM extension.

>>> import tvm, tvm_stitch
>>> ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))
>>> ex = tvm.compile(mod, target, relax_pipeline="stitch")      # the same, by name
>>> tvm_stitch.fusion_report(mod, target).kernels
>>> fn = tvm_stitch.from_torch(model, example_inputs, target="cuda")   # from PyTorch

Importing the package imports nothing heavy: the names below load their modules on first use,
and TVM is hooked when it is imported (before or after this package): ``"stitch"`` is registered
with Relax's pipelines, and libraries holding Triton PTX load (:mod:`.codegen.ptx`). A library
built by the stitch pipeline therefore loads where only TVM's runtime is installed.
"""

from __future__ import annotations

import importlib
import sys
import types

from ._hooks import after_import

__version__ = "0.1.0"

_NAMES = {
    "from_torch": "frontend",
    "HardwareModel": "hardware",
    "UnsupportedTargetError": "hardware",
    "default_pipeline": "pipeline",
    "phases": "pipeline",
    "pipeline": "pipeline",
    "register": "pipeline",
    "FusionReport": "report",
    "compare_pipelines": "report",
    "fusion_report": "report",
}

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


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    elif name == "passes":
        value = importlib.import_module(".passes", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose ``pipeline`` stays the function: importing the submodule of that name
    (which any ``from tvm_stitch.pipeline import ...`` does first) would bind the module."""

    def __setattr__(self, name, value):
        if name == "pipeline" and isinstance(value, types.ModuleType):
            value = value.pipeline
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def _on_tvm() -> None:
    """TVM is imported: let libraries holding Triton PTX load, and register ``"stitch"`` where
    TVM has its compiler (Relax is imported with it; a runtime-only TVM has none): the pipeline
    module registers it as it loads (or has, or will once its own import of TVM returns)."""
    from .codegen import ptx

    ptx.install()
    if "tvm.relax" in sys.modules:
        importlib.import_module(".pipeline", __name__)


after_import("tvm", _on_tvm)
