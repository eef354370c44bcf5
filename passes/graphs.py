"""Kernels that read a function's inputs, moved out of the way of TVM's CUDA graphs.

TVM's ``RewriteCUDAGraph`` (``relax.backend.use_cuda_graph``) captures runs of kernel launches
whose tensors are weights (the parameters after ``num_input``) or its own static allocations;
a launch that reads a model input (``input_ids``, an attention mask) cannot be replayed with the
next call's input, so it runs outside and cuts the graph in two.  A padding mask read by every
layer's attention kernel cuts a BERT into one graph per layer, each boundary a VM round trip
(~1.8 µs).  ``StageInputs`` copies such an input once, at the start of the function, into a
tensor of the function's own: every kernel then reads the copy, and only the copies run outside
the graph.  An input is copied only where that costs less than the cuts it saves
(:mod:`tvm_stitch.cost.graphs`): three 64 MB inputs of one attention kernel are not.

A function of symbolic shape (``R.Tensor(("batch", "seq"))``) whose input dims all have upper
bounds (``tir_var_upper_bound``, which memory planning sizes its storage by) has those inputs
copied too, and is annotated with TVM's ``relax.rewrite_cuda_graph.capture_symbolic_vars``:
its graph is then captured once per value of the dims (at the first call of each shape) and
replayed at every later call of that shape.
"""

from __future__ import annotations

import logging

import tvm
from tvm import relax, te

from tvm_stitch.cost.graphs import inputs_to_stage
from tvm_stitch.graph import dtype_bytes
from tvm_stitch.hardware import HardwareModel

from .module import replace_functions

logger = logging.getLogger("tvm_stitch.graphs")


#: TVM's attribute naming the symbolic dims a function's CUDA graphs are captured per value of
CAPTURE_VARS = "relax.rewrite_cuda_graph.capture_symbolic_vars"


def _bounded_shape(var, bounded: set) -> tuple | None:
    """The shape of a tensor variable when every dimension is a constant or a dim in
    ``bounded`` (names), else None."""
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = list(ty.shape.values)
    ok = all(isinstance(d, tvm.tirx.IntImm)
             or (isinstance(d, tvm.tirx.Var) and d.name in bounded) for d in dims)
    return tuple(dims) if ok else None


def _symbolic(shape) -> list:
    return [d for d in shape if not isinstance(d, tvm.tirx.IntImm)]


def _copy(shape, dtype) -> tvm.tirx.PrimFunc:
    """An elementwise copy kernel (TVM's default schedule binds it to threads); a symbolic dim
    becomes a variable of the kernel's own, defined by its input's shape."""
    shape = [int(d) if isinstance(d, tvm.tirx.IntImm) else tvm.tirx.Var(d.name, str(d.ty))
             for d in shape]
    src = te.placeholder(shape, dtype, "x")
    dst = te.compute(shape, src, name="staged")
    return te.create_prim_func([src, dst]).with_attr("op_pattern", 0)


def _nbytes(shape, dtype: str, bounds: dict) -> int:
    """Bytes of a tensor of ``shape``, a symbolic dim at its bound."""
    named = {str(k): int(v) for k, v in bounds.items()}
    count = 1
    for d in shape:
        count *= int(d) if isinstance(d, tvm.tirx.IntImm) else named[d.name]
    return count * dtype_bytes(dtype)


#: ops that give a view of their argument, no kernel
_VIEWS = {"relax.reshape", "relax.memory.view", "relax.memory.ensure_zero_offset"}


def kernel_reads(body: relax.SeqExpr, inputs: set) -> list[frozenset]:
    """The kernel launches of ``body`` in order, each as the set of ``inputs`` it reads
    (through views, tuples and aliases of them)."""
    alias = {p: frozenset([p]) for p in inputs}
    reads = []
    for block in body.blocks:
        for binding in block.bindings:
            value = binding.value
            used = frozenset().union(*(alias.get(v, frozenset())
                                       for v in relax.analysis.free_vars(value)))
            op = value.op if isinstance(value, relax.Call) else None
            name = op.name if isinstance(op, tvm.ir.Op) else None
            if op is not None and name not in _VIEWS:
                reads.append(used)  # a kernel (or a subfunction's call)
            elif used:
                alias[binding.var] = used
    return reads


@relax.expr_functor.mutator
class _Rename(relax.PyExprMutator):
    def __init__(self, mapping):
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, op):
        return self.mapping.get(op, op)


@tvm.transform.module_pass(opt_level=0, name="StitchStageInputs")
class StageInputs:
    """Copy the model inputs its kernels read into tensors of the function's own, first thing,
    when CUDA graphs are on (``relax.backend.use_cuda_graph``; else nothing changes), where the
    copies cost less than the graph cuts they save (:func:`~tvm_stitch.cost.graphs.inputs_to_stage`:
    a mask read by every layer is copied; large inputs read by a few kernels are not).

    Only functions that say which parameters are inputs (the ``num_input`` attribute, which
    ``RewriteCUDAGraph`` reads too) are changed, and only their inputs whose dims are constants
    or symbolic dims with an upper bound; a function with such symbolic dims is annotated to
    capture a graph per value of them (:data:`CAPTURE_VARS`).

    Parameters
    ----------
    hw : HardwareModel, optional
        The GPU's facts the decision uses (default: the H100's).
    """

    def __init__(self, hw: HardwareModel | None = None):
        self.hw = hw

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not bool(ctx.config.get("relax.backend.use_cuda_graph", False)):
            return mod
        hw = self.hw or HardwareModel.from_target(tvm.target.Target(
            {"kind": "cuda", "arch": "sm_90a"}))
        copies = {}  # (shape, dtype) -> GlobalVar of its copy kernel
        updates = {}
        bb = relax.BlockBuilder(replace_functions(mod, {}))
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function) or func.attrs is None:
                continue
            if "num_input" not in func.attrs or not isinstance(func.body, relax.SeqExpr):
                continue
            read = set(relax.analysis.free_vars(func.body))
            bounds = dict(func.attrs.get("tir_var_upper_bound", None) or {})
            bounded = {str(k) for k in bounds}
            shapes = {p: _bounded_shape(p, bounded)
                      for p in list(func.params)[: int(func.attrs["num_input"])] if p in read}
            shapes = {p: shape for p, shape in shapes.items() if shape is not None}
            if not shapes:
                continue
            reads = kernel_reads(func.body, set(shapes))
            nbytes = {p: _nbytes(shapes[p], str(p.ty.dtype), bounds) for p in shapes}
            staged = inputs_to_stage(reads, nbytes, hw)
            for p in shapes:
                if p not in staged:
                    logger.info("%s: input %s not copied: its copy (%d bytes) costs more than "
                                "the CUDA-graph cuts it saves", gv.name_hint, p.name, nbytes[p])
            inputs = [p for p in shapes if p in staged]
            # graphs are captured per value of the inputs' bounded dims, copied or not
            dims = sorted({d.name for p in shapes for d in _symbolic(shapes[p])})
            annotate = bool(dims) and CAPTURE_VARS not in func.attrs
            if not inputs and not annotate:
                continue
            updated = self._staged(bb, func, inputs, shapes, copies) if inputs else func
            if annotate:
                updated = updated.with_attr(CAPTURE_VARS, dims)
            updates[gv] = updated
            if inputs:
                logger.info("%s: inputs %s copied before the CUDA graph", gv.name_hint,
                            [p.name for p in inputs])
        if not updates:
            return mod
        return relax.transform.Normalize()(replace_functions(bb.get(), updates))

    @staticmethod
    def _staged(bb, func, inputs, shapes, copies) -> relax.Function:
        """``func`` with ``inputs`` copied first (their copy kernels added to ``bb``, one per
        shape and dtype in ``copies``) and read through the copies."""
        bindings, mapping = [], {}
        for p in inputs:
            dtype = str(p.ty.dtype)
            key = (str(shapes[p]), dtype)  # symbolic dims by name: their copy is shared
            if key not in copies:
                name = f"stage_input_{len(copies)}"
                copies[key] = bb.add_func(
                    _copy(shapes[p], dtype).with_attr("global_symbol", name), name)
            var = relax.Var(f"{p.name}_staged", p.ty)
            call = bb.normalize(relax.call_tir(copies[key], [p],
                                               relax.TensorType(shapes[p], dtype)))
            bindings.append(relax.VarBinding(var, call))
            mapping[p] = var
        body = _Rename(mapping).visit_expr(func.body)
        blocks = list(body.blocks)
        if blocks and isinstance(blocks[0], relax.DataflowBlock):
            blocks[0] = relax.DataflowBlock(bindings + list(blocks[0].bindings))
        else:
            blocks.insert(0, relax.DataflowBlock(bindings))
        return relax.Function(func.params, relax.SeqExpr(blocks, body.body),
                              func.ret_ty, func.is_pure, func.attrs)
