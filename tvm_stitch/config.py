"""Every tunable of tvm-stitch in one place, with what it changes.

Pipelines take these as keyword options (``tvm_stitch.pipeline(target, analyze=False)``); unknown
options are an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses

#: where a dependently launched kernel releases the next launch (``launch_dependents``)
LAUNCH_DEPENDENTS = ("start", "exit")
#: the default: at its exit (measured: :class:`PipelineOptions`' ``launch_dependents``)
DEFAULT_LAUNCH_DEPENDENTS = "exit"


def check_launch_dependents(value) -> str:
    """``value`` if it is one of :data:`LAUNCH_DEPENDENTS`; else a ``ValueError``."""
    if value not in LAUNCH_DEPENDENTS:
        raise ValueError(f"launch_dependents takes 'start' or 'exit'; got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Options of :func:`tvm_stitch.pipeline`.

    Attributes
    ----------
    fold : bool
        Evaluate at compile time every value that depends on no input (causal and padding masks
        built from ``arange``/``full``/comparisons, position ids, rotary tables) and use it as a
        constant; boolean scans that remain accumulate in ``int32``.  Runs before TVM's library
        dispatch.
    analyze : bool
        Build the tensor dependency graph after legalization and log its summary (INFO level on
        the ``tvm_stitch`` logger).  Costs a walk over every TIR block; off for the fastest builds.
    report : bool
        Log the fusion report (kernels, bytes, groups) after fusion.
    stitch : bool
        Form FusionStitching patterns over memory-intensive regions (row reductions in the
        middle) so each becomes one kernel; on CUDA each pattern is planned by the
        latency-evaluator and scheduled with warp or block composition.
    accumulate_fp32 : bool
        Half-precision sums, means, variances and softmaxes accumulate in float32 (their input
        cast to float32, the result cast back), as PyTorch does; TVM's legalization accumulates
        them in float16.  The casts are elementwise: fused, no extra bytes.
    compute_fp32 : bool
        Float16 arithmetic inside a kernel runs in float32 and is rounded to float16 where it is
        stored, as torch.compile's kernels and TVM's LLVM code compute it; TVM's CUDA code
        otherwise rounds after every operation of a fused expression.  Conversions happen in
        registers: no extra bytes.
    mcfuser : tuple of str
        Which kernel families are recognized on the tensor graph and generated in Triton
        (MCFuser): ``"attention"``, ``"chain"`` (GEMM chains), ``"gemm"`` (matrix products with
        their epilogues, side by side when they share an input).  ``()`` turns the pass off.
        Needs Triton at compile time, not a GPU: without one the kernels are compiled to sm_90a
        PTX and embedded, with the tuning database's or the cost model's tiles.
    fold_norms : bool
        Normalizations (LayerNorm, RMSNorm, any elementwise function of row statistics) whose
        every reader is a generated GEMM stop being kernels: each GEMM computes them, as ``A``'s
        prologue or in its epilogue, from row statistics in two phases — the GEMM that writes
        the row also writes its moments (Σx, Σx² per 16–128 columns, wider for more rows:
        :func:`tvm_stitch.analysis.recognize.moment_chunk`) and the readers add them up;
        where no GEMM writes the row, or a statistic is no sum of moments (a maximum), each
        reader re-reads its rows.  With ``lift_params`` too, a GEMM reading the normalization
        as ``A`` reads its input as it is (TMA) with weights scaled by the normalization's
        column factor (γ) and column sums of the weights (γ·W, β·W), made once in the
        transform, and finishes the normalization in its epilogue
        (:mod:`tvm_stitch.analysis.through_weights`); a normalization that cannot be folded so
        stays a kernel.  Off by default: it is not faster than the kernels it saves
        (BERT-base on an H100 with the warp-specialized Gluon GEMMs, 5 instead of 7 kernels
        per layer, same run: 8×512 1719.2 vs 1706.4 µs, 1×128 349.6 vs 335.2 — launched
        plainly, ``dependent_launch=False``; with the next launch released at a kernel's exit,
        the default now, 1×128 330.9 vs 322.0 and 8×512 1791.1 vs 1741.9, same runs,
        2026-11-26; earlier, on an H200, 8×512 2045.9 vs 1939.2; earlier forms: re-reading
        781 vs 460 µs, two-phase in ``A``'s prologue 539 vs 434 on an H100).  Needs
        ``"gemm"``.
    lift_params : bool
        Computations that depend on weights only — the parameters past the entry function's
        ``num_input`` — move into a function of their own, ``<entry>_transform_params``
        (``relax.transform.LiftTransformParams``), which takes the weights as one tuple and
        returns the entry's new trailing parameters: run it once when the weights are
        loaded. With it, the weights of GEMMs sharing their input (a layer's Q, K, V) are
        concatenated there, and their kernel reads them with one TMA descriptor; without it
        the warp-specialized GEMM reads them through a descriptor each, as fast (BERT-base
        8×512 on an H100, same run: 1727.5 µs with it, 1707.1 without; 2026-11-27, before
        which such bands had no warp-specialized form: 1823.2 without, another run). Off by
        default: the entry's parameters change (the benchmarks' runners call the transform
        when it is on, :func:`tvm_stitch.pipeline.prepare_args`).
        :func:`tvm_stitch.from_torch`, whose module calls the transform itself, turns it on
        for CUDA (:func:`tvm_stitch.frontend.default_options`). Weights bound into the module as
        constants (``relax.transform.BindParams``) are joined at compile time, with or
        without it.
    dependent_launch : bool
        The generated kernels, and TVM's own kernels of at most one block per SM, are
        launched with programmatic dependent launch (TVM's
        ``tirx.use_programtic_dependent_launch``; sm_90): each waits for the kernel before it
        to complete and lets the next one be launched early (``launch_dependents``), so
        launches and block start-up overlap the previous kernel (BERT-base 1×128 on an
        H100: 349.7 µs instead of 384.6 for the generated kernels; TVM's kernels too, same
        process: 331.0 against 336.8).  TVM's larger kernels stay plain (launched early they
        crowd onto the SMs freed first: BERT-base 8×512 1790.7 against 1729.7 µs;
        :class:`~tvm_stitch.passes.LaunchDependently`).  False launches every kernel plainly —
        for profiles whose per-kernel durations should not include the wait for the kernel
        before (CUPTI counts it), or to compare.
    launch_dependents : {"start", "exit"}
        When a dependently launched kernel lets the next one be launched: ``"start"``, right
        after its wait, so the next kernel's blocks take whatever SM room this one leaves and
        wait there; ``"exit"`` (the default), once all its blocks have exited. On the H100,
        same runs, ``"exit"`` is faster or level: BERT-base ``lift_params`` 1×128 322.0 and
        322.5 µs against 333.2 and 334.5, 32×128 1559.2 against 1582.2, 8×512 1741.9 against
        1741.2; with ``fold_norms`` too, 1×128 330.9 against 375.9 (2026-11-26,
        ``h100-launch-exit-2026-11-26.md``). Released at the start, a GEMM launched after a
        GEMM ran ~2 µs longer at 8×512 (``benchmarks/timeline.py``; why was not found).
        Earlier, on an H200, ``"start"`` was the faster (1×128 358.1 against 379.4).
    check_kernels : bool
        On CUDA, every kernel is lowered, generated and compiled once ahead of the build (NVRTC
        where TVM has a CUDA runtime, ``nvcc`` on a machine without a GPU; one compile for the
        module), and a kernel TVM cannot build is given TVM's default schedule instead, with
        a warning: one defective kernel costs that kernel's speed, not the build.  Costs a
        second lowering of the kernels and one compile: seconds with ``nvcc`` (BERT-base's
        two layers on the 2-core CPU machine: 3.3 s without, 9.9 s with, under load), less
        with NVRTC.
    tune : {"measure", "model"}
        How the kernels' tiles are chosen for shapes the tuning database does not hold:
        ``"measure"`` runs MCFuser's search on the GPU (10-30 s a shape, kept in the database);
        ``"model"`` takes the cost model's choice (no measurement, nothing stored), as a build
        without a GPU does.
    """

    fold: bool = True
    analyze: bool = True
    report: bool = True
    stitch: bool = True
    accumulate_fp32: bool = True
    compute_fp32: bool = True
    mcfuser: tuple = ("attention", "chain", "gemm")
    fold_norms: bool = False
    lift_params: bool = False
    dependent_launch: bool = True
    launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS
    check_kernels: bool = True
    tune: str = "measure"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.type in ("bool", bool) and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"{f.name} takes True or False; got {getattr(self, f.name)!r}")
        check_launch_dependents(self.launch_dependents)
        if self.tune not in ("measure", "model"):
            raise ValueError(f"tune takes 'measure' or 'model'; got {self.tune!r}")
        unknown = set(self.mcfuser) - {"attention", "chain", "gemm"}
        if isinstance(self.mcfuser, str) or unknown:
            raise ValueError(
                f"mcfuser takes a tuple of 'attention', 'chain', 'gemm'; got {self.mcfuser!r}"
            )

    @classmethod
    def from_kwargs(cls, **options) -> PipelineOptions:
        """Validate keyword options; raise ``TypeError`` naming the unknown ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(
                f"unknown tvm_stitch.pipeline option(s) {unknown}; known: {sorted(known)}"
            )
        return cls(**options)
