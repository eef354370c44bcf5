"""Tuning each Triton template: random inputs of the right shapes, the template's legality check
and launch options, then Algorithm 1 (:func:`~tvm_stitch.tune.measure.measured_search`).

Used by the Relax passes (through the tuning database) and by the kernel benchmark, so both run
the same search.  With ``on_device=True`` (the default) the functions need a CUDA GPU and
PyTorch; with ``on_device=False`` the analytical model alone picks the tiles.  Every result's
``config`` holds the template parameters and launch options of the best candidate.
"""

from __future__ import annotations

import dataclasses
import logging

from tvm_stitch.analysis.indexing import HALF
from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.cost.model import CostModel, Workload
from tvm_stitch.explore.tiling import Candidate, ChainSpec, build_search_space

from .evolution import SearchConfig
from .measure import TURNS, Tuned, launch_key, measured_search

logger = logging.getLogger("tvm_stitch.tune")

#: Algorithm 1's knobs for tuning inside a compile: a small population, few rounds
PASS_SEARCH = SearchConfig(population=64, top_n=8, eps=0.01, max_rounds=4)
#: ... and a short one (a runtime kernel's bucket points): one round of the model's best, the
#: seeds beside them, the best refined
QUICK_SEARCH = SearchConfig(population=64, top_n=8, eps=0.01, max_rounds=1)


def randn(shape, dtype, scale=1.0):
    import torch

    return torch.randn(shape, device="cuda", dtype=getattr(torch, str(dtype))) * scale


def element_bytes(dtype) -> int:
    """Bytes of an operand element: 2 for 16-bit floats, else 4."""
    return 2 if str(dtype) in HALF else 4


@dataclasses.dataclass(frozen=True)
class Space:
    """A family's tile search over one kernel (its ``tune.space(match)``).

    Attributes
    ----------
    spec : ChainSpec
        The chain of loops whose tiles are searched.
    legal : callable
        ``legal(candidate)``: why the kernel cannot run the candidate, or None.
    template : callable
        ``template(candidate)``: the kernel's template parameters (``BLOCK_*``, ...).
    accumulators : int
        Products sharing the A operand (the cost model's
        :attr:`~tvm_stitch.cost.model.Workload.accumulators`).
    """

    spec: ChainSpec
    legal: object
    template: object
    accumulators: int = 1


def pair_spec(match) -> ChainSpec:
    """The chain of a kernel of two products (attention, chains): (batch · heads) instances
    of ``(m, n, k, d)``."""
    ext = match.frame.extents
    return ChainSpec.gemm_chain(ext.get("b", 1) * ext.get("h", 1), ext["m"], ext["n"], ext["k"],
                                ext["d"], dtype_bytes=element_bytes(match.dtype))


def _tune(family: str):
    from tvm_stitch.families import part  # the registry: data only

    return part(family, "tune")


def search(
    spec, hw, make, legal, config, family, template, on_device, desc, launches=None, seeds=None,
    workload=None, cost=None, split=False, refine_top=2,
) -> Tuned:
    fam = _tune(family)
    default = lambda c: fam.default_launch(template(c))  # noqa: E731
    workload = workload or Workload(family, dict(spec.extents), spec.batch, spec.dtype_bytes)
    if split:
        cost = cost or CostModel(hw)
        default = split_k_launch(workload, cost, default)
    tuned = measured_search(
        spec,
        hw,
        make,
        legal,
        config,
        fam.LAUNCHES if launches is None else launches,
        default,
        desc=desc,
        on_device=on_device,
        seeds=fam.SEEDS if seeds is None else seeds,
        workload=workload,
        cost=cost,
        refine_top=refine_top,
    )
    tuned.config = {**template(tuned.result.best), **tuned.launch}
    if tuned.config.get("PERSISTENT") or tuned.config.get("WS"):
        tuned.config["NUM_SMS"] = hw.num_sms
    return tuned


def split_k_launch(workload: Workload, cost, base):
    """``base(candidate) -> launch`` with the split of k the cost model prefers among the
    family's ``SPLITS`` (splits of at least one ``BLOCK_K`` step each): a tile search over a
    split-K kernel prices every tiling at its best split."""

    def launch(cand):
        opt = base(cand)
        steps = -(-workload.extents["k"] // cand.tile_dict["k"])
        splits = [s for s in getattr(_tune(workload.family), "SPLITS", (1,)) if s <= steps]
        best = min(splits, key=lambda s: cost.predict(workload, cand.tile_dict,
                                                      {**opt, "SPLIT_K": s}))
        return {**opt, "SPLIT_K": best} if best > 1 else opt

    return launch


def tune_generated(
    match, source, shapes, constants=None, hw=None, config=PASS_SEARCH, on_device=True, cost=None,
    refine_top=2,
) -> Tuned:
    """Tiles and launch of a generated kernel (:mod:`tvm_stitch.codegen.triton_gen`), searched
    by timing that kernel itself: its epilogue, masks, causal block skipping and layouts are in
    every measurement, so the tiles chosen are the shipped kernel's best, not a template's.

    Parameters
    ----------
    match : Match
        The recognized kernel.
    source : KernelSource
        Its generated text.
    shapes : dict
        Graph tensor -> ``(shape, dtype)`` of the kernel's inputs and outputs.
    constants : dict, optional
        Graph tensor -> numpy array, for inputs that are constants (folded masks): measured
        with their values, random data for the rest.
    hw : HardwareModel
    config : SearchConfig
    on_device : bool
        False: the cost model alone picks (no GPU needed; nothing is launched).
    cost : CostModel, optional
        The model ranking candidates (default: the analytical model alone).
    refine_top : int
        Measured candidates timed again with every launch option (:func:`measured_search`).
    """
    family = match.family
    space = _tune(family).space(match)
    spec, template = space.spec, space.template
    launches, seeds = _tune(family).options(match, source, on_device)
    workload = Workload(
        family, dict(spec.extents), spec.batch, spec.dtype_bytes, space.accumulators,
        bool(source.persistent), sum(r.extent for r in match.statistics),
    )
    make = None  # the model alone decides: nothing is launched
    if on_device:
        make = _generated_runner(match, source, shapes, constants or {}, hw, template)
    tuned = search(
        spec, hw, make, space.legal, config, family, template, on_device, source.name,
        launches=launches, seeds=seeds, workload=workload, cost=cost, split=source.split_k,
        refine_top=refine_top,
    )
    tuned.workload = {**workload.to_dict(), "kernel": match.describe()}
    return tuned


#: the template parameter of each loop's tile
_TILE_PARAMS = {"m": "BLOCK_M", "n": "BLOCK_N", "k": "BLOCK_K", "h": "BLOCK_H"}
#: launch options a generated kernel's config may hold (see :func:`launch_legality`)
LAUNCH_KEYS = ("num_warps", "num_stages", "NUM_SMS", "PERSISTENT", "SPLIT_K", "TMA",
               "TMA_STORE", "WS", "EW", "PTR_STORE")


def record_legality(match, source, config, hw) -> str | None:
    """Why a tuning record's ``config`` cannot launch the generated kernel ``source`` of
    ``match``, or None: its tiles must be a candidate of the kernel's search space (tile sizes
    rule 3 leaves, shared memory, the template's legality), its template parameters those of
    that candidate and its launch options ones the kernel has (:func:`launch_legality`).

    Parameters
    ----------
    match : Match
    source : KernelSource
    config : dict
        Template parameters and launch options, as :func:`tune_generated` makes them.
    hw : HardwareModel
    """
    if not isinstance(config, dict) or not config:
        return f"config {config!r} holds no template parameters"
    kernel = _tune(match.family).space(match)
    spec, legal, template = kernel.spec, kernel.legal, kernel.template
    space = build_search_space(spec, hw.smem_per_block, legal, count=False)
    tiles = _record_tiles(config, space, getattr(_tune(match.family), "WHOLE_TILES", ""))
    if isinstance(tiles, str):
        return tiles
    odd = next((x for x in tiles if tiles[x] not in space.tiles[x]), None)
    if odd:
        return f"tiles {tiles}: a {odd} tile of {tiles[odd]}, not one of {space.tiles[odd]}"
    cand = space.find(tiles)
    if cand is None:
        first = Candidate(space.exprs[0], tuple(tiles.items()))
        return f"tiles {tiles}: {legal(first) or 'not a candidate of the search space'}"
    params = template(cand)
    wrong = {k: v for k, v in params.items() if config.get(k) != v}
    if wrong:
        return f"template parameters {wrong} expected for tiles {tiles}"
    return launch_legality(match, source, config, params)


def best_measured(match, source, measurements, hw) -> dict | None:
    """The config of the fastest of ``measurements`` (a tuning record's timings of the same
    computation at the same extents, in another formulation: a static kernel's) that the
    generated kernel ``source`` of ``match`` can launch (:func:`launch_legality`), or None.

    A runtime kernel (:mod:`tvm_stitch.codegen.runtime`) has no persistent, split-K or TMA
    form; the static kernel of its bucket point was timed with and without them, and its best
    timing without them is the runtime kernel's tiles, measured."""
    kernel = _tune(match.family).space(match)
    space = build_search_space(kernel.spec, hw.smem_per_block, kernel.legal, count=False)
    timed = [m for m in measurements or () if isinstance(m, dict)
             and isinstance(m.get("time_s"), (int, float)) and m["time_s"] < float("inf")]
    for m in sorted(timed, key=lambda m: m["time_s"]):
        tiles, launch = m.get("tiles"), m.get("launch")
        if not isinstance(tiles, dict) or not isinstance(launch, dict):
            continue
        cand = space.find(tiles)
        if cand is None:
            continue
        params = kernel.template(cand)
        config = {**params, **launch}
        if config.get("PERSISTENT") or config.get("WS"):
            config["NUM_SMS"] = hw.num_sms
        if launch_legality(match, source, config, params) is None:
            return config
    return None


def _record_tiles(config: dict, space, whole: str) -> dict | str:
    """The tile of each loop of ``space`` in ``config`` (loops in ``whole``, e.g. an
    attention's head dims, may be left out: the largest size), or why there is none."""
    tiles = {}
    for x, sizes in space.tiles.items():
        key = _TILE_PARAMS[x]
        value = config.get(key, max(sizes) if x in whole else None)
        if not _count(value):
            return f"{key} = {value!r} is not a tile size"
        tiles[x] = value
    return tiles


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def launch_legality(match, source, config: dict, params=()) -> str | None:
    """Why ``config``'s launch options cannot launch the generated kernel ``source``, or None:
    tile sizes, the template's parameters ``params`` and known options (:data:`LAUNCH_KEYS`),
    of integer values; warps a power of two, at least one pipeline stage, split and SMs counts,
    and only the formulations the kernel has (persistent, split-K, TMA loads or stores, the
    warp-specialized form at the tiles and partitions it takes)."""
    known = {*_TILE_PARAMS.values(), *LAUNCH_KEYS, *params}
    unknown = sorted(set(config) - known)
    if unknown:
        return f"unknown options {unknown}"
    odd = {k: v for k, v in config.items() if not isinstance(v, int)}
    if odd:
        return f"options {odd} are not integers"
    warps = config.get("num_warps", 4)
    if warps not in (1, 2, 4, 8, 16, 32) or config.get("num_stages", 3) < 1:
        return f"{warps} warps, {config.get('num_stages')} pipeline stages"
    bad = [k for k in ("SPLIT_K", "NUM_SMS") if not _count(config.get(k, 1))]
    if bad:
        return ", ".join(f"{k} {config[k]}" for k in bad)
    forms = {"PERSISTENT": source.persistent, "TMA": source.tma, "TMA_STORE": source.tma_store,
             "WS": source.ws, "SPLIT_K": source.split_k or config.get("SPLIT_K", 1) == 1}
    missing = [k for k, has in forms.items() if config.get(k) and not has]
    if missing:
        return f"{source.name} has no {', '.join(missing)} formulation"
    return _ws_legality(match, config) if config.get("WS") else None


def _ws_legality(match, config: dict) -> str | None:
    """Why the warp-specialized form cannot run ``config``, or None (the family's
    ``ws_launch_legality``; a family without one takes any)."""
    check = getattr(_tune(match.family), "ws_launch_legality", None)
    return check(match, config) if check else None


def generated_runner(match, source, shapes, constants=None, hw=None):
    """``run(config) -> fn``: ``fn()`` launches the generated kernel with ``config`` (template
    parameters and launch options) on device tensors of the right shapes (constants with their
    values, random floats and integer or boolean ones for the rest: ``run.inputs``, written to
    ``run.outputs``)."""
    import torch

    from tvm_stitch.codegen.embed import launch_options
    from tvm_stitch.codegen.kernel_text import (
        launch_buffers,
        launch_constexprs,
        torch_descriptors,
    )
    from tvm_stitch.codegen.triton_gen import load

    constants = constants or {}
    inputs = []
    for t in source.inputs:
        shape, dtype = shapes[t]
        if t in constants:
            inputs.append(torch.from_numpy(constants[t]).to("cuda"))
        elif "float" in dtype:
            inputs.append(randn(tuple(shape), dtype, 0.5))
        else:  # ones: a mask showing every key (1 or True keeps a key in PyTorch's and
            # Hugging Face's conventions), the case a kernel skipping masked blocks is timed in
            inputs.append(torch.ones(tuple(shape), dtype=getattr(torch, dtype), device="cuda"))
    outputs = [
        torch.empty(tuple(shapes[t][0]), dtype=getattr(torch, shapes[t][1]), device="cuda")
        for t in source.outputs
    ]
    tk._tma_allocator()

    def launch(config):
        fn = load(source, config)
        opts = launch_options(source, config)
        config = {"NUM_SMS": hw.num_sms, **config}
        consts = launch_constexprs(source, match, config, fn.arg_names)
        for name, (size, dtype) in launch_buffers(source, match, consts).items():
            consts[name] = torch.zeros(size, dtype=getattr(torch, dtype), device="cuda")
        grid = source.grid({**consts, "WS": config.get("WS")}, match)
        descs = torch_descriptors(source, config, consts, inputs, outputs)  # made here
        return fn, grid, {**descs, **consts, **opts}

    def run(config):
        fn, grid, kwargs = launch(config)
        return lambda: fn[grid](*inputs, *outputs, **kwargs)

    def prepare(configs):
        """Compile the kernel for each of ``configs`` side by side, so that the timings of
        ``run`` find them compiled: in worker processes into Triton's cache
        (:mod:`~tvm_stitch.codegen.precompile`), else in threads (Triton's ``warmup``; the
        device is not touched).  One that fails is left to its timing, which fails and says
        so."""
        import concurrent.futures

        from tvm_stitch.codegen import precompile
        from tvm_stitch.codegen.precompile import compile_workers

        def warm(config):
            fn, grid, kwargs = launch(config)
            fn.warmup(*inputs, *outputs, grid=grid, **kwargs)

        def specialized(config):
            try:
                fn, grid, kwargs = launch(config)
            except Exception as err:  # noqa: BLE001 - any: its timing fails and says so
                logger.debug("%s: not compiled ahead: %s", source.name, err)
                return None
            return fn, precompile.specialization(fn, [*inputs, *outputs], kwargs, grid)

        for config in configs:
            load(source, config)  # each form of the text imported here, once
        workers = compile_workers(len(configs))
        if workers > 1 and precompile.available():
            items = [x for x in map(specialized, configs) if x is not None]
            with TURNS.waiting():  # another search's turn while the workers compile
                done = precompile.compile_ahead(items)
            if done is not None:
                return
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(warm, c) for c in configs]:
                try:
                    future.result()
                except Exception as err:  # noqa: BLE001 - any: its timing fails and says so
                    logger.debug("%s: not compiled ahead: %s", source.name, err)

    run.inputs, run.outputs, run.prepare = inputs, outputs, prepare
    return run


def _generated_runner(match, source, shapes, constants, hw, template):
    """``make(candidate, launch)`` for the search (:func:`generated_runner`), with
    ``make.prepare(pairs)`` compiling the candidates' kernels ahead, side by side.

    Where this thread's search times on a tuning server (:func:`.measure.timing_device`),
    ``make.prepare`` has the server compile and time the batch, and ``make.time(candidate,
    launch)`` gives each timing once (a candidate timed again, a contender, is timed there
    again); nothing is built here unless the search's ``run`` is called."""
    from .measure import timing_device

    device = timing_device()
    local = []

    def runner():
        if not local:
            local.append(generated_runner(match, source, shapes, constants, hw))
        return local[0]

    def config_of(cand, launch):
        return {**template(cand), **launch}

    def make(cand, launch):
        config = config_of(cand, launch)
        if device is not None:  # built here when first run
            def lazy():
                return runner()(config)()

            return lazy
        return runner()(config)

    make.prepare = lambda pairs: runner().prepare([config_of(*pair) for pair in pairs])
    if device is None:
        return make
    timed = {}

    def batch(pairs):
        configs = [config_of(*pair) for pair in pairs]
        out = device.time(match, source, shapes, constants, hw, configs)
        return {(c, launch_key(la)): t for (c, la), t in zip(pairs, out)}

    def time(cand, launch):
        found = timed.pop((cand, launch_key(launch)), None)
        if found is None:
            found = batch([(cand, launch)])[(cand, launch_key(launch))]
        if isinstance(found, str):
            raise RuntimeError(f"on {device.name}: {found}")
        return found

    make.prepare = lambda pairs: timed.update(batch(pairs))
    make.time = time
    return make
