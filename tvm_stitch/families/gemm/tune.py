"""A GEMM's tile search (:mod:`tvm_stitch.tune.kernels`): the chain of one product (bands side
by side in ``n``), the template's legality, launches with the persistent TMA formulation,
split-K, TMA stores and the warp-specialized Gluon form where its kernel has them, and seeds
known to suit Hopper's tensor cores."""

from __future__ import annotations

import dataclasses
import logging

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.explore.tiling import ChainSpec
from tvm_stitch.families.gemm import template
from tvm_stitch.tune.kernels import PASS_SEARCH, Space, Tuned, element_bytes, randn, search

logger = logging.getLogger("tvm_stitch.tune")


def _seed(m, n, k, warps, stages, persistent, split=1):
    launch = {"num_warps": warps, "num_stages": stages, "PERSISTENT": persistent}
    if split > 1:
        launch["SPLIT_K"] = split
    return {"m": m, "n": n, "k": k, "launch": launch}


#: splits of k a split-K GEMM may use (``SPLIT_K``: programs per output tile)
SPLITS = template.SPLITS

#: launch options the search tries for its best tile candidates: warps x stages, PERSISTENT
#: (one program per SM loading through TMA, the template's other formulation) and SPLIT_K
#: (programs per output tile, each over a slice of k; generated kernels only)
LAUNCHES = [
    {"num_warps": w, "num_stages": s, "PERSISTENT": p}
    for p in (False, True)
    for w in (4, 8)
    for s in (3, 4)
] + [{"num_warps": 4, "num_stages": 4, "PERSISTENT": False, "SPLIT_K": k} for k in SPLITS[1:]]

#: tiles measured besides the search's picks, with their launch: the best of a sweep of
#: formulations on the H100 for BERT's GEMMs at 4096 and 128 tokens (a warpgroup takes 64 rows;
#: ``docs/results/h100-hopper-gemm-2026-11-23.md``)
SEEDS = [
    _seed(128, 256, 64, 8, 4, True),
    _seed(128, 256, 64, 8, 3, True),
    _seed(256, 128, 64, 8, 3, True),
    _seed(128, 128, 64, 4, 4, True),
    _seed(128, 128, 64, 8, 3, False),
    _seed(128, 128, 64, 4, 3, False),
    _seed(64, 128, 64, 4, 4, False),
    _seed(64, 64, 128, 4, 4, False),
    _seed(64, 64, 64, 4, 4, False),
    _seed(64, 32, 128, 4, 4, False),
    # split-K (tiles of few rows and a long k: BERT's FFN out at 128 tokens)
    _seed(64, 64, 128, 4, 4, False, split=4),
    _seed(64, 128, 128, 4, 4, False, split=2),
]


def default_launch(config: dict) -> dict:
    """Three stages, warps by tile area (:func:`~tvm_stitch.codegen.triton_kernels.num_warps`)."""
    return {"num_warps": tk.num_warps(config["BLOCK_M"], config["BLOCK_N"]), "num_stages": 3}


def template_options(persistent: bool, split: bool = False,
                     tma_store: bool = False) -> tuple[list, list]:
    """Launch options and seeds of a GEMM search; without the persistent formulation, seeds
    run their tiles one program per tile; without split-K, the split ones are left out; with
    ``tma_store`` every persistent launch is also tried storing its tiles by TMA (measured
    only: the cost model prices both stores alike, so a model-only build stores by pointers)."""
    launches = [
        o for o in LAUNCHES
        if (persistent or not o["PERSISTENT"]) and (split or o.get("SPLIT_K", 1) == 1)
    ]
    seeds = [
        seed if persistent else {**seed, "launch": {**seed["launch"], "PERSISTENT": False}}
        for seed in SEEDS
        if split or seed["launch"].get("SPLIT_K", 1) == 1
    ]
    if persistent and tma_store:
        launches += [{**o, "TMA_STORE": True} for o in launches if o["PERSISTENT"]]
        seeds += [{**s, "launch": {**s["launch"], "TMA_STORE": True}}
                  for s in seeds if s["launch"]["PERSISTENT"]]
    return launches, seeds


def ws_seeds(staging: bool = True, paired: bool = False) -> list[dict]:
    """Seeds of the warp-specialized GEMM (:mod:`tvm_stitch.families.gemm.gluon`): a consumer
    warpgroup's 64 rows, the column and k tiles, ``WS`` consumers, the ring's slots and the
    warps of an epilogue partition (``EW``, with ``PTR_STORE`` where it stores through
    pointers; left out without ``staging``, see
    :func:`~tvm_stitch.families.gemm.gluon.staging_legality`). ``paired``: a gate and an up
    interleaved, whose product is twice the column tile: half the columns, the same
    accumulator and B tile as the others."""
    from tvm_stitch.families.gemm.gluon_launch import applicable_tiles, ws_config

    seeds = []
    for tiles in applicable_tiles(staging):
        config = ws_config(*tiles)
        n = config.pop("BLOCK_N") // (2 if paired else 1)
        seeds.append({"m": config.pop("BLOCK_M"), "n": n, "k": config.pop("BLOCK_K"),
                      "launch": config})
    return seeds


def space(match) -> Space:
    """One product over every band's columns (``n`` summed), the batch its own axis; the
    template's legality with a kernel's moments in whole pieces (:func:`legality`)."""
    ext = match.frame.extents
    n = sum(s.n for s in match.segments)
    spec = dataclasses.replace(
        ChainSpec.gemm(ext["m"], n, ext["k"], dtype_bytes=element_bytes(match.dtype)),
        batch=ext.get("b", 1),
    )
    return Space(spec, lambda c: legality(match, spec, c), template.gemm_config,
                 accumulators=len(match.segments[0].products))


def legality(match, spec: ChainSpec, cand) -> str | None:
    """Why a generated GEMM kernel cannot run ``cand`` well, or None: the GEMM template's rules
    (:func:`~tvm_stitch.families.gemm.template.gemm_legality`), and a kernel writing a row's
    moments in pieces (:func:`~tvm_stitch.families.gemm.recognize.moment_chunk` columns each)
    takes column tiles of whole pieces."""
    chunk = max((o.chunk for o in match.all_outputs), default=0)
    n = cand.tile_dict["n"]
    if chunk and n % chunk:
        return f"{n}-column tiles writing moments in pieces of {chunk} columns"
    if match.paired and 2 * n > 256:  # one wgmma's columns, one TMA box's rows
        return f"gate and up of {n} columns each: a product of {2 * n} columns"
    return template.gemm_legality(spec, cand, accumulators=len(match.segments[0].products))


def options(match, source, on_device: bool) -> tuple[list, list]:
    """Launches and seeds of a generated GEMM: the formulations its text has (persistent,
    split-K, TMA stores) and its warp-specialized form at its tiles, measured on a GPU or
    priced by the cost model (``on_device`` False). Ranked by the model on the H100 records,
    the form is chosen for BERT's GEMMs at 2048-4096 rows and none at 128-400 rows; the
    model's picks at 4096 rows went from 1.20-1.25x the best measured to 1.04-1.06x
    (``docs/results/h200-dynamic-ws-2026-11-29.md``)."""
    launches, seeds = template_options(source.persistent, source.split_k, source.tma_store)
    if source.ws:
        from tvm_stitch.families.gemm.gluon import staging_legality

        why = staging_legality(match)
        if why:
            logger.info("%s: no epilogue partition: %s", match.describe(), why)
        seeds = [*seeds, *ws_seeds(staging=why is None, paired=match.paired)]
    return launches, seeds


def ws_launch_legality(match, config: dict) -> str | None:
    """Why the warp-specialized form cannot run ``config``: consumer warpgroups of
    :data:`~tvm_stitch.families.gemm.gluon_launch.WS_GEMM_ROWS` rows each and an epilogue
    partition (``EW``, ``PTR_STORE``) it has registers for."""
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


# -- the template's search (the kernel benchmark's) ------------------------------
def tune_gemm(
    m, n, k, dtype, hw, config=PASS_SEARCH, on_device=True, persistent=True
) -> Tuned:
    """Tiles and launch of ``x (m,k) @ w (n,k)^T + bias`` (the Linear template).

    Epilogues (GELU, residual) are not timed: they add the same work to every tiling.
    ``persistent``: the kernel has the persistent TMA formulation to choose (a GEMM whose
    operands TMA cannot read has not).
    """
    spec = ChainSpec.gemm(m, n, k, dtype_bytes=element_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (randn((m, k), dtype), randn((n, k), dtype, k**-0.5), randn((n,), dtype))

    def make(cand, launch):
        conf = {**template.gemm_config(cand), "NUM_SMS": hw.num_sms}
        return lambda: template.run_gemm_epilogue(*inputs, config=conf, **launch)

    tuned = search(
        spec,
        hw,
        make,
        lambda c: template.gemm_legality(spec, c),
        config,
        "gemm",
        template.gemm_config,
        on_device,
        f"gemm {m}x{n}x{k}",
        *template_options(persistent),
    )
    tuned.inputs = inputs
    return tuned
