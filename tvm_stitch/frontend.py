"""PyTorch models in one line: export, import, mixed precision, stitch compile.

>>> fn = tvm_stitch.from_torch(model, (input_ids,), target="cuda", dtype="float16")
>>> out = fn(input_ids)            # torch tensors in, the model's output structure out
>>> fn = tvm_stitch.from_torch(model, (), example_kwargs=dict(tokens))
>>> out = fn(**tokens)             # inputs by name

The model is exported with ``torch.export`` in float32 on the CPU, wherever it lives and in
whatever dtype (:func:`_converted`; it is given back as it was), and imported with TVM's
``from_exported_program``.  For ``float16``, ``relax.transform.ToMixedPrecision`` converts the
module afterwards (float16 operands, float32 accumulation, float16 weights) and
``HalfActivations`` keeps the activations in float16 as ``model.half()`` does (reductions still
accumulate in float32): TVM 0.27 cannot import a model exported in float16 (mixed dtypes in its
linear layers).  For ``bfloat16`` (the default on CUDA for a bfloat16 model), ``AsBFloat16``
retypes ``ToMixedPrecision``'s float16 first.  Tensors cross between PyTorch and
TVM through DLPack, without copies, on PyTorch's current CUDA stream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import time

import numpy as np
import tvm
from tvm import relax

from .analysis.indexing import HALF
from .errors import error_line

logger = logging.getLogger("tvm_stitch.frontend")

DTYPES = ("float32", "float16", "bfloat16")
#: bytes TVM wants a tensor's data aligned to (``from_dlpack`` refuses less)
ALIGNMENT = 64


@dataclasses.dataclass
class Imported:
    """A PyTorch module imported into Relax.

    Attributes
    ----------
    mod : tvm.IRModule
        ``main(*inputs, *weights)``: inputs first, then every parameter and buffer.
    weights : list of numpy.ndarray
        The weights in ``main``'s order (float16 for a float16 module).
    num_inputs : int
        How many of ``main``'s parameters are inputs.
    out_spec : object
        The pytree spec of the module's output (``torch.utils._pytree``), to rebuild it.
    dtype : str
    index_bounds : dict of int to int
        ``{input position: rows}``: the inputs whose values index an embedding table
        (``aten.embedding``), with the rows of the smallest table each indexes
        (:func:`_index_bounds`).
    """

    mod: tvm.IRModule
    weights: list
    num_inputs: int
    out_spec: object
    dtype: str
    index_bounds: dict = dataclasses.field(default_factory=dict)


def import_torch(
    module, example_args, dtype: str = "float32", example_kwargs=None, convert: bool = True,
    dynamic_shapes=None,
) -> Imported:
    r"""Export ``module`` with ``torch.export`` and import it into Relax.

    Parameters
    ----------
    module : torch.nn.Module
        On the CPU or the GPU, in any floating dtype: put in eval mode, on the CPU and in
        float32 for the export, and given back as it was (its tensors, their devices and
        dtypes, its training flags): while it is exported a model on the GPU or in float16 or
        bfloat16 has a float32 copy of its weights in CPU memory beside its own
        (:func:`_converted`).  A ``forward`` taking ``use_cache`` (a ``transformers`` decoder)
        is exported with ``use_cache=False`` unless ``example_kwargs`` sets it.
    example_args : tuple of torch.Tensor
        Example inputs, on any device (copied to the CPU for the export): the shapes the
        compiled model takes, but for the dims ``dynamic_shapes`` lets vary.
    dtype : {"float32", "float16", "bfloat16"}
        Compute dtype of the imported module.
    example_kwargs : dict, optional
        Keyword arguments: tensors are inputs after the positional ones; anything else
        (``use_cache=False``) is fixed for the compiled model.
    convert : bool
        Export in float32 and convert to ``dtype`` with ``ToMixedPrecision`` (the default, which
        models with weights need).  ``False`` exports in ``dtype`` directly: floating inputs
        and outputs keep the exported dtypes (TVM's importer accumulates half-precision
        products in float32; the outputs are cast back, inside the last kernel).
    dynamic_shapes : dict or tuple, optional
        ``torch.export``'s own: the inputs' dims that may vary, as ``torch.export.Dim``\ s with
        their ranges, by input name (or position) and axis, e.g. ``{"input_ids": {0:
        Dim("batch", max=64), 1: Dim("seq", max=512)}}``. They stay symbolic in the module,
        with their ranges (``tir_var_lower_bound``/``tir_var_upper_bound``).

    Returns
    -------
    Imported
    """
    import torch
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    export_dtype = torch.float32 if convert else getattr(torch, dtype)
    example_kwargs = _without_cache(module, example_kwargs or {})

    def on_cpu(a):  # an example input as the CPU's float32 export takes it
        return a.to("cpu", export_dtype) if a.is_floating_point() else a.to("cpu")

    with _for_export(module, export_dtype):
        args = tuple(on_cpu(a) for a in example_args)
        tensors = {k: on_cpu(v) for k, v in example_kwargs.items() if isinstance(v, torch.Tensor)}
        with torch.no_grad():
            try:
                exported = torch.export.export(_bind_constants(module, example_kwargs), args,
                                               kwargs=tensors, dynamic_shapes=dynamic_shapes)
            except Exception as err:
                if dynamic_shapes is None:
                    raise
                raise ValueError(
                    f"torch.export refused dynamic_shapes={dynamic_shapes!r}: "
                    f"{error_line(err, type(err).__name__)}") from err
            exported = _views_as_reshapes(exported)
        try:
            # PyTorch's decompositions as the importer runs them, and the fused attention
            # kernels' own: decomposed where the importer would find them
            exported = exported.run_decompositions(decompositions())
            mod = from_exported_program(
                exported, keep_params_as_input=True, unwrap_unit_return_tuple=True,
                run_ep_decomposition=False,
            )
        except Exception as err:
            raise RuntimeError(
                "TVM's from_exported_program could not import the exported model "
                f"({type(err).__name__}: {error_line(err, 'no message')}); a model TVM "
                "cannot import is not compiled by tvm-stitch either"
            ) from err
    from tvm_stitch.passes import finite_fills

    # a torch.full of -inf (a mask) imported as it is fails TVM's own legalization: both
    # pipelines, and the fallback to TVM's, take it as a broadcast
    mod, params = detach_params(finite_fills(mod))
    unbounded = mod
    if dynamic_shapes is not None:  # shapes under the dims' ranges, before any retyping
        from tvm_stitch.passes import BoundSymbolicShapes

        mod = BoundSymbolicShapes()(mod)
    weights = [p.numpy() for p in params["main"]]
    num_inputs = len(mod["main"].params) - len(weights)
    if not convert:
        # TVM's importer accumulates half-precision products in float32 and keeps their
        # results float32 up to the outputs; PyTorch returns the exported dtypes
        mod = _exported_output_dtypes(mod, exported)
    if dtype in HALF and convert:
        # float16 operands with float32 accumulation (out_dtype is the accumulator's dtype: with
        # "float16" results drift ~0.1 from PyTorch's on BERT-base); weights become float16
        # parameters instead of float32 ones cast on every call
        from tvm_stitch.passes.precision import AsBFloat16, HalfActivations, as_dtype

        names = [v.name for v in mod["main"].params[num_inputs:]]
        try:
            mod = _mixed_precision(mod, names, unbounded if dynamic_shapes is not None else None)
        except Exception as err:
            if dynamic_shapes is None:
                raise
            # TVM 0.27's mixed precision fails on GPT-2's and LLaMA's masks with symbolic dims
            raise NotImplementedError(
                f"TVM's ToMixedPrecision cannot convert this model with dynamic_shapes to "
                f"{dtype} ({error_line(err, type(err).__name__)}); compile it in float32, or "
                "with static shapes") from err
        if dtype == "bfloat16":
            mod = AsBFloat16()(mod)  # TVM's mixed precision knows only float16
        mod = HalfActivations(dtype)(mod)  # 16-bit activations, as model.half() computes them
        mod, _ = _half_parameters(mod, set(names))  # weights left float32 (symbolic shapes)
        # each weight in its parameter's dtype (in bfloat16 the scale and shift a LayerNorm
        # reads directly stay float32: the norm runs in float32)
        types = [str(v.ty.dtype) for v in mod["main"].params[num_inputs:]]
        weights = [as_dtype(w, t) if w.dtype == np.float32 and t in HALF else w
                   for w, t in zip(weights, types)]
    return Imported(mod, weights, num_inputs, exported.call_spec.out_spec, dtype,
                    _index_bounds(exported))


def decompositions() -> dict:
    """PyTorch's core ATen decompositions (what ``from_exported_program`` runs by default), and
    PyTorch's fused attention kernels decomposed into the math form the CPU's export records.

    ``scaled_dot_product_attention`` decomposes on the device of the tensors it was exported
    with: on the CPU into products and a softmax (``_scaled_dot_product_flash_attention_for_cpu``
    has a decomposition), on CUDA into ``_scaled_dot_product_efficient_attention``, its flash
    or cuDNN kernels, which have none and which TVM's importer lacks ("Unsupported function
    types").  :func:`import_torch` exports on the CPU; should one of those kernels still be in a
    program (a forward calling it), it becomes the CPU's form, which TVM imports and the stitch
    recognizers know.  For inference only: the kernels' other outputs (log-sum-exp, dropout's
    random state) are empty tensors, and a dropout probability other than zero is an error.

    Returns
    -------
    dict
        ``run_decompositions``' table.
    """
    import torch
    from torch._decomp.decompositions import scaled_dot_product_flash_attention_for_cpu as cpu

    aten = torch.ops.aten

    def fused(query, key, value, mask, dropout_p, is_causal, scale, outputs):
        out = cpu(query, key, value, dropout_p, is_causal, attn_mask=mask, scale=scale)[0]
        if outputs == 4:  # output, log_sumexp, philox_seed, philox_offset
            return out, *(query.new_empty(0) for _ in range(3))
        # output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, two of RNG state, debug mask
        empty = [query.new_empty(0) for _ in range(6)]
        return out, *empty[:3], query.size(2), key.size(2), *empty[3:]

    def efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                  is_causal=False, *, scale=None):
        return fused(query, key, value, attn_bias, dropout_p, is_causal, scale, 4)

    def flash(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
              scale=None):
        return fused(query, key, value, None, dropout_p, is_causal, scale, 9)

    def cudnn(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,
              return_debug_mask=False, *, scale=None):
        return fused(query, key, value, attn_bias, dropout_p, is_causal, scale, 9)

    def overrideable(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False,
                     return_debug_mask=False, *, scale=None):
        return fused(query, key, value, attn_bias, dropout_p, is_causal, scale, 9)

    table = torch.export.default_decompositions()
    table[aten._scaled_dot_product_efficient_attention.default] = efficient
    table[aten._scaled_dot_product_flash_attention.default] = flash
    table[aten._scaled_dot_product_cudnn_attention.default] = cudnn
    table[aten._scaled_dot_product_fused_attention_overrideable.default] = overrideable
    return table


#: ATen operators that pass every value of their (integer) input on unchanged, between a model's
#: input and the embedding lookup it feeds (``_to_copy`` only to an integer dtype)
VALUE_KEEPING = frozenset({
    "view", "reshape", "_unsafe_view", "clone", "alias", "contiguous", "unsqueeze", "squeeze",
    "flatten", "permute", "transpose", "t", "expand", "_to_copy", "to",
})


def _index_bounds(exported) -> dict:
    """``{input position: rows}``: the user inputs of ``exported`` whose values all index an
    embedding table (``aten.embedding``'s indices, reached from the input through
    :data:`VALUE_KEEPING` operators), with the rows of the smallest such table.

    PyTorch raises ``IndexError`` for an id outside ``[0, rows)``; the ``take`` the lookup
    becomes wraps it (the stitch pipeline; TVM's own pipeline clamps it):
    :class:`StitchModule` checks these inputs instead.
    """
    import torch

    users = list(exported.graph_signature.user_inputs)
    bounds = {}
    for node in exported.graph.nodes:
        if node.op != "call_function" or node.target is not torch.ops.aten.embedding.default:
            continue
        weight, ids = node.args[0], node.args[1]
        table = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
        while (isinstance(ids, torch.fx.Node) and ids.op == "call_function"
               and hasattr(ids.target, "overloadpacket")
               and ids.target.overloadpacket.__name__ in VALUE_KEEPING
               and isinstance(ids.meta.get("val"), torch.Tensor)
               and not ids.meta["val"].is_floating_point()):
            ids = ids.args[0]
        if not (isinstance(ids, torch.fx.Node) and ids.op == "placeholder"
                and ids.name in users and isinstance(table, torch.Tensor)):
            continue
        val = ids.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.is_floating_point() or val.is_complex():
            continue
        k, rows = users.index(ids.name), int(table.shape[0])
        bounds[k] = min(rows, bounds.get(k, rows))
        logger.debug("input %s indexes a table of %d rows (%s)", ids.name, rows, node.name)
    return bounds


def _exported_output_dtypes(mod, exported):
    """``mod`` whose ``main`` returns each floating output in the dtype the exported program
    gives it: a cast where TVM's importer left a wider one, bound in the last dataflow block
    (so that it fuses into the producing kernel)."""
    out_node = next(n for n in exported.graph.nodes if n.op == "output")
    nodes = out_node.args[0]
    nodes = list(nodes) if isinstance(nodes, (tuple, list)) else [nodes]
    wanted = []
    for n in nodes:
        val = n.meta.get("val") if hasattr(n, "meta") else None
        wanted.append(str(val.dtype).replace("torch.", "") if hasattr(val, "dtype") else None)
    func = mod["main"]
    blocks, ret = list(func.body.blocks), func.body.body
    if not blocks or not isinstance(blocks[-1], relax.DataflowBlock):
        return mod
    if len(wanted) == 1:
        fields = [ret]
    elif isinstance(ret, relax.Tuple) and len(ret.fields) == len(wanted):
        fields = list(ret.fields)
    else:
        return mod
    bb = relax.BlockBuilder()
    bindings, outs = list(blocks[-1].bindings), []
    for k, (field, dtype) in enumerate(zip(fields, wanted)):
        have = field.ty.dtype if isinstance(field.ty, relax.TensorType) else None
        if dtype is None or have is None or str(have) == dtype or not dtype.startswith("float"):
            outs.append(field)
            continue
        cast = bb.normalize(relax.op.astype(field, dtype))
        var = relax.Var(f"output{k}", cast.ty)
        bindings.append(relax.VarBinding(var, cast))
        outs.append(var)
    if all(a.same_as(b) for a, b in zip(outs, fields)):
        return mod
    body = outs[0] if len(wanted) == 1 else bb.normalize(relax.Tuple(outs))
    blocks[-1] = relax.DataflowBlock(bindings)
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    mod["main"] = relax.Function(
        func.params, relax.SeqExpr(blocks, body), body.ty, func.is_pure, func.attrs
    )
    return mod


def _views_as_reshapes(exported):
    """``exported`` with every ``aten.view`` a ``aten.reshape``.

    ``from_exported_program`` re-traces the program through PyTorch's decompositions, which
    may give a tensor other strides than the export saw: ``scaled_dot_product_attention``
    (``transformers``' default attention) decomposes to a product whose output is laid out
    unlike the fused kernel's, and GPT-2's ``view`` of its transposed heads then fails.  The
    imported module is functional, so a reshape means the same as a view, and a reshape is
    valid whatever the strides.
    """
    import torch

    view = torch.ops.aten.view.default
    nodes = [n for n in exported.graph_module.graph.nodes
             if n.op == "call_function" and n.target is view]
    for node in nodes:
        node.target = torch.ops.aten.reshape.default
    if nodes:
        exported.graph_module.recompile()
    return exported


def _without_cache(module, kwargs: dict) -> dict:
    """``kwargs`` with ``use_cache=False`` where ``module.forward`` takes ``use_cache`` and the
    caller left it unset: a compiled model of static shapes keeps no KV cache, and a
    ``transformers`` cache object is no tensor ``torch.export`` can return."""

    try:
        takes = "use_cache" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        takes = False
    if not takes or "use_cache" in kwargs:
        return kwargs
    logger.info("%s: use_cache=False (the compiled model keeps no KV cache)",
                type(module).__name__)
    return {**kwargs, "use_cache": False}


@contextlib.contextmanager
def _for_export(module, dtype):
    """``module`` in eval mode on the CPU with floating parameters and buffers in ``dtype``
    inside the block, given back as it was after it, raised or not (:func:`_converted`).
    Mixture-of-experts layers are exported as ``batched_mm`` meanwhile (:func:`_static_experts`)."""
    with _static_experts(module), _converted(module, dtype) as converted:
        yield converted


#: ``transformers``' experts implementation whose export TVM imports: every expert multiplies
#: every token (static shapes, batched products; the tokens an expert was not routed to are
#: weighted zero).  Its default, ``grouped_mm``, is a custom operator TVM's importer lacks, and
#: ``eager`` loops over the experts with data-dependent shapes.
STATIC_EXPERTS = "batched_mm"


@contextlib.contextmanager
def _static_experts(module):
    """``transformers`` models in ``module`` whose experts can be switched compute them as
    :data:`STATIC_EXPERTS` inside the block, and get their own implementation back after it
    (``get_experts_implementation``/``set_experts_implementation``, transformers' own)."""
    switched = []
    try:
        for m in module.modules():
            can = getattr(type(m), "_can_set_experts_implementation", None)
            if not (callable(can) and hasattr(m, "get_experts_implementation") and can()):
                continue
            before = m.get_experts_implementation()
            if set(before.values()) - {STATIC_EXPERTS, None}:
                logger.info("%s: experts exported as transformers' %r instead of %s (every "
                            "expert on every token: TVM imports no grouped product)",
                            type(m).__name__, STATIC_EXPERTS, before)
                m.set_experts_implementation(STATIC_EXPERTS)
                switched.append((m, before))
        yield
    finally:
        for m, before in reversed(switched):
            m.set_experts_implementation(before)


def _mixed_precision(mod, names, unbounded=None):
    """TVM's ``ToMixedPrecision`` of ``mod`` (float16 operands, float32 accumulation).  A
    module of symbolic shape it cannot convert once its shapes are bounded (TVM 0.27 fails on
    Hugging Face BERT's ``gather_elements`` of token types over ``seq`` positions, "no block
    is being built") is converted before ``BoundSymbolicShapes`` instead (``unbounded``, the
    same module before it; the dtypes it decides do not depend on the shapes), then bounded."""
    convert = relax.transform.ToMixedPrecision("float32", fp16_input_names=names)
    try:
        return convert(mod)
    except Exception:
        if unbounded is None:
            raise
    from tvm_stitch.passes import BoundSymbolicShapes

    try:
        return BoundSymbolicShapes()(convert(unbounded))
    except Exception:  # noqa: BLE001 - TVM's, any: the weights are converted apart below
        pass
    # TVM 0.27 fails ("no block is being built") to make the weights float16 parameters of
    # a function of symbolic shape (even a Linear's): they stay float32 parameters, cast in
    # the function, made 16-bit parameters after the activations are (:func:`_half_parameters`)
    return relax.transform.ToMixedPrecision("float32")(mod)


_ASTYPE = tvm.ir.Op.get("relax.astype")


def _half_parameters(mod, names) -> tuple:
    """``(mod, converted names)``: ``main``'s float32 parameters among ``names`` that it reads
    only cast to one 16-bit format (what ``ToMixedPrecision`` without input names leaves of
    weights, and :class:`~tvm_stitch.passes.precision.HalfActivations` of the tables and norm
    parameters it narrows) as parameters of that format, each cast the parameter itself. The
    weights are then converted once at import, as ``ToMixedPrecision``'s
    ``fp16_input_names`` does, instead of read as float32 by every kernel that casts them
    (twice the bytes)."""
    func = mod["main"]
    blocks = list(func.body.blocks)
    uses: dict = {}
    for block in blocks:
        for binding in block.bindings:
            for var in relax.analysis.free_vars(binding.value):
                uses.setdefault(var, []).append(binding.value)
    for var in relax.analysis.free_vars(func.body.body):
        uses.setdefault(var, []).append(None)

    def cast_to(param) -> str | None:
        if not (param.name in names and isinstance(param.ty, relax.TensorType)
                and str(param.ty.dtype) == "float32" and uses.get(param)
                and all(isinstance(v, relax.Call) and v.op.same_as(_ASTYPE)
                        for v in uses[param])):
            return None
        dtypes = {str(v.attrs.dtype) for v in uses[param]}
        return dtypes.pop() if len(dtypes) == 1 and dtypes <= set(HALF) else None

    new = {p: relax.Var(p.name, relax.TensorType(p.ty.shape, cast_to(p), p.ty.vdevice))
           for p in func.params if cast_to(p)}
    if not new:
        return mod, []
    out_blocks = []
    for block in blocks:
        bindings = []
        for binding in block.bindings:
            value = binding.value
            if (isinstance(value, relax.Call) and value.op.same_as(_ASTYPE)
                    and value.args[0] in new):
                value = new[value.args[0]]
            bindings.append(relax.VarBinding(binding.var, value)
                            if isinstance(binding, relax.VarBinding) else binding)
        out_blocks.append(type(block)(bindings))
    params = [new.get(p, p) for p in func.params]
    mod = tvm.IRModule(dict(mod.functions), attrs=mod.attrs)
    mod["main"] = relax.Function(params, relax.SeqExpr(out_blocks, func.body.body),
                                 func.body.body.ty, func.is_pure, func.attrs)
    return mod, [p.name for p in new]


@contextlib.contextmanager
def _converted(module, dtype):
    """``module`` in eval mode on the CPU with floating parameters and buffers in ``dtype``
    inside the block, as it was after it.

    ``Module.to`` gives parameters (and their gradients) new data and every module new buffer
    objects; the old ones are kept and put back, so nothing is rounded and every tensor is the
    object it was, on its device.  Tensors that modules hold as plain attributes (neither
    parameters nor buffers), on another device than the CPU, are on the CPU meanwhile (their
    dtypes kept).  Each submodule gets its training flag back.  A model on the GPU is copied
    to the CPU one tensor at a time, on the CPU side (no second copy of its weights on the
    GPU): the export then records what a CPU model's records, which TVM imports (on CUDA
    ``scaled_dot_product_attention`` decomposes to fused kernels TVM's importer lacks).
    """
    import torch

    params = [(p, p.data, p.grad, p.grad.data if p.grad is not None else None)
              for p in module.parameters()]
    # the slots too: with torch.__future__'s overwrite flag ``Module.to`` puts new Parameters
    # there, and it always puts new buffers
    slots = [(m._parameters, name, t) for m in module.modules()
             for name, t in m._parameters.items()]
    slots += [(m._buffers, name, t) for m in module.modules() for name, t in m._buffers.items()]
    attrs = [(vars(m), name, t) for m in module.modules() for name, t in vars(m).items()
             if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta")]
    modes = [(m, m.training) for m in module.modules()]
    moved = {p.device for p, *_ in params if p.device.type != "cpu"}
    if moved:
        logger.info("%s: exported from a %s copy on the CPU (it is on %s)",
                    type(module).__name__, str(dtype).replace("torch.", ""),
                    ", ".join(sorted(map(str, moved))))
    try:
        for attrs_of, name, t in attrs:
            attrs_of[name] = t.cpu()
        yield module.to("cpu", dtype).eval()
    finally:
        with torch.no_grad():
            for p, data, grad, grad_data in params:
                p.data = data
                if grad is not None:
                    grad.data = grad_data
                    p.grad = grad
        for slot, name, t in slots + attrs:
            slot[name] = t
        for m, training in modes:
            m.training = training


def _bind_constants(module, kwargs: dict):
    """``module`` with its non-tensor keyword arguments fixed (they are not model inputs)."""
    import torch

    constants = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    if not constants:
        return module

    class Bound(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, *args, **tensors):
            return self.inner(*args, **tensors, **constants)

    # the inputs keep the model's own names (torch.export names them after the signature)
    with contextlib.suppress(TypeError, ValueError):
        inner = inspect.signature(module.forward)
        kept = [p for name, p in inner.parameters.items() if name not in constants]
        if all(p.kind not in (p.VAR_POSITIONAL, p.KEYWORD_ONLY) for p in kept):
            this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
            Bound.forward.__signature__ = inner.replace(parameters=[this, *kept])
    return Bound()


class StitchModule:
    """A compiled model called like the PyTorch module it came from.

    Built by :func:`from_torch`.  Calling it takes torch tensors of the example inputs' shapes
    (floating ones are cast to the compiled dtype when they differ) on the target's device,
    positionally or by the names in :attr:`inputs` (``fn(**tokenizer_output)`` for a model
    compiled from keyword inputs), and returns the module's output structure with torch
    tensors that share TVM's memory.

    Attributes
    ----------
    imported : Imported
    executable : tvm.relax.VMExecutable
    check_indices : bool
        Whether a call checks the inputs that index embedding tables (token ids;
        :attr:`Imported.index_bounds`) and raises ``IndexError`` for an id outside its table,
        as PyTorch does (the compiled lookup would wrap it).  On CUDA the check waits for the
        GPU (one synchronisation a call): on by default on the CPU only.
    """

    def __init__(self, imported: Imported, executable, device, check_indices: bool | None = None):
        self.imported = imported
        self.executable = executable
        self.device = device
        self.vm = relax.VirtualMachine(executable, device)
        self._cuda = device.dlpack_device_type() == tvm.cuda(0).dlpack_device_type()
        self.check_indices = not self._cuda if check_indices is None else bool(check_indices)
        from tvm_stitch.library import prepare_args
        from tvm_stitch.pipeline import num_input

        weights = [tvm.runtime.tensor(w, device=device) for w in imported.weights]
        # compiled with lift_params: the weights' own computations (joined Q/K/V weights) once
        self.params = prepare_args(self.vm, "main", weights,
                                   0 if num_input(imported.mod, "main") is not None else None)
        main = imported.mod["main"]
        #: each input's name, shape (an int per static dim, the dim's name for a symbolic one)
        #: and dtype
        self.inputs = [
            (p.name, tuple(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d)
                           for d in p.ty.shape.values), str(p.ty.dtype))
            for p in main.params[: imported.num_inputs]
        ]
        from tvm_stitch.analysis.bounds import var_ranges

        #: the symbolic dims' ranges ``{name: (lower, upper)}``
        self.ranges = var_ranges(main)

    def __call__(self, *args, **kwargs):
        import torch
        import tvm_ffi
        from torch.utils import _pytree

        if kwargs:
            args = self._by_name(args, kwargs)
        if len(args) != len(self.inputs):
            raise TypeError(f"expected {len(self.inputs)} inputs {self.inputs}, got {len(args)}")
        tensors, dims = [], {}
        for arg, (name, shape, dtype) in zip(args, self.inputs):
            self._check_shape(name, tuple(arg.shape), shape, dims)
            if (arg.device.type == "cuda") != self._cuda:
                raise ValueError(f"input {name} is on {arg.device}, the model on {self.device}")
            want = getattr(torch, dtype)
            if arg.dtype != want and not (arg.is_floating_point() and want.is_floating_point):
                raise TypeError(f"input {name}: dtype {arg.dtype}, compiled for {dtype}")
            tensor = arg.to(want).contiguous()
            if tensor.data_ptr() % ALIGNMENT:  # a view (a slice, a numpy array's memory)
                tensor = tensor.clone()  # PyTorch's allocators align; TVM takes aligned only
            tensors.append(tvm.runtime.from_dlpack(tensor))
        if self.check_indices:
            self._check_indices(args)
        if self._cuda:
            with tvm_ffi.use_torch_stream():
                out = self.vm["main"](*tensors, *self.params)
        else:
            out = self.vm["main"](*tensors, *self.params)
        flat = list(out) if type(out).__name__ in ("Array", "list", "tuple") else [out]
        flat = [torch.from_dlpack(o) for o in flat]
        try:
            return _pytree.tree_unflatten(flat, self.imported.out_spec)
        except (ValueError, TypeError):
            return flat[0] if len(flat) == 1 else tuple(flat)

    def _check_shape(self, name, got: tuple, shape: tuple, dims: dict) -> None:
        """ValueError unless ``got`` is an input's ``shape``: its static dims equal, its
        symbolic ones in their ranges and equal wherever a dim recurs (``dims``: the sizes
        seen so far)."""
        ok = len(got) == len(shape)
        for size, dim in zip(got, shape) if ok else ():
            if isinstance(dim, int):
                ok = ok and size == dim
                continue
            lo, hi = self.ranges.get(dim, (0, None))
            if size < lo or (hi is not None and size > hi):
                raise ValueError(f"input {name}: {dim} = {size} outside the compiled range "
                                 f"[{lo}, {hi}] (shape {got}, compiled for {shape})")
            ok = ok and dims.setdefault(dim, size) == size
        if not ok:
            raise ValueError(f"input {name}: shape {got}, compiled for {shape}")

    def _check_indices(self, args) -> None:
        """``IndexError`` where an input holds an id outside the embedding table it indexes
        (PyTorch's error; TVM's ``take`` would wrap the id): one synchronisation on CUDA."""
        import torch

        bounds = self.imported.index_bounds
        if not bounds:
            return
        outside = {k: (args[k] < 0) | (args[k] >= rows) for k, rows in bounds.items()}
        if not torch.stack([o.any() for o in outside.values()]).any():
            return
        for k, o in outside.items():
            if o.any():
                raise IndexError(
                    f"index out of range in self: input {k} ({self.inputs[k][0]}) holds "
                    f"{int(args[k][o].flatten()[0])}, outside the {bounds[k]} rows of the "
                    "embedding table it indexes"
                )

    def _by_name(self, args: tuple, kwargs: dict) -> tuple:
        """``args`` followed by the remaining inputs taken from ``kwargs`` by name."""
        rest = [name for name, _, _ in self.inputs[len(args):]]
        unknown = sorted(set(kwargs) - set(rest))
        missing = [name for name in rest if name not in kwargs]
        if unknown or missing:
            raise TypeError(
                f"inputs {unknown or missing} {'not compiled' if unknown else 'missing'}; "
                f"compiled for {[name for name, _, _ in self.inputs]}"
            )
        return (*args, *(kwargs[name] for name in rest))


def default_options(target, **options) -> dict:
    """``from_torch``'s pipeline options: ``options``, with ``lift_params`` on for a CUDA
    target unless they set it.

    The weights' own computations (Q, K and V's weights joined for one TMA descriptor, and
    whatever else depends on weights only) then run once, when :class:`StitchModule` loads
    the weights, and the entry takes what they made: ``from_torch``'s caller never sees the
    entry's parameters, so the option's change of them costs nothing there (for
    ``tvm.compile`` it stays opt-in). Hugging Face BERT-base on an H100, same run, measured
    before Q, K and V over their own weights had the warp-specialized GEMM too:
    ``docs/results/h100-from-torch-defaults-2026-11-27.md``.

    Parameters
    ----------
    target : tvm.target.Target or str or dict
        The target ``from_torch`` compiles for (as :func:`tvm_stitch.pipeline.as_target`
        takes it).
    **options
        :func:`tvm_stitch.pipeline` options the caller gave.

    Returns
    -------
    dict
        The options to compile with (a new dict).
    """
    from tvm_stitch.pipeline import as_target

    if as_target(target).kind.name == "cuda":
        options.setdefault("lift_params", True)
    return options


def default_dtype(module, cuda: bool, example_args=()) -> str:
    """``from_torch``'s dtype when none is given: float32 on the CPU; on CUDA bfloat16 for a
    model with bfloat16 floating parameters and no float16 ones (some modules may be kept in
    float32; a bfloat16 model's range exceeds float16's) — for a model without parameters,
    judged by its floating inputs — else float16."""
    import torch

    if not cuda:
        return "float32"
    dtypes = {p.dtype for p in module.parameters() if p.is_floating_point()}
    if not dtypes:
        dtypes = {a.dtype for a in example_args
                  if isinstance(a, torch.Tensor) and a.is_floating_point()}
    return "bfloat16" if torch.bfloat16 in dtypes and torch.float16 not in dtypes else "float16"


def from_torch(
    module, example_args, target="cuda", dtype: str | None = None, example_kwargs=None,
    check_indices: bool | None = None, dynamic_shapes=None, cuda_graph: bool | None = None,
    **options
) -> StitchModule:
    """Compile a PyTorch module with the stitch pipeline; call the result like the module.

    Parameters
    ----------
    module : torch.nn.Module
        A model (Hugging Face or not), on the CPU or the GPU, in float32, float16 or bfloat16,
        with any attention implementation; given back as it was (:func:`import_torch`).  A
        `transformers` decoder runs without its KV cache.
    example_args : tuple of torch.Tensor
        Inputs with the shapes to compile for (but for ``dynamic_shapes``), on either device.
    target : str or dict or tvm.target.Target
        ``"cuda"`` (the H100, sm_90a) or ``"llvm"``.
    dtype : {"float32", "float16", "bfloat16"}, optional
        Default: on CUDA the model's own 16-bit format (bfloat16 for a bfloat16 model, else
        float16; :func:`default_dtype`); float32 on the CPU.
    example_kwargs : dict, optional
        Keyword inputs.
    check_indices : bool, optional
        Whether each call checks that the inputs indexing embedding tables (token ids) are
        within them, raising ``IndexError`` as PyTorch does (the compiled lookup would wrap
        an id outside).  Default: on the CPU yes; on CUDA no, as the check waits for the GPU
        (one synchronisation a call).  :attr:`StitchModule.check_indices` changes it later.
    dynamic_shapes : dict or tuple, optional
        Dims that may vary, as ``torch.export`` takes them (:func:`import_torch`): one
        compile serves every shape in their ranges; a call outside them raises ``ValueError``.
    cuda_graph : bool, optional
        Replay the kernels as CUDA graphs (TVM's ``relax.backend.use_cuda_graph``): a call
        then costs one graph launch instead of one launch per kernel.  With dynamic dims a
        graph is captured at the first call of each shape (two runs of the model) and replayed
        at the later ones; each shape seen keeps its graph (TVM has no eviction: a service
        with very many shapes may prefer ``False``).  Default: on for CUDA, unless the
        caller's ``PassContext`` sets ``relax.backend.use_cuda_graph``.
    **options
        :func:`tvm_stitch.pipeline` options; on CUDA ``lift_params`` is on unless given
        (:func:`default_options`).

    Returns
    -------
    StitchModule
    """
    import tvm_stitch
    from tvm_stitch.pipeline import as_target

    target = as_target(target)
    cuda = target.kind.name == "cuda"
    dtype = dtype or default_dtype(module, cuda, example_args)
    start = time.perf_counter()
    imported = import_torch(module, example_args, dtype, example_kwargs,
                            dynamic_shapes=dynamic_shapes)
    options = default_options(target, **options)
    built = time.perf_counter()
    current = tvm.transform.PassContext.current()
    config = dict(current.config)
    if cuda_graph is not None or "relax.backend.use_cuda_graph" not in config:
        config["relax.backend.use_cuda_graph"] = cuda and cuda_graph is not False
    from tvm_stitch import executables
    from tvm_stitch.tune.database import default_path

    kept = executables.enabled() and not current.instruments
    name = executables.key(imported.mod, target, options, {
        "opt_level": current.opt_level, "required": list(current.required_pass),
        "disabled": list(current.disabled_pass), **config}) if kept else None
    loaded = executables.load(name, default_path()) if kept else None
    if loaded is not None:
        ex = relax.VMExecutable(loaded)
    else:
        with tvm.transform.PassContext(  # the caller's context, CUDA graphs as asked
                opt_level=current.opt_level, required_pass=current.required_pass,
                disabled_pass=current.disabled_pass, instruments=current.instruments,
                config=config):
            ex = tvm.compile(imported.mod, target,
                             relax_pipeline=tvm_stitch.pipeline(target, **options))
        if kept:
            executables.store(name, ex, default_path())
    logger.info("from_torch: %.1f s (export, import and conversion %.1f s, compile %.1f s%s)",
                time.perf_counter() - start, built - start, time.perf_counter() - built,
                ": the executable kept from an earlier run" if loaded is not None else "")
    return StitchModule(imported, ex, tvm.cuda(0) if cuda else tvm.cpu(0), check_indices)
