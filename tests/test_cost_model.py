"""The cost model that ranks generated kernels (issue 11): its terms, its fit on tuning databases
recorded on the H100, and its use by the search without a GPU.

``data/h100-tuning-*.json`` are tuning databases written by BERT-base compiles on the H100
(``benchmarks/run_gpu.sh OUT bert:1x128``, ``bert:8x512 bert:32x128``; ``-norms``: the GEMMs of
a 1×128 compile with ``fold_norms``; ``-attention-4x16x512``: the plain-PyTorch attention
workload at head dims 64 and 128, with and without a causal mask, TMA loads searched;
``-8x512-gemms``: the four GEMMs of BERT-base at 4096 tokens as generated since their persistent
form reads through host-made descriptors): every candidate the search measured, with its tiles,
launch and time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import tvm

from tvm_stitch.cost.model import CostModel, Workload, analytical, samples, spearman, terms
from tvm_stitch.explore.tiling import ChainSpec
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.tune.measure import measured_search

HW = HardwareModel.from_target(tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
DATA = Path(__file__).parent / "data"
SMALL, LARGE = "h100-tuning-bert-base-1x128.json", "h100-tuning-bert-base-8x512-32x128.json"
ATTENTION = "h100-tuning-attention-4x16x512.json"
NORMS = "h100-tuning-bert-base-1x128-norms.json"  # GEMMs with LayerNorms folded in, and not
GEMMS_8X512 = "h100-tuning-bert-base-8x512-gemms.json"  # the four GEMMs, host-made descriptors
GLUON_8X512 = "h100-tuning-bert-base-8x512-gluon.json"  # the same with the Gluon forms measured
FFN2 = Workload("gemm", {"m": 4096, "n": 768, "k": 3072}, persistent=True)


def _records(name):
    return json.loads((DATA / name).read_text())["records"]


def _warp_specialized_searches(name) -> list:
    """``(record, measurements, analytical predictions)`` of each recorded search in ``name``,
    each of which measured a warp-specialized form (failed measurements left out)."""
    out = []
    for rec in _records(name).values():
        held = [s for s in samples({"r": rec}) if math.isfinite(s[3])]
        assert any(la.get("WS") for _, _, la, _ in held)
        out.append((rec, held, [analytical(w, t, la, HW) for w, t, la, _ in held]))
    return out


def _launch(warps=8, stages=3, persistent=False):
    return {"num_warps": warps, "num_stages": stages, "PERSISTENT": persistent}


def test_spearman_matches_scipy_with_ties():
    scipy = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    a = rng.integers(0, 5, 40).astype(float)
    b = a + rng.normal(0, 2, 40)
    assert spearman(a, b) == pytest.approx(scipy.spearmanr(a, b).correlation)
    assert math.isnan(spearman([1, 2], [2, 1]))
    assert spearman([1, 2, 3, math.inf], [3, 2, 1, 0]) == pytest.approx(-1.0)


def test_accumulators_beyond_the_registers_spill():
    """128x256 fp32 accumulators are 256 registers a thread with 4 warps (over 255: spills,
    ~8x slower on the H100) and 128 with 8 warps."""
    tiles = {"m": 128, "n": 256, "k": 64}
    four, eight = (terms(FFN2, tiles, _launch(w), HW) for w in (4, 8))
    assert four["spill"] > 0 and eight["spill"] == 0
    assert four["time"] > 3 * eight["time"]


def test_a_warpgroup_takes_64_rows():
    tiles = {"m": 64, "n": 128, "k": 64}
    assert terms(FFN2, tiles, _launch(4), HW)["row_use"] == 1.0
    assert terms(FFN2, tiles, _launch(8), HW)["row_use"] == 0.5  # two warpgroups of 32 rows


def test_short_k_tiles_pay_per_iteration():
    """BLOCK_K 16 runs four times the main-loop iterations of 64 (measured 62 vs 34 µs for
    BERT's Q/K/V at 4096 tokens; the model sees the direction, not the size: ~1.1x)."""
    w = Workload("gemm", {"m": 4096, "n": 2304, "k": 768})
    t16, t64 = (terms(w, {"m": 128, "n": 128, "k": k}, _launch(), HW) for k in (16, 64))
    assert t16["iters"] == 4 * t64["iters"]
    assert t16["time"] > t64["time"]


def test_stages_that_do_not_fit_are_priced_as_built():
    """Four stages of 128x256x128 tiles need 384 KiB: the pass builds them with two; one stage
    serializes loads and products."""
    tiles = {"m": 128, "n": 256, "k": 128}
    assert analytical(FFN2, tiles, _launch(stages=4), HW) == analytical(
        FFN2, tiles, _launch(stages=2), HW
    )
    assert analytical(FFN2, tiles, _launch(stages=1), HW) > analytical(
        FFN2, tiles, _launch(stages=2), HW
    )


def test_waves_quantize():
    """4096x768: 96 tiles of 128x256 fill one wave of 132 SMs; 256x256 leaves half the SMs idle
    and 64x64 runs 768 tiles over several waves."""
    t = {
        (m, n): terms(FFN2, {"m": m, "n": n, "k": 64}, _launch(), HW)
        for m, n in ((128, 256), (64, 64))
    }
    assert t[128, 256]["waves"] == 1 and t[64, 64]["waves"] > 1


def test_analytical_model_ranks_the_recorded_compiles():
    """Over every measured candidate of each recorded BERT-base compile (pooled), the analytical
    model alone ranks with Spearman >= 0.8 (the first MCFuser model's: -0.65…0.39 per kernel)."""
    for name in (SMALL, LARGE):
        pred, meas = [], []
        for w, tiles, launch, seconds in samples(_records(name), "sm_90"):
            if math.isfinite(seconds):
                pred.append(analytical(w, tiles, launch, HW))
                meas.append(seconds)
        assert len(meas) > 100
        assert spearman(pred, meas) >= 0.8, name


def test_row_statistics_are_priced():
    """A compile with the LayerNorms folded into the GEMMs (``fold_norms``; recorded on the
    H100): the model ranks its kernels only because it prices the statistics each program reads
    (Spearman 0.84 pooled; 0.41 with the term left out)."""
    held = [s for s in samples(_records(NORMS), "sm_90") if math.isfinite(s[3])]
    assert sum(1 for w, *_ in held if w.row_elements) > 100
    meas = [s[3] for s in held]
    pred = [analytical(w, t, la, HW) for w, t, la, _ in held]
    blind = [analytical(dataclasses.replace(w, row_elements=0), t, la, HW) for w, t, la, _ in held]
    assert spearman(pred, meas) >= 0.8
    assert spearman(blind, meas) < 0.6


def test_corrected_model_fits_held_out_compiles():
    """The correction learned on one recorded compile keeps ranking the other (held out) at
    Spearman >= 0.8, and it fits its own training data better than the analytical model."""
    pytest.importorskip("xgboost")
    for train, test in ((SMALL, LARGE), (LARGE, SMALL)):
        model = CostModel(HW)
        assert model.fit(samples(_records(train), "sm_90"))
        assert model.fitted_on > 100
        held = [s for s in samples(_records(test), "sm_90") if math.isfinite(s[3])]
        pred = [model.predict(w, t, la) for w, t, la, _ in held]
        assert spearman(pred, [s for *_, s in held]) >= 0.8, test
        own = [s for s in samples(_records(train), "sm_90") if math.isfinite(s[3])]
        err_fit = [abs(math.log(model.predict(w, t, la) / s)) for w, t, la, s in own]
        err_ana = [abs(math.log(analytical(w, t, la, HW) / s)) for w, t, la, s in own]
        assert np.mean(err_fit) < 0.5 * np.mean(err_ana)


def test_too_few_measurements_leave_the_analytical_model():
    model = CostModel(HW)
    some = samples(_records(SMALL), "sm_90")[:10]
    assert not model.fit(some)
    tiles = {"m": 128, "n": 256, "k": 64}
    assert model.predict(FFN2, tiles, _launch()) == analytical(FFN2, tiles, _launch(), HW)
    assert samples(_records(SMALL), "sm_80") == []  # another GPU's measurements are not used


def test_model_only_search_chooses_the_launch():
    """Without a GPU the model prices every candidate at its best launch: BERT's FFN2 at 4096
    tokens gets 128x256-class tiles with 8 warps (their 4-warp default spills), the launch the
    model prices lowest; nothing is launched."""
    from tvm_stitch.families.gemm import template as gemm_template

    spec = ChainSpec.gemm(4096, 768, 3072)
    launches = [_launch(w, s, p) for w in (4, 8) for s in (3, 4) for p in (False, True)]
    tuned = measured_search(
        spec,
        HW,
        None,
        lambda c: gemm_template.gemm_legality(spec, c),
        launches=launches,
        default_launch=lambda c: _launch(4, 3),
        on_device=False,
        workload=FFN2,
    )
    tiles = tuned.result.best.tile_dict
    assert gemm_template.gemm_legality(spec, tuned.result.best) is None
    assert tiles["m"] * tiles["n"] >= 128 * 256 and tuned.launch["num_warps"] == 8
    prices = [analytical(FFN2, tiles, la, HW) for la in launches]
    assert tuned.time == pytest.approx(min(prices))
    assert min(prices) < analytical(FFN2, tiles, _launch(4, 3), HW)
    assert tuned.measurements == []


def test_device_made_tensor_descriptors_are_priced():
    """An attention launched with TMA loads makes three descriptors per program on the device
    (measured on the H100: 3-6 µs slower at 4×16×512): each wave pays their latency.  Over the
    recorded candidates of the four kernels the analytical model ranks with Spearman 0.63 on
    average (0.48 with TMA unpriced; 0.93 at head dim 64, 0.17 for d128's causal kernel)."""
    w = Workload("attention", {"m": 512, "n": 512, "k": 128, "h": 128}, batch=64)
    tiles = {"m": 64, "n": 64, "k": 128, "h": 128}
    plain = terms(w, tiles, {"num_warps": 4, "num_stages": 3, "TMA": False}, HW)
    tma = terms(w, tiles, {"num_warps": 4, "num_stages": 3, "TMA": True}, HW)
    latency = HW.mem_latency_cycles / HW.clock_hz
    assert tma["time"] - plain["time"] == pytest.approx(plain["waves"] * 3 * latency)
    rhos = []
    for rec in _records(ATTENTION).values():
        held = [s for s in samples({"r": rec}) if math.isfinite(s[3])]
        if any(la.get("TMA") for _, _, la, _ in held):
            rhos.append(spearman([analytical(w, t, la, HW) for w, t, la, _ in held],
                                 [s for *_, s in held]))
    assert len(rhos) == 4 and np.mean(rhos) >= 0.6


SPLIT = "h100-tuning-bert-base-1x128-split.json"  # the four GEMMs at 128 tokens, split-K offered


def test_split_k_is_priced():
    """Split-K: ``SPLIT_K`` times the programs over a k loop that many times shorter, plus each
    partial tile's round trip.  It pays for a long k over few tiles (BERT's FFN out at 128
    tokens), not for a large grid (4096 tokens).  On the H100's recorded searches at 128 tokens
    (split and unsplit candidates of the four GEMMs) the analytical model ranks at Spearman 0.84
    pooled, 0.82 for FFN out, whose favourite is within 1.07× of the best measured."""
    tiles = {"m": 64, "n": 32, "k": 256}
    small = Workload("gemm", {"m": 128, "n": 768, "k": 3072})
    one, two = (terms(small, tiles, {**_launch(4, 3), "SPLIT_K": s}, HW) for s in (1, 2))
    assert two["programs"] == 2 * one["programs"] and two["iters"] * 2 == one["iters"]
    assert two["time"] < one["time"]
    big = {"m": 128, "n": 128, "k": 64}
    assert (analytical(FFN2, big, {**_launch(), "SPLIT_K": 2}, HW)
            > analytical(FFN2, big, _launch(), HW))
    pooled_model, pooled_time = [], []
    for rec in _records(SPLIT).values():
        held = [s for s in samples({"r": rec}) if math.isfinite(s[3])]
        model = [analytical(w, t, la, HW) for w, t, la, _ in held]
        times = [s for *_, s in held]
        pooled_model += model
        pooled_time += times
        if rec["workload"]["extents"]["k"] == 3072:
            assert any(la.get("SPLIT_K", 1) > 1 for _, _, la, _ in held)
            assert spearman(model, times) >= 0.75
            assert times[int(np.argmin(model))] <= 1.15 * min(times)
    assert spearman(pooled_model, pooled_time) >= 0.8


WS_ATTENTION = "h100-tuning-attention-ws-4x16x512.json"  # d128, causal and not, WS measured


def test_warp_specialized_attention_is_priced():
    """The warp-specialized attention (launch ``WS``) takes 128 query rows (other tiles are
    infeasible) and hides a warpgroup's softmax behind the other's products: priced at the
    larger of the two, where the Triton form pays their sum.  On the recorded H100 searches at
    head dim 128 the model alone picks it, the measured best (19.7 and 21.5 µs against 22.1 and
    23.8 for the Triton form's best)."""
    w = Workload("attention", {"m": 512, "n": 512, "k": 128, "h": 128}, batch=64)
    ws = {"num_warps": 4, "num_stages": 2, "WS": True}
    assert analytical(w, {"m": 64, "n": 128, "k": 128, "h": 128}, ws, HW) == math.inf
    t = terms(w, {"m": 128, "n": 128, "k": 128, "h": 128}, ws, HW)
    triton = terms(w, {"m": 128, "n": 128, "k": 128, "h": 128},
                   {"num_warps": 8, "num_stages": 2}, HW)
    assert t["programs"] == triton["programs"] and t["comp"] == pytest.approx(triton["comp"])
    assert t["time"] < triton["time"]
    searches = _warp_specialized_searches(WS_ATTENTION)
    assert len(searches) == 2
    for _, held, pred in searches:
        pick = held[int(np.argmin(pred))]
        assert pick[2].get("WS") and pick[3] <= 1.05 * min(s for *_, s in held)


def test_tma_loads_and_short_rings_are_priced():
    """The TMA unit streams a persistent GEMM's tiles faster than the warps' own loads (BERT's
    FFN2, 128x256 tiles: 38.6 µs persistent against 44.5 with pointer loads on the H100), and
    a ring of 2 stages keeps one load in flight, busy for its latency and its transfer: wider
    k tiles in 2 stages are priced above 64-wide ones in 3 (measured 1.2-1.4x slower)."""
    tiles = {"m": 128, "n": 256, "k": 64}
    assert analytical(FFN2, tiles, _launch(8, 3, True), HW) < analytical(
        FFN2, tiles, _launch(8, 3, False), HW)
    wide = analytical(FFN2, {"m": 128, "n": 256, "k": 128}, _launch(8, 2, True), HW)
    assert wide > analytical(FFN2, tiles, _launch(8, 3, True), HW)


def test_warp_specialized_gemm_is_priced():
    """A Gluon GEMM (launch ``WS`` consumers of 64 rows, ``EW`` epilogue warps) is priced as
    it runs: tiles of 64 × WS rows (BERT's out-projection in 192 × 128 tiles: 132 programs, one
    wave), persistent with TMA loads, its output staged in shared memory, and with an epilogue
    partition each tile's epilogue behind the next tile's products.  On the recorded H100
    searches of BERT's four GEMMs at 4096 tokens, where the Gluon forms are the measured best,
    the analytical model ranks each kernel's candidates with Spearman >= 0.7 (0.73-0.91;
    priced as Triton forms of 64-row tiles: 0.59-0.79) and picks a Gluon form within 3% of
    the best for Q/K/V (1.30x before); for the other three its favourite is still a Triton
    form, 7-26% slower."""
    w = Workload("gemm", {"m": 4096, "n": 768, "k": 768}, persistent=True)
    tiles = {"m": 64, "n": 128, "k": 64}
    three = terms(w, tiles, {"num_warps": 4, "num_stages": 4, "WS": 3}, HW)
    assert three["programs"] == 22 * 6 and three["row_use"] == 1.0
    ffn1 = Workload("gemm", {"m": 4096, "n": 3072, "k": 768}, persistent=True)
    ws2 = {"num_warps": 4, "num_stages": 5, "WS": 2}
    assert analytical(ffn1, tiles, {**ws2, "EW": 8}, HW) < analytical(ffn1, tiles, ws2, HW)
    searches = _warp_specialized_searches(GLUON_8X512)
    assert len(searches) == 4
    for rec, held, pred in searches:
        meas = [s for *_, s in held]
        assert spearman(pred, meas) >= 0.7, rec["workload"]["kernel"]
        if "3 bands" in rec["workload"]["kernel"]:
            pick = held[int(np.argmin(pred))]
            assert pick[2].get("WS") and pick[3] <= 1.05 * min(meas)


def test_model_favourites_on_the_bert_gemms():
    """On the recorded searches of BERT-base's four GEMMs at 4096 tokens (Q/K/V in three bands,
    out-projection, FFN1 + GELU, FFN2), the candidate the analytical model prices lowest —
    the slowest of any it ties with — measured within 15% of the best, and the model ranks
    the candidates with Spearman >= 0.8 pooled."""
    records = _records(GEMMS_8X512)
    assert len(records) == 4
    pred_all, meas_all = [], []
    for rec in records.values():
        held = [s for s in samples({"r": rec}) if math.isfinite(s[3])]
        pred = [analytical(w, t, la, HW) for w, t, la, _ in held]
        meas = [s for *_, s in held]
        tied = [m for p, m in zip(pred, meas) if p <= min(pred) * 1.0005]
        assert max(tied) <= 1.15 * min(meas), rec["workload"]["kernel"]
        pred_all += pred
        meas_all += meas
    assert spearman(pred_all, meas_all) >= 0.8


def test_float32_products_are_priced_on_the_cuda_cores():
    """Float32 kernels multiply in IEEE float32 (``DOT_PREC``): FMAs at the CUDA cores' rate,
    both operand tiles in registers.  A recorded float32 causal attention (d64, 8 query heads
    per K/V head): its 64×128 tiles spill and ran 11× slower than 64×16 — the model's
    favourite before, now priced as spilling; the favourite is within 1.3× of the best."""
    (record,) = _records("h100-tuning-attention-f32.json").values()
    w = Workload.from_dict(record["workload"])
    meas = [m for m in record["measurements"] if math.isfinite(m["time_s"])]
    pred = [analytical(w, m["tiles"], m["launch"], HW) for m in meas]
    favourite = meas[pred.index(min(pred))]
    assert favourite["time_s"] <= 1.3 * min(m["time_s"] for m in meas)
    wide = next(m for m in meas if m["tiles"]["n"] == 128 and m["tiles"]["m"] == 64)
    assert terms(w, wide["tiles"], wide["launch"], HW)["spill"] > 0
    half = dataclasses.replace(w, dtype_bytes=2)  # the same kernel in float16: wgmma, no spill
    assert terms(half, wide["tiles"], wide["launch"], HW)["spill"] == 0
    assert terms(half, wide["tiles"], wide["launch"], HW)["comp"] * 10 < terms(
        w, wide["tiles"], wide["launch"], HW)["comp"]


def test_close_candidates_are_timed_again_before_one_is_chosen():
    """``measure.confirm``: the candidates measured within 15% of the best (at most four,
    each (candidate, launch) once) are timed three times more in turns and the lowest median
    wins -- a lucky first timing, or one taken before the clock drifted down, does not pick;
    far ones are not timed again."""
    from tvm_stitch.tune.measure import confirm

    timed = [(10.0, "a", {"w": 4}), (11.3, "b", {"w": 4}), (10.2, "a", {"w": 4}),
             (10.4, "a", {"w": 8}), (10.45, "c", {"w": 4}), (11.4, "e", {"w": 4}),
             (12.0, "d", {"w": 4})]
    later = {("a", 4): [10.6, 10.5, 10.7], ("b", 4): [10.1, 10.2, 10.0],
             ("a", 8): [10.3, 10.4, 10.2], ("c", 4): [10.9, 10.8, 11.0]}
    calls = []

    def timer(cand, launch):
        calls.append((cand, launch["w"]))
        return later[cand, launch["w"]][sum(c == calls[-1] for c in calls) - 1]

    # b, timed 13% slower at first, is the fastest timed in turns
    assert confirm(timed, timer, ("a", {"w": 4}, 10.0)) == ("b", {"w": 4}, 10.1)
    # four contenders (e, fifth within 15%, is left out; d is 20% slower), in turns
    assert calls == [("a", 4), ("a", 8), ("c", 4), ("b", 4)] * 3
    calls.clear()
    assert confirm([(10.0, "a", {"w": 4}), (12.0, "d", {"w": 4})], timer,
                   ("a", {"w": 4}, 10.0)) == ("a", {"w": 4}, 10.0)
    assert calls == []


def test_a_measured_search_compiles_each_batch_of_candidates_before_timing_it(monkeypatch):
    """Item 4 of issue 48: the candidates a measured search times (each round's, the seeds,
    the launches refined) are handed to ``make_fn.prepare`` before the first of them is timed,
    so their kernels compile side by side on the host's cores; every timing finds its
    candidate prepared, and the choice is the timings' as without it."""
    from tvm_stitch.families.gemm import template as gemm_template
    from tvm_stitch.tune import measure as measure_mod

    spec = ChainSpec.gemm(4096, 768, 3072)
    prepared, timed, batches = set(), [], []

    def key(cand, launch):
        return cand, tuple(sorted(launch.items()))

    def seconds(cand, launch):  # a made-up device: larger tiles faster, 8 warps faster
        tiles = cand.tile_dict
        return 1e4 / (tiles["m"] * tiles["n"]) / launch["num_warps"] + tiles["k"] * 1e-3

    def make(cand, launch):
        timed.append(key(cand, launch))
        assert key(cand, launch) in prepared, "timed before it was compiled"
        return lambda: seconds(cand, launch)

    first_batch = set()

    def prepare(pairs):
        keys = [key(c, la) for c, la in pairs]
        if not batches:
            first_batch.update(keys)
        batches.append(len(pairs))
        assert not prepared.intersection(keys), "compiled ahead twice"
        prepared.update(keys)

    make.prepare = prepare
    monkeypatch.setattr(measure_mod, "time_torch", lambda fn, *a, **k: fn())
    launches = [_launch(w, 3) for w in (4, 8)]
    tuned = measured_search(
        spec, HW, make, lambda c: gemm_template.gemm_legality(spec, c), launches=launches,
        default_launch=lambda c: _launch(4, 3), workload=FFN2,
        seeds=[{"m": 64, "n": 64, "k": 64, "launch": _launch(8, 4)}])
    assert timed and set(timed) <= prepared
    assert max(batches) > 1  # rounds' candidates compiled together, not one at a time
    # the seed is compiled with the first round's candidates, not in a batch of its own
    seed = [k for k in timed if k[0].tile_dict == {"m": 64, "n": 64, "k": 64}
            and dict(k[1]) == _launch(8, 4)]
    assert seed and seed[0] in first_batch
    best = min(set(timed), key=lambda kl: seconds(kl[0], dict(kl[1])))
    assert (tuned.result.best, tuned.launch) == (best[0], dict(best[1]))
    # the search says where its time went: as many compiled ahead and timed as happened (the
    # last kernel made is the chosen one's runner, not timed)
    assert tuned.phases["compiled"] == sum(batches) and tuned.phases["timed"] == len(timed) - 1
    assert 0 <= tuned.phases["compile"] + tuned.phases["time"] <= tuned.seconds
