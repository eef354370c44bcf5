"""A GEMM chain's tile search (:mod:`tvm_stitch.tune.kernels`): the chain ``(A·B)·D``, the
template's legality (the second product's columns in ``BLOCK_H`` tiles, A hoisted where it
fits)."""

from __future__ import annotations

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.explore.tiling import ChainSpec
from tvm_stitch.families.chain import template
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
#: no tiles known to suit every chain: the search's picks alone
SEEDS: list = []


def default_launch(config: dict) -> dict:
    """Three stages, warps by tile area (:func:`~tvm_stitch.codegen.triton_kernels.num_warps`)."""
    return {"num_warps": tk.num_warps(config["BLOCK_M"], config["BLOCK_N"]), "num_stages": 3}


def space(match) -> Space:
    spec = pair_spec(match)
    return Space(spec, lambda c: template.chain_legality(spec, c),
                 lambda c: template.chain_config(spec, c))


def options(match, source, on_device: bool) -> tuple[list, list]:
    """The template's launches and seeds."""
    return LAUNCHES, SEEDS


# -- the template's search (the kernel benchmark's) ------------------------------
def tune_chain(batch, m, n, k, h, dtype, hw, config=PASS_SEARCH, on_device=True) -> Tuned:
    """Tiling of the GEMM chain ``(a @ b) @ d`` for ``a`` (batch, m, k)."""
    spec = ChainSpec.gemm_chain(batch, m, n, k, h, dtype_bytes=element_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            randn((batch, m, k), dtype, k**-0.5),
            randn((batch, k, n), dtype),
            randn((batch, n, h), dtype, n**-0.5),
        )

    def make(cand, launch):
        conf = template.chain_config(spec, cand)
        return lambda: template.run_gemm_chain(*inputs, conf, **launch)

    tuned = search(
        spec,
        hw,
        make,
        lambda c: template.chain_legality(spec, c),
        config,
        "chain",
        lambda c: template.chain_config(spec, c),
        on_device,
        f"chain {batch}x{m}x{n}x{k}x{h}",
    )
    tuned.inputs = inputs
    return tuned
