"""Reductions over half-precision tensors accumulate in float32.

TVM legalizes ``R.sum``/``R.mean``/``R.variance`` and ``R.nn.softmax``/``R.nn.log_softmax`` on a
float16 tensor into TIR that accumulates in float16: a sum of 4096 ones stops at 2048.
``nn.layer_norm`` and ``nn.rms_norm`` already accumulate in float32 inside TVM, as PyTorch does for
every half-precision reduction.  ``AccumulateFloat32`` rewrites the other reductions to read their
input cast to float32 and cast the result back, before ``LegalizeOps``::

    R.sum(x)  ->  R.astype(R.sum(R.astype(x, "float32")), "float16")

The casts are elementwise, so the stitched kernel reads the half-precision tensor once and keeps
the float32 values in registers; the bytes moved do not change.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax

logger = logging.getLogger("tvm_stitch.precision")

#: Reductions whose TVM legalization accumulates in the input's dtype.
PROMOTED = ("relax.sum", "relax.mean", "relax.variance", "relax.nn.softmax", "relax.nn.log_softmax")
HALF = ("float16", "bfloat16")
#: Functions that stand for one kernel (fused groups, pattern-matched composites) are kept whole.
_KERNEL_ATTRS = ("Primitive", "Composite", "Codegen")


@relax.expr_functor.mutator
class _Promoter(relax.PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0
        self._ops = {tvm.ir.Op.get(name) for name in PROMOTED}

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if call.op not in self._ops or len(call.args) != 1:
            return call
        dtype = _dtype(call.args[0])
        if dtype not in HALF:
            return call
        wide = self.builder_.emit(relax.op.astype(call.args[0], "float32"))
        out = self.builder_.emit(relax.Call(call.op, [wide], call.attrs))
        self.count += 1
        return relax.op.astype(out, dtype)


def _dtype(expr) -> str | None:
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else None


@tvm.transform.module_pass(opt_level=0, name="AccumulateFloat32")
class AccumulateFloat32:
    """Half-precision sums, means, variances and softmaxes accumulate in float32.

    Runs on Relax operators, before ``LegalizeOps``; other operators are unchanged.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        promoter = _Promoter(mod)
        for gv, func in mod.functions.items():
            attrs = func.attrs or {}
            if isinstance(func, relax.Function) and not any(k in attrs for k in _KERNEL_ATTRS):
                try:
                    new = promoter.visit_expr(func)
                except Exception as err:  # noqa: BLE001 - never break a build: keep TVM's dtypes
                    logger.warning("precision: %s left as it is: %r", gv.name_hint, err)
                    continue
                promoter.builder_.update_func(gv, new)
        if not promoter.count:
            return mod
        logger.info("precision: %d half-precision reductions accumulate in float32", promoter.count)
        return promoter.builder_.get()
