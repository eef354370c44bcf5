"""The four benchmark studies: which workloads at which shapes, against which baselines.

On ``cuda`` the shapes are those of ``../shared/ANCHORS.md`` and the baselines are TVM's default
pipeline, PyTorch eager (the fused op where PyTorch has one), PyTorch with SDPA where attention
is involved, and ``torch.compile``.  On ``llvm`` the shapes are small and irregular (the CPU
machine and CI have two cores) and the baselines are TVM's default pipeline and PyTorch eager.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from tvm_stitch.errors import error_line
from tvm_stitch.pipeline import as_target
from tvm_stitch.report import fusion_report
from tvm_stitch.workloads import GEMM_CHAINS, get_workload

from .harness import (
    DeviceLimits,
    Record,
    compare,
    compile_tvm,
    fill_rates,
    format_table,
    in_turns,
    measure_limits,
    run_isolated,
    run_tvm,
    time_tvm,
    torch_outputs,
    torch_timer,
    tvm_device,
    tvm_graph_timer,
)

logger = logging.getLogger("tvm_stitch.bench")

MEMORY_SHAPES_GPU = [
    ("layernorm", {"rows": 4096, "cols": 768}),
    ("layernorm", {"rows": 4096, "cols": 1024}),
    ("layernorm-ops", {"rows": 4096, "cols": 768}),
    ("layernorm-ops", {"rows": 4096, "cols": 1024}),
    ("softmax", {"rows": 49152, "cols": 128}),
    ("softmax", {"rows": 65536, "cols": 512}),
    ("softmax-ops", {"rows": 49152, "cols": 128}),
    ("softmax-ops", {"rows": 65536, "cols": 512}),
    ("add-layernorm", {"rows": 4096, "cols": 768}),
    ("transpose-layernorm", {"rows": 4096, "cols": 768}),
    ("bias-gelu", {"rows": 4096, "cols": 3072}),
    ("rmsnorm", {"rows": 4096, "cols": 768}),
    ("mean-pool", {"batch": 8, "seq": 512, "hidden": 768}),
    ("mean-pool", {"batch": 32, "seq": 128, "hidden": 768}),
    ("mean-pool", {"batch": 1, "seq": 128, "hidden": 768}),
    ("column-mean", {"rows": 4096, "cols": 768}),
    ("column-mean", {"rows": 65536, "cols": 64}),
    ("rotary", {"batch": 4, "seq": 512, "heads": 32, "dim": 128}),
    ("rotary", {"batch": 1, "seq": 2048, "heads": 8, "dim": 128}),
    ("qk-norms", {"batch": 4, "seq": 512, "heads": 32, "kv_heads": 8, "dim": 128}),
    ("qk-norms", {"batch": 1, "seq": 2048, "heads": 32, "kv_heads": 8, "dim": 128}),
    ("qk-norms", {"batch": 1, "seq": 128, "heads": 16, "kv_heads": 8, "dim": 128}),
    ("mask-layernorms", {"batch": 8, "seq": 512, "hidden": 768}),
    ("mask-layernorms", {"batch": 1, "seq": 128, "hidden": 768}),
]
_MEM_CPU = [
    ("mean-pool", {"batch": 3, "seq": 77, "hidden": 90}),
    ("column-mean", {"rows": 1823, "cols": 781}),
    ("rotary", {"batch": 2, "seq": 37, "heads": 3, "dim": 64}),
    ("qk-norms", {"batch": 2, "seq": 37, "heads": 4, "kv_heads": 1, "dim": 64}),
    ("mask-layernorms", {"batch": 3, "seq": 17, "hidden": 96}),
] + [
    (name, {"rows": 1823, "cols": 781})
    for name in (
        "layernorm",
        "layernorm-ops",
        "add-layernorm",
        "transpose-layernorm",
        "softmax",
        "softmax-ops",
        "bias-gelu",
        "rmsnorm",
    )
]

#: study -> target kind -> [(workload, shape parameters)]
CASES: dict[str, dict[str, list[tuple[str, dict]]]] = {
    "bert": {
        "cuda": [
            ("bert-base", {"batch": 1, "seq": 128}),
            ("bert-base", {"batch": 32, "seq": 128}),
            ("bert-base", {"batch": 8, "seq": 512}),
        ],
        "llvm": [("bert-tiny", {"batch": 1, "seq": 128})],
    },
    "memory": {"cuda": MEMORY_SHAPES_GPU, "llvm": _MEM_CPU},
    "gemm-chains": {
        "cuda": [(name, {}) for name in GEMM_CHAINS],
        "llvm": [("G1", {}), ("G7", {"m": 129, "n": 97})],
    },
    "zoo": {
        "cuda": [
            ("hf-bert-base", {"batch": 1, "seq": 128}),
            ("bert-base", {"batch": 1, "seq": 128}),
            ("hf-bert-base", {"batch": 8, "seq": 512}),
            ("bert-base", {"batch": 8, "seq": 512}),
            ("gpt2-base", {"batch": 1, "seq": 256}),
            ("gpt2-base", {"batch": 8, "seq": 256}),
            ("llama-base", {"batch": 1, "seq": 256}),
            ("vit-base", {"batch": 1}),
            *(
                ("torch-attention", {"batch": 4, "heads": 16, "seq": 512, "dim": d, "causal": c})
                for d in (64, 128)
                for c in (0, 1)
            ),
        ],
        "llvm": [
            ("hf-bert-tiny", {"batch": 2, "seq": 19}),
            ("gpt2-tiny", {"seq": 33}),
            ("llama-tiny", {"seq": 33}),
            ("vit-tiny", {}),
        ],
    },
    "attention": {
        "cuda": [(f"S{i}", {}) for i in range(1, 10)],
        "llvm": [("S7", {}), ("S6", {"heads": 2, "m": 77, "n": 131})],
    },
}
STUDIES = tuple(CASES)
#: Studies whose TVM calls are also timed as CUDA-graph replays (the kernels of a pattern, as
#: PyTorch is timed); BERT's VM already runs through Relax's CUDA graph.
GRAPH_TIMED = ("memory", "gemm-chains", "attention")

#: study -> label of PyTorch's eager implementation in the tables
_EAGER_LABEL = {
    "memory": "torch-op",
    "gemm-chains": "torch-bmm-bmm",
    "attention": "torch-naive",
    "bert": "torch-eager",
    "zoo": "torch-eager",
}


def run_study(
    study: str,
    target="llvm",
    *,
    workloads: list[str] | None = None,
    params: dict | None = None,
    dtype: str | None = None,
    torch_baselines: bool = True,
    json_out: str | None = None,
    echo: Callable[[str], None] = print,
    variants: list[dict] | None = None,
    graph: bool = False,
) -> list[Record]:
    """Run one study and print its table.

    Parameters
    ----------
    study : str
        One of :data:`STUDIES`.
    target : str or tvm.target.Target
        ``llvm`` or ``cuda``.
    workloads : list of str, optional
        Only these workloads of the study.
    params : dict, optional
        Shape parameters overriding every case (e.g. ``{"batch": 8, "seq": 512}``).
    dtype : str, optional
        ``float16`` or ``float32``; default float16 on CUDA, float32 on the CPU.
    torch_baselines : bool
        Measure the PyTorch baselines (needs ``torch``).
    json_out : str, optional
        Append one JSON line per record to this file.
    echo : callable
        Where progress and the table go.
    variants : list of dict, optional
        Stitch pipelines with other options measured in the same run (e.g.
        ``[{"fold_norms": False}]``), each as ``tvm-stitch[key=value]``.
    graph : bool
        Also time every TVM build of a study not in :data:`GRAPH_TIMED` as CUDA-graph replays
        (``graph_us``), the way PyTorch is timed: a like-for-like figure for models, whose
        ``time_evaluator`` loop and PyTorch's replay loop may run at different clocks.

    Returns
    -------
    list of Record
    """
    if study not in CASES:
        raise KeyError(f"unknown study {study!r}; known: {', '.join(STUDIES)}")
    target = as_target(target)
    kind = target.kind.name
    dtype = dtype or ("float16" if kind == "cuda" else "float32")
    cases = [c for c in CASES[study][kind] if not workloads or c[0] in workloads]
    if workloads and not cases:
        cases = [(w, {}) for w in workloads]  # any workload may be benchmarked in any study
    if params:  # overriding the shape may make cases identical: keep one of each
        merged = [(name, {**case, **params}) for name, case in cases]
        cases = [c for i, c in enumerate(merged) if c not in merged[:i]]
    device = "cuda" if kind == "cuda" else "cpu"
    limits = measure_limits(device) if kind == "cuda" else DeviceLimits()
    if limits.copy_gbps:
        echo(
            f"device {limits.name}: copy {limits.copy_gbps:.0f} GB/s (read+write), "
            f"fp16 GEMM {limits.peak_tflops:.0f} TFLOP/s, measured now"
        )
    records: list[Record] = []
    for name, case_params in cases:
        inst = get_workload(name).instance(dtype, **case_params)
        echo(f"[{study}] {inst.name}")
        new = bench_instance(study, inst, target, limits, torch_baselines=torch_baselines,
                             variants=variants, graph=graph)
        records.extend(new)
        if json_out:
            with open(json_out, "a", encoding="utf-8") as f:
                for rec in new:
                    f.write(rec.to_json() + "\n")
        if len(cases) > 1:  # each workload's rows as soon as they are measured
            echo(format_table(new))
    echo(format_table(records))
    return records


#: rounds in which a workload's implementations are timed in turns, after all are built
#: (:func:`~tvm_stitch.benchmarks.harness.in_turns`): each round a fifth of the budget
TURNS = 5


def bench_instance(study, inst, target, limits: DeviceLimits, torch_baselines: bool = True,
                   variants=None, graph: bool = False):
    """Measure every implementation of one workload instance; see :func:`run_study`.

    Every implementation is built and checked first, then all are timed in turns
    (:data:`TURNS` rounds), so they are compared at the same clocks. TVM's default pipeline
    on CUDA runs in a child process (its kernels may fault) and is timed there, alone."""
    kind = target.kind.name
    device = "cuda" if kind == "cuda" else "cpu"
    refs = inst.reference()
    base = {
        "study": study,
        "workload": inst.name,
        "target": kind,
        "device": limits.name,
        "dtype": inst.dtype,
    }
    records, timers = [], []  # (record, the attributes its timing sets, timer(budget_ms) -> µs)
    runs = [("default", {}), ("stitch", {})] + [("stitch", dict(v)) for v in variants or ()]
    for pipeline, options in runs:
        label = ",".join(f"{k}={v}" for k, v in options.items())
        rec = Record(impl=f"tvm-{pipeline}" + (f"[{label}]" if label else ""), **base)
        records.append(rec)
        try:
            report = fusion_report(inst.mod, target, pipeline, **options)
            rec.kernels, rec.est_bytes = report.kernels, report.bytes
            if kind == "cuda" and pipeline == "default":
                # TVM's own kernels may fault on imported models: run them in a child process
                rec.time_us, outs, rec.compile_s = run_isolated(inst, target, pipeline)
                rec.max_err, rec.correct = compare(outs, refs, inst.tolerance)
                continue
            vm, rec.compile_s, rec.note = compile_tvm(inst, target, pipeline, options=options)
            dev = tvm_device(target)
            args, outs = run_tvm(vm, inst, dev)
            rec.max_err, rec.correct = compare(outs, refs, inst.tolerance)
            graph_timer = None
            if kind == "cuda" and not all(np.isfinite(o).all() for o in outs):
                # Relax's CUDA-graph rewrite gave non-finite results (seen on GPT-2, with or
                # without tvm-stitch's kernels): measure the build without it, and say so
                vm, rec.compile_s, _ = compile_tvm(inst, target, pipeline, use_cuda_graph=False,
                                                   options=options)
                args, outs = run_tvm(vm, inst, dev)
                rec.max_err, rec.correct = compare(outs, refs, inst.tolerance)
                rec.note = "Relax CUDA graph gave NaN: built without it"
                graph_timer = _graph_timer(inst, rec, target, pipeline, options)
            # a module of one or two kernels is timed as CUDA-graph replays too (as PyTorch
            # is): the VM's per-call cost would otherwise be most of its figure
            elif kind == "cuda" and (graph or study in GRAPH_TIMED or (rec.kernels or 99) <= 2):
                graph_timer = _graph_timer(inst, rec, target, pipeline, options)
            timers.append((rec, ("time_us",),
                           lambda budget, vm=vm, args=args, dev=dev:
                           time_tvm(vm, inst.func, args, dev, budget)))
            if graph_timer is not None:
                timers.append((rec, ("graph_us",), graph_timer))
        except Exception as err:  # noqa: BLE001 - recorded in its row (_failed)
            _failed(inst, rec, err)
    if torch_baselines:
        records.extend(_torch_records(study, inst, device, base, refs, timers))
    times = in_turns([t for _, _, t in timers], TURNS)
    for (rec, attrs, _), value in zip(timers, times):
        if isinstance(value, Exception):  # the row's other figure, if any, stands
            _failed(inst, rec, value)
            continue
        for attr in attrs:
            setattr(rec, attr, value)
    return [fill_rates(rec, inst, limits) for rec in records]


def _failed(inst, rec, err) -> None:
    logger.warning("%s %s failed: %s", inst.name, rec.impl, error_line(err))
    logger.debug("%s %s failed", inst.name, rec.impl, exc_info=err)
    rec.note = f"failed: {type(err).__name__}: {error_line(err)}"[:200]


def _graph_timer(inst, rec, target, pipeline, options=None):
    """A timer of the TVM call as CUDA-graph replays; None (with a note) when it cannot be
    captured.

    A VM that runs its kernels through Relax's own CUDA graph cannot be captured inside another
    graph (and a failed capture leaves PyTorch's CUDA state unusable), so this figure comes
    from the same pipeline built without it."""
    try:
        plain, _, _ = compile_tvm(inst, target, pipeline, use_cuda_graph=False, options=options)
        args, _ = run_tvm(plain, inst, tvm_device(target))
        return tvm_graph_timer(plain, inst.func, args)
    except Exception as err:  # noqa: BLE001 - the VM figure stands alone then
        logger.warning("%s %s: no CUDA-graph timing: %s", inst.name, rec.impl, err)
        rec.note = "; ".join(filter(None, [rec.note, f"no graph timing ({type(err).__name__})"]))
        return None


def _torch_records(study, inst, device, base, refs, timers):
    """The PyTorch baselines' records, checked; their timers appended to ``timers``."""
    try:
        import torch
    except ImportError:
        return [Record(impl="torch", note="torch not installed", **base)]
    tdtype = getattr(torch, inst.dtype)
    impls = [(_EAGER_LABEL.get(study, "torch-eager"), inst.torch_fns["eager"], False)]
    if "sdpa" in inst.torch_fns:
        impls.append(("torch-sdpa", inst.torch_fns["sdpa"], False))
    if device == "cuda":
        impls.append(("torch-compile", inst.torch_fns.get("sdpa", inst.torch_fns["eager"]), True))
        # further baselines a workload names (FlexAttention with its block mask): compiled
        # by the workload itself
        impls += [(f"torch-{name}", fn, False) for name, fn in inst.torch_fns.items()
                  if name not in ("eager", "sdpa")]
    records = []
    for label, make, compiled in impls:
        rec = Record(impl=label, **base)
        records.append(rec)
        try:
            fn = make(device, tdtype)
            if compiled:
                start = time.perf_counter()
                fn = torch.compile(fn)
                torch_outputs(fn, inst.torch_args(device, tdtype))
                rec.compile_s = time.perf_counter() - start
            args = inst.torch_args(device, tdtype)
            rec.max_err, rec.correct = compare(torch_outputs(fn, args), refs, inst.tolerance)
            # on the GPU PyTorch is timed as CUDA-graph replays: its figure is both
            attrs = ("time_us", "graph_us") if device == "cuda" else ("time_us",)
            try:
                timer = torch_timer(fn, args, device)
            except RuntimeError as err:  # e.g. HF's eager GPT-2 copies host tensors
                if device != "cuda" or "graph" not in str(err).lower():
                    raise
                torch.cuda.synchronize()
                timer, attrs = torch_timer(fn, args, device, graph=False), ("time_us",)
                rec.note = "cannot be captured in a CUDA graph: timed call by call"
            timers.append((rec, attrs, timer))
        except Exception as err:  # noqa: BLE001 - recorded in its row (_failed)
            _failed(inst, rec, err)
    return records
