"""FusionStitching's Relax integration.

``StitchFusion`` runs after ``LegalizeOps`` and ``AnnotateTIROpPattern``, before ``FuseOps``: it
forms fusion patterns over memory-intensive regions (:mod:`tvm_stitch.stitch.former`) and
wraps each in a ``Primitive`` Relax function named ``stitched_*``, so that ``FuseTIR`` merges the
pattern into one PrimFunc (reductions in the middle included).  ``StitchSchedule`` runs after
``FuseTIR`` on CUDA targets: it plans each ``stitched_*`` PrimFunc (kernel plan + latency
evaluator, :mod:`tvm_stitch.stitch.plan`) and applies the plan's schedule, so the pattern
becomes one kernel whose intermediates stay in registers or shared memory.  A pattern no plan
schedules is not formed: ``StitchFusion`` checks each one before fusing and leaves the ops of a
refused one to TVM's fusion (reason logged).  Everything else is left to TVM.
"""

from __future__ import annotations

import dataclasses
import logging

import tvm
from tvm import relax

from tvm_stitch.graph.specialize import module_point, representative
from tvm_stitch.stitch.former import form_groups

from .module import replace_functions
from .order import topological

logger = logging.getLogger("tvm_stitch.stitch")

PREFIX = "stitched_"
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@tvm.transform.module_pass(opt_level=0, name="StitchFusion")
class StitchFusion:
    """Group memory-intensive patterns (row reductions in the middle) into Primitive functions.

    A pattern is formed only when a kernel plan schedules it (legality before fusion: formed
    and refused later, it would be left to TVM's fallback schedule as one function, one thread
    per row); otherwise its ops are left to TVM's fusion, the reason logged.

    Parameters
    ----------
    schedules : dict, optional
        Shared with :class:`StitchSchedule` so that the patterns checked here are not
        scheduled a second time.
    explore : {"greedy", "search"}
        How patterns are chosen (:func:`~tvm_stitch.stitch.former.form_groups`).
    """

    def __init__(self, schedules=None, explore: str = "search"):
        self.schedules = {} if schedules is None else schedules
        self.explore = explore

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        self.schedules.clear()  # one module's schedules at a time
        gpu, hw = _hardware()
        if hw is None:  # no plan can schedule a pattern for this GPU: TVM's fusion throughout
            return mod
        skip = set()
        # a refused pattern is left to TVM's fusion; a refused packed kernel is formed again as
        # the patterns it packed, each checked in its turn (so twice at most)
        for _ in range(3):
            out, formed = _form(mod, skip=skip, explore=self.explore, hw=hw)
            if not formed:
                return mod
            refused = _unschedulable(out, formed, self.schedules, gpu, hw)
            for name, why in refused.items():
                logger.info("stitch: %s not formed, left to TVM's fusion: %s", name, why)
            if not refused:
                break
            skip |= {formed[name] for name in refused}
        else:
            out, formed = _form(mod, skip=skip, explore=self.explore, hw=hw)
            if not formed:
                return mod
        logger.info("stitch: %d fusion patterns formed", len(formed))
        return out


def _form(mod, skip, explore="search", hw=None):
    """``mod`` with each fusion pattern (but those keyed in ``skip``; chosen as ``explore`` says,
    for ``hw``: :func:`~tvm_stitch.stitch.former.form_groups`) wrapped in a Primitive
    function; also ``{function name: pattern key}`` of the patterns formed (key: the function,
    the dataflow block's index and the members' binding indices — the same in every formation
    of ``mod``)."""
    builder = relax.BlockBuilder(mod)
    updates, formed = {}, {}
    for gv, func in mod.functions.items():
        if not isinstance(func, relax.Function) or (func.attrs and "Primitive" in func.attrs):
            continue
        new_blocks, changed = [], False
        for index, block in enumerate(func.body.blocks):
            if not isinstance(block, relax.DataflowBlock):
                new_blocks.append(block)
                continue
            try:
                groups, refused = form_groups(mod, block, representative(func), explore, hw)
                if not skip:  # logged once, not again when the patterns are formed anew
                    for name, why in refused:
                        logger.info("stitch: %s not joined: %s", name, why)
                groups = _unpacked(groups, gv.name_hint, index, skip)
                keys = {g.gid: _key(gv.name_hint, index, g) for g in groups}
                groups = [g for g in groups if keys[g.gid] not in skip]
                names = {}
                rewritten = _rewrite_block(builder, block, groups, func, names) if groups else None
            except Exception as err:  # noqa: BLE001 - never break a build: TVM's fusion
                logger.warning("stitch: %s: block left to TVM's fusion: %r", gv.name_hint, err)
                rewritten = None
            if rewritten is None:
                new_blocks.append(block)
                continue
            formed.update({name: keys[gid] for gid, name in names.items()})
            new_blocks.append(rewritten)
            changed = True
        if changed:
            updates[gv] = relax.Function(
                func.params,
                relax.SeqExpr(new_blocks, func.body.body),
                func.ret_ty,
                func.is_pure,
                func.attrs,
            )
    if not updates:
        return mod, {}
    out = builder.get()
    for gv, func in updates.items():
        out[gv] = func
    return relax.transform.Normalize()(out), formed


def _key(name, index, group) -> tuple:
    """A pattern's key: the function, the dataflow block's index and the members' binding
    indices — the same in every formation of the module."""
    return name, index, tuple(group.members)


def _unpacked(groups, name, index, skip) -> list:
    """``groups`` with each packed kernel whose key is in ``skip`` (refused as one kernel)
    replaced by the patterns it packed, with group ids of their own."""
    out, fresh = [], max((g.gid for g in groups), default=-1) + 1
    for g in groups:
        if g.parts and _key(name, index, g) in skip:
            logger.info("stitch: the patterns packed with %s formed one by one", g.members)
            for part in g.parts:
                out.append(dataclasses.replace(part, gid=fresh, parts=[]))
                fresh += 1
        else:
            out.append(g)
    return out


def _unschedulable(mod, formed, cache, gpu, hw) -> dict:
    """``{function name: why}`` for the formed patterns no kernel plan schedules (tried as
    :class:`StitchSchedule` will try them, on the patterns ``FuseTIR`` merges)."""
    from tvm_stitch.stitch.schedule import schedule_pattern

    try:
        fused = relax.transform.FuseTIR()(mod)
    except Exception as err:  # noqa: BLE001 - FuseTIR will say it again in the pipeline
        logger.warning("stitch: patterns not checked, left to TVM's fusion (FuseTIR: %r)", err)
        return {name: f"FuseTIR failed: {err!r}" for name in formed}
    refused, point = {}, module_point(mod)
    for gv, func in fused.functions.items():
        if gv.name_hint in formed and isinstance(func, tvm.tirx.PrimFunc):
            scheduled, _, reasons = schedule_pattern(func, hw, gpu, cache=cache, point=point)
            if scheduled is None:
                refused[gv.name_hint] = "; ".join(reasons) or "no plan applies"
    return refused


def _hardware():
    """``(gpu, hw)``: whether the current target is CUDA, and the GPU the plans are made for
    (the default GPU when lowering for a CPU; ``hw`` None when the target names no known GPU)."""
    from tvm_stitch.hardware import HardwareModel

    target = tvm.target.Target.current(allow_none=True)
    gpu = target is not None and target.kind.name == "cuda"
    try:
        return gpu, HardwareModel.from_target(target if gpu else {"kind": "cuda", "arch": "sm_90a"})
    except ValueError as err:
        logger.info("stitch: no kernel plans: %s", err)
        return gpu, None


def _rewrite_block(builder, block, groups, func, names):
    """The block with each group's bindings replaced by one call to a Primitive function;
    ``names`` gets each group's function name (by group id)."""
    bindings = list(block.bindings)
    index = {b.var: i for i, b in enumerate(bindings)}
    used_later = _uses(block, func)
    # a binding several groups recompute (``Group.copies``) is computed in each of them, and
    # stays a binding of its own only where something else reads it too
    holders: dict = {}
    for g in groups:
        for i in g.copies:
            holders.setdefault(i, set()).add(g.gid)
    member = {i: g for g in groups for i in g.members if i not in holders}
    held = {i for i, gids in holders.items()
            if not used_later(bindings[i].var, {j for g in groups if g.gid in gids
                                                for j in g.members})}
    # super nodes: a group (its copies too) or a single binding; ordered topologically,
    # program order first
    nodes = {("g", g.gid): sorted(g.members) for g in groups}
    nodes.update((("b", i), [i]) for i in range(len(bindings))
                 if i not in member and i not in held)
    deps = {k: set() for k in nodes}
    for key, idxs in nodes.items():
        for i in idxs:
            for v in _free_vars(bindings[i].value):
                j = index.get(v)
                if j is None or (j in holders and key[0] == "g" and key[1] in holders[j]):
                    continue
                dk = ("g", member[j].gid) if j in member else ("b", j)
                if dk != key:
                    deps[key].add(dk)
    # the former keeps patterns convex: their calls never form a cycle
    order = topological(deps, {k: min(v) for k, v in nodes.items()})
    out = []
    for key in order:
        idxs = nodes[key]
        if key[0] == "b":
            out.append(bindings[idxs[0]])
            continue
        gv, calls = _group_call(builder, bindings, idxs, used_later, holders)
        names[key[1]] = gv.name_hint
        out.extend(calls)
    return relax.DataflowBlock(out)


def _group_call(builder, bindings, idxs, used_later, copies=()):
    """A Primitive function of the bindings ``idxs`` and the bindings that call it; it returns
    what is read after it, but the ``copies`` it recomputes for itself."""
    inside = {bindings[i].var for i in idxs}
    params, seen = [], set()
    for i in idxs:
        # free variables and tensor constants become parameters (FuseTIR takes no constants)
        for v in [*_free_vars(bindings[i].value), *_constants(bindings[i].value)]:
            if v not in inside and v not in seen:
                seen.add(v)
                params.append(v)
    outputs = [bindings[i].var for i in idxs
               if i not in copies and used_later(bindings[i].var, set(idxs))]
    new_params = [
        relax.Var(p.name if isinstance(p, relax.Var) else f"const{k}", p.ty)
        for k, p in enumerate(params)
    ]
    sub = dict(zip(params, new_params))
    body = []
    for i in idxs:
        b = bindings[i]
        var = relax.DataflowVar(b.var.name, b.var.ty)
        sub[b.var] = var
        body.append(relax.VarBinding(var, _substitute(b.value, sub)))
    rets = [sub[o] for o in outputs]
    ret = rets[0] if len(rets) == 1 else relax.Tuple(rets)
    if len(rets) > 1:
        tup = relax.Var("gv", relax.TupleType([o.ty for o in outputs]))
        body.append(relax.VarBinding(tup, ret))
        ret = tup
    fn = relax.Function(new_params, relax.SeqExpr([relax.DataflowBlock(body)], ret), ret.ty)
    names = []
    for i in idxs:
        callee = bindings[i].value.args[0].name_hint
        if callee not in names:
            names.append(callee)
    fn = fn.with_attr("Primitive", True)
    gv = builder.add_func(fn, PREFIX + "_".join(names)[:60])
    call = relax.Call(gv, params)
    if len(outputs) == 1:
        return gv, [relax.VarBinding(outputs[0], call)]
    tup = relax.DataflowVar(f"{outputs[0].name}_tuple", relax.TupleType([o.ty for o in outputs]))
    result = [relax.VarBinding(tup, call)]
    for k, o in enumerate(outputs):
        result.append(relax.VarBinding(o, relax.TupleGetItem(tup, k)))
    return gv, result


def _uses(block, func):
    """``used_later(var, group)``: whether ``var`` is read outside its group."""
    readers: dict = {}
    for i, b in enumerate(block.bindings):
        for v in _free_vars(b.value):
            readers.setdefault(v, set()).add(i)
    escaping = set(relax.analysis.free_vars(func.body.body))
    for b in block.bindings:
        if not isinstance(b.var, relax.DataflowVar):
            escaping.add(b.var)

    def used_later(var, group):
        return var in escaping or bool(readers.get(var, set()) - group)

    return used_later


def _constants(expr):
    return [a for a in expr.args[1].fields if isinstance(a, tvm.ir.expr.Constant)]


def _free_vars(expr):
    return list(relax.analysis.free_vars(expr))


def _substitute(expr, sub):
    """A ``call_tir`` with its tensor arguments renamed by ``sub``."""
    fields = [sub.get(a, a) for a in expr.args[1].fields]
    return relax.Call(
        expr.op, [expr.args[0], relax.Tuple(fields), *expr.args[2:]], expr.attrs, expr.ty_args
    )


@tvm.transform.module_pass(opt_level=0, name="StitchSchedule")
class StitchSchedule:
    """Plan and schedule every ``stitched_*`` PrimFunc for the current target.

    ``FuseOps`` groups made only of elementwise and broadcast ops (bias + GELU) get the thread
    composition plan too: 128-bit loads and stores, several elements per thread.

    On CUDA the plan's schedule binds blocks and threads; on ``llvm`` the same plan (made for
    the default GPU) is lowered with parallel blocks and serial thread loops, so the CPU runs
    the plan's loop structure.

    When TVM's schedule rejects a step of the cheapest plan, the next plans are tried
    (:func:`~tvm_stitch.stitch.schedule.schedule_pattern`, up to
    :data:`~tvm_stitch.stitch.schedule.FALLBACK_PLANS`, then the cheapest of each grouping of
    rows not tried yet); a pattern no plan covers is left to
    TVM's default schedule (with the pipeline's passes, stitched patterns are not:
    :class:`StitchFusion` forms only patterns a plan schedules for the same target).  Every
    refusal is logged with its reason.  The chosen plans are kept in :attr:`plans` (name ->
    :class:`~tvm_stitch.stitch.plan.KernelPlan`) for inspection.

    Parameters
    ----------
    schedules : dict, optional
        The schedules :class:`StitchFusion` made while checking its patterns.
    """

    def __init__(self, schedules=None):
        self.plans = {}
        self.schedules = {} if schedules is None else schedules

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from tvm_stitch.stitch.schedule import schedule_pattern

        gpu, hw = _hardware()
        if hw is None:
            return mod
        updates, point = {}, module_point(mod)
        for gv, func in list(mod.functions.items()):
            if not isinstance(func, tvm.tirx.PrimFunc) or _scheduled(func):
                continue
            stitched = gv.name_hint.startswith(PREFIX)
            log = logger.info if stitched else logger.debug
            scheduled, plan, reasons = schedule_pattern(
                func, hw, gpu, thread_only=not stitched, cache=self.schedules, point=point
            )
            if scheduled is None:
                log("stitch: %s left to TVM's schedule: %s", gv.name_hint, "; ".join(reasons))
                continue
            for why in reasons:  # the plans refused before the one applied
                log("stitch: %s: %s", gv.name_hint, why)
            updates[gv] = scheduled
            self.plans[gv.name_hint] = plan
            logger.info("stitch: %s: %s", gv.name_hint, plan.describe())
        return _widen_calls(replace_functions(mod, updates), updates)


def _widen_calls(mod: tvm.IRModule, updates: dict) -> tvm.IRModule:
    """``mod`` with the calls of functions that gained outputs (a column pattern's partial
    sums, :func:`~tvm_stitch.stitch.columns.lift_partials`) passing them: Relax allocates the
    buffers, the callers see the results they saw before."""
    from tvm_stitch.graph.kernels import PARTIALS_ATTR

    widened = {}
    for gv, func in updates.items():
        count = int(func.attrs.get(PARTIALS_ATTR, 0)) if func.attrs else 0
        if count:
            widened[gv] = [
                relax.TensorType(tuple(int(d) for d in p.ty.shape), str(p.ty.dtype))
                for p in func.params[-count:]
            ]
    if not widened:
        return mod
    # fresh global variables (the old ones carry the narrower signature), same names
    functions = {gv: f for gv, f in mod.functions.items() if gv not in widened}
    builder = relax.BlockBuilder(
        tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    )
    renamed = {gv: builder.add_func(updates[gv], gv.name_hint) for gv in widened}
    mod = builder.get()
    widened = {renamed[gv]: tys for gv, tys in widened.items()}
    mutator = _Widen(mod, widened, renamed)
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


@relax.expr_functor.mutator
class _Widen(relax.PyExprMutator):
    def __init__(self, mod, widened, renamed):
        super().__init__(mod)
        self.widened = widened
        self.renamed = renamed

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CALL_TIR) or call.args[0] not in self.renamed:
            return call
        gv = self.renamed[call.args[0]]
        out = call.ty_args[0]
        outs = list(out.fields) if isinstance(out, relax.TupleType) else [out]
        wide = relax.call_tir(gv, call.args[1], outs + self.widened[gv])
        if len(call.args) > 2:  # the call's symbolic-shape arguments (``tir_vars``), kept
            wide = relax.Call(wide.op, [*wide.args, *call.args[2:]], wide.attrs, wide.ty_args)
        value = self.builder_.emit(wide)
        if isinstance(out, relax.TupleType):
            return relax.Tuple([relax.TupleGetItem(value, i) for i in range(len(outs))])
        return relax.TupleGetItem(value, 0)


def _scheduled(func) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled", False))
