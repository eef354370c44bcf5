"""Measuring on the device: the timer every benchmark and the tuner use, and Algorithm 1 with
measurements (the cost model ranks, the GPU times the top candidates).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import statistics
import threading
import time

from tvm_stitch.cost.model import CostModel, Workload
from tvm_stitch.explore.tiling import build_search_space

from .evolution import SearchConfig, SearchResult, evolutionary_search


class Turns:
    """Measured searches running side by side take turns: a thread :meth:`hold`-s its turn
    while it runs Python or touches the device (timings, CUDA graphs, Triton's JIT, the cost
    model and the tuning database), and gives it up only while it waits for worker processes
    to compile its candidates (:meth:`waiting`), when another search runs. Timings are never
    taken while another search uses the device, and nothing a search shares is used by two
    threads at once. A thread that does not hold a turn (a compile's searches one after the
    other) waits for nothing."""

    def __init__(self):
        self._lock = threading.Lock()
        self._mine = threading.local()

    @contextlib.contextmanager
    def hold(self):
        """This thread's turn, for the ``with`` block."""
        with self._lock:
            self._mine.held = True
            try:
                yield
            finally:
                self._mine.held = False

    @contextlib.contextmanager
    def waiting(self):
        """The turn given up for the ``with`` block (where this thread holds it)."""
        if not getattr(self._mine, "held", False):
            yield
            return
        self._mine.held = False
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._mine.held = True


#: the turns of the searches of one process (:meth:`~tvm_stitch.tune.policy.KernelTuner.prefetch`)
TURNS = Turns()

_DEVICE = threading.local()


def timing_device():
    """The tuning server this thread's search times its candidates on
    (:class:`~tvm_stitch.tune.remote.RemoteDevice`, set by :func:`timing_on`), or None: this
    process's GPU."""
    return getattr(_DEVICE, "device", None)


@contextlib.contextmanager
def timing_on(device):
    """This thread's searches time their candidates on ``device`` (None: this process's GPU)
    for the ``with`` block."""
    previous = timing_device()
    _DEVICE.device = device
    try:
        yield
    finally:
        _DEVICE.device = previous


def time_candidate(fn) -> float:
    """Seconds a call of a search's candidate ``fn`` (no arguments) takes on this GPU: how a
    search times, here and on a tuning server (:mod:`~tvm_stitch.tune.remote`)."""
    return time_torch(fn, [], "cuda", budget_ms=30) * 1e-6


def time_torch(fn, args, device: str, budget_ms: float = 200.0, graph: bool = True) -> float:
    """Median microseconds per call; CUDA-graph replays on the GPU (``graph``; else one call at a
    time between CUDA events, for code that cannot be captured), wall time on the CPU."""
    return torch_timer(fn, args, device, graph)(budget_ms)


def torch_timer(fn, args, device: str, graph: bool = True):
    """``timer(budget_ms) -> median microseconds per call`` of ``fn(*args)``, timed as
    :func:`time_torch` times it; the warm-up calls and the CUDA graph's capture are done once,
    here, so the timer may be called again (timings taken in turns with others).

    The timer holds ``fn``, ``args`` and the captured output (``timer.held``): a replay reads
    and writes their memory, which PyTorch's allocator would give to other tensors once the
    caller drops them (a graph replayed over freed weights or indices reads garbage)."""
    import torch

    with torch.no_grad():
        if device == "cuda" and not graph:
            for _ in range(3):
                fn(*args)

            def call_timer(budget_ms):
                with torch.no_grad():
                    return time_replay(lambda: fn(*args), budget_ms)

            return call_timer
        if device == "cpu":
            fn(*args)

            def cpu_timer(budget_ms):
                with torch.no_grad():
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

            return cpu_timer
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            out = fn(*args)

        def timer(budget_ms: float) -> float:
            return time_replay(captured.replay, budget_ms)

        timer.held = (fn, args, out)
        return timer


def time_replay(replay, budget_ms: float) -> float:
    """Median microseconds per ``replay()`` (a CUDA graph's), timed between CUDA events."""
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


@dataclasses.dataclass
class Tuned:
    """What :func:`measured_search` found.

    Attributes
    ----------
    space : SearchSpace
        The pruned space (its ``counts`` per rule).
    result : SearchResult
        Algorithm 1's result over tile sizes (model/measurement pairs, correlation).
    launch : dict
        The launch options (``num_warps``, ``num_stages``) chosen for ``result.best``.
    time : float
        Measured seconds of the best candidate with ``launch``.
    seconds : float
        Wall time of the whole search, compilation included.
    failures : list of str
        Candidates that failed to compile or run (skipped).
    measurements : list of dict
        Every timing taken: ``{"tiles", "expr", "launch", "model_s", "time_s"}`` (failures
        with ``time_s`` infinite) — what the tuning database keeps for fitting the cost model.
    run : callable
        Runs the best candidate with ``launch`` (returns the kernel's output).
    phases : dict
        Seconds of the search's phases: ``compile`` (candidates' kernels compiled ahead, side
        by side) and ``time`` (timings on the device, a kernel compiled there when it was
        not ahead), and how many of each (``compiled``, ``timed``).
    inputs : tuple
        The tensors ``run`` reads (set by the tuning functions of ``tvm_stitch.tune.kernels``).
    config : dict
        Template parameters and launch options of the best candidate (set by the same).
    workload : dict
        What was tuned, for the cost model (``Workload.to_dict()`` and the kernel's text).
    """

    space: object
    result: SearchResult
    launch: dict
    time: float
    seconds: float
    failures: list
    measurements: list = dataclasses.field(default_factory=list)
    run: object = None
    phases: dict = dataclasses.field(default_factory=dict)
    inputs: tuple = ()
    config: dict = dataclasses.field(default_factory=dict)
    workload: dict = dataclasses.field(default_factory=dict)


def measured_search(
    spec,
    hw,
    make_fn,
    legal=None,
    config: SearchConfig | None = None,
    launches=(),
    default_launch=None,
    refine_top: int = 2,
    desc: str = "search",
    on_device: bool = True,
    seeds=(),
    workload: Workload | None = None,
    cost: CostModel | None = None,
) -> Tuned:
    """Algorithm 1 over ``spec``'s pruned space, timing candidates on the GPU.

    Tile sizes are searched with each candidate's default launch options; then the
    ``refine_top`` best measured candidates are timed again with every entry of ``launches``
    (warps and pipeline stages, which the analytical model does not see).  Last, the
    candidates within :data:`CONFIRM_WITHIN` of the best are timed again in turns and the
    lowest median wins (:func:`confirm`): one timing's noise does not pick.  A progress bar
    shows the steps (on a terminal or in a notebook).

    Parameters
    ----------
    spec : ChainSpec
    hw : HardwareModel
    make_fn : callable
        ``make_fn(candidate, launch) -> fn``: a no-argument function running the candidate's
        kernel with launch options ``launch`` (a dict).  Where it has ``prepare``,
        ``make_fn.prepare([(candidate, launch), ...])`` is called with the candidates about
        to be timed (each round's, the seeds, the launches refined) first: it compiles their
        kernels side by side, on the host's cores, and the timings find them compiled.  Where
        it has ``time``, ``make_fn.time(candidate, launch)`` gives the seconds instead of
        timing ``fn`` here (a tuning server's, :mod:`~tvm_stitch.tune.remote`).
    legal : callable, optional
        The code generator's legality check.
    config : SearchConfig, optional
    launches : sequence of dict, optional
        Launch options tried for the best candidates.
    default_launch : callable, optional
        ``default_launch(candidate) -> dict`` used during the tile search (default ``{}``).
    refine_top : int
    desc : str
        Label of the progress bar.
    on_device : bool
        False searches with the cost model only (no GPU): ``make_fn`` is not called; the model
        also picks the launch of its best candidates, and ``time`` is its prediction.
    seeds : sequence of dict
        Tile sizes (loop -> tile) measured besides the search's picks, one candidate each when
        the space has them: what is known to work on the device (FlashAttention's tiles), so a
        model that ranks poorly cannot hide them.  A seed's ``"launch"`` entry gives the launch
        options it is measured with (else the candidate's default).
    workload : Workload
        The kernel's family and shape, for the cost model (required).
    cost : CostModel, optional
        The model ranking candidates (default: the analytical model alone).
    """
    from tqdm.auto import tqdm

    cfg = config or SearchConfig()
    space = build_search_space(spec, hw.smem_per_block, legal=legal)
    failures = []
    measurements = []
    default_launch = default_launch or (lambda cand: {})
    if workload is None:
        raise ValueError("measured_search needs the kernel's Workload (its family and shape)")
    cost = cost or CostModel(hw)
    model_launches = list(launches)
    if not on_device:
        launches = ()
    bar = tqdm(total=cfg.max_rounds + refine_top * len(launches), desc=desc, disable=None)

    timed = []  # (seconds, candidate, launch) of every timing
    phases = {"compile": 0.0, "time": 0.0, "compiled": 0, "timed": 0}

    timer = getattr(make_fn, "time", None) if on_device else None

    def time_once(cand, launch):
        start = time.perf_counter()
        try:
            if timer is not None:  # timed elsewhere (a tuning server, :mod:`.remote`)
                return timer(cand, launch)
            return time_candidate(make_fn(cand, launch))
        finally:
            phases["time"] += time.perf_counter() - start
            phases["timed"] += 1

    def measure(cand, launch=None):
        launch = default_launch(cand) if launch is None else launch
        try:
            t = time_once(cand, launch)
        except Exception as err:  # noqa: BLE001 - a candidate that fails to compile is skipped
            failures.append(f"{cand} {launch}: {type(err).__name__}")
            t = math.inf
        timed.append((t, cand, dict(launch)))
        measurements.append({
            "tiles": cand.tile_dict,
            "expr": str(cand.expr),
            "launch": dict(launch),
            "model_s": model(cand, launch),
            "time_s": t,
        })
        return t

    ready = getattr(make_fn, "prepare", None) if on_device else None
    prepared = set()  # (candidate, launch) compiled ahead already
    seeded = _seeded(space, seeds) if on_device else []

    def prepare(pairs):
        pairs = [(cand, default_launch(cand) if launch is None else launch)
                 for cand, launch in pairs]
        fresh = {}
        for cand, launch in pairs:
            if (cand, launch_key(launch)) not in prepared:
                fresh.setdefault((cand, launch_key(launch)), (cand, launch))
        pairs = list(fresh.values())
        if ready is not None and pairs:
            start = time.perf_counter()
            ready(pairs)
            phases["compile"] += time.perf_counter() - start
            phases["compiled"] += len(pairs)
            prepared.update((cand, launch_key(launch)) for cand, launch in pairs)

    def round_prepare(cands):
        # the seeds are known from the start: compiled with the first round's candidates, one
        # batch of compiles fewer to wait for
        pairs = [(c, None) for c in cands]
        if not prepared:
            pairs += [(c, g) for c, g in seeded if g is not None or c not in cands]
        prepare(pairs)

    def progress(rounds, best):
        bar.update(1)
        bar.set_postfix(best_us=f"{best * 1e6:.1f}")

    def model(cand, launch=None):
        if launch is None and not on_device and model_launches:
            # nothing is measured: a candidate is priced at the best launch the model sees
            return min(cost.predict(workload, cand.tile_dict, la) for la in model_launches)
        launch = default_launch(cand) if launch is None else launch
        return cost.predict(workload, cand.tile_dict, launch)

    start = time.perf_counter()
    result = evolutionary_search(space, model, measure if on_device else None, cfg, progress,
                                 round_prepare)
    bar.update(cfg.max_rounds - result.rounds)
    best, launch, best_time = result.best, default_launch(result.best), result.best_time
    times = dict(result.times)
    if on_device:
        prepare([(c, g) for c, g in seeded if g is not None or c not in times])
        for cand, given in seeded:
            opt = default_launch(cand) if given is None else given
            if given is None and cand in times:
                t = times[cand]
            else:
                t = measure(cand, opt)
                times[cand] = min(times.get(cand, math.inf), t)
            if t < best_time:
                best, launch, best_time = cand, dict(opt), t
    ranked = sorted(times.items(), key=lambda item: item[1])[:refine_top]
    if not on_device and model_launches:  # the model also picks the launch
        best_time = math.inf
        for cand, _ in ranked:
            for opt in model_launches:
                t = model(cand, opt)
                if t < best_time:
                    best, launch, best_time = cand, dict(opt), t
    if not on_device:  # the seeds priced too, each with its own launch (forms the
        # launches list has not: the warp-specialized GEMM's consumer warpgroups)
        for cand, given in _seeded(space, seeds):
            opt = default_launch(cand) if given is None else given
            t = model(cand, opt)
            if t < best_time:
                best, launch, best_time = cand, dict(opt), t
    prepare([(cand, opt) for cand, _ in ranked for opt in launches])
    for cand, _ in ranked:
        for opt in launches:
            t = measure(cand, opt)
            bar.update(1)
            if t < best_time:
                best, launch, best_time = cand, dict(opt), t
    if on_device:
        best, launch, best_time = confirm(timed, time_once, (best, launch, best_time))
    bar.close()
    result = dataclasses.replace(result, best=best, best_time=best_time)
    seconds = time.perf_counter() - start
    run = make_fn(best, launch) if on_device else None
    return Tuned(space, result, launch, best_time, seconds, failures, measurements, run,
                 phases)


#: candidates measured within this fraction of the best are timed again before one is chosen:
#: under a sustained load the device's clock drifts by more than 5% within one search (on the
#: H200 a 650 µs GEMM timed first, then fourth in a row of five, took 648 and 749 µs;
#: ``h200-clock-drift-wide-tiles-2026-11-30.md``), so a candidate timed late lost to one timed
#: early by its place alone
CONFIRM_WITHIN = 0.15
#: ... at most this many, each this many times, in turns
CONFIRM_TOP, CONFIRM_ROUNDS = 4, 3


def confirm(timed, timer, best):
    """The ``(candidate, launch, seconds)`` to keep: the measured ``timed`` entries
    ``(seconds, candidate, launch)`` within :data:`CONFIRM_WITHIN` of ``best``'s seconds (at
    most :data:`CONFIRM_TOP`, distinct) timed :data:`CONFIRM_ROUNDS` times more by
    ``timer(candidate, launch)``, in turns (the device's clock drifts), the lowest median of
    those timings winning; ``best`` itself when no other is that close."""
    if not math.isfinite(best[2]):
        return best
    limit = best[2] * (1 + CONFIRM_WITHIN)
    contenders, seen = [], set()
    for t, cand, launch in sorted(timed, key=lambda x: x[0]):
        key = (cand, launch_key(launch))
        if t > limit or len(contenders) == CONFIRM_TOP:
            break
        if key not in seen:
            seen.add(key)
            contenders.append((cand, launch))
    if len(contenders) < 2:
        return best
    runs = {i: [] for i in range(len(contenders))}
    for _ in range(CONFIRM_ROUNDS):
        for i, (cand, launch) in enumerate(contenders):
            try:
                runs[i].append(timer(cand, launch))
            except Exception:  # noqa: BLE001 - timed once already: a failure now drops it
                runs[i].append(math.inf)
    i = min(runs, key=lambda k: statistics.median(runs[k]))
    return contenders[i][0], dict(contenders[i][1]), statistics.median(runs[i])


def launch_key(launch: dict) -> tuple:
    """A launch's options as a hashable key."""
    return tuple(sorted(launch.items()))


def _seeded(space, seeds) -> list:
    """``(candidate, launch)`` of ``space`` for each seed it holds: a seed is a tile-size dict,
    with its launch options under ``"launch"`` (else None: the candidate's default)."""
    wanted = [
        (tuple(sorted((x, t) for x, t in seed.items() if x != "launch")), seed.get("launch"))
        for seed in seeds
    ]
    found = {}
    for cand in space.candidates():
        tiles = cand.tile_dict
        for i, (key, _) in enumerate(wanted):
            if i not in found and all(tiles.get(x) == t for x, t in key):
                found[i] = cand
        if len(found) == len(wanted):
            break
    return [(found[i], wanted[i][1]) for i in sorted(found)]
