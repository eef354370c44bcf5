"""An attention's tile search (:mod:`tvm_stitch.tune.kernels`): the chain Q·Kᵀ then P·V with
the head dims whole, TMA loads and the warp-specialized Gluon form where its kernel has them."""

from __future__ import annotations

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.cost.model import Workload, infeasible
from tvm_stitch.explore.tiling import ChainSpec
from tvm_stitch.families.attention import template
from tvm_stitch.tune.kernels import (
    PASS_SEARCH,
    Space,
    Tuned,
    element_bytes,
    pair_spec,
    randn,
    search,
)

#: launch options the search tries for its best tile candidates
LAUNCHES = [{"num_warps": w, "num_stages": s} for w in (4, 8) for s in (2, 3)]

#: tiles measured besides the search's picks: FlashAttention runs 64-128 query rows against
#: 32-128 keys; one warpgroup over 128 query rows, two stages: the H100's best at head dim 128
#: (22.1 us for 4x16x512, against 24.1 for 64x64; results of 2026-11-24)
SEEDS = [{"m": m, "n": n} for m in (64, 128) for n in (32, 64, 128)] + [
    {"m": 128, "n": 64, "launch": {"num_warps": 4, "num_stages": 2}},
]

#: loops whose tile is the whole extent (the head dims): a record may leave them out
WHOLE_TILES = "kh"


def default_launch(config: dict) -> dict:
    """Three stages, a warpgroup (4 warps) per 64 query rows: the score and output tiles are
    split by rows only, and a Hopper warpgroup's wgmma takes 64 rows."""
    return {"num_warps": 4 * max(1, config["BLOCK_M"] // tk.WARPGROUP_ROWS), "num_stages": 3}


def ws_seeds() -> list[dict]:
    """Seeds of the warp-specialized attention (:mod:`tvm_stitch.families.attention.gluon`):
    128 query rows per program, its key tiles and ring slots."""
    from tvm_stitch.families.attention.gluon import WS_ROWS, WS_TILES

    return [{"m": WS_ROWS, "n": n, "launch": {"num_warps": 4, "num_stages": slots, "WS": True}}
            for n, slots in WS_TILES]


def space(match) -> Space:
    """Q·Kᵀ then P·V per (batch, head), the template's legality (head dims whole)."""
    spec = pair_spec(match)
    return Space(spec, lambda c: template.attention_legality(spec, c), template.attention_config)


def options(match, source, on_device: bool) -> tuple[list, list]:
    """Launches and seeds: each launch also with Q, K and V brought in by TMA where the kernel
    can; the warp-specialized form measured at its tilings, or priced by the model beside the
    Triton form's launches."""
    launches, seeds = LAUNCHES, SEEDS
    if source.tma:
        launches = [{**o, "TMA": t} for t in (False, True) for o in launches]
    if source.ws:
        seeds = [*seeds, *ws_seeds()]
        if not on_device:
            launches = [*launches, *(s["launch"] for s in ws_seeds())]
    return launches, seeds


def ws_launch_legality(match, config: dict) -> str | None:
    """The warp-specialized form takes 128 query rows
    (:func:`~tvm_stitch.families.attention.cost.infeasible`)."""
    return infeasible(Workload("attention", {}), {"m": config.get("BLOCK_M")}, config)


# -- the template's search (the kernel benchmark's) ------------------------------
def tune_attention(
    batch, m, n, dk, dh, dtype, hw, config=PASS_SEARCH, mask=False, on_device=True
) -> Tuned:
    """Tiles of the attention template for ``batch`` (batch · heads) problems of (m, n, dk, dh).

    With ``mask`` an additive (batch, 1, n) mask broadcast over query rows is applied, as in BERT.
    """
    spec = ChainSpec.gemm_chain(batch, m, n, dk, dh, dtype_bytes=element_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            randn((batch, m, dk), dtype),
            randn((batch, n, dk), dtype),
            randn((batch, n, dh), dtype),
        )
        if mask:
            inputs += (randn((batch, 1, n), dtype),)

    def make(cand, launch):
        conf = template.attention_config(cand)
        return lambda: template.run_attention(*inputs, config=conf, **launch)

    tuned = search(
        spec,
        hw,
        make,
        lambda c: template.attention_legality(spec, c),
        config,
        "attention",
        template.attention_config,
        on_device,
        f"attention {batch}x{m}x{n}x{dk}x{dh}",
        workload=Workload("attention", dict(spec.extents), batch, spec.dtype_bytes),
    )
    tuned.inputs = inputs
    return tuned
