"""The launches of the ``gemm`` family's warp-specialized Gluon form (:mod:`.gluon`): its
consumer warpgroups' rows, the tilings the search measures, and the register budgets of each
partition."""

from __future__ import annotations

#: a consumer warpgroup's rows (one ``wgmma`` instruction's M)
WS_GEMM_ROWS = 64
#: consumer warpgroups -> (the launch's register limit, a consumer's registers after
#: ``setmaxnreg``): the loading warp's partition is padded to a warpgroup, so 2 consumers make
#: 384 threads (168 each at launch; 2 × 240 + 24 after) and 3 make 512 (128; 3 × 160 + 24)
WS_GEMM_REGS = {2: (168, 240), 3: (128, 160)}
WS_GEMM_LOAD_REGS = 24
#: ``(consumers, BLOCK_N, BLOCK_K, ring slots[, epilogue warps[, stores through pointers]])``
#: the search measures:
#: 192 × 128 (cuBLAS's tile; 4 slots and the output's staging tiles take 213 KB of shared
#: memory), 128 × 128 (a tile of 128 tokens), 128 × 128 with an epilogue partition of 4 or 8
#: warps (``EW``: 224 KB with the product's and the output's staging tiles; BERT's FFN-in with
#: its GELU 36.9 µs against the Triton form's 40.7, Q/K/V 26.3 against 26.5), and 192 × 128
#: with one of 4 warps (3 slots, 216 KB; BERT's out-projection with its residual 12.7 µs
#: against 13.2 without: the partition reads the residual in 16-byte pieces, the consumers in
#: the accumulator's 4; FFN-in's GELU is too much for 4 warps behind three consumers, 44.7;
#: H100, 2026-11-26), and 192 × 128 with one of 4 warps storing through pointers
#: (``PTR_STORE``: no output staging tile, so 4 slots fit in 208 KB; BERT's joined Q/K/V
#: 25.5 µs against 26.2 by TMA, chosen by the search at 32 × 128 (25.2); no better on the
#: other three; H100, session 27, ``h100-pointer-store-2026-11-26.md``), and 128 × 256 (two
#: consumers of 64 × 256, 3 slots, 208 KB; the fastest of LLaMA-3-8B's GEMMs at 2048 tokens:
#: Q/K/V 137.2 µs against 141.1, the out-projection 96.4 against 99.4, gate × up interleaved
#: (a 256-column product) 642.1 against 671.4, FFN-out 311.7 against 329.5; BERT's at 4096
#: tokens 32–43 µs, behind the others: 768 columns make 3 tiles a row; H200,
#: ``h200-clock-drift-wide-tiles-2026-11-30.md``). Not seeded: consumers of 128 rows (two
#: ``wgmma`` a k step, cuBLAS's ``256x128``; slower on every GEMM of both models, same run),
#: ping-pong schedules (two consumers taking whole tiles in turns;
#: BERT's FFN-in tied the Triton form alone, 38.4 vs 38.5 µs, and cost 20-50 µs end to end),
#: and each tile's epilogue behind the next tile's first products in the consumers themselves
#: (a second accumulator: slower on every GEMM but Q/K/V; H200, 2026-11-26)
WS_GEMM_TILES = ((3, 128, 64, 4), (2, 128, 64, 5), (2, 128, 64, 5, 4), (2, 128, 64, 5, 8),
                 (3, 128, 64, 3, 4), (3, 128, 64, 4, 4, 1), (2, 256, 64, 3))
#: (consumers, an epilogue partition's warps ``EW``) -> (the launch's register limit, each
#: further consumer's registers, the epilogue's): the consumers, the epilogue's warps and the
#: loading warp's warpgroup make 512 threads (2 consumers, 4 warps), 640 (2 and 8, or 3 and
#: 4); the first consumer (Gluon's default partition) gets what is left
#: (:func:`default_registers`): 176, 136 and 120 -- as measured (2026-11-26; an even split of
#: (2, 8)'s, 144 and 152, was not measured)
WS_GEMM_EPILOGUE_REGS = {(2, 4): (128, 176, 136), (2, 8): (96, 160, 80), (3, 4): (96, 120, 96)}
#: the widest column tile: a consumer holds 64 × BLOCK_N float32 accumulators (bounds checks
#: along a band's columns are left out where this many divide them, as in the Triton form)
WS_GEMM_MAX_N = 256


def default_registers(consumers: int, epilogue: int) -> int:
    """Registers Gluon leaves the first consumer (its default partition) of a launch of
    ``consumers`` consumer warpgroups with an epilogue partition of ``epilogue`` warps: the
    launch's registers less the other partitions' (each warpgroup's ``setmaxnreg``; the loading
    warp's padded to a warpgroup)."""
    limit, consumer, regs = WS_GEMM_EPILOGUE_REGS[consumers, epilogue]
    groups = consumers + epilogue // 4 + 1  # consumers, the epilogue's warpgroups, the loader's
    left = (limit * groups - consumer * (consumers - 1) - regs * (epilogue // 4)
            - WS_GEMM_LOAD_REGS)
    return left // 8 * 8


def applicable_tiles(staging: bool, tiles=WS_GEMM_TILES) -> list[tuple]:
    """The tilings of ``tiles`` (as :data:`WS_GEMM_TILES`) a GEMM can take: those with an
    epilogue partition only where its consumers can stage their products (``staging``:
    :func:`~.gluon.staging_legality` is None)."""
    return [t for t in tiles if staging or len(t) < 5 or not t[4]]


def ws_config(consumers: int, bn: int, bk: int, slots: int, epilogue: int = 0,
              pointers: int = 0) -> dict:
    """The launch config of one of :data:`WS_GEMM_TILES` (``NUM_SMS`` added by the caller);
    ``epilogue``: the warps of an epilogue partition (``EW``; 0: the consumers run it);
    ``pointers``: the partition stores through pointers (``PTR_STORE``), not by TMA."""
    if epilogue and (consumers, epilogue) not in WS_GEMM_EPILOGUE_REGS:
        raise ValueError(f"an epilogue partition of {epilogue} warps with {consumers} consumers:"
                         f" only (consumers, warps) in {sorted(WS_GEMM_EPILOGUE_REGS)}")
    if pointers and not epilogue:
        raise ValueError("stores through pointers are an epilogue partition's (EW)")
    config = {"BLOCK_M": WS_GEMM_ROWS, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4,
              "num_stages": slots, "WS": consumers}
    if epilogue:
        config["EW"] = epilogue
    return {**config, "PTR_STORE": 1} if pointers else config
