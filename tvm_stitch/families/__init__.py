"""The kernel families MCFuser's pass generates, one folder each, and their registry.

A family's name is its one name everywhere: the value of the ``mcfuser`` pipeline option, the
``family`` of its matches, the prefix of its generated kernels (``stitch_<name>_<digest>``, the
tuning database's keys), its tile search's seeds and launch options
(:data:`tvm_stitch.tune.kernels.SEEDS`, :data:`tvm_stitch.codegen.triton_kernels.LAUNCHES`) and
the first word of its log lines. Its folder holds its recognizer (``recognize.py``, analysis)
and its printers (``triton.py``, ``gluon.py``: code generation).

This module is data only (the package's lowest layer): whatever imports a family's modules
finds them by :meth:`Family.module`.
"""

from __future__ import annotations

import dataclasses
import importlib


@dataclasses.dataclass(frozen=True)
class Family:
    """A kernel family.

    Attributes
    ----------
    name : str
        Its one name (see the module's docstring).
    computes : str
        What its kernels compute, in a line.
    """

    name: str
    computes: str

    def module(self, part: str):
        """The family's module ``part`` (``"recognize"``, ``"triton"``, ``"gluon"``)."""
        return importlib.import_module(f"{__name__}.{self.name}.{part}")


#: every family, by name: adding one is a folder and a line here
REGISTRY: dict[str, Family] = {
    f.name: f
    for f in (
        Family("attention", "softmax(g(Q·Kᵀ))·V: scales, masks, K/V shared by query heads"),
        Family("chain", "two products, the second reading the first through casts"),
        Family("gemm", "a product and its epilogue; products sharing A side by side"),
    )
}

#: the families' names, in the registry's order
FAMILIES = tuple(REGISTRY)
