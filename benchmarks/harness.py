"""Measurement primitives shared by the studies.

* TVM modules are timed with the VM's ``time_evaluator`` (median of repeats, run in C++), built
  with ``relax.backend.use_cuda_graph`` on CUDA.  That time includes the VM's own cost per call
  (1–4 µs: argument checks, the output's allocation, the launch), which exceeds the kernel of a
  small pattern.
* PyTorch functions are captured in a CUDA graph and timed by replaying it between CUDA events
  (median of repeats); on the CPU they are timed with ``perf_counter``.
* For a like-for-like figure a TVM call is also captured in a CUDA graph (its launches go to
  PyTorch's capturing stream through ``tvm_ffi.use_torch_stream``) and timed like PyTorch's
  (``graph_us``); rates (GB/s, TFLOP/s) come from that figure when there is one.
* Every compiled module's output is compared with the float32 CPU reference before it is timed; a
  wrong result is recorded (``correct: false``) and its time is not reported as a win.
* The studies time a workload's implementations in turns once all are built (:func:`in_turns`),
  so all are timed at the same clocks.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import statistics
import threading
import time

import numpy as np
import tvm
from tvm import relax

import tvm_stitch

# compare and time_tvm are the harness's too (tvm-stitch check uses them with TVM's runtime only)
from tvm_stitch.library import compare, prepare_args, time_tvm  # noqa: F401
from tvm_stitch.pipeline import as_target, num_input
from tvm_stitch.tune.measure import time_torch, torch_timer  # noqa: F401

logger = logging.getLogger("tvm_stitch.bench")


@dataclasses.dataclass
class Record:
    """One implementation of one workload, measured.  Serialised as one JSON line."""

    study: str
    workload: str
    impl: str
    target: str
    device: str
    dtype: str
    time_us: float | None = None
    graph_us: float | None = None
    gbps: float | None = None
    pct_copy: float | None = None
    tflops: float | None = None
    pct_peak: float | None = None
    kernels: int | None = None
    est_bytes: int | None = None
    compile_s: float | None = None
    max_err: float | None = None
    correct: bool | None = None
    note: str = ""

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in dataclasses.asdict(self).items() if v is not None})


@dataclasses.dataclass
class DeviceLimits:
    """Limits measured in the same run: copy bandwidth (bytes read + written) and fp16 GEMM peak."""

    copy_gbps: float | None = None
    peak_tflops: float | None = None
    l2_bytes: int | None = None
    name: str = "cpu"


# -- TVM -------------------------------------------------------------------------------------------
def tvm_device(target: tvm.target.Target):
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)


def _pipeline(target, kind: str, options=None):
    """The stitch pipeline (with ``options``) or TVM's default one for ``target``."""
    if kind == "stitch":
        return tvm_stitch.pipeline(target, **(options or {}))
    return tvm_stitch.default_pipeline(target)


def compile_tvm(inst, target, pipeline_kind: str, use_cuda_graph: bool = True, options=None):
    """Compile ``inst.mod`` with the stitch (``options``: its options) or the default pipeline.

    Returns
    -------
    (relax.VirtualMachine, float, str)
        The VM, compile seconds, and a note (e.g. why CUDA graphs were turned off).
    """
    target = as_target(target)
    pipe = _pipeline(target, pipeline_kind, options)
    graphs = use_cuda_graph and target.kind.name == "cuda"
    note = ""
    start = time.perf_counter()
    try:
        with tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": graphs}):
            ex = tvm.compile(inst.mod, target, relax_pipeline=pipe)
    except Exception as err:
        if not graphs:
            raise
        note = f"no CUDA graph ({type(err).__name__})"
        logger.warning("%s: CUDA graph build failed (%s); building without", inst.name, err)
        ex = tvm.compile(inst.mod, target, relax_pipeline=pipe)
    seconds = time.perf_counter() - start
    return relax.VirtualMachine(ex, tvm_device(target)), seconds, note


_CHILD = """
import json, sys, numpy as np, tvm
from tvm import relax
from tvm_stitch.benchmarks.harness import time_tvm
from tvm_stitch.library import prepare_args
folder, func, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
inputs = None if sys.argv[4] == "-" else int(sys.argv[4])
dev = tvm.cuda(0)
vm = relax.VirtualMachine(tvm.runtime.load_module(folder + "/mod.so"), dev)
args = [tvm.runtime.tensor(np.load(f"{folder}/arg{i}.npy"), device=dev) for i in range(count)]
args = prepare_args(vm, func, args, inputs)
out = vm[func](*args)
outs = list(out) if type(out).__name__ in ("Array", "list", "tuple") else [out]
for i, o in enumerate(outs):
    np.save(f"{folder}/out{i}.npy", o.numpy())
json.dump({"time_us": time_tvm(vm, func, args, dev), "outs": len(outs)},
          open(folder + "/result.json", "w"))
"""


def run_isolated(inst, target, pipeline_kind: str) -> tuple[float, list[np.ndarray], float]:
    """Compile here, run and time in a child process: ``(time_us, outputs, compile_s)``.

    A kernel that faults on the GPU ends its process (TVM's default pipeline does on GPT-2 and
    LLaMA, in its scan over booleans); in a child, the benchmark survives and records why.
    """
    import json
    import subprocess
    import sys
    import tempfile

    target = as_target(target)
    pipe = _pipeline(target, pipeline_kind)
    start = time.perf_counter()
    ex = tvm.compile(inst.mod, target, relax_pipeline=pipe)
    seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        ex.export_library(f"{folder}/mod.so")
        for i, a in enumerate(inst.args):
            np.save(f"{folder}/arg{i}.npy", a)
        res = subprocess.run(
            [sys.executable, "-c", _CHILD, folder, inst.func, str(len(inst.args)),
             str(num_input(inst.mod, inst.func) or "-")],
            capture_output=True, text=True, check=False, timeout=600,
        )
        if res.returncode != 0:
            lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
            raise RuntimeError(f"crashed on the GPU: {lines[-1] if lines else res.returncode}")
        result = json.loads(open(f"{folder}/result.json").read())
        outs = [np.load(f"{folder}/out{i}.npy") for i in range(result["outs"])]
    return result["time_us"], outs, seconds


def run_tvm(vm, inst, dev) -> tuple[list, list[np.ndarray]]:
    """Run once; return the device arguments (reused for timing; weights transformed where
    the module lifted their transform) and the outputs as numpy."""
    args = device_args(vm, inst, dev)
    out = vm[inst.func](*args)
    outs = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
    return args, [o.numpy() for o in outs]


def device_args(vm, inst, dev) -> list:
    """``inst.args`` on ``dev``, as ``vm[inst.func]`` takes them (see
    :func:`tvm_stitch.library.prepare_args`)."""
    args = [tvm.runtime.tensor(a, device=dev) for a in inst.args]
    return prepare_args(vm, inst.func, args, num_input(inst.mod, inst.func))


def tvm_graph_timer(vm, func: str, args):
    """``timer(budget_ms) -> median µs`` per replay of ``vm[func](*args)`` captured in a CUDA
    graph (the way :func:`time_torch` times PyTorch), so the VM's per-call cost is left out.
    The capture is done once, here; each call of the timer times replays (the VM, ``args`` and
    the captured output held by the timer).

    Raises whatever the capture raises (e.g. a function that synchronises); callers record it.
    """
    import torch
    import tvm_ffi

    from tvm_stitch.tune.measure import time_replay

    fn = vm[func]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with tvm_ffi.use_torch_stream(torch.cuda.stream(stream)):
        for _ in range(3):  # the VM's allocator pool holds the output's storage from now on
            fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with tvm_ffi.use_torch_stream(torch.cuda.graph(graph)):
        out = fn(*args)

    def timer(budget_ms: float) -> float:
        return time_replay(graph.replay, budget_ms)

    # held with the timer: the replays read the arguments and the VM's storage and write the
    # output's (freed, they would be given to other tensors)
    timer.held = (vm, args, out)
    return timer


class PowerMeter:
    """The GPU's energy counter, SM clock and power-cap state, read through NVML (``libnvidia-ml``,
    which the driver installs), so a timing can say at what power and clock it ran: under a
    sustained load the H200 holds its power cap by lowering its clock
    (``h200-bench-in-turns-2026-11-30.md``). The energy counter moves in steps: over turns
    of 6–40 ms it read 0 W for one implementation and 2014 W for another, so read it over
    windows of a second or more.

    :meth:`open` gives None where NVML or its energy counter is missing (the CPU machine)."""

    #: ``nvmlClockType_t`` of the SM clock
    _SM_CLOCK = 1
    #: ``nvmlClocksEventReasonSwPowerCap``
    _SW_POWER_CAP = 0x4

    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle

    @classmethod
    def open(cls, index: int | None = None) -> PowerMeter | None:
        """The meter of CUDA device 0 (NVML's ``index``: by default the first of
        ``CUDA_VISIBLE_DEVICES``, or 0); None when it cannot be read."""
        import ctypes
        import os

        if index is None:
            first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
            index = int(first) if first.isdigit() else 0
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            return None
        handle = ctypes.c_void_p()
        if lib.nvmlInit_v2() != 0 or lib.nvmlDeviceGetHandleByIndex_v2(
                ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
        meter = cls(lib, handle)
        return meter if meter.energy_mj() is not None else None

    def energy_mj(self) -> int | None:
        """The device's energy counter, mJ since the driver loaded."""
        import ctypes

        return self._read(self._lib.nvmlDeviceGetTotalEnergyConsumption, ctypes.c_ulonglong)

    def sm_mhz(self) -> int | None:
        """The SM clock now, MHz."""
        import ctypes

        return self._read(self._lib.nvmlDeviceGetClockInfo, ctypes.c_uint, self._SM_CLOCK)

    def power_capped(self) -> bool | None:
        """Whether the clock is held down now to keep the power under its limit (the
        software power cap among NVML's clock event reasons)."""
        import ctypes

        read = getattr(self._lib, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            self._lib.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = self._read(read, ctypes.c_ulonglong)
        return None if reasons is None else bool(reasons & self._SW_POWER_CAP)

    def _read(self, fn, ctype, *args) -> int | None:
        """``fn(device, *args, &value)``'s value (of ``ctype``), or None where NVML fails."""
        import ctypes

        value = ctype()
        return value.value if fn(self._handle, *args, ctypes.byref(value)) == 0 else None


#: seconds of a sustained run's end that its settled figures come from
WINDOW_S = 1.0
#: ms per timed chunk
CHUNK_MS = 50.0


class Sampler(threading.Thread):
    """NVML read every ``period`` seconds, in the background: ``(time, SM MHz, power capped,
    energy mJ)`` samples."""

    def __init__(self, meter, period: float = 0.005):
        super().__init__(daemon=True)
        self.meter, self.period = meter, period
        self.samples: list[tuple] = []
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            m = self.meter
            self.samples.append((time.perf_counter(), m.sm_mhz(), m.power_capped(),
                                 m.energy_mj()))
            time.sleep(self.period)

    def stop(self):
        self._done.set()
        self.join()

    def window(self, start: float, end: float) -> dict:
        """Median clock, power-capped share, and power from the energy counter, between
        ``start`` and ``end``."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2:
            return {}
        clocks = [s[1] for s in inside if s[1] is not None]
        capped = [s[2] for s in inside if s[2] is not None]
        energy = [(s[0], s[3]) for s in inside if s[3] is not None]
        out = {"mhz": statistics.median(clocks) if clocks else None,
               "capped": sum(capped) / len(capped) if capped else None}
        if len(energy) >= 2 and energy[-1][0] > energy[0][0]:
            out["watts"] = (energy[-1][1] - energy[0][1]) / 1e3 / (energy[-1][0] - energy[0][0])
        return out

    def counter_step(self) -> float | None:
        """The median time between changes of the energy counter (its update period)."""
        changes = [a[0] for a, b in itertools.pairwise(self.samples)
                   if a[3] is not None and b[3] is not None and b[3] != a[3]]
        gaps = [b - a for a, b in itertools.pairwise(changes)]
        return statistics.median(gaps) if gaps else None


def sustained(timer, seconds: float, sampler: Sampler) -> dict:
    """``timer(budget_ms) -> µs`` called in chunks for ``seconds``; the figures of the last
    :data:`WINDOW_S`."""
    chunks = []  # (end time, µs)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        us = timer(CHUNK_MS)
        chunks.append((time.perf_counter(), us))
    end = chunks[-1][0]
    settled = statistics.median(us for t, us in chunks if t >= end - WINDOW_S)
    out = {"first_us": chunks[0][1], "us": settled, **sampler.window(end - WINDOW_S, end)}
    if out.get("watts"):
        out["mj"] = out["watts"] * settled / 1e3
    return out


def in_turns(timers, rounds: int, budget_ms: float = 200.0) -> list[float | Exception]:
    """Each of ``timers`` (``timer(budget_ms) -> µs``) called ``rounds`` times in turns, a
    ``rounds``-th of ``budget_ms`` each, and the median of its calls, so every implementation
    of a workload is timed at the same clocks (under a sustained load the GPU's clock drifts
    down by up to 15% within seconds: ``h200-clock-drift-wide-tiles-2026-11-30.md``). A timer
    that raises is dropped from later rounds; its entry is the exception."""
    samples: list = [[] for _ in timers]
    for _ in range(rounds):
        for i, timer in enumerate(timers):
            if isinstance(samples[i], Exception):
                continue
            try:
                samples[i].append(timer(budget_ms / rounds))
            except Exception as err:  # noqa: BLE001 - recorded by the caller
                samples[i] = err
    return [s if isinstance(s, Exception) else statistics.median(s) for s in samples]


# -- PyTorch ---------------------------------------------------------------------------------------
def torch_outputs(fn, args) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else [out]
    return [o.float().cpu().numpy() for o in outs]


def _triton_copy(src, dst, block: int = 4096):
    """``dst[:] = src`` with a Triton kernel: 16-byte accesses, many loads in flight."""
    import triton
    import triton.language as tl

    global _COPY_KERNEL  # noqa: PLW0603 - compiled once per process
    if _COPY_KERNEL is None:

        @triton.jit
        def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):  # noqa: N803
            offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)

        _COPY_KERNEL = copy_kernel
    n = src.numel()
    _COPY_KERNEL[(triton.cdiv(n, block),)](src, dst, n, BLOCK=block, num_warps=8)


_COPY_KERNEL = None


def measure_limits(device: str) -> DeviceLimits:
    """Copy bandwidth and fp16 GEMM peak of the GPU, measured now (nothing on the CPU)."""
    if device == "cpu":
        return DeviceLimits()
    import torch

    n = 256 * 1024 * 1024  # 512 MiB of fp16 each way, far beyond L2
    src = torch.empty(n, dtype=torch.float16, device="cuda")
    dst = torch.empty_like(src)
    # the achievable rate is the best of two ways to copy: PyTorch's and a plain Triton kernel
    copy_us = min(
        time_torch(lambda: dst.copy_(src), [], "cuda"),
        time_torch(lambda: _triton_copy(src, dst), [], "cuda"),
    )
    a = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.float16, device="cuda")
    mm_us = time_torch(lambda: a @ b, [], "cuda", budget_ms=300)
    return DeviceLimits(
        copy_gbps=2 * n * 2 / copy_us / 1e3,
        peak_tflops=2 * 8192**3 / mm_us / 1e6,
        l2_bytes=torch.cuda.get_device_properties(0).L2_cache_size,
        name=torch.cuda.get_device_name(),
    )


# -- comparison ------------------------------------------------------------------------------------
def fill_rates(rec: Record, inst, limits: DeviceLimits) -> Record:
    """GB/s (memory-bound workloads) or TFLOP/s (GEMM workloads) from ``rec.graph_us`` (the
    CUDA-graph figure) when there is one, else from ``rec.time_us``."""
    us = rec.graph_us or rec.time_us
    if us is None:
        return rec
    if inst.ideal_bytes and not inst.flops:
        rec.gbps = inst.ideal_bytes / us / 1e3
        if limits.copy_gbps:
            rec.pct_copy = 100 * rec.gbps / limits.copy_gbps
        if limits.l2_bytes and inst.ideal_bytes <= limits.l2_bytes:
            # repeated calls find their inputs in L2: GB/s can exceed the DRAM copy rate
            rec.note = "; ".join(filter(None, [rec.note, "fits in L2"]))
    if inst.flops:
        rec.tflops = inst.flops / us / 1e6
        if limits.peak_tflops:
            rec.pct_peak = 100 * rec.tflops / limits.peak_tflops
    return rec


def format_table(records: list[Record]) -> str:
    """Records as an aligned text table, grouped by workload."""
    cols = [
        ("workload", lambda r: r.workload, "<"),
        ("impl", lambda r: r.impl, "<"),
        ("time us", lambda r: _num(r.time_us, ".1f"), ">"),
        ("graph us", lambda r: _num(r.graph_us, ".1f"), ">"),
        ("GB/s", lambda r: _num(r.gbps, ".0f"), ">"),
        ("%copy", lambda r: _num(r.pct_copy, ".0f"), ">"),
        ("TFLOP/s", lambda r: _num(r.tflops, ".1f"), ">"),
        ("%peak", lambda r: _num(r.pct_peak, ".0f"), ">"),
        ("kernels", lambda r: _num(r.kernels, "d"), ">"),
        ("max err", lambda r: _num(r.max_err, ".1e"), ">"),
        ("ok", lambda r: "" if r.correct is None else ("yes" if r.correct else "NO"), "<"),
        ("note", lambda r: r.note, "<"),
    ]
    rows = [[f(r) for _, f, _ in cols] for r in records]
    widths = [
        max(len(c[0]), *(len(row[i]) for row in rows)) if rows else len(c[0])
        for i, c in enumerate(cols)
    ]
    lines = ["  ".join(f"{c[0]:{a}{w}}" for c, w, (_, _, a) in zip(cols, widths, cols))]
    for row in rows:
        lines.append("  ".join(f"{v:{a}{w}}" for v, w, (_, _, a) in zip(row, widths, cols)))
    return "\n".join(lines)


def _num(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def bound(inst):
    """``inst`` with its weights bound as constants: the entry takes its inputs only."""
    func = inst.mod[inst.func]
    n = int(func.attrs["num_input"])
    params = {p.name: a for p, a in zip(list(func.params)[n:], inst.args[n:])}
    mod = relax.transform.BindParams(inst.func, params)(inst.mod)
    return dataclasses.replace(inst, mod=mod, args=list(inst.args[:n]))


def generated_gemms(workload: str, dtype: str = "float16", joined: bool = True,
                    fold_norms: bool = False, **params) -> list:
    """``(match, source, shapes, graph)`` of each distinct GEMM kernel the stitch pipeline
    generates for ``workload`` (instance ``params``); ``joined``: banded GEMMs (Q, K, V) read
    their weights joined, as the pipeline's ``lift_params`` makes them; ``fold_norms``:
    normalizations read only by GEMMs folded into them (through the weights, with
    ``joined``), as the pipeline's ``fold_norms`` folds them; with ``joined`` a gate and an
    up over one interleaved weight."""
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.analysis.weights import join_weights, pair_weights, weight_tensors
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until
    from tvm_stitch.workloads import get_workload

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    inst = get_workload(workload).instance(dtype, **params)
    mod = run_until(inst.mod, target, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    weights = weight_tensors(graph, mod[inst.func]) if joined else None
    out, seen = [], set()
    found_all = recognize(graph, fold_norms=fold_norms, weights=weights if fold_norms else None)
    for found in (m for m in found_all.matches if m.family == "gemm"):
        match = found
        if joined and len(found.segments) > 1:  # scaled weights join as the pipeline's do
            scaled = {d.name for d in found.derived if d.kind == "scaled"}
            match, _ = join_weights(found, set(weights) | scaled)
        elif joined and len(found.segments[0].products) == 2:  # gate and up interleaved
            paired, _ = pair_weights(found, set(weights))
            match = paired or found
        source = kernel_source(match)
        if source.name not in seen:
            seen.add(source.name)
            shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
                      for t in [*source.inputs, *source.outputs] if t in graph.tensors}
            # joined or derived weights (the bands' side by side, scaled, column sums) and
            # row moments: tensors the graph does not hold
            for view in match.views.values():
                shapes.setdefault(view.tensor, (view.shape, view.dtype))
            out.append((match, source, shapes, graph))
    return out


def ptxas_report(ptx: str) -> str:
    """Registers, spills and any ``wgmma`` serialization ptxas reports for ``ptx`` (sm_90a;
    the ptxas Triton ships)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                              check=True, capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", info)
    spills = re.findall(r"(\d+) bytes spill stores", info)
    serial = re.findall(r"serialized due to (.*?) in the function", info)
    return (f"registers {','.join(regs)} spill stores {','.join(spills)}"
            + (f"; wgmma SERIALIZED: {serial[0]}" if serial else ""))
