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
from tvm_stitch.cost.model import CostModel, Workload, infeasible
from tvm_stitch.explore.tiling import Candidate, ChainSpec, build_search_space

from .evolution import SearchConfig
from .measure import Tuned, measured_search

logger = logging.getLogger("tvm_stitch.tune")

#: Algorithm 1's knobs for tuning inside a compile: a small population, few rounds
PASS_SEARCH = SearchConfig(population=64, top_n=8, eps=0.01, max_rounds=4)


def _randn(shape, dtype, scale=1.0):
    import torch

    return torch.randn(shape, device="cuda", dtype=getattr(torch, str(dtype))) * scale


def _bytes(dtype) -> int:
    return 2 if str(dtype) in HALF else 4


def _gemm_seed(m, n, k, warps, stages, persistent, split=1):
    launch = {"num_warps": warps, "num_stages": stages, "PERSISTENT": persistent}
    if split > 1:
        launch["SPLIT_K"] = split
    return {"m": m, "n": n, "k": k, "launch": launch}


#: tiles measured besides the search's picks (known to suit Hopper's tensor cores): a warpgroup
#: takes 64 rows; FlashAttention runs 64-128 query rows against 32-128 keys.  GEMM seeds carry
#: their launch: the best of a sweep of formulations on the H100 for BERT's GEMMs at 4096 and
#: 128 tokens (``docs/results/h100-hopper-gemm-2026-11-23.md``)
SEEDS = {
    "gemm": [
        _gemm_seed(128, 256, 64, 8, 4, True),
        _gemm_seed(128, 256, 64, 8, 3, True),
        _gemm_seed(256, 128, 64, 8, 3, True),
        _gemm_seed(128, 128, 64, 4, 4, True),
        _gemm_seed(128, 128, 64, 8, 3, False),
        _gemm_seed(128, 128, 64, 4, 3, False),
        _gemm_seed(64, 128, 64, 4, 4, False),
        _gemm_seed(64, 64, 128, 4, 4, False),
        _gemm_seed(64, 64, 64, 4, 4, False),
        _gemm_seed(64, 32, 128, 4, 4, False),
        # split-K (tiles of few rows and a long k: BERT's FFN out at 128 tokens)
        _gemm_seed(64, 64, 128, 4, 4, False, split=4),
        _gemm_seed(64, 128, 128, 4, 4, False, split=2),
    ],
    "attention": [{"m": m, "n": n} for m in (64, 128) for n in (32, 64, 128)] + [
        # one warpgroup over 128 query rows, two stages: the H100's best at head dim 128
        # (22.1 us for 4x16x512, against 24.1 for 64x64; results of 2026-11-24)
        {"m": 128, "n": 64, "launch": {"num_warps": 4, "num_stages": 2}},
    ],
    "chain": [],
}


def ws_seeds() -> list[dict]:
    """Seeds of the warp-specialized attention (:mod:`tvm_stitch.families.attention.gluon`):
    128 query rows per program, its key tiles and ring slots."""
    from tvm_stitch.families.attention.gluon import WS_ROWS, WS_TILES

    return [{"m": WS_ROWS, "n": n, "launch": {"num_warps": 4, "num_stages": slots, "WS": True}}
            for n, slots in WS_TILES]


def gemm_ws_seeds(staging: bool = True) -> list[dict]:
    """Seeds of the warp-specialized GEMM (:mod:`tvm_stitch.families.gemm.gluon`): a consumer
    warpgroup's 64 rows, the column and k tiles, ``WS`` consumers, the ring's slots and the
    warps of an epilogue partition (``EW``, with ``PTR_STORE`` where it stores through
    pointers; left out without ``staging``, see
    :func:`~tvm_stitch.families.gemm.gluon.staging_legality`)."""
    from tvm_stitch.families.gemm.gluon_launch import applicable_tiles, ws_config

    seeds = []
    for tiles in applicable_tiles(staging):
        config = ws_config(*tiles)
        seeds.append({"m": config.pop("BLOCK_M"), "n": config.pop("BLOCK_N"),
                      "k": config.pop("BLOCK_K"), "launch": config})
    return seeds


def _search(
    spec, hw, make, legal, config, family, template, on_device, desc, launches=None, seeds=None,
    workload=None, cost=None, split=False,
) -> Tuned:
    default = lambda c: tk.default_launch(template(c), family)  # noqa: E731
    if split:
        cost = cost or CostModel(hw)
        default = split_k_launch(workload, cost, default)
    tuned = measured_search(
        spec,
        hw,
        make,
        legal,
        config,
        tk.LAUNCHES[family] if launches is None else launches,
        default,
        desc=desc,
        on_device=on_device,
        seeds=SEEDS[family] if seeds is None else seeds,
        workload=workload,
        cost=cost,
    )
    tuned.config = {**template(tuned.result.best), **tuned.launch}
    if tuned.config.get("PERSISTENT") or tuned.config.get("WS"):
        tuned.config["NUM_SMS"] = hw.num_sms
    return tuned


def _gemm_options(persistent: bool, split: bool = False,
                  tma_store: bool = False) -> tuple[list, list]:
    """Launch options and seeds of a GEMM search; without the persistent formulation, seeds
    run their tiles one program per tile; without split-K, the split ones are left out; with
    ``tma_store`` every persistent launch is also tried storing its tiles by TMA (measured
    only: the cost model prices both stores alike, so a model-only build stores by pointers)."""
    launches = [
        o for o in tk.LAUNCHES["gemm"]
        if (persistent or not o["PERSISTENT"]) and (split or o.get("SPLIT_K", 1) == 1)
    ]
    seeds = [
        seed if persistent else {**seed, "launch": {**seed["launch"], "PERSISTENT": False}}
        for seed in SEEDS["gemm"]
        if split or seed["launch"].get("SPLIT_K", 1) == 1
    ]
    if persistent and tma_store:
        launches += [{**o, "TMA_STORE": True} for o in launches if o["PERSISTENT"]]
        seeds += [{**s, "launch": {**s["launch"], "TMA_STORE": True}}
                  for s in seeds if s["launch"]["PERSISTENT"]]
    return launches, seeds


def split_k_launch(workload: Workload, cost, base):
    """``base(candidate) -> launch`` with the split of k the cost model prefers among
    :data:`~tvm_stitch.codegen.triton_kernels.SPLITS` (splits of at least one ``BLOCK_K``
    step each): a tile search over a split-K kernel prices every tiling at its best split."""

    def launch(cand):
        opt = base(cand)
        steps = -(-workload.extents["k"] // cand.tile_dict["k"])
        splits = [s for s in tk.SPLITS if s <= steps]
        best = min(splits, key=lambda s: cost.predict(workload, cand.tile_dict,
                                                      {**opt, "SPLIT_K": s}))
        return {**opt, "SPLIT_K": best} if best > 1 else opt

    return launch


def tune_gemm(
    m, n, k, dtype, hw, config=PASS_SEARCH, on_device=True, persistent=True
) -> Tuned:
    """Tiles and launch of ``x (m,k) @ w (n,k)^T + bias`` (the Linear template).

    Epilogues (GELU, residual) are not timed: they add the same work to every tiling.
    ``persistent``: the kernel has the persistent TMA formulation to choose (a GEMM whose
    operands TMA cannot read has not).
    """
    spec = ChainSpec.gemm(m, n, k, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (_randn((m, k), dtype), _randn((n, k), dtype, k**-0.5), _randn((n,), dtype))

    def make(cand, launch):
        conf = {**tk.gemm_config(cand), "NUM_SMS": hw.num_sms}
        return lambda: tk.run_gemm_epilogue(*inputs, config=conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        lambda c: tk.gemm_legality(spec, c),
        config,
        "gemm",
        tk.gemm_config,
        on_device,
        f"gemm {m}x{n}x{k}",
        *_gemm_options(persistent),
    )
    tuned.inputs = inputs
    return tuned


def tune_chain(batch, m, n, k, h, dtype, hw, config=PASS_SEARCH, on_device=True) -> Tuned:
    """Tiling of the GEMM chain ``(a @ b) @ d`` for ``a`` (batch, m, k)."""
    spec = ChainSpec.gemm_chain(batch, m, n, k, h, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            _randn((batch, m, k), dtype, k**-0.5),
            _randn((batch, k, n), dtype),
            _randn((batch, n, h), dtype, n**-0.5),
        )

    def make(cand, launch):
        conf = tk.chain_config(spec, cand)
        return lambda: tk.run_gemm_chain(*inputs, conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        lambda c: tk.chain_legality(spec, c),
        config,
        "chain",
        lambda c: tk.chain_config(spec, c),
        on_device,
        f"chain {batch}x{m}x{n}x{k}x{h}",
    )
    tuned.inputs = inputs
    return tuned


def tune_attention(
    batch, m, n, dk, dh, dtype, hw, config=PASS_SEARCH, mask=False, on_device=True
) -> Tuned:
    """Tiles of the attention template for ``batch`` (batch · heads) problems of (m, n, dk, dh).

    With ``mask`` an additive (batch, 1, n) mask broadcast over query rows is applied, as in BERT.
    """
    spec = ChainSpec.gemm_chain(batch, m, n, dk, dh, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            _randn((batch, m, dk), dtype),
            _randn((batch, n, dk), dtype),
            _randn((batch, n, dh), dtype),
        )
        if mask:
            inputs += (_randn((batch, 1, n), dtype),)

    def make(cand, launch):
        conf = tk.attention_config(cand)
        return lambda: tk.run_attention(*inputs, config=conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        lambda c: tk.attention_legality(spec, c),
        config,
        "attention",
        tk.attention_config,
        on_device,
        f"attention {batch}x{m}x{n}x{dk}x{dh}",
        workload=Workload("attention", dict(spec.extents), batch, spec.dtype_bytes),
    )
    tuned.inputs = inputs
    return tuned


def tune_generated(
    match, source, shapes, constants=None, hw=None, config=PASS_SEARCH, on_device=True, cost=None
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
    """
    family = match.family
    spec, legal, template, tfamily = generated_template(match)
    if family == "gemm":
        products = len(match.segments[0].products)
        launches, seeds = _gemm_options(source.persistent, source.split_k, source.tma_store)
        if source.ws and on_device:  # the warp-specialized Gluon form, measured at its tiles
            # (measured only, as TMA stores: the model prices it as the Triton form)
            from tvm_stitch.families.gemm.gluon import staging_legality

            why = staging_legality(match)
            if why:
                logger.info("%s: no epilogue partition: %s", match.describe(), why)
            seeds = [*seeds, *gemm_ws_seeds(staging=why is None)]
    else:
        launches, seeds = tk.LAUNCHES[tfamily], SEEDS[tfamily]
        if source.tma:  # each launch also with Q, K and V brought in by TMA
            launches = [{**o, "TMA": t} for t in (False, True) for o in launches]
        if source.ws:  # the warp-specialized Gluon form: measured at its tilings, or
            # priced by the model beside the Triton form's launches
            seeds = [*seeds, *ws_seeds()]
            if not on_device:
                launches = [*launches, *(s["launch"] for s in ws_seeds())]
    workload = Workload(
        family, dict(spec.extents), spec.batch, spec.dtype_bytes,
        products if family == "gemm" else 1, bool(source.persistent),
        sum(r.extent for r in match.statistics),
    )
    make = None  # the model alone decides: nothing is launched
    if on_device:
        make = _generated_runner(match, source, shapes, constants or {}, hw, template)
    tuned = _search(
        spec, hw, make, legal, config, tfamily, template, on_device, source.name,
        launches=launches, seeds=seeds, workload=workload, cost=cost, split=source.split_k,
    )
    tuned.workload = {**workload.to_dict(), "kernel": match.describe()}
    return tuned


def generated_template(match) -> tuple:
    """``(spec, legal, template, family)`` of the search over a generated kernel's tiles: the
    chain of ``match``, the legality check of its template (``legal(candidate)``: why it cannot
    run the candidate, or None), the template parameters of a candidate
    (``template(candidate)``) and the template family of its launch options and seeds."""
    ext = match.frame.extents
    batch = ext.get("b", 1) * (ext.get("h", 1) if match.family != "gemm" else 1)
    if match.family == "gemm":
        n = sum(s.n for s in match.segments)
        spec = dataclasses.replace(
            ChainSpec.gemm(ext["m"], n, ext["k"], dtype_bytes=_bytes(match.dtype)), batch=batch
        )
        return (spec, lambda c: generated_gemm_legality(match, spec, c), tk.gemm_config,
                "gemm")
    spec = ChainSpec.gemm_chain(
        batch, ext["m"], ext["n"], ext["k"], ext["d"], dtype_bytes=_bytes(match.dtype)
    )
    if match.family == "attention":
        return spec, lambda c: tk.attention_legality(spec, c), tk.attention_config, "attention"
    return (spec, lambda c: tk.chain_legality(spec, c), lambda c: tk.chain_config(spec, c),
            "chain")


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
    spec, legal, template, _ = generated_template(match)
    space = build_search_space(spec, hw.smem_per_block, legal, count=False)
    tiles = _record_tiles(config, space, match.family)
    if isinstance(tiles, str):
        return tiles
    odd = next((x for x in tiles if tiles[x] not in space.tiles[x]), None)
    if odd:
        return f"tiles {tiles}: a {odd} tile of {tiles[odd]}, not one of {space.tiles[odd]}"
    cand = space.find(tiles)
    if cand is None:
        first = Candidate(space.exprs[0], tuple(tiles.items()))
        return f"tiles {tiles}: {legal(first) or 'not a candidate of the search space'}"
    wrong = {k: v for k, v in template(cand).items() if config.get(k) != v}
    if wrong:
        return f"template parameters {wrong} expected for tiles {tiles}"
    return launch_legality(match, source, config)


def _record_tiles(config: dict, space, family: str) -> dict | str:
    """The tile of each loop of ``space`` in ``config`` (an attention's head tiles are whole:
    the largest size), or why there is none."""
    tiles = {}
    for x, sizes in space.tiles.items():
        key = _TILE_PARAMS[x]
        value = config.get(key, max(sizes) if family == "attention" and x in "kh" else None)
        if not _count(value):
            return f"{key} = {value!r} is not a tile size"
        tiles[x] = value
    return tiles


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def launch_legality(match, source, config: dict) -> str | None:
    """Why ``config``'s launch options cannot launch the generated kernel ``source``, or None:
    known options (:data:`LAUNCH_KEYS`) of integer values, warps a power of two, at least one
    pipeline stage, split and SMs counts, and only the formulations the kernel has
    (persistent, split-K, TMA loads or stores, the warp-specialized form at the tiles and
    partitions it takes)."""
    unknown = sorted(set(config) - set(_TILE_PARAMS.values()) - set(LAUNCH_KEYS) - {"HOIST_A"})
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
    """Why the warp-specialized form cannot run ``config``, or None: an attention's tiles of
    :data:`~tvm_stitch.cost.model.WS_ROWS` query rows; a GEMM's consumer warpgroups of
    :data:`~tvm_stitch.families.gemm.gluon_launch.WS_GEMM_ROWS` rows each and an epilogue partition
    (``EW``, ``PTR_STORE``) it has registers for."""
    if match.family == "attention":
        return infeasible(Workload("attention", {}), {"m": config.get("BLOCK_M")}, config)
    from tvm_stitch.families.gemm.gluon_launch import (
        WS_GEMM_EPILOGUE_REGS,
        WS_GEMM_REGS,
        WS_GEMM_ROWS,
    )

    ws, ew = config["WS"], config.get("EW")
    if ws not in WS_GEMM_REGS or config.get("BLOCK_M") != WS_GEMM_ROWS:
        return f"{ws} consumer warpgroups of {config.get('BLOCK_M')} rows"
    if (ew and (ws, ew) not in WS_GEMM_EPILOGUE_REGS) or (config.get("PTR_STORE") and not ew):
        return f"an epilogue partition of {ew} warps (PTR_STORE {config.get('PTR_STORE')})"
    return None


def generated_gemm_legality(match, spec: ChainSpec, cand) -> str | None:
    """Why a generated GEMM kernel cannot run ``cand`` well, or None: the GEMM template's rules
    (:func:`~tvm_stitch.codegen.triton_kernels.gemm_legality`), and a kernel writing a row's
    moments in pieces (:func:`~tvm_stitch.families.gemm.recognize.moment_chunk` columns each) takes
    column tiles of whole pieces."""
    chunk = max((o.chunk for o in match.all_outputs), default=0)
    n = cand.tile_dict["n"]
    if chunk and n % chunk:
        return f"{n}-column tiles writing moments in pieces of {chunk} columns"
    return tk.gemm_legality(spec, cand, accumulators=len(match.segments[0].products))


def generated_runner(match, source, shapes, constants=None, hw=None):
    """``run(config) -> fn``: ``fn()`` launches the generated kernel with ``config`` (template
    parameters and launch options) on device tensors of the right shapes (constants with their
    values, random data for the rest: ``run.inputs``, written to ``run.outputs``)."""
    import torch

    from tvm_stitch.codegen.embed import launch_options
    from tvm_stitch.codegen.kernel_text import (
        launch_constexprs,
        split_k_buffers,
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
            inputs.append(_randn(tuple(shape), dtype, 0.5))
        else:
            inputs.append(torch.zeros(tuple(shape), dtype=getattr(torch, dtype), device="cuda"))
    outputs = [
        torch.empty(tuple(shapes[t][0]), dtype=getattr(torch, shapes[t][1]), device="cuda")
        for t in source.outputs
    ]
    tk._tma_allocator()

    def run(config):
        fn = load(source, config)
        opts = launch_options(source, config)
        config = {"NUM_SMS": hw.num_sms, **config}
        consts = launch_constexprs(source, match, config, fn.arg_names)
        for name, (size, dtype) in split_k_buffers(source, match, consts).items():
            consts[name] = torch.zeros(size, dtype=getattr(torch, dtype), device="cuda")
        grid = source.grid({**consts, "WS": config.get("WS")}, match)
        descs = torch_descriptors(source, config, consts, inputs, outputs)  # made here
        return lambda: fn[grid](*inputs, *outputs, **descs, **consts, **opts)

    run.inputs, run.outputs = inputs, outputs
    return run


def _generated_runner(match, source, shapes, constants, hw, template):
    """``make(candidate, launch)`` for the search (:func:`generated_runner`)."""
    run = generated_runner(match, source, shapes, constants, hw)
    return lambda cand, launch: run({**template(cand), **launch})
