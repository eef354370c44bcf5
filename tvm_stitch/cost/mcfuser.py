"""MCFuser's analytical performance model (paper §IV-A, equations (2)–(5)).

``t = (t_mem + t_comp) · α`` where ``t_mem`` sums, over every placed load and store, the tile
bytes times the statement's trip count divided by the bandwidth ``W``; ``t_comp`` sums the tile
FLOPs of every compute statement times its trip count divided by the peak ``P``; and
``α = (N_block + N_SM) / N_block`` penalises grids too small to fill the GPU.  ``W``, ``P`` and
``N_SM`` come from :class:`~tvm_stitch.hardware.HardwareModel`.
"""

from __future__ import annotations

import dataclasses
import math

from tvm_stitch.explore.tiling import Candidate, ChainSpec, grid_loops, placements, trip_counts
from tvm_stitch.hardware import HardwareModel


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The model's terms for one candidate (seconds, except ``alpha`` and ``blocks``)."""

    t_mem: float
    t_comp: float
    alpha: float
    blocks: int
    bytes: int
    flops: int

    @property
    def time(self) -> float:
        """Equation (2)."""
        return (self.t_mem + self.t_comp) * self.alpha


def estimate(spec: ChainSpec, cand: Candidate, hw: HardwareModel) -> Estimate:
    """Equations (2)–(5) for one candidate of ``spec`` on ``hw``."""
    tiles = cand.tile_dict
    moved = flops = 0
    for st in placements(spec, cand.expr, tiles):
        if st.kind == "compute":
            flops += 2 * st.elements * st.trips  # one multiply-add per tile point
        else:
            moved += st.elements * spec.dtype_bytes * st.trips
    moved *= spec.batch
    flops *= spec.batch
    trips = trip_counts(spec, tiles)
    blocks = spec.batch * math.prod(trips[x] for x in grid_loops(spec, cand.expr))
    return Estimate(
        t_mem=moved / hw.mem_bandwidth,
        t_comp=flops / hw.peak_flops_fp16,
        alpha=(blocks + hw.num_sms) / blocks,
        blocks=blocks,
        bytes=moved,
        flops=flops,
    )
