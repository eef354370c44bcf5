"""An attention's program for the cost model (:mod:`tvm_stitch.cost.model`): flash-style, one
program per (instance, query tile), a loop over key tiles with an online softmax between the
products (exponentials on the SFUs); TMA loads, and the warp-specialized Gluon form (``WS``:
:data:`WS_ROWS` query rows, two consumer warpgroups taking turns behind a loading warp,
persistent) as its launch says."""

from __future__ import annotations

import dataclasses

from tvm_stitch.cost.model import Program, pair_program

WS_ROWS = 128  # query rows of a warp-specialized attention's tile (two consumer warpgroups)
SOFTMAX_OPS = 8  # fp32 operations per logit of an online softmax (scale, max, subtract, sum, ...)
TMA_DESCRIPTORS = 3  # tensor descriptors an attention program makes on the device (Q, K, V)


def infeasible(w, tiles: dict, launch: dict) -> str | None:
    """The warp-specialized form takes :data:`WS_ROWS` query rows a program."""
    if launch.get("WS") and tiles.get("m") != WS_ROWS:
        return f"a warp-specialized attention takes {WS_ROWS} query rows, not {tiles.get('m')}"
    return None


def program(w, tiles: dict, launch: dict, hw) -> Program:
    """One program's work (see :class:`~tvm_stitch.cost.model.Program`): each warpgroup's
    softmax hidden behind the other's products in the warp-specialized form."""
    ws = bool(launch.get("WS"))
    bm, bn = tiles["m"], tiles["n"]
    lanes = hw.peak_flops_fp32 / 2 / hw.num_sms  # fp32 results per second of an SM
    # an exponential and the row statistics per logit
    sfu = bm * bn / (hw.sfu_per_sm * hw.clock_hz) + SOFTMAX_OPS * bm * bn / lanes
    p = pair_program(w, tiles, launch, sfu=sfu, warps=8 if ws else int(launch.get("num_warps", 4)))
    if ws:  # the output leaves through shared memory too; persistent, loading by TMA
        return dataclasses.replace(p, smem_fixed=p.smem_fixed + bm * w.extents["h"] * w.dtype_bytes,
                                   persistent=True, tma=True, overlapped=True)
    if launch.get("TMA"):  # descriptors made on the device, per program
        return dataclasses.replace(p, tma=True, descriptors=TMA_DESCRIPTORS)
    return p
