"""MCFuser's Relax integration: recognized kernels become generated Triton kernels.

Runs after ``LegalizeOps`` (and common-subexpression elimination), on ``call_tir`` bindings.  The
tensor dependency graph of each Relax function is built and
:func:`tvm_stitch.analysis.recognize.recognize` finds attention, GEMM chains and GEMMs with their
epilogues — by what the blocks compute, whatever the front end — and groups GEMMs sharing their
input.  Each match becomes one ``call_tir`` of an opaque PrimFunc that launches its generated
Triton kernel (:mod:`tvm_stitch.codegen.triton_gen`) with the tiles and launch options of the
search (measured on the GPU and kept in the tuning database; the analytical model alone without
a GPU).  Operands are read in place, so the layout ops around them and the epilogue ops die and
are removed.  What is not recognized stays for TVM; every rejection is logged
(``tvm_stitch.recognize``).  A kernel that fails to build — whatever the reason — is left to
TVM alone, with the reason logged (and so are kernels reading what only it would write); a
tuning record the kernel cannot launch is ignored with a warning and its tiles searched again.

Without a GPU the kernels are still compiled (Triton emits sm_90 PTX anywhere) and embedded, with
tiles from the tuning database or, for kernels it does not hold, the cost model: an executable
compiled on a CPU machine and exported with ``export_library`` runs on the GPU host.  Without
Triton the pass does nothing, with the reason logged.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging

import numpy as np
import tvm
from tvm import relax

from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.analysis.weights import (
    bound_weights,
    interleave,
    join_weights,
    pair_weights,
    prefetched,
    weight_tensors,
)
from tvm_stitch.codegen import embed
from tvm_stitch.codegen.derived import derived_inputs, derived_weight_func
from tvm_stitch.codegen.embed import can_compile, can_measure
from tvm_stitch.codegen.kernel_text import UnsupportedKernelError
from tvm_stitch.codegen.runtime_plan import RuntimePlanner
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.config import DEFAULT_LAUNCH_DEPENDENTS, check_launch_dependents, check_tune
from tvm_stitch.errors import error_line
from tvm_stitch.families import FAMILIES, part
from tvm_stitch.families import check as check_families
from tvm_stitch.graph import build_graph
from tvm_stitch.tune.policy import KernelTuner

from .order import topological

logger = logging.getLogger("tvm_stitch.mcfuser")

_KERNEL_ATTRS = ("Primitive", "Composite", "Codegen")


def _smem_limit() -> int:
    from tvm_stitch.hardware import HardwareModel

    return HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"}).smem_per_block


def embed_builder(match, source, config, shapes, dependent=True,
                  launch_dependents=DEFAULT_LAUNCH_DEPENDENTS, num_sms=None):
    """The launch PrimFunc of a generated kernel and its CUDA module (``dependent``: launched
    with programmatic dependent launch, releasing the next launch at ``launch_dependents``;
    ``"auto"`` decides by the grid on ``num_sms`` SMs)."""
    launch = embed.generated_launch(source, match, config, shapes, _smem_limit(), dependent,
                                    launch_dependents, num_sms)
    return launch.func, launch.modules()


def plan_builder(match, source, config, shapes):
    """The launch PrimFunc alone, without the module holding the kernel (fusion reports)."""
    return embed.generated_launch(source, match, config, shapes, _smem_limit()).func, []


@tvm.transform.module_pass(opt_level=0, name="StitchFuseMBCI")
class FuseMBCI:
    """Replace recognized attention, GEMM chains and GEMMs (+ epilogues) with generated Triton
    kernels.

    Parameters
    ----------
    database : TuningDatabase, optional
        Where tuned configurations are kept (default: the user's tuning database).
    builder : callable, optional
        ``builder(match, source, config, shapes) -> (PrimFunc, external_mods)``; default
        :func:`embed_builder`, or :func:`plan_builder` with ``plan_only``.  Tests pass
        :func:`tvm_stitch.codegen.te_reference` builders to run the rewrite on a CPU.
    mcfuser : tuple of str
        Which of ``"attention"``, ``"chain"``, ``"gemm"`` to rewrite.
    plan_only : bool
        Plan the launches without making the modules holding the kernels (fusion reports).
    tune : {"measure", "model"}
        ``"measure"``: search tiles by measuring on the GPU (when there is one); ``"model"``
        (or no GPU): the tuning database's or the cost model's choice is taken (model choices
        are not stored). :class:`~tvm_stitch.tune.policy.KernelTuner` carries the policy out.
    fold_norms : bool
        Fold normalizations whose every reader is a GEMM kernel into those kernels (see
        :class:`tvm_stitch.config.PipelineOptions`).
    lift_params : bool
        Concatenate the weights of a banded GEMM (parameters past the function's
        ``num_input``) into one tensor its kernel reads through one TMA descriptor (see
        :mod:`tvm_stitch.analysis.weights`); the concatenation is left in the function, for
        ``relax.transform.LiftTransformParams`` to move out of it. Weights bound as constants
        are joined either way, at compile time (one constant).
    dependent_launch : bool
        Launch the kernels with programmatic dependent launch (see
        :class:`tvm_stitch.config.PipelineOptions`).
    launch_dependents : {"start", "exit"}
        When each lets the next be launched (see :class:`tvm_stitch.config.PipelineOptions`).
    mask_blocks : bool
        Attention skips the key blocks a folded mask hides (see
        :class:`tvm_stitch.config.PipelineOptions`).
    prefetch_weights : bool
        Kernels pull their weights into L2 before waiting for the kernel before them (see
        :class:`tvm_stitch.config.PipelineOptions`).
    """

    def __init__(
        self, database=None, builder=None, mcfuser=FAMILIES, plan_only=False, tune="measure",
        fold_norms=False, lift_params=False, dependent_launch=True,
        launch_dependents=DEFAULT_LAUNCH_DEPENDENTS, mask_blocks=True, prefetch_weights=True,
    ):
        self.database = database
        self.builder = builder
        self.mcfuser = check_families(mcfuser)
        self.plan_only = plan_only
        self.tune = check_tune(tune)
        self.fold_norms = fold_norms
        self.lift_params = lift_params
        self.dependent_launch = dependent_launch
        self.launch_dependents = check_launch_dependents(launch_dependents)
        self.mask_blocks = mask_blocks
        self.prefetch_weights = prefetch_weights

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from tvm_stitch.hardware import HardwareModel
        from tvm_stitch.tune.database import TuningDatabase

        compiles, why = can_compile()
        on_device, no_gpu = can_measure()
        builder = self.builder
        if builder is None:
            if not compiles:
                logger.info("Triton kernels not used: %s; TVM keeps every operator", why)
                return mod
        target = tvm.target.Target.current(allow_none=True)
        try:
            hw = HardwareModel.from_target(target)
        except ValueError as err:
            logger.info("Triton kernels not used: %s", err)
            return mod
        if builder is None:
            builder = plan_builder if self.plan_only else functools.partial(
                embed_builder, dependent=self.dependent_launch,
                launch_dependents=self.launch_dependents, num_sms=hw.num_sms)
        measure = self.tune == "measure"
        if not on_device and measure:
            logger.info(
                "tiles not measured (%s): from the tuning database, else the cost model", no_gpu
            )
        tuner = KernelTuner(hw, self.database or TuningDatabase(), on_device and measure)
        out = _Rewriter(mod, builder, tuner, self.fold_norms, self.lift_params,
                        self.mask_blocks, self.prefetch_weights).run(self.mcfuser)
        summary = tuner.summary()
        if summary:
            logger.info("%s", summary)
        return out


class _Rewriter:
    """One pass over a module: rewrites matches, collects the new PrimFuncs and CUDA modules."""

    def __init__(self, mod, builder, tuner, fold_norms=False, join=False, mask_blocks=True,
                 prefetch_weights=False):
        self.mod, self.builder, self.tuner = mod, builder, tuner
        self.fold_norms = fold_norms
        self.mask_blocks = mask_blocks
        self.prefetch_weights = prefetch_weights
        self.resident: set[str] = set()  # graph tensors in memory before the function runs
        self.join = join
        self.weights: set[str] = set()  # graph tensors that are weights (when joining)
        self.bound: set[str] = set()  # graph tensors that are constants (bound weights)
        self.ctx = relax.BlockBuilder(mod)  # hands out typed GlobalVars for new PrimFuncs
        self.funcs: dict[str, relax.GlobalVar] = {}
        self.prims: dict[str, tvm.tirx.PrimFunc] = {}
        self.externals = list((mod.attrs or {}).get("external_mods", []))
        self.counts: dict[str, int] = {}

    def run(self, families) -> tvm.IRModule:
        rewritten = {}
        for gv, func in self.mod.functions.items():
            if not isinstance(func, relax.Function) or any(
                k in (func.attrs or {}) for k in _KERNEL_ATTRS
            ):
                continue
            try:
                new = self._function(gv.name_hint, func, families)
            except Exception as err:
                logger.warning("Triton kernels: %s left to TVM: %r", gv.name_hint, err)
                logger.debug("Triton kernels: %s", gv.name_hint, exc_info=True)
                continue
            if new is not None:
                rewritten[gv] = new
        if not rewritten:
            return self.mod
        mod = self.ctx.get()
        for gv, func in rewritten.items():
            mod[gv] = func
        mod = relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
        logger.info("Triton kernels: %s", ", ".join(f"{v} {k}" for k, v in self.counts.items()))
        return mod.with_attr("external_mods", self.externals) if self.externals else mod

    def _function(self, name, func, families):
        graph = build_graph(self.mod, name, legalize=False)
        self.values = dict(graph.values)  # and the tensors kernels pass each other (moments)
        params = weight_tensors(graph, func)
        self.weights = set(params) if self.join else set()
        self.bound = bound_weights(graph)  # joined at compile time, lifting or not
        self.resident = params | self.bound
        self.name, self.families = name, families
        self.planner = RuntimePlanner(self.mod, name, families, self.fold_norms,
                                      lambda: self.weights if self.join else None)
        found = recognize(graph, families, fold_norms=self.fold_norms,
                          weights=self.weights if self.join else None,
                          runtime=bool(graph.point))
        if not self.mask_blocks:  # every key block read, the mask applied on each
            for m in found.matches:
                m.causal = m.window = m.runtime_band = None
        self.tuner.prefetch(r for m in found.matches for r in self._requests(graph, m))
        kernels = [(m, k) for m in _progress(found.matches, name)
                   if (k := self._try_kernel(graph, m))]
        kernels = _connected(kernels, func)
        if not kernels:
            return None
        blocks = []
        for block in func.body.blocks:
            mine = [
                (m, call)
                for m, call in kernels
                if all(_defined_in(block, graph.values[o.tensor]) for o in m.all_outputs
                       if o.tensor in graph.values)
            ]
            blocks.append(_rewrite_block(block, mine) if mine else block)
        return relax.Function(
            func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
            func.attrs,
        )

    def _try_kernel(self, graph, match):
        """:meth:`_kernel`, or None where it fails: whatever fails (a kernel the generator
        refuses, a Triton compile error, a bad config) leaves that match alone to TVM, with
        the reason logged, and undoes what it bound."""
        values, weights, counts = dict(self.values), set(self.weights), dict(self.counts)
        try:
            return self._kernel(graph, match)
        except (UnsupportedKernelError, ValueError, NotImplementedError) as err:
            logger.info("%s left to TVM: %s", match.describe(outputs=True), err)
        except Exception as err:  # any other failure costs its kernel, no other
            logger.warning("%s left to TVM: %s: %s", match.describe(outputs=True),
                           type(err).__name__, error_line(err, repr(err)))
            logger.debug("%s", match.describe(), exc_info=True)
        self.values, self.weights, self.counts = values, weights, counts
        return None

    def _kernel(self, graph, match):
        """``(GlobalVar, args, output types, outputs, bindings before the call)`` of the kernel
        of ``match`` (built once per variant)."""
        if _symbolic(graph, match):
            return self._runtime_kernel(graph, match)
        match, pre, source, shapes, constants = self._prepared(graph, match)
        key = self._variant(match, source, shapes, constants)
        self.counts[match.family] = self.counts.get(match.family, 0) + 1
        args = [self._value(graph, t) for t in source.inputs]
        prim = self.prims[key]
        args += _zeroed(prim, list(prim.params)[len(args):])
        # the kernel's outputs, then buffers it needs besides them (Triton's scratch memory)
        types = [
            relax.TensorType(tuple(int(d) for d in buf.shape), buf.dtype)
            for buf in list(prim.params)[len(args):]
        ]
        outs = [self._value(graph, t) for t in source.outputs]
        return self.funcs[key], args, types, outs, pre

    def _prepared(self, graph, match):
        """``(match, bindings, source, shapes, constants)`` of the static kernel of ``match``:
        the match reading its weights joined or derived (:meth:`_joined`, :meth:`_derived`:
        their bindings), its generated text, the shapes of what it reads and writes, and the
        values of the constants it reads."""
        derived, shapes = self._derived(match)
        match, pre, joined = self._joined(match)
        pre, shapes = derived + pre, {**shapes, **joined}
        source = kernel_source(match)
        tensors = [*source.inputs, *source.outputs]
        shapes.update({t: (graph.tensors[t].shape, graph.tensors[t].dtype) for t in tensors
                       if t not in shapes})
        if self.prefetch_weights:  # weights, and what is made of weights alone
            weights = self.resident | set(joined) | {d.name for d in match.derived}
            source = dataclasses.replace(source, prefetch=prefetched(
                source.inputs, weights, shapes, self.tuner.hw.l2_bytes))
        constants = {
            t: graph.values[t].value.numpy()
            for t in source.inputs
            if isinstance(graph.values.get(t), tvm.ir.expr.Constant)
        }
        return match, pre, source, shapes, constants

    def _requests(self, graph, match) -> list:
        """The tuner's calls the kernel of ``match`` will make (``(args, kwargs)`` of
        :meth:`KernelTuner.config`), for their searches to run side by side ahead
        (:meth:`KernelTuner.prefetch`); none where the kernel cannot be planned (its own
        attempt says why). Nothing bound is kept."""
        values, weights = dict(self.values), set(self.weights)
        try:
            if _symbolic(graph, match):
                plan = self.planner.plan(graph, match)
                return [plan.request, *(r for _, r in plan.buckets)]
            match, _, source, shapes, constants = self._prepared(graph, match)
            return [((match, source, shapes, constants), {})]
        except Exception as err:  # noqa: BLE001 - any: the kernel's own attempt reports it
            logger.debug("%s: no search ahead: %s", match.describe(), err)
            return []
        finally:
            self.values, self.weights = values, weights

    def _runtime_kernel(self, graph, match):
        """:meth:`_kernel` of a match of symbolic shape: its kernel takes the family's runtime
        extents as arguments (:mod:`tvm_stitch.codegen.runtime`), its tiles are those of the
        function's representative point, its launch takes the symbolic dims."""
        from tvm_stitch.codegen import runtime
        from tvm_stitch.graph.specialize import representative, value_at

        plan = self.planner.plan(graph, match)
        kernel, shapes, values = plan.kernel, plan.shapes, plan.values
        source = kernel.source
        args, kwargs = plan.request
        config = runtime.fixed(self.tuner.config(*args, **kwargs), source)
        size = runtime.kernel_size(kernel.match.frame.extents, kernel.match.runtime)
        variants = runtime.variant_bounds(
            (value_at(size, representative(self.mod[self.name])), config),
            self._bucket_configs(match, plan))
        if variants:
            config = {**config, embed.VARIANTS: variants}
        key = self._add(kernel.match, source, config, shapes, match.describe())
        self.counts[match.family] = self.counts.get(match.family, 0) + 1
        scalars = runtime.dims_of(shape for shape, _ in shapes.values())
        inputs, outputs = values[: len(source.inputs)], values[len(source.inputs):]
        # a split-K variant's counters (zeros) and workspace, as :meth:`_kernel` gives them
        params = list(self.prims[key].params)
        extra = _zeroed(self.prims[key], params[len(inputs):])
        args = [*inputs, *extra, *scalars]
        types = [v.ty for v in outputs]
        types += [relax.TensorType(tuple(int(d) for d in buf.shape), buf.dtype)
                  for buf in params[len(args) + len(outputs):]]
        return self.funcs[key], args, types, outputs, []

    def _bucket_configs(self, match, plan) -> list:
        """``[(size, config), ...]``: the tiles of a runtime kernel at its plan's smaller
        sizes (:meth:`RuntimePlanner.plan`), each the tuner's (searched, measured or modelled);
        :func:`runtime.variant_bounds` orders them for :func:`embed.generated_launch`, which
        launches the first whose bound the call's size does not exceed."""
        from tvm_stitch.codegen import runtime

        found = []
        for size, (args, kwargs) in plan.buckets:
            try:
                tiles = runtime.fixed(self.tuner.config(*args, **kwargs), plan.kernel.source,
                                      split=True)
            except Exception as err:  # noqa: BLE001 - any: the point gets no tiles of its own
                logger.info("%s: no tiles of its own at size %s: %s: %s", match.describe(),
                            size, type(err).__name__, err)
                continue
            found.append((size, tiles))
        return found

    def _variant(self, match, source, shapes, constants) -> str:
        """The name of the kernel's PrimFunc with its tuned config (built once per variant);
        where a tuning record's config fails to build, the record is rejected and the tiles
        searched again."""
        config = self.tuner.config(match, source, shapes, constants)
        try:
            return self._add(match, source, config, shapes)
        except Exception as err:
            if self.tuner.record(match, source) is None:
                raise
            self.tuner.reject(match, source, f"it failed to build: {type(err).__name__}: "
                              f"{error_line(err, repr(err))}")
        return self._add(match, source, self.tuner.config(match, source, shapes, constants),
                         shapes)

    def _add(self, match, source, config, shapes, describe=None) -> str:
        """The name of the PrimFunc launching ``source`` with ``config``, added to the module
        the first time (``describe``: what the kernel computes, by default ``match``'s own
        description; a runtime kernel's match has its sentinel sizes)."""
        key = f"{source.name}_{embed._tag(config)}{embed.prefetch_tag(source)}"
        if config.get(embed.VARIANTS):  # tiles of smaller sizes besides
            key += "_" + hashlib.sha1(repr(config[embed.VARIANTS]).encode()).hexdigest()[:6]
        if key not in self.funcs:
            func, ext = self._build(match, source, config, shapes)
            # opaque to FuseOps: the kernel is complete, nothing may be fused into it
            func = func.with_attrs({"global_symbol": key, "op_pattern": 8,
                                    "tvm_stitch.kernel": describe or match.describe()})
            self.funcs[key] = self.ctx.add_func(func, key)
            self.prims[key] = func
            self.externals.extend(ext)
        return key

    def _joined(self, match):
        """``(match, bindings, shapes)``: ``match`` reading its bands' weights joined in one
        tensor where that lets one TMA descriptor read them, or its gate and up weights
        interleaved in one (one product of twice the columns,
        :func:`~tvm_stitch.analysis.weights.pair_weights`) — the joined tensor bound before
        the kernel (a constant where the weights are) — else ``match`` unchanged, no
        bindings."""
        joinable = self.weights | self.bound
        reads = [v.tensor for role, v in match.views.items()
                 if isinstance(role, str) and role.startswith("b")]
        # bands read by TMA (the family's ``triton.tma_layout``: GEMMs)
        tma_layout = getattr(part(match.family, "triton"), "tma_layout", None)
        if tma_layout is None or not joinable.intersection(reads):
            return match, [], {}
        if len(match.segments) > 1:
            joined_match, joined = join_weights(match, joinable)
        elif match.segments and len(match.segments[0].products) == 2:
            joined_match, joined = pair_weights(match, joinable)
        else:
            return match, [], {}
        if joined_match is None:
            logger.info("%s: weights not joined: %s", match.describe(), joined)
            return match, [], {}
        why = tma_layout(joined_match)
        if isinstance(why, str) and not joined.interleaved:
            logger.info("%s: weights not joined: TMA cannot read them (%s)",
                        match.describe(), why)
            return match, [], {}
        how = "interleaved" if joined.interleaved else "joined"
        if all(t in self.bound for t in joined.parts):  # constants: one constant
            parts = [self.values[t].value.numpy() for t in joined.parts]
            value = (interleave(parts, joined.axis) if joined.interleaved
                     else np.concatenate(parts, joined.axis))
            self.values[joined.name] = relax.const(value, joined.dtype)
            logger.info("%s: bound weights %s %s into one %s constant", match.describe(),
                        ", ".join(joined.parts), how, "x".join(map(str, joined.shape)))
            return joined_match, [], {joined.name: (joined.shape, joined.dtype)}
        from tvm import te, topi

        def joined_func():
            parts = [te.placeholder(self._shape(t)[0], joined.dtype, name=f"w{i}")
                     for i, t in enumerate(joined.parts)]
            if not joined.interleaved:
                return te.create_prim_func([*parts, topi.concatenate(parts, joined.axis)])
            w0, w1 = parts

            def element(r, c):  # gate's and up's rows (columns) in turn
                i = (r, c)[joined.axis]
                at = (i // 2, c) if joined.axis == 0 else (r, i // 2)
                return tvm.tirx.Select(i % 2 == 0, w0[at], w1[at])

            return te.create_prim_func([w0, w1, te.compute(joined.shape, element)])

        kind = "pair" if joined.interleaved else "join"
        key = f"{kind}_{joined.dtype}_{joined.axis}_" + "_".join(
            "x".join(map(str, self._shape(t)[0])) for t in joined.parts)
        binding = self._bind(joined.name, key, joined_func, joined.parts, joined.shape,
                             joined.dtype)
        logger.info("%s: weights %s %s into one %s tensor", match.describe(),
                    ", ".join(joined.parts), how, "x".join(map(str, joined.shape)))
        return joined_match, [binding], {joined.name: (joined.shape, joined.dtype)}

    def _derived(self, match):
        """``(bindings, shapes)`` computing the tensors ``match`` derives from weights (a
        normalization folded through them): TE PrimFuncs of the weights, bound before the
        kernel, lifted out of the entry with the other weight-only work."""
        bindings, shapes = [], {}
        for d in match.derived:
            if d.name in self.values:
                continue
            inputs = derived_inputs(d)
            func = derived_weight_func(d, {t: self._shape(t) for t in inputs})
            key = f"{d.kind}_{d.dtype}_{'x'.join(map(str, d.shape))}_{func.attrs['digest']}"
            bindings.append(self._bind(d.name, key, lambda func=func: func, inputs, d.shape,
                                       d.dtype))
            shapes[d.name] = (d.shape, d.dtype)
            if d.kind == "scaled":
                self.weights.add(d.name)  # it may be joined with its band's neighbours
        if match.derived:
            logger.info("%s: normalization through the weights %s", match.describe(),
                        ", ".join(sorted({d.weight for d in match.derived})))
        return bindings, shapes

    def _shape(self, tensor):
        ty = self.values[tensor].ty
        return tuple(int(d) for d in ty.shape.values), str(ty.dtype)

    def _bind(self, name, key, make_func, inputs, shape, dtype):
        """The binding of a new tensor ``name`` computed by the PrimFunc ``key`` (made by
        ``make_func`` and added to the module the first time) from the tensors ``inputs``."""
        if key not in self.funcs:
            self.funcs[key] = self.ctx.add_func(make_func().with_attr("global_symbol", key), key)
        ty = relax.TensorType(tuple(shape), dtype)
        var = relax.DataflowVar(name.replace(".", "_"), ty)
        self.values[name] = var
        call = relax.call_tir(self.funcs[key], [self.values[t] for t in inputs], ty)
        return relax.VarBinding(var, call)

    def _value(self, graph, tensor):
        """The Relax value of a graph tensor, or a new variable for a tensor only kernels pass
        each other (a row's moments, from the GEMM writing it to those normalizing it)."""
        if tensor not in self.values:
            info = graph.tensors[tensor]
            self.values[tensor] = relax.DataflowVar(
                tensor.replace(".", "_"), relax.TensorType(tuple(info.shape), info.dtype)
            )
        return self.values[tensor]


    def _build(self, match, source, config, shapes):
        """``builder``'s ``(func, modules)``, with fewer pipeline stages while the kernel needs
        more shared memory than a block has (:func:`embed.with_fewer_stages`)."""
        try:
            built, _ = embed.with_fewer_stages(
                lambda config: self.builder(match, source, config, shapes), config)
        except embed.SharedMemoryError as err:
            raise UnsupportedKernelError(str(err)) from err
        return built


def _zeroed(prim, params) -> list:
    """Zero constants for the inputs of ``prim`` that must hold zeros (a split-K launch's
    counters, which the kernel leaves zero: :data:`embed.ZEROED_INPUTS`), the first of
    ``params`` (its parameters after the kernel's inputs)."""
    zeroed = int(prim.attrs.get(embed.ZEROED_INPUTS, 0)) if prim.attrs else 0
    return [relax.const(np.zeros([int(d) for d in buf.shape], str(buf.dtype)))
            for buf in params[:zeroed]]


def _symbolic(graph, match) -> bool:
    """Whether ``match`` covers a node of symbolic shape (its kernel is a runtime one)."""
    return any(graph.nodes[n].symbolic for n in match.covered if n in graph.nodes)


def _progress(matches, name):
    """``matches`` with a progress bar (tqdm's: on a terminal or in a notebook, else none)
    counting the kernels generated, tuned and compiled, the longest phase of a compile."""
    from tqdm.auto import tqdm

    return tqdm(matches, desc=f"Triton kernels of {name}", unit="kernel", disable=None,
                leave=False)


def _connected(kernels, func) -> list:
    """``kernels`` without those reading a tensor no binding of ``func`` nor kept kernel
    defines (a row's moments, when the kernel writing them was left to TVM), and so on."""
    defined = set(func.params) | {b.var for block in func.body.blocks for b in block.bindings}
    kept = list(kernels)
    while True:
        made = defined | {v for _, (_, _, _, outs, pre) in kept
                          for v in [*outs, *(b.var for b in pre)]}
        missing = [(m, _undefined(k, made)) for m, k in kept]
        if not any(why for _, why in missing):
            return kept
        for m, why in missing:
            if why:
                logger.warning("%s left to TVM: it reads %s, which no kernel writes",
                               m.describe(outputs=True), ", ".join(sorted(why)))
        kept = [(m, k) for (m, k), (_, why) in zip(kept, missing) if not why]


def _undefined(kernel, defined) -> set:
    """Names of the variables ``kernel``'s call and bindings read that ``defined`` lacks."""
    _, args, _, _, pre = kernel
    # a symbolic dim passed to a kernel is the function's (its parameters' shapes define it)
    read = {a for a in args if isinstance(a, relax.Var) and not isinstance(a.ty, tvm.ir.PrimType)}
    read |= {v for b in pre for v in relax.analysis.free_vars(b.value)}
    return {v.name for v in read - defined}


def _defined_in(block, value) -> bool:
    var = value.tuple_value if isinstance(value, relax.TupleGetItem) else value
    return any(b.var.same_as(var) for b in block.bindings)


def _rewrite_block(block, kernels):
    """``block`` with each kernel's outputs bound to its call, in a dependence order that keeps
    the original one where it can."""
    replaced = {}
    nodes = []  # (priority, bindings)
    position = {b.var: i for i, b in enumerate(block.bindings)}
    for _, (gv, args, types, outs, pre) in kernels:
        call = relax.call_tir(gv, args, types[0] if len(types) == 1 else types)
        first = min(position[o] for o in outs if o in position)
        if len(types) == 1:
            bindings = [*pre, relax.VarBinding(outs[0], call)]
        else:
            tup = relax.DataflowVar(f"{outs[0].name}_kernel", relax.TupleType(types))
            bindings = [*pre, relax.VarBinding(tup, call)]
            bindings += [relax.VarBinding(o, relax.TupleGetItem(tup, i)) for i, o in
                         enumerate(outs)]  # buffers past the outputs are left unread
        for o in outs:
            replaced[o] = True
        nodes.append((first, bindings))
    for i, b in enumerate(block.bindings):
        if b.var not in replaced:
            nodes.append((i, [b]))
    deps = _dependences(nodes)
    order = topological(deps, {k: nodes[k][0] for k in deps})
    return relax.DataflowBlock([b for k in order for b in nodes[k][1]])


def _dependences(nodes) -> dict:
    """Node -> the nodes defining the variables its bindings read."""
    defines = {b.var: k for k, (_, bindings) in enumerate(nodes) for b in bindings}
    deps = {}
    for k, (_, bindings) in enumerate(nodes):
        inside = {b.var for b in bindings}
        deps[k] = {
            defines[v]
            for b in bindings
            for v in relax.analysis.free_vars(b.value)
            if v not in inside and v in defines
        }
    return deps
