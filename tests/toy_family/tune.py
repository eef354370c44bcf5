"""The tile search: the chain of one product, power-of-two tiles of at least 16."""

from __future__ import annotations

from tvm_stitch.explore.tiling import ChainSpec
from tvm_stitch.tune.kernels import Space, element_bytes

LAUNCHES = [{"num_warps": w, "num_stages": s} for w in (4, 8) for s in (2, 3)]
SEEDS = [{"m": 64, "n": 64, "k": 32}]


def default_launch(config) -> dict:
    return {"num_warps": 4, "num_stages": 3}


def _legal(cand) -> str | None:
    small = {x: t for x, t in cand.tile_dict.items() if t < 16 or t & (t - 1)}
    return f"tiles {small}: tl.dot takes powers of two of at least 16" if small else None


def space(match) -> Space:
    ext = match.frame.extents
    spec = ChainSpec.gemm(ext["m"], ext["n"], ext["k"], dtype_bytes=element_bytes(match.dtype))
    return Space(spec, _legal, lambda c: {f"BLOCK_{x.upper()}": t for x, t in c.tile_dict.items()})


def options(match, source, on_device: bool) -> tuple[list, list]:
    return LAUNCHES, SEEDS
