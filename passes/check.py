"""A kernel TVM cannot build costs that kernel, not the build.

``RecordKernels`` runs after ``FuseTIR``, before any schedule: it keeps each PrimFunc as it is
then.  ``CheckKernels`` runs once every kernel is scheduled (CUDA targets): it lowers, generates
and compiles them all ahead of the build (:func:`tvm_stitch.codegen.check.failing`: NVRTC on
the GPU host, ``nvcc`` on a machine without a GPU, one compile for the whole module), and gives
each kernel that fails back to TVM's default schedule of its recorded form — with the reason, as
a warning, since such a kernel is a defect of tvm-stitch's.  The Triton kernels' launchers are
not checked: Triton compiled them while they were generated.
"""

from __future__ import annotations

import logging

import tvm

from tvm_stitch.codegen.check import build_error, failing

from .module import replace_functions

logger = logging.getLogger("tvm_stitch.stitch")


@tvm.transform.module_pass(opt_level=0, name="StitchRecordKernels")
class RecordKernels:
    """Keep every unscheduled PrimFunc of the module, by name, in ``store``.

    Parameters
    ----------
    store : dict
        Shared with :class:`CheckKernels`.
    """

    def __init__(self, store: dict):
        self.store = store

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.store.clear()  # one module's kernels at a time
        self.store.update({gv.name_hint: f for gv, f in mod.functions.items()
                           if isinstance(f, tvm.tirx.PrimFunc) and not _generated(f)})
        return mod


@tvm.transform.module_pass(opt_level=0, name="StitchCheckKernels")
class CheckKernels:
    """Build the module's kernels ahead of the build; one that fails is scheduled by
    ``fallback`` (TVM's default schedule passes) from its form kept by :class:`RecordKernels`.

    Parameters
    ----------
    store : dict
        The kernels :class:`RecordKernels` kept.
    fallback : list of tvm.transform.Pass
        TVM's own schedule passes for the target.
    """

    def __init__(self, store: dict, fallback: list):
        self.store = store
        self.fallback = tvm.transform.Sequential(list(fallback))

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        target = tvm.target.Target.current(allow_none=True)
        if target is None or target.kind.name != "cuda":
            return mod  # a CPU's kernels are lowered with each plan (schedule_pattern)
        funcs = {gv.name_hint: f for gv, f in mod.functions.items()
                 if isinstance(f, tvm.tirx.PrimFunc) and gv.name_hint in self.store}
        updates = {}
        for name, why in failing(funcs, target).items():
            redo = self.fallback(tvm.IRModule({name: self.store[name]}))[name]
            again = build_error({name: redo}, target)
            if again:
                logger.warning("stitch: kernel %s cannot be built (%s), nor with TVM's "
                               "schedule (%s)", name, why, again)
                continue
            logger.warning("stitch: kernel %s cannot be built (%s); TVM's schedule instead",
                           name, why)
            updates[mod.get_global_var(name)] = redo
        return replace_functions(mod, updates)


def _generated(func) -> bool:
    """A generated kernel's launcher (compiled by Triton as it was generated)."""
    return bool(func.attrs and "tvm_stitch.kernel" in func.attrs)
