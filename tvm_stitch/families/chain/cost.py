"""A GEMM chain's program for the cost model (:mod:`tvm_stitch.cost.model`): flash-style, one
program per (instance, row tile), a loop over the first product's column tiles, each
multiplied into the second product's accumulator."""

from __future__ import annotations

from tvm_stitch.cost.model import Program, pair_program


def program(w, tiles: dict, launch: dict, hw) -> Program:
    """One program's work (see :class:`~tvm_stitch.cost.model.Program`)."""
    return pair_program(w, tiles, launch, sfu=0.0, warps=int(launch.get("num_warps", 4)))
