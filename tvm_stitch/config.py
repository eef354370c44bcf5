"""Every tunable of tvm-stitch in one place, with what it changes.

Pipelines take these as keyword options (``tvm_stitch.pipeline(target, analyze=False)``); unknown
options are an error, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tvm_stitch.families import FAMILIES
from tvm_stitch.families import check as check_families

#: where a dependently launched kernel releases the next launch (``launch_dependents``)
LAUNCH_DEPENDENTS = ("auto", "start", "exit")
#: the default: at its start where its grid leaves SMs free, else at its exit (measured:
#: :class:`PipelineOptions`' ``launch_dependents``)
DEFAULT_LAUNCH_DEPENDENTS = "auto"


def cache_root() -> Path:
    """Where tvm-stitch keeps what it generates and builds: ``$TVM_STITCH_CACHE``, default
    ``~/.cache/tvm-stitch`` (the generated Triton sources in ``triton/``, the kept executables
    in ``executables/``)."""
    root = os.environ.get("TVM_STITCH_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "tvm-stitch"


def check_tune(value) -> str:
    """``value`` if it is ``"measure"`` or ``"model"``; else a ``ValueError``."""
    if value not in ("measure", "model"):
        raise ValueError(f"tune takes 'measure' or 'model'; got {value!r}")
    return value


#: how FusionStitching's patterns are chosen (``explore``)
EXPLORE = ("greedy", "search")


def check_explore(value) -> str:
    """``value`` if it is one of :data:`EXPLORE`; else a ``ValueError``."""
    if value not in EXPLORE:
        raise ValueError(f"explore takes 'greedy' or 'search'; got {value!r}")
    return value


def check_launch_dependents(value) -> str:
    """``value`` if it is one of :data:`LAUNCH_DEPENDENTS`; else a ``ValueError``."""
    if value not in LAUNCH_DEPENDENTS:
        raise ValueError(f"launch_dependents takes 'auto', 'start' or 'exit'; got {value!r}")
    return value


def release_point(launch_dependents: str, blocks: int | None, num_sms: int | None) -> str:
    """Where a kernel of ``blocks`` blocks (None: a grid known at run time) releases the next
    launch: ``launch_dependents`` itself, or for ``"auto"`` its start where the grid leaves
    SMs free (the next kernel's blocks take those and prefetch its weights while this one
    runs), else its exit (a grid filling the SMs would share them with the next kernel's
    waiting blocks: every GEMM after a GEMM lost about 2 µs at BERT-base 8×512)."""
    check_launch_dependents(launch_dependents)
    if launch_dependents != "auto":
        return launch_dependents
    fits = blocks is not None and num_sms is not None and blocks < num_sms
    return "start" if fits else "exit"


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Options of :func:`tvm_stitch.pipeline`, each under one name from the pipeline to the pass
    that reads it. What each does, and the measurements behind its default: ``docs/options.md``.

    Attributes
    ----------
    fold : bool
        Evaluate values that depend on no input (masks, position ids, rotary tables) at compile
        time.
    analyze : bool
        Build the tensor dependency graph after legalization and log its summary.
    report : bool
        Log the fusion report (kernels, bytes, groups) after fusion.
    stitch : bool
        Stitch memory-intensive regions into one kernel each (FusionStitching), planned by the
        latency-evaluator on CUDA.
    accumulate_fp32 : bool
        Half-precision reductions and softmaxes accumulate in float32, as PyTorch does.
    compute_fp32 : bool
        Float16 arithmetic inside a kernel runs in float32, rounded where it is stored.
    mcfuser : tuple of str
        The kernel families generated in Triton (MCFuser): ``"attention"``, ``"chain"``,
        ``"gemm"``; ``()`` turns the pass off.
    fold_norms : bool
        Normalizations whose every reader is a generated GEMM are computed by those GEMMs.
        Needs ``"gemm"``.
    lift_params : bool
        Weight-only computations move to ``<entry>_transform_params``, run once at load time;
        banded GEMMs read their weights joined.
    dependent_launch : bool
        Launch kernels with programmatic dependent launch (sm_90).
    launch_dependents : {"auto", "start", "exit"}
        When a dependently launched kernel lets the next one launch: at its start, at its
        exit, or (``"auto"``) at its start where its grid leaves SMs free, else at its exit
        (:func:`release_point`).
    prefetch_weights : bool
        A generated kernel of static shape whose weights fit a quarter of L2 pulls them into
        L2 first thing, before it waits for the kernel before it (batch 1: small-M GEMMs are
        bound by their weights' latency).
    check_kernels : bool
        On CUDA, compile every kernel ahead of the build; one that fails gets TVM's schedule.
    tune : {"measure", "model"}
        Tiles for shapes the tuning database lacks: measured on the GPU, or the cost model's.
    explore : {"greedy", "search"}
        How FusionStitching's patterns are chosen: the greedy rule in program order, or the
        fusion explorer's search (FusionStitching's approximate DP and beam search,
        :mod:`tvm_stitch.explore.fusion`).
    mask_blocks : bool
        Attention skips the key blocks a mask folded at compile time hides from every query of
        a block (causal, sliding windows), and applies the mask only on the blocks its edges
        cross; with a padding mask read at run time too, the blocks outside the band are
        skipped unless a row of the block sees no key. False: the mask on every block (the
        dense-mask kernel, for comparison).
    """

    fold: bool = True
    analyze: bool = True
    report: bool = True
    stitch: bool = True
    accumulate_fp32: bool = True
    compute_fp32: bool = True
    mcfuser: tuple = FAMILIES
    fold_norms: bool = False
    lift_params: bool = False
    dependent_launch: bool = True
    launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS
    prefetch_weights: bool = True
    check_kernels: bool = True
    tune: str = "measure"
    mask_blocks: bool = True
    explore: str = "search"

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.type in ("bool", bool) and not isinstance(getattr(self, f.name), bool):
                raise ValueError(f"{f.name} takes True or False; got {getattr(self, f.name)!r}")
        check_launch_dependents(self.launch_dependents)
        check_tune(self.tune)
        check_explore(self.explore)
        try:
            check_families(self.mcfuser)
        except ValueError as err:
            raise ValueError(f"mcfuser takes a tuple of kernel families: {err}") from None

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
