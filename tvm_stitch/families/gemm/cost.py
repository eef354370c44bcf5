"""A GEMM's program for the cost model (:mod:`tvm_stitch.cost.model`): one output tile of
``bm × bn`` (all products sharing A), a loop over k; persistent TMA, split-K and the
warp-specialized Gluon form (``WS`` consumer warpgroups sharing B's tile, an ``EW`` epilogue
partition) as its launch says."""

from __future__ import annotations

from tvm_stitch.cost.model import BASE_REGISTERS, Program, cdiv


def program(w, tiles: dict, launch: dict, hw) -> Program:
    """One program's work (see :class:`~tvm_stitch.cost.model.Program`)."""
    # a warp-specialized Gluon GEMM (:mod:`~tvm_stitch.families.gemm.gluon`): ``WS`` consumer
    # warpgroups of ``tiles["m"]`` rows each share B's tile, persistent over the tiles, a
    # loading warp filling a TMA ring; ``EW`` epilogue warps run a tile's epilogue during the
    # next tile's products
    consumers = int(launch.get("WS") or 0)
    warps = 4 * consumers if consumers else int(launch.get("num_warps", 4))
    persistent = consumers > 0 or (bool(launch.get("PERSISTENT", False)) and w.persistent)
    split = 1 if persistent else max(int(launch.get("SPLIT_K", 1)), 1)
    ext, b = w.extents, w.dtype_bytes
    bm, bn = tiles["m"] * max(consumers, 1), tiles["n"]
    threads = 32 * warps
    bk, acc = tiles["k"], w.accumulators
    registers = bm * bn * acc / threads + BASE_REGISTERS
    loaded = (bm * bk + acc * bk * bn) * b
    if b >= 4:  # an FMA product (float32) holds both operand tiles in registers
        registers += (bm * bk + acc * bk * bn) / threads
    # a Gluon GEMM stages its output tile (and with ``EW`` the product's, the output's none
    # when the partition stores through pointers) in shared memory
    staged = bm * bn * b * (2 if launch.get("EW") and not launch.get("PTR_STORE") else 1) \
        if consumers else 0
    return Program(
        warps=warps, bm=bm, bn=bn,
        programs=w.batch * cdiv(ext["m"], bm) * cdiv(ext["n"], bn) * split,
        iters=cdiv(cdiv(ext["k"], bk), split),
        flops=2 * bm * bn * bk * acc,
        loaded=loaded,
        sfu=0.0,
        registers=registers,
        smem_fixed=staged,
        unique=(ext["m"] * ext["k"] + ext["k"] * ext["n"] * acc + ext["m"] * ext["n"]) * b,
        stored=bm * bn * b,
        persistent=persistent,
        split=split,
        tma=persistent,
        # a slot is busy for a load's latency and its transfer (Little's law), so few stages
        # bound the loop even where L2 keeps up (BERT's GEMMs at 4096 tokens: 128x256x128
        # tiles in 2 stages measured 1.2-1.4x the 3-stage 128x256x64 ones)
        busy_with_load=True,
        epilogue_overlapped=bool(consumers and launch.get("EW")),
    )
