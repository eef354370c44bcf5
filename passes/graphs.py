"""Kernels that read a function's inputs, moved out of the way of TVM's CUDA graphs.

TVM's ``RewriteCUDAGraph`` (``relax.backend.use_cuda_graph``) captures runs of kernel launches
whose tensors are weights (the parameters after ``num_input``) or its own static allocations;
a launch that reads a model input (``input_ids``, an attention mask) cannot be replayed with the
next call's input, so it runs outside and cuts the graph in two.  A padding mask read by every
layer's attention kernel cuts a BERT into one graph per layer, each boundary a VM round trip
(~5 µs).  ``StageInputs`` copies each such input once, at the start of the function, into a
tensor of the function's own: every kernel then reads the copy, and only the copies run outside
the graph.

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
    when CUDA graphs are on (``relax.backend.use_cuda_graph``; else nothing changes).

    Only functions that say which parameters are inputs (the ``num_input`` attribute, which
    ``RewriteCUDAGraph`` reads too) are changed, and only their inputs whose dims are constants
    or symbolic dims with an upper bound; a function with such symbolic dims is annotated to
    capture a graph per value of them (:data:`CAPTURE_VARS`).
    """

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not bool(ctx.config.get("relax.backend.use_cuda_graph", False)):
            return mod
        copies = {}  # (shape, dtype) -> GlobalVar of its copy kernel
        updates = {}
        bb = relax.BlockBuilder(replace_functions(mod, {}))
        for gv, func in mod.functions.items():
            if not isinstance(func, relax.Function) or func.attrs is None:
                continue
            if "num_input" not in func.attrs or not isinstance(func.body, relax.SeqExpr):
                continue
            read = set(relax.analysis.free_vars(func.body))
            bounded = {str(k) for k in (func.attrs.get("tir_var_upper_bound", None) or {})}
            shapes = {p: _bounded_shape(p, bounded)
                      for p in list(func.params)[: int(func.attrs["num_input"])] if p in read}
            inputs = [p for p, shape in shapes.items() if shape is not None]
            if not inputs:
                continue
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
            updated = relax.Function(func.params, relax.SeqExpr(blocks, body.body),
                                     func.ret_ty, func.is_pure, func.attrs)
            dims = sorted({d.name for p in inputs for d in _symbolic(shapes[p])})
            if dims and CAPTURE_VARS not in func.attrs:
                updated = updated.with_attr(CAPTURE_VARS, dims)
            updates[gv] = updated
            logger.info("%s: inputs %s copied before the CUDA graph", gv.name_hint,
                        [p.name for p in inputs])
        if not updates:
            return mod
        return relax.transform.Normalize()(replace_functions(bb.get(), updates))
