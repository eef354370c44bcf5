"""A GEMM chain's tile search (:mod:`tvm_stitch.tune.kernels`): the chain ``(A·B)·D``, the
template's legality (the second product's columns in ``BLOCK_H`` tiles, A hoisted where it
fits)."""

from __future__ import annotations

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.tune.kernels import Space, pair_spec

#: launch options the search tries for its best tile candidates
LAUNCHES = [{"num_warps": w, "num_stages": s} for w in (4, 8) for s in (2, 3)]
#: no tiles known to suit every chain: the search's picks alone
SEEDS: list = []


def default_launch(config: dict) -> dict:
    """Three stages, warps by tile area (:func:`~tvm_stitch.codegen.triton_kernels.num_warps`)."""
    return {"num_warps": tk.num_warps(config["BLOCK_M"], config["BLOCK_N"]), "num_stages": 3}


def space(match) -> Space:
    spec = pair_spec(match)
    return Space(spec, lambda c: tk.chain_legality(spec, c), lambda c: tk.chain_config(spec, c))


def options(match, source, on_device: bool) -> tuple[list, list]:
    """The template's launches and seeds."""
    return LAUNCHES, SEEDS
