"""MCFuser search space (§III), analytical model (§IV-A) and evolutionary search (§IV-B)."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from tvm_stitch.cost.mcfuser import estimate
from tvm_stitch.explore.tiling import (
    SMEM_SLACK,
    Candidate,
    ChainSpec,
    TilingExpr,
    _rule3,
    build_search_space,
    placements,
    rule3_padding,
    smem_estimate,
    sub_expression,
    tile_options,
    tiling_expressions,
)
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.tune.evolution import SearchConfig, evolutionary_search

H100 = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
PAPER = ChainSpec.gemm_chain(1, 1024, 1024, 512, 512)  # Fig. 7's example: M=N=1024, K=H=512
MHNK = TilingExpr(tuple("mhnk"))
FLAT = TilingExpr(("m", "n"), (("k",), ("h",)))


def _by_kind(statements):
    return {(s.kind, s.tensor): s for s in statements}


def test_expressions_and_initial_space_match_the_paper():
    exprs = tiling_expressions(PAPER)
    assert len(exprs) == 26  # 4! deep + 2 flat
    assert {str(e) for e in exprs if e.is_flat} == {"mn(k,h)", "nm(k,h)"}
    space = build_search_space(PAPER, H100.smem_per_block)
    assert space.counts["all"] == 109051904  # (24 + 2) x 64^2 x 32^2, as printed in §III-C


def test_pruning_counts_fig7():
    space = build_search_space(PAPER, H100.smem_per_block)
    c = space.counts
    # our reading of rules 1 and 2 (see the module docstring): 26 -> 6 -> 4 expressions
    assert (c["expressions"], c["rule1_expressions"], c["rule2_expressions"]) == (26, 6, 4)
    assert sorted(sub_expression(PAPER, e) for e in space.exprs) == ["n(k,h)", "nhk", "nk", "nkh"]
    # rule 3: only divisors of the power-of-two dimensions remain (7 x 7 x 6 x 6 per expression)
    assert c["rule3"] == 4 * 7 * 7 * 6 * 6
    assert c["rule3"] / c["rule2"] < 0.01  # "discards 99% of impractical tile sizes"
    # rule 4 removes a sizeable part ("40%") and the result is ~10^4
    assert 0.25 < 1 - c["rule4"] / c["rule3"] < 0.6
    assert 10**3 < c["rule4"] < 10**5
    for cand in space.candidates():
        assert smem_estimate(PAPER, cand.expr, cand.tile_dict) <= SMEM_SLACK * H100.smem_per_block
        assert all(t % 16 == 0 for t in cand.tile_dict.values())


def test_rule1_example_and_rule2_reason():
    # the paper's example: mhnk and mnkh run the same loops per thread block
    assert sub_expression(PAPER, MHNK) == "nk"
    assert sub_expression(PAPER, TilingExpr(tuple("mnkh"))) == "nkh"
    assert sub_expression(PAPER, TilingExpr(tuple("nmkh"))) == "nkh"  # m is bound anywhere
    space = build_search_space(PAPER, H100.smem_per_block)
    # k outside n would keep partial C tiles for every n: rule 2 drops it
    assert all(not e.path("n")[:-1].count("k") for e in space.exprs)


def test_padding_rule():
    assert rule3_padding(1024, 256) and not rule3_padding(1024, 48)
    assert rule3_padding(781, 784 // 16 * 16)  # 784 pads 781 by 0.4%
    assert not rule3_padding(781, 512)  # 1024 pads 781 by 31%


@pytest.mark.parametrize(
    "extent, powers",
    [
        (24, [16, 32]),  # head dimensions
        (40, [16, 32]),
        (134, [16, 32, 64, 128]),
        (200, [16, 32, 64, 128]),
        (400, [16, 32, 64, 128, 256]),
        (781, [16, 32, 64, 128, 256, 512]),
        (1536, [16, 32, 64, 128, 256, 512, 1024]),
    ],
)
def test_powers_of_two_that_fit_a_ragged_extent_stay(extent, powers):
    """Triton's tiles are powers of two (masks handle the edge): the padding rule alone left
    400 rows only 16 and 32, which no warpgroup takes, so every BERT GEMM at 2 x 200 tokens
    fell back to TVM. Every power of two up to the extent (rounded up to 16) stays; the
    padding rule still prunes the other multiples of 16, keeping the least padding ones where
    none pads less than 5% (48 for 40)."""
    tiles = _rule3(extent, tile_options(extent))
    assert [t for t in tiles if t & (t - 1) == 0] == powers
    options = tile_options(extent)
    pad = {t: -extent % t for t in options}
    fits = [t for t in options if rule3_padding(extent, t)]
    # the other multiples of 16: those padding less than 5%, else the least padding ones
    least = [t for t in options if pad[t] == min(pad.values())]
    assert [t for t in tiles if t & (t - 1)] == [t for t in fits or least if t & (t - 1)]
    if extent >= 128:
        space = build_search_space(ChainSpec.gemm(extent, 768, 768), H100.smem_per_block)
        assert {64, 128} <= set(space.tiles["m"])


def test_every_row_count_keeps_a_warpgroup_tile():
    """Before, 474 of the row counts from 64 to 4096 (77, 96, 160, 300, 400, 600, ...) kept no
    power of two of 64 rows or more, and their GEMMs had no legal tiling at all."""
    for rows in range(64, 4097):
        tiles = _rule3(rows, tile_options(rows))
        assert 64 in tiles and (rows < 128 or 128 in tiles), rows


def test_placement_and_hoisting_on_extent_one():
    tiles = {"m": 64, "n": 64, "k": 64, "h": 64}
    st = _by_kind(placements(PAPER, MHNK, tiles))
    assert st[("load", "A")].scope == ("m", "h", "n", "k")
    assert st[("load", "A")].trips == 16 * 8 * 16 * 8
    assert st[("store", "E")].scope == ("m", "h")  # k and n don't index E (Fig. 4a, line 10)
    # K = T_k: loop k has one trip and is dead; A's load hoists to the m loop (Fig. 4b)
    st = _by_kind(placements(PAPER, MHNK, {**tiles, "k": 512}))
    a = st[("load", "A")]
    assert a.scope == ("m",) and a.trips == 16 and a.tile == {"m": 64, "k": 512}
    assert st[("load", "B")].scope == ("m", "h", "n")  # B is still indexed by n
    # flat tiling: E accumulates over n for every h tile and is stored once per m tile
    st = _by_kind(placements(PAPER, FLAT, tiles))
    assert st[("store", "E")].scope == ("m",) and st[("store", "E")].tile == {"m": 64, "h": 512}
    assert st[("compute", "C")].trips == 16 * 16 * 8  # computed once per (m, n), not per h


def test_model_by_hand():
    spec = ChainSpec.gemm_chain(1, 256, 256, 64, 64)
    tiles = {"m": 64, "n": 64, "k": 64, "h": 64}
    est = estimate(spec, Candidate(FLAT, tuple(tiles.items())), H100)
    # loads: A once per m tile (k has one trip) = 256*64; B and D once per (m, n) = 4 * 256*64
    # each; store E once = 256*64; all fp16
    moved = 2 * (256 * 64 + 4 * 256 * 64 + 4 * 256 * 64 + 256 * 64)
    assert est.bytes == moved
    assert est.flops == 2 * 256 * 256 * 64 * 2
    assert est.blocks == 4 and est.alpha == (4 + 132) / 4
    assert est.time == pytest.approx(
        (moved / H100.mem_bandwidth + est.flops / H100.peak_flops_fp16) * est.alpha
    )


def test_model_ranks_redundant_loads_lower():
    tiles = {"m": 128, "n": 64, "k": 64, "h": 64}
    deep = estimate(PAPER, Candidate(MHNK, tuple(tiles.items())), H100)
    flat = estimate(PAPER, Candidate(FLAT, tuple(tiles.items())), H100)
    # mhnk recomputes C (and reloads A, B) for every h tile; the flat tiling does not
    assert flat.bytes < deep.bytes and flat.flops < deep.flops and flat.time < deep.time
    bigger = estimate(PAPER, Candidate(FLAT, tuple({**tiles, "m": 16}.items())), H100)
    assert bigger.bytes > flat.bytes  # small m tiles reload B and D more often


def test_evolutionary_search_model_only_is_deterministic_and_good():
    spec = ChainSpec.gemm_chain(1, 512, 512, 256, 256)
    space = build_search_space(spec, H100.smem_per_block)
    model = lambda c: estimate(spec, c, H100).time  # noqa: E731
    seen = []
    result = evolutionary_search(space, model, progress=lambda r, t: seen.append(t))
    again = evolutionary_search(space, model)
    assert result.best == again.best and not result.measured
    assert math.isnan(result.correlation)
    assert seen == sorted(seen, reverse=True)  # the best time never gets worse
    exhaustive = min(model(c) for c in space.candidates())
    assert result.best_time <= 1.15 * exhaustive


@pytest.mark.slow
def test_model_only_search_is_the_same_in_every_process(tmp_path):
    """Candidates the model ties on are ranked in one order whatever Python's string hashing
    (a build without a GPU picks the same tiles from one process to the next)."""
    script = (
        "import re, tvm, tvm_stitch\n"
        "from tvm_stitch.report import cuda_source\n"
        "from tvm_stitch.workloads import get_workload\n"
        "target = tvm.target.Target({'kind': 'cuda', 'arch': 'sm_90a'})\n"
        "for name in ('G2', 'G10'):\n"
        "    mod = get_workload(name).instance('float16').mod\n"
        "    ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))\n"
        "    print(sorted(set(re.findall(r'stitch_chain_\\w+', cuda_source(ex)))))\n"
    )
    outs = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed,
                            "TVM_STITCH_TUNING_DB": str(tmp_path / "db.json")}).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1, outs


def test_evolutionary_search_measures_top_n_and_correlates():
    spec = ChainSpec.gemm_chain(1, 512, 256, 64, 128)
    space = build_search_space(spec, H100.smem_per_block)
    model = lambda c: estimate(spec, c, H100).time  # noqa: E731
    calls = []

    def measure(c):  # a "device" that agrees with the model up to a deterministic wobble
        calls.append(c)
        return model(c) * (1.0 + 0.05 * (hash(str(c)) % 7) / 7)

    result = evolutionary_search(space, model, measure, SearchConfig(population=64, top_n=8))
    assert len(calls) == len(set(calls)) == len(result.pairs)  # nothing measured twice
    assert len(calls) <= 8 * result.rounds
    assert result.correlation > 0.8
    # a candidate that fails on the device (inf) neither wins nor poisons the correlation
    count = iter(range(10**6))

    def flaky(c):  # every third candidate fails to compile
        return math.inf if next(count) % 3 == 0 else measure(c)

    failing = evolutionary_search(space, model, flaky, SearchConfig(population=64, top_n=8))
    assert math.isfinite(failing.best_time) and math.isfinite(failing.correlation)


def test_empty_space_is_an_error():
    space = build_search_space(PAPER, smem_limit=16)
    with pytest.raises(ValueError, match="empty"):
        evolutionary_search(space, lambda c: 1.0)


def test_code_generator_legality_restricts_the_space():
    from tvm_stitch.families.chain.template import chain_legality

    spec = ChainSpec.gemm_chain(1, 512, 512, 256, 256)
    space = build_search_space(spec, H100.smem_per_block, legal=lambda c: chain_legality(spec, c))
    assert 0 < space.counts["legal"] < space.counts["rule4"]
    assert all(chain_legality(spec, c) is None for c in space.candidates())
    result = evolutionary_search(space, lambda c: estimate(spec, c, H100).time)
    assert chain_legality(spec, result.best) is None  # mutation stays legal too


def test_gemm_space_holds_the_hopper_seeds_with_their_launches():
    """Every GEMM seed survives pruning and legality at BERT's shapes and is measured with its
    own launch (warps, stages, persistent); row tiles below a warpgroup's 64 rows are illegal."""
    from tvm_stitch.families.gemm import template as gemm_template
    from tvm_stitch.families.gemm.tune import SEEDS
    from tvm_stitch.tune.measure import _seeded

    spec = ChainSpec.gemm(4096, 3072, 768)
    space = build_search_space(spec, H100.smem_per_block,
                               legal=lambda c: gemm_template.gemm_legality(spec, c))
    assert all(c.tile_dict["m"] >= 64 for c in space.candidates())
    seeded = _seeded(space, SEEDS)
    assert len(seeded) == len(SEEDS)
    first, launch = seeded[0]
    assert first.tile_dict == {"m": 128, "n": 256, "k": 64}
    assert launch == {"num_warps": 8, "num_stages": 4, "PERSISTENT": True}
    # few rows (batch 1): small row tiles stay legal
    small = ChainSpec.gemm(16, 768, 768)
    assert gemm_template.gemm_legality(small, next(iter(build_search_space(
        small, H100.smem_per_block).candidates()))) is None
