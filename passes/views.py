"""Reshapes of symbolic shape as the injective ops they are.

TVM's ``AnnotateTIROpPattern`` marks a legalized reshape whose shapes are symbolic (its indices
``floordiv``/``floormod`` by a dim known only at run time) opaque, so ``FuseOps`` and the
stitch former fuse nothing through it: a cast before it and the mask after it stay apart, and
a slice of position embeddings stays a copy of its own, where the same model with static shapes
runs one kernel.  :class:`InjectiveViews` marks every PrimFunc of symbolic shape that only
moves data (one block, no reduction, its value one load) injective again, as TVM marks the
static one.
"""

from __future__ import annotations

import logging

import tvm
from tvm import ir, tirx

from tvm_stitch.graph.tdg import static_dims
from tvm_stitch.graph.tir_walk import iter_sblocks

logger = logging.getLogger("tvm_stitch.views")

#: TVM's op patterns (``relay.op.OpPattern``): injective, opaque
INJECTIVE, OPAQUE = 2, 8


def moves_data(func: tirx.PrimFunc) -> bool:
    """Whether ``func`` computes one tensor by one block whose value is one load of another
    (a reshape, transpose, slice or broadcast): no arithmetic, no reduction."""
    blocks = [b for b, _ in iter_sblocks(func.body) if b.iter_vars]
    if len(blocks) != 1:
        return False
    block = blocks[0]
    store = block.body
    return (all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)
            and isinstance(store, tirx.BufferStore)
            and isinstance(store.value, ir.expr.TensorLoad))


@tvm.transform.module_pass(opt_level=0, name="StitchInjectiveViews")
class InjectiveViews:
    """PrimFuncs of symbolic shape that only move data (:func:`moves_data`), marked opaque by
    ``AnnotateTIROpPattern``, marked injective (run after it)."""

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        changed = []
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tirx.PrimFunc) or func.attrs is None:
                continue
            if int(func.attrs.get("op_pattern", -1)) != OPAQUE:
                continue
            symbolic = any(static_dims(p.shape) is None for p in func.params
                           if hasattr(p, "shape"))
            if symbolic and moves_data(func):
                mod[gv] = func.with_attr("op_pattern", INJECTIVE)
                changed.append(gv.name_hint)
        if changed:
            logger.info("views of symbolic shape made injective: %s", ", ".join(changed))
        return mod
