"""The stitch pipeline: TVM's default Relax pipeline for the target with tvm-stitch's passes in it.

Phases (each a list of passes, so reports can stop after fusion):

``dispatch``   [symbolic shapes simplified under their dims' ranges], [input-independent values
               folded into constants], TVM's library dispatch
               (sampling, sort/scan)
``fusion``     [float32 accumulation], LegalizeOps, [common subexpressions], [MCFuser: kernels
               recognized on the tensor graph, generated in Triton], [tensor-graph analysis],
               AnnotateTIROpPattern, FoldConstant, [StitchFusion], FuseOps, FuseTIR,
               [StitchSchedule], [fusion report]
``schedule``   [kernels without reductions in 16-byte pieces], dlight's default GPU schedules
               (none on CPU; a rule that fails on a kernel is logged and the next one tried),
               [float16 arithmetic in float32], [every kernel built ahead: one that fails gets
               TVM's schedule]
``lower``      dataflow lowering, [TVM's kernels launched dependently (sm_90)]
``finalize``   memory planning, CUDA graphs (when enabled), VM lowering

The stitch passes: GEMM chains, attention and Linear layers as searched Triton kernels (MCFuser,
GPU only), float32 accumulation of half-precision reductions, the tensor-graph analysis,
FusionStitching (pattern former + kernel plans) and the fusion report.  The ``default`` phases
are exactly TVM's ``relax.get_default_pipeline(target)``.
"""

from __future__ import annotations

import importlib
import logging
import time

import tvm
from tvm import relax
from tvm.s_tir import dlight as dl

from .config import PipelineOptions
from .errors import error_line
from .graph.tir_walk import iter_sblocks
from .hardware import HardwareModel, UnsupportedTargetError
from .stitch.injective import VectorizedInjective

logger = logging.getLogger("tvm_stitch.pipeline")

SUPPORTED_KINDS = ("llvm", "cuda")

#: Names the command line and the workloads accept for targets: ``cuda`` is the H100 (sm_90a).
SHORT_TARGETS = {"cuda": {"kind": "cuda", "arch": "sm_90a"}, "llvm": "llvm"}


def _backend(target: tvm.target.Target):
    kind = target.kind.name
    if kind not in SUPPORTED_KINDS:
        raise ValueError(
            f"tvm-stitch pipelines support targets {SUPPORTED_KINDS}, got {kind!r}; "
            "use relax.get_default_pipeline for other targets"
        )
    name = "cuda" if kind == "cuda" else "cpu_generic"
    return importlib.import_module(f"tvm.relax.backend.{name}.pipeline")


def _guarded(schedule_pass):
    """dlight's ``ApplyDefaultSchedule`` pass with each rule but the last of several
    :class:`_Guarded`: a rule failing on a kernel passes it to the next; the last rule's
    failure stays an error.  A pass of one rule (ours, before TVM's) is guarded whole: TVM's
    pass after it takes the kernel."""
    *rules, last = schedule_pass.rules
    if not rules:
        return dl.ApplyDefaultSchedule(_Guarded(last))
    return dl.ApplyDefaultSchedule(*map(_Guarded, rules), last)


class _Guarded(dl.ScheduleRule):
    """A dlight rule whose failure on a kernel is logged and passed over: the next rule is
    tried, as where the rule does not apply (dlight's GEMV rule asserts on a product whose
    reduction has one step — attention over a single key).  A failure of one of tvm-stitch's
    own rules is a defect, logged as a warning."""

    def __init__(self, rule):
        self.rule = rule

    def apply(self, func, target, tunable):
        try:
            return self.rule.apply(func, target, tunable)
        except Exception as err:  # noqa: BLE001 - the rule failed: the next one is tried
            ours = type(self.rule).__module__.startswith("tvm_stitch")
            (logger.warning if ours else logger.info)(
                "dlight's %s rule failed on the kernel of blocks %s (%s: %s); the next rule is "
                "tried", type(self.rule).__name__, _blocks(func), type(err).__name__,
                error_line(err, "no message"))
            return None


def _blocks(func) -> list[str]:
    """The names of ``func``'s blocks (for a log line; empty where they cannot be read)."""
    try:
        return [b.name_hint for b, _ in iter_sblocks(func.body) if b.name_hint != "root"]
    except Exception:  # noqa: BLE001 - a log line's detail
        return []


def _hardware(target: tvm.target.Target) -> HardwareModel | None:
    """The target's GPU facts, None where no hardware table describes it (CPUs too)."""
    try:
        return HardwareModel.from_target(target)
    except UnsupportedTargetError:
        return None


def as_target(target) -> tvm.target.Target:
    """A ``tvm.target.Target`` from a target, a string, a dict, or the current target scope."""
    if target is None:
        target = tvm.target.Target.current(allow_none=True)
        if target is None:
            raise ValueError(
                "no target: pass one to tvm_stitch.pipeline(target) or build inside `with target:`"
            )
        return target
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str) and target in SHORT_TARGETS:
        target = SHORT_TARGETS[target]
    return tvm.target.Target(target)


def phases(target, kind: str = "stitch", plan_only: bool = False, **options) -> list:
    """The passes of a pipeline, grouped in named phases.

    Parameters
    ----------
    target : tvm.target.Target or str or dict
        ``llvm`` or a CUDA target (the short name ``"cuda"`` means ``sm_90a``).
    kind : {"stitch", "default"}
        tvm-stitch's pipeline or TVM's default one for the target.
    plan_only : bool
        Recognize and plan the Triton kernels of a CUDA target even where they cannot be loaded
        (no GPU): for fusion reports, not for building.
    **options
        :class:`~tvm_stitch.config.PipelineOptions` fields (stitch only).
    """
    from tvm_stitch import passes

    target = as_target(target)
    opts = PipelineOptions.from_kwargs(**options)
    backend = _backend(target)
    lower = list(backend.dataflow_lower_passes(target))
    dispatch = list(backend.library_dispatch_passes(target))
    legalize = list(backend.legalize_passes(target))
    schedule = [p for p in legalize if p.info.name == "ApplyDefaultSchedule"]
    fusion = [p for p in legalize if p.info.name != "ApplyDefaultSchedule"]
    tvm_schedule = list(schedule)
    if kind == "stitch":
        at = next(i for i, p in enumerate(fusion) if p.info.name == "LegalizeOps") + 1
        if opts.analyze:
            fusion.insert(at, passes.AnalyzeTensorGraph())
        if opts.mcfuser and target.kind.name == "cuda":
            fusion.insert(
                at, passes.FuseMBCI(mcfuser=opts.mcfuser, plan_only=plan_only, tune=opts.tune,
                                    fold_norms=opts.fold_norms, lift_params=opts.lift_params,
                                    dependent_launch=opts.dependent_launch,
                                    launch_dependents=opts.launch_dependents,
                                    mask_blocks=opts.mask_blocks,
                                    prefetch_weights=opts.prefetch_weights)
            )
        # one tensor where a front end computed it several times (a cast per consumer); the
        # aliases that leaves are dropped (an alias reads its tensor outside any kernel)
        fusion.insert(at, relax.transform.CanonicalizeBindings())
        fusion.insert(at, relax.transform.EliminateCommonSubexpr())
        # reshapes of symbolic shape fuse as static ones do (TVM marks them opaque)
        at = next(i for i, p in enumerate(fusion) if p.info.name == "AnnotateTIROpPattern") + 1
        fusion.insert(at, passes.InjectiveViews())
        if opts.report:
            fusion.append(passes.ReportFusion())
        kernels = {}  # each kernel before any schedule, for CheckKernels' fallback
        at = next(i for i, p in enumerate(fusion) if p.info.name == "FuseTIR") + 1
        fusion.insert(at, passes.RecordKernels(kernels))
        if opts.stitch:
            schedules = {}  # the patterns StitchFusion checked are scheduled once
            at = next(i for i, p in enumerate(fusion) if p.info.name == "FuseOps")
            fusion.insert(at, passes.StitchFusion(schedules, opts.explore))
            at = next(i for i, p in enumerate(fusion) if p.info.name == "StitchRecordKernels")
            fusion.insert(at + 1, passes.StitchSchedule(schedules))
        if opts.lift_params:  # weight-only computations (joined weights) run once, apart
            fusion.append(relax.transform.LiftTransformParams())
        if target.kind.name == "cuda":  # kernels reading model inputs would cut CUDA graphs;
            # after lifting, which makes the copies' variables dataflow variables, and
            # RewriteDataflowReshape would turn those back into views of the inputs
            fusion.append(passes.StageInputs(_hardware(target)))
        if opts.accumulate_fp32:
            at = next(i for i, p in enumerate(fusion) if p.info.name == "LegalizeOps")
            fusion.insert(at, passes.AccumulateFloat32())
        if opts.stitch and target.kind.name == "cuda":  # before TVM's rules: 16-byte pieces
            schedule.insert(0, dl.ApplyDefaultSchedule(VectorizedInjective()))
        schedule = [_guarded(p) for p in schedule]
        if opts.compute_fp32:
            schedule.append(passes.ComputeFloat32())
        if opts.check_kernels and target.kind.name == "cuda":
            schedule.append(passes.CheckKernels(kernels, tvm_schedule))
        if opts.fold:
            dispatch.insert(0, passes.FoldStaticShapes())
        dispatch.insert(0, passes.BoundSymbolicShapes())
        hw = _hardware(target)
        if opts.dependent_launch and hw and int(hw.arch[3:]) >= 90:  # after reshapes: views
            lower.append(passes.LaunchDependently(opts.launch_dependents, hw.num_sms))
    elif kind != "default":
        raise ValueError(f"unknown pipeline kind {kind!r}: 'stitch' or 'default'")
    elif options:
        raise TypeError("the default pipeline takes no options")
    return [
        ("dispatch", dispatch),
        ("fusion", fusion),
        ("schedule", schedule),
        ("lower", lower),
        ("finalize", list(backend.finalize_passes(target))),
    ]


def run_until(mod: tvm.IRModule, target, pass_name: str, **options) -> tvm.IRModule:
    """``mod`` after the stitch pipeline's passes that come before ``pass_name`` (e.g.
    ``"StitchFuseMBCI"``: the legalized module that recognition reads).

    Raises
    ------
    ValueError
        When the pipeline for ``target`` has no such pass.
    """
    target = as_target(target)
    seq = [p for _, group in phases(target, "stitch", **options) for p in group]
    names = [p.info.name for p in seq]
    if pass_name not in names:
        raise ValueError(f"no pass {pass_name!r} in the stitch pipeline; it has {names}")
    with target:
        return tvm.transform.Sequential(seq[: names.index(pass_name)])(mod)


def pipeline(target=None, **options) -> tvm.transform.Pass:
    """The stitch Relax pipeline, for ``tvm.compile(mod, target, relax_pipeline=...)``.

    Parameters
    ----------
    target : tvm.target.Target or str or dict, optional
        ``llvm`` or a CUDA target.  When omitted, the target in scope when the pipeline runs is
        used (``tvm.compile`` enters its target), which is how ``relax_pipeline="stitch"`` works.
    **options
        See :class:`tvm_stitch.config.PipelineOptions`.

    Returns
    -------
    tvm.transform.Pass

    Examples
    --------
    >>> ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    >>> ex = tvm.compile(mod, "llvm", relax_pipeline="stitch")
    """
    PipelineOptions.from_kwargs(**options)  # fail at construction, not at build time
    fixed = None if target is None else as_target(target)

    @tvm.transform.module_pass(opt_level=0, name="StitchPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        tgt = as_target(fixed)
        with tgt:
            return _timed(mod, phases(tgt, "stitch", **options))

    return _pipeline


def _timed(mod: tvm.IRModule, groups) -> tvm.IRModule:
    """``mod`` through every phase's passes in order, one at a time (each a ``Sequential`` of
    one, as the whole would run it), logging the time of each phase and of its slowest
    passes."""
    lines = []
    for phase, passes_ in groups:
        start, slow = time.perf_counter(), []
        for p in passes_:
            begin = time.perf_counter()
            mod = tvm.transform.Sequential([p])(mod)
            slow.append((time.perf_counter() - begin, p.info.name))
        slowest = ", ".join(f"{name} {t:.1f} s" for t, name in sorted(slow, reverse=True)[:3])
        lines.append(f"{phase} {time.perf_counter() - start:.1f} s ({slowest})")
    logger.info("stitch pipeline: %s", "; ".join(lines))
    return mod


def num_input(mod: tvm.IRModule, func: str) -> int | None:
    """The ``num_input`` attribute of ``mod[func]`` (how many parameters are inputs, the rest
    weights), or None."""
    value = (mod[func].attrs or {}).get("num_input")
    return None if value is None else int(value)


def default_pipeline(target=None) -> tvm.transform.Pass:
    """TVM's default Relax pipeline for ``target`` (the baseline every benchmark reports)."""
    fixed = None if target is None else as_target(target)

    @tvm.transform.module_pass(opt_level=0, name="TVMDefaultPipeline")
    def _pipeline(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        tgt = as_target(fixed)
        seq = [p for _, group in phases(tgt, "default") for p in group]
        with tgt:
            return tvm.transform.Sequential(seq)(mod)

    return _pipeline


def register() -> None:
    """Register ``"stitch"`` with ``tvm.relax.pipeline`` (idempotent)."""
    from tvm.relax import pipeline as relax_pipeline

    if "stitch" not in relax_pipeline.PIPELINE_MAP:
        relax_pipeline.register_pipeline("stitch")(lambda **options: pipeline(None, **options))


register()  # relax_pipeline="stitch" once the package is imported
