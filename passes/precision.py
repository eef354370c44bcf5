"""Half-precision numerics as PyTorch's: float32 accumulation, float16 storage, float32 arithmetic.

Reductions over half-precision tensors accumulate in float32.

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

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir.prim import expr as P

from tvm_stitch.analysis.elem import INTRINSICS
from tvm_stitch.analysis.indexing import HALF, dtype_of
from tvm_stitch.graph.tir_walk import iter_exprs

from .module import replace_functions

logger = logging.getLogger("tvm_stitch.precision")

#: Reductions whose TVM legalization accumulates in the input's dtype.
PROMOTED = ("relax.sum", "relax.mean", "relax.variance", "relax.nn.softmax", "relax.nn.log_softmax")
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
        promoter = _rewrite_functions(_Promoter(mod), mod)
        if not promoter.count:
            return mod
        logger.info("precision: %d half-precision reductions accumulate in float32", promoter.count)
        return promoter.builder_.get()


def _rewrite_functions(mutator, mod):
    """``mutator`` run over every Relax function of ``mod`` but those standing for one kernel;
    a function it fails on is left as it is (never break a build: TVM's dtypes are kept)."""
    for gv, func in mod.functions.items():
        attrs = func.attrs or {}
        if isinstance(func, relax.Function) and not any(k in attrs for k in _KERNEL_ATTRS):
            try:
                new = mutator.visit_expr(func)
            except Exception as err:  # noqa: BLE001 - never break a build
                logger.warning("precision: %s left as it is: %r", gv.name_hint, err)
                continue
            mutator.builder_.update_func(gv, new)
    return mutator


# -- half-precision activations -------------------------------------------------------------------
#: Ops whose dtypes are left as they are: products and convolutions (``ToMixedPrecision`` already
#: gives them half-precision operands and float32 accumulation) and casts (they say their dtype).
_KEEP = ("relax.matmul", "relax.linear", "relax.astype", "relax.nn.conv1d", "relax.nn.conv2d",
         "relax.nn.conv3d", "relax.nn.conv2d_transpose")
#: Largest finite value of each 16-bit float format (saturation bounds)
_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}
#: Ops TVM 0.27 legalizes in float32 and float16 only: in a bfloat16 module they run in float32
#: between casts (PyTorch's bfloat16 LayerNorm also computes in float32 and rounds once)
_NO_BFLOAT16 = ("relax.nn.layer_norm", "relax.nn.group_norm", "relax.nn.instance_norm")
#: Reductions that sum (max and min are exact in any format): a norm's statistics
_SUMS = ("relax.sum", "relax.mean", "relax.variance", "relax.std", "relax.prod")


def _summed_only(mod) -> set:
    """Vars read by sums only (the ``x²`` of an RMSNorm's mean, the squared deviations of a
    LayerNorm written out): computed in float32 from their float16 operands, as PyTorch's
    norms compute them, so ``x²`` cannot overflow float16 before it is averaged."""
    readers: dict = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                op = value.op.name if isinstance(value, relax.Call) and isinstance(
                    value.op, tvm.ir.Op) else None
                for var in relax.analysis.free_vars(value):
                    readers.setdefault(var, set()).add(op)
        for var in relax.analysis.free_vars(func.body.body):
            readers.setdefault(var, set()).add(None)
    return {var for var, ops in readers.items() if ops <= set(_SUMS)}


@relax.expr_functor.mutator
class _Narrower(relax.PyExprMutator):
    """Float32 activations computed in float16: each op with a float32 result (but products and
    casts) is re-emitted on float16 operands when its type then comes out float16; its float32
    form stays as a cast for consumers that want float32 (dead, and removed, when none do).
    Values computed from no parameter (rotary tables: angles of up to ``seq`` radians, whose
    float16 rounding alone moves a cosine by 0.06 at position 255) stay float32 up to where they
    meet an activation.  A norm's statistics (sums and means, and what is computed from them
    alone: ``rsqrt(mean(x²) + eps)``), the values only summed (``x²``) and the ops applying a
    statistic (``x · rstd``) stay float32, as PyTorch's norms compute them in float32 and round
    their output once."""

    def __init__(self, mod, dtype: str = "float16"):
        super().__init__(mod)
        self.dtype = dtype  # the 16-bit format activations are computed in
        self.half: dict = {}  # original float32 var -> its float16 value
        self.independent: set = set()  # vars computed from no function parameter
        self.wide: dict = {}  # independent var rounded to float16 -> its float32 value
        self.statistics: set = set()  # sums and values computed from them alone
        self.summed = _summed_only(mod)
        self.count = 0

    def _float32_statistic(self, binding) -> bool:
        """Whether ``binding`` is a statistic, a value only summed, or applies a statistic
        (then it is kept float32; statistics are recorded)."""
        value = binding.value
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return False
        args = [a for a in value.args if isinstance(a, relax.Var)]
        stats = [a for a in args if a in self.statistics]
        if value.op.name in _SUMS or (
            stats and all(a in self.statistics or a in self.independent for a in args)
        ):
            self.statistics.add(binding.var)
            return True
        return bool(stats) or binding.var in self.summed

    def _narrow(self, arg):
        if isinstance(arg, relax.Var) and arg in self.half:
            return self.half[arg]
        new = self.visit_expr(arg)
        if _dtype(new) != "float32":
            return new
        bound = self.lookup_binding(new) if isinstance(new, relax.Var) else None
        for const in (new, bound):
            if isinstance(const, tvm.ir.expr.Constant):
                return _saturated(const, self.dtype)
        if isinstance(arg, relax.Var) and arg in self.independent:
            # an input-independent table (rotary cos/sin, a mask) meets the activations: cast
            # there, as ``cos.to(x.dtype)`` does, its finite extremes saturated (a float32
            # minimum would round to -inf) and its infinities kept (a boolean mask's -inf)
            return self.builder_.emit(relax.op.astype(self._saturate(new), self.dtype))
        return self.builder_.emit(relax.op.astype(new, self.dtype))

    def visit_var_binding_(self, binding):
        value = binding.value
        if all(v in self.independent for v in relax.analysis.free_vars(value)):
            # computed from no parameter (positions, rotary angles and tables, causal masks):
            # kept in the model's float32, as PyTorch computes rotary tables (with static shapes
            # the pipeline folds them at compile time: the precision costs nothing at run time)
            self.independent.add(binding.var)
            self._independent_binding(binding)
            return
        source = _cast(value, "float32")
        if source is not None and _dtype(source) in HALF:  # astype(x16, float32)
            self.half[binding.var] = self.visit_expr(source)
        target = _cast(value, self.dtype)
        if isinstance(target, relax.Var) and target in self.half:
            self._rebind(binding, self.half[target])  # astype(x32, float16) of a narrowed x
            return
        if isinstance(target, tvm.ir.expr.Constant) and _dtype(target) == "float32":
            self._rebind(binding, _saturated(target, self.dtype))
            return
        if self._narrow_tuple(binding):
            return
        if not self._narrowable(value, self.dtype) or self._float32_statistic(binding):
            super().visit_var_binding_(binding)
            return
        call = relax.Call(value.op, [self._narrow(a) for a in value.args], value.attrs,
                          value.ty_args)
        try:
            call = self.builder_.normalize(call)
        except Exception:  # noqa: BLE001 - an op that insists on float32 stays as it is
            call = None
        if call is None or not _tensor_of(call.ty, self.dtype):
            super().visit_var_binding_(binding)
            return
        half = self.builder_.emit(call)
        self.half[binding.var] = half
        self.count += 1
        self._rebind(binding, relax.op.astype(half, "float32"))

    def _narrow_tuple(self, binding) -> bool:
        """A tuple of float32 tensors (``split``'s) computed in float16 as other ops are, and
        the items read from it (whose casts back to float16 are then the float16 items): a
        split of a float16 activation is no float32 round trip. False where ``binding`` is
        neither (nothing emitted)."""
        value = binding.value
        if isinstance(value, relax.TupleGetItem) and value.tuple_value in self.half:
            item = self.builder_.emit(relax.TupleGetItem(self.half[value.tuple_value],
                                                         value.index))
            self.half[binding.var] = item
            self._rebind(binding, relax.op.astype(item, "float32"))
            return True
        ty = getattr(value, "ty", None)
        if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                and value.op.name not in _KEEP and isinstance(ty, tvm.ir.TupleType)
                and ty.fields and all(_tensor_of(f, "float32") for f in ty.fields)
                and any(isinstance(a, relax.Var) and a in self.half for a in value.args)):
            return False
        try:
            call = self.builder_.normalize(relax.Call(
                value.op, [self._narrow(a) for a in value.args], value.attrs, value.ty_args))
        except Exception:  # noqa: BLE001 - an op that insists on float32 stays as it is
            return False
        if not all(_tensor_of(f, self.dtype) for f in call.ty.fields):
            return False
        half = self.builder_.emit(call)
        self.half[binding.var] = half
        self.count += 1
        self._rebind(binding, relax.Tuple([
            relax.op.astype(relax.TupleGetItem(half, i), "float32")
            for i in range(len(call.ty.fields))]))
        return True

    def _independent_binding(self, binding):
        """An input-independent value: float16 roundings that ``ToMixedPrecision`` put inside
        the independent region (operands and result of a product of positions and inverse
        frequencies, as transformers 5.17's LLaMA writes its rotary angles) are undone — each
        value keeps its float32 form (``self.wide``) until it meets an activation, where
        :meth:`_narrow` casts it once."""
        value = binding.value
        target = _cast(value, self.dtype)
        if target is not None and _dtype(target) == "float32":
            self.wide[binding.var] = self._wide(target)
            # its own cast to float16 saturates (a float32 minimum would become -inf)
            self._rebind(binding, self._narrow(target))
            self.count += 1
            return
        source = _cast(value, "float32")
        if isinstance(source, relax.Var) and source in self.wide:
            self._rebind(binding, self.wide[source])  # astype(round(x), float32) is x
            self.count += 1
            return
        wide = self._widened(value)
        if wide is None:
            super().visit_var_binding_(binding)
            return
        self.count += 1
        if _tensor_of(binding.var.ty, "float32"):
            self._rebind(binding, wide)
            return
        self.wide[binding.var] = wide = self.builder_.emit(wide)
        self._rebind(binding, relax.op.astype(self._saturate(wide), str(binding.var.ty.dtype)))

    def _saturate(self, value):
        """``value`` (float32) with its finite values clipped to the 16-bit range; infinities
        stay (a mask of ``-inf`` hides its keys, and a row of them is a row with no key)."""
        bound = _MAX[self.dtype]
        clipped = self.builder_.emit(relax.op.clip(value, -bound, bound))
        return self.builder_.emit(relax.op.where(relax.op.isinf(value), value, clipped))

    def _wide(self, arg):
        """``arg`` (an original var or expression) in float32 where it was rounded (a float16
        constant beside it, exactly), else as the mutator has it."""
        if isinstance(arg, relax.Var) and arg in self.wide:
            return self.wide[arg]
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self._wide(f) for f in arg.fields])
        if isinstance(arg, tvm.ir.expr.Constant) and _dtype(arg) == self.dtype:
            return relax.const(arg.value.numpy().astype("float32"), "float32")
        return self.visit_expr(arg)

    def _rounded(self, arg) -> bool:
        if isinstance(arg, relax.Tuple):
            return any(self._rounded(f) for f in arg.fields)
        return isinstance(arg, relax.Var) and arg in self.wide

    def _widened(self, value):
        """``value`` recomputed on the float32 values its rounded operands came from (a
        float32 result), or None when no operand was rounded or the op will not take them."""
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if value.op == tvm.ir.Op.get("relax.astype"):
            return None
        if not any(self._rounded(a) for a in value.args):
            return None
        call = relax.Call(value.op, [self._wide(a) for a in value.args], value.attrs,
                          value.ty_args)
        try:
            call = self.builder_.normalize(call)
        except Exception:  # noqa: BLE001 - an op that insists on its dtypes: keep the rounding
            return None
        return call if _tensor_of(call.ty, "float32") else None

    def _rebind(self, binding, value):
        """Bind ``value`` where ``binding`` was (a dataflow var, or a block's output)."""
        var = binding.var
        if isinstance(var, relax.DataflowVar) or not self.builder_.current_block_is_dataflow():
            new = self.builder_.emit(value, var.name)
        else:
            new = self.builder_.emit_output(value, var.name)
        self.set_var_remap(var, new)

    @staticmethod
    def _narrowable(value, dtype) -> bool:
        return (
            isinstance(value, relax.Call)
            and isinstance(value.op, tvm.ir.Op)
            and value.op.name not in _KEEP
            and not (dtype == "bfloat16" and value.op.name in _NO_BFLOAT16)
            and _tensor_of(value.ty, "float32")
        )


def _saturated(const, dtype: str = "float16"):
    """A float32 constant in ``dtype``, its finite extremes saturated: ``finfo(float32).min``,
    which masks are made of, becomes the 16-bit format's lowest finite value (as in a float16 or
    bfloat16 model), not -inf (``0 * -inf`` is NaN).  Infinities stay: ``-inf`` is what a
    boolean mask becomes (``scaled_dot_product_attention``'s), and a row of it has no key to
    attend to."""
    value = const.value.numpy()
    value = np.where(np.isinf(value), value, np.clip(value, -_MAX[dtype], _MAX[dtype]))
    return relax.const(as_dtype(value, dtype), dtype)


def as_dtype(value, dtype: str):
    """``value`` (a float32 array) rounded to ``dtype`` (bfloat16 through ``ml_dtypes``)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return np.asarray(value, dtype="float32").astype(ml_dtypes.bfloat16)
    return np.asarray(value).astype(dtype)


def _cast(value, dtype):
    """``x`` of ``astype(x, dtype)``, else None."""
    if (
        isinstance(value, relax.Call)
        and value.op == tvm.ir.Op.get("relax.astype")
        and str(value.attrs.dtype) == dtype
    ):
        return value.args[0]
    return None


def _tensor_of(ty, dtype) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == dtype


@tvm.transform.module_pass(opt_level=0, name="HalfActivations")
class HalfActivations:
    """Activations in float16 (or bfloat16), as after PyTorch's ``model.half()`` (``.bfloat16()``).

    Runs after ``relax.transform.ToMixedPrecision``, which gives products float16 operands but
    computes every other op in float32 unless all its operands come from products: a transformer's
    embedding lookup (``take``, no mixed-precision policy in TVM) then keeps the whole residual
    stream — its adds and LayerNorms — in float32, twice the bytes PyTorch moves for the same
    model in float16.  Here every op with a float32 result but products and casts is computed on
    16-bit operands (finite float32 constants saturated to the format's range, as a 16-bit
    model's ``finfo.min`` masks are; infinities, a boolean mask's ``-inf``, stay infinite);
    reductions still accumulate in float32 (:class:`AccumulateFloat32`, TVM's norms).  Values
    that depend on no parameter (rotary angles and tables, masks built from positions) stay
    float32 and are cast, saturated alike, where they meet an activation — as
    PyTorch's rotary embeddings compute their tables in float32.  The function's signature is
    unchanged.

    Parameters
    ----------
    dtype : {"float16", "bfloat16"}
        The 16-bit format of the module's products (for bfloat16, run :class:`AsBFloat16` on
        ``ToMixedPrecision``'s float16 first).
    """

    def __init__(self, dtype: str = "float16"):
        if dtype not in HALF:
            raise ValueError(f"dtype must be one of {HALF}, got {dtype!r}")
        self.dtype = dtype

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        narrower = _rewrite_functions(_Narrower(mod, self.dtype), mod)
        if not narrower.count:
            return mod
        logger.info("precision: %d ops computed in %s instead of float32", narrower.count,
                    self.dtype)
        out = narrower.builder_.get()
        return relax.transform.DeadCodeElimination()(relax.transform.CanonicalizeBindings()(out))


# -- bfloat16 --------------------------------------------------------------------------------------
@relax.expr_functor.mutator
class _Retyper(relax.PyExprMutator):
    """float16 tensors, casts and constants of a module as bfloat16; types are inferred again."""

    def __init__(self, mod):
        super().__init__(mod)
        self.count = 0
        self.float32_params = _norm_parameters(mod)

    def visit_var_def_(self, var):
        ty = var.ty
        if isinstance(ty, relax.TensorType) and str(ty.dtype) == "float16":
            self.count += 1
            # a norm's scale and shift that it reads directly (ToMixedPrecision made the norm
            # float16) and nothing else reads: float32 parameters (the norm runs in float32;
            # casts of them would be per-column work inside the row kernel)
            wide = any(var.same_as(p) for p in self.float32_params)
            new = relax.Var(var.name, relax.TensorType(ty.shape, "float32", ty.vdevice) if wide
                            else _as_bfloat16(ty))
            self.set_var_remap(var, new)
            return new
        return var

    def visit_call_(self, call):
        args = [self._arg(a) for a in call.args]
        op = call.op if isinstance(call.op, tvm.ir.Op) else self.visit_expr(call.op)
        ty_args = [_as_bfloat16(t) for t in call.ty_args]
        if call.op == tvm.ir.Op.get("relax.astype") and str(call.attrs.dtype) == "float16":
            self.count += 1
            return relax.op.astype(args[0], "bfloat16")
        if isinstance(op, tvm.ir.Op) and op.name in _NO_BFLOAT16 and _dtype(call) in HALF:
            wide = [self.builder_.emit(relax.op.astype(a, "float32")) if _dtype(a) == "bfloat16"
                    else a for a in args]
            out = self.builder_.emit(relax.Call(op, wide, call.attrs, call.ty_args))
            return relax.op.astype(out, "bfloat16")
        return relax.Call(op, args, call.attrs, ty_args)  # its type inferred again

    def _arg(self, arg):
        if isinstance(arg, relax.Tuple):  # a concat's operands
            return relax.Tuple([self._arg(f) for f in arg.fields])
        if isinstance(arg, tvm.ir.expr.Constant) and _dtype(arg) == "float16":
            self.count += 1
            value = as_dtype(arg.value.numpy(), "bfloat16")
            return relax.const(value, "bfloat16")
        return self.visit_expr(arg)


def _as_bfloat16(ty):
    """``ty`` with a float16 tensor type as bfloat16."""
    if isinstance(ty, relax.TensorType) and str(ty.dtype) == "float16":
        return relax.TensorType(ty.shape, "bfloat16", ty.vdevice)
    return ty


def _norm_parameters(mod) -> list:
    """Function parameters read only as the scale or shift of ops that run in float32 in a
    bfloat16 module (:data:`_NO_BFLOAT16`)."""
    found = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        uses: dict = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                norm = (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)
                        and value.op.name in _NO_BFLOAT16)
                for var in relax.analysis.free_vars(value):
                    only_scale = norm and not value.args[0].same_as(var)
                    uses.setdefault(var, []).append(only_scale)
        for var in relax.analysis.free_vars(func.body.body):
            uses.setdefault(var, []).append(False)
        found += [p for p in func.params if uses.get(p) and all(uses[p])]
    return found


def _float16_left(mod) -> list[str]:
    """What of ``mod``'s Relax functions is still typed float16 (op names; empty: nothing)."""
    left = []
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue

        def visit(e):
            ty = getattr(e, "ty", None)
            if isinstance(ty, relax.TensorType) and str(ty.dtype) == "float16":
                op = e.op.name if isinstance(e, relax.Call) and isinstance(e.op, tvm.ir.Op) else (
                    type(e).__name__)
                left.append(op)

        relax.analysis.post_order_visit(func, visit)
    return left


@tvm.transform.module_pass(opt_level=0, name="AsBFloat16")
class AsBFloat16:
    """``ToMixedPrecision``'s float16 as bfloat16: parameters, casts and constants (TVM's
    mixed-precision pass knows only float16; the products keep their float32 accumulation).

    Raises ValueError when a float16 value is left that the rewrite cannot retype (an op
    with its own float16 attribute), rather than compile a model in two formats.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        retyper = _rewrite_functions(_Retyper(mod), mod)
        out = retyper.builder_.get()
        left = _float16_left(out)
        if left:
            raise ValueError(f"float16 left after the bfloat16 rewrite: {sorted(set(left))}")
        logger.info("precision: %d float16 parameters, casts and constants as bfloat16",
                    retyper.count)
        return out


# -- float32 arithmetic inside kernels -------------------------------------------------------------
_ARITH = (P.Add, P.Sub, P.Mul, P.Div, P.Min, P.Max)
_COMPARE = (P.EQ, P.NE, P.LT, P.LE, P.GT, P.GE, P.And, P.Or)
#: Intrinsics computed in float32 on float32 operands
_MATH = INTRINSICS - {"isnan", "isinf"}


def _float32_like(dtype: str) -> str | None:
    """``float32`` with ``dtype``'s lanes where ``dtype`` is a 16-bit float, else None."""
    base, _, lanes = dtype.partition("x")
    return None if base not in HALF else "float32" + (f"x{lanes}" if lanes else "")


def _intrinsic(expr) -> str | None:
    if isinstance(expr, tvm.ir.expr.Call) and isinstance(expr.op, tvm.ir.Op):
        return expr.op.name.removeprefix("tirx.").removeprefix("prim.")
    return None


def _computes_half(value) -> bool:
    """Whether ``value`` does float16 arithmetic (not only loads, casts and selections)."""
    return any(
        _float32_like(dtype_of(e)) and (isinstance(e, _ARITH) or _intrinsic(e) in _MATH)
        for e in iter_exprs(value)
    )


def _widen(expr):
    """``expr`` with its float16 arithmetic done in float32: a float16 value becomes float32,
    rounded to float16 only where ``expr`` casts explicitly; other dtypes are kept."""
    wide = _float32_like(dtype_of(expr))
    if wide is None:
        if isinstance(expr, P.Cast) and _float32_like(dtype_of(expr.value)):
            inner = _widen(expr.value)
            return inner if dtype_of(inner) == dtype_of(expr) else P.Cast(dtype_of(expr), inner)
        if isinstance(expr, _COMPARE):
            return type(expr)(_widen(expr.a), _widen(expr.b))
        if isinstance(expr, P.Not):
            return P.Not(_widen(expr.a))
        if isinstance(expr, P.Select):
            parts = (expr.condition, expr.true_value, expr.false_value)
            return P.Select(*[_widen(p) for p in parts])
        return expr
    if isinstance(expr, P.FloatImm):
        return P.FloatImm(wide, float(expr.value))
    if isinstance(expr, _ARITH):
        return type(expr)(_widen(expr.a), _widen(expr.b))
    if isinstance(expr, P.Select):
        parts = (expr.condition, expr.true_value, expr.false_value)
        return P.Select(*[_widen(p) for p in parts])
    if isinstance(expr, P.Broadcast):
        return P.Broadcast(_widen(expr.value), expr.lanes)
    if isinstance(expr, P.Cast) and not _float32_like(dtype_of(expr.value)):
        # an explicit rounding (float32 -> float16) stays one; its operand is computed wide
        return P.Cast(wide, P.Cast(dtype_of(expr), _widen(expr.value)))
    if _intrinsic(expr) in _MATH or _intrinsic(expr) == "if_then_else":
        return tirx.call_intrin(wide, expr.op, *[_widen(a) for a in expr.args])
    return P.Cast(wide, expr)  # a load, a variable, an opaque call: read, then widened


def _self_update(store) -> bool:
    """``acc[i] = acc[i] ⊕ …``: a reduction's update keeps its accumulator's dtype."""
    return any(
        isinstance(e, tvm.ir.expr.TensorLoad) and e.source.same_as(store.buffer)
        for e in iter_exprs(store.value)
    )


def _store_float32(store):
    if not _computes_half(store.value) or _self_update(store):
        return store
    value = _widen(store.value)
    if dtype_of(value) != dtype_of(store.value):
        value = P.Cast(dtype_of(store.value), value)
    return tirx.BufferStore(store.buffer, value, store.indices)


@tvm.transform.module_pass(opt_level=0, name="ComputeFloat32")
class ComputeFloat32:
    """Float16 arithmetic inside a kernel runs in float32; values are rounded to float16 where
    they are stored (or cast explicitly), as PyTorch's fused kernels (torch.compile's) and TVM's
    LLVM code compute them.

    TVM's CUDA code otherwise rounds after every operation of a fused expression (``hexp``,
    ``__hmul``): a SiLU × up, a rotary embedding, a scaled and masked logit each round 3-5 times
    where PyTorch rounds once per operator and a fused kernel once per store.  Runs on the
    scheduled PrimFuncs; a reduction's update (``acc = acc + …``) is left as it is
    (:class:`AccumulateFloat32` chooses its dtype), and so is every store that only moves or
    selects values.  Memory traffic is unchanged: the conversions happen in registers.
    """

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions.items():
            if isinstance(func, tirx.PrimFunc):
                new = tvm_ffi.structural_map(func, [(tirx.BufferStore, _store_float32)])
                if not new.same_as(func):
                    updates[gv] = new
        if updates:
            logger.info("precision: float16 arithmetic of %d kernels computed in float32",
                        len(updates))
        return replace_functions(mod, updates)
