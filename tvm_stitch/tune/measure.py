"""Measuring on the device: the timer every benchmark and the tuner use, and Algorithm 1 with
measurements (the analytical model ranks, the GPU times the top candidates).
"""

from __future__ import annotations

import math
import statistics
import time

from tvm_stitch.cost.mcfuser import estimate
from tvm_stitch.explore.tiling import build_search_space

from .evolution import SearchConfig, evolutionary_search


def time_torch(fn, args, device: str, budget_ms: float = 200.0) -> float:
    """Median microseconds per call; CUDA-graph replays on the GPU, wall time on the CPU."""
    import torch

    with torch.no_grad():
        if device == "cpu":
            fn(*args)
            start = time.perf_counter()
            fn(*args)
            probe = time.perf_counter() - start
            number = max(1, int(budget_ms / 10 / 1e3 / max(probe, 1e-7)))
            samples = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(number):
                    fn(*args)
                samples.append((time.perf_counter() - start) / number)
            return statistics.median(samples) * 1e6
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(*args)
        return _time_replay(graph.replay, budget_ms)


def _time_replay(replay, budget_ms: float) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay()
    torch.cuda.synchronize()
    start.record()
    replay()
    end.record()
    end.synchronize()
    probe_ms = max(start.elapsed_time(end), 1e-4)
    number = max(1, int(budget_ms / 10 / probe_ms))
    samples = []
    for _ in range(10):
        start.record()
        for _ in range(number):
            replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / number)
    return statistics.median(samples) * 1e3


def measured_search(spec, hw, make_fn, legal=None, config: SearchConfig | None = None):
    """Algorithm 1 over ``spec``'s pruned space, timing candidates on the GPU.

    Parameters
    ----------
    spec : ChainSpec
    hw : HardwareModel
    make_fn : callable
        ``make_fn(candidate) -> fn``: a no-argument function that runs the candidate's kernel.
    legal : callable, optional
        The code generator's legality check.
    config : SearchConfig, optional

    Returns
    -------
    (SearchSpace, SearchResult, float, list of str)
        The space, the result, the search's wall seconds and the candidates that failed.
    """
    space = build_search_space(spec, hw.smem_per_block, legal=legal)
    failures = []

    def measure(cand):
        try:
            return time_torch(make_fn(cand), [], "cuda", budget_ms=30) * 1e-6
        except Exception as err:  # noqa: BLE001 - a candidate that fails to compile is skipped
            failures.append(f"{cand}: {type(err).__name__}")
            return math.inf

    start = time.perf_counter()
    result = evolutionary_search(space, lambda c: estimate(spec, c, hw).time, measure, config)
    return space, result, time.perf_counter() - start, failures
