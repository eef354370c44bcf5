"""Gate and up projections over one interleaved weight (issue 49, item 1): a GEMM of two
products sharing ``A`` (SwiGLU's gate × up) reads both weights from one tensor whose rows take
turns, joined once when the weights load (``lift_params``) or at compile time (bound
constants), and computes one product of twice the columns, split after the product loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_stitch.benchmarks.harness import bound as bound_weights
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.analysis.weights import interleave, pair_weights, weight_tensors
from tvm_stitch.codegen import triton_gen
from tvm_stitch.codegen.te_reference import reference_func
from tvm_stitch.families.gemm.gluon import ws_legality
from tvm_stitch.families.gemm.triton import tma_descriptors
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.report import fused_module
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _gate_up(dtype="float16", **params):
    inst = get_workload("llama-tiny").instance(dtype, layers=1, **params)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    (match,) = [m for m in recognize(graph).matches
                if m.family == "gemm" and len(m.segments[0].products) == 2]
    return inst, mod, graph, match


def test_the_paired_views_read_every_second_row_of_one_tensor():
    """The gate's row j is the joined tensor's row 2j, the up's 2j + 1; a GEMM whose products'
    B are not two weights keeps its two products."""
    inst, mod, graph, match = _gate_up()
    weights = weight_tensors(graph, mod[inst.func])
    missing, why = pair_weights(match, set())
    assert missing is None and "weights" in why
    paired, joined = pair_weights(match, weights)
    n, k = match.segments[0].n, match.frame.extents["k"]
    assert joined.interleaved and joined.shape == (2 * n, k) and paired.paired
    gate, up = paired.views["b0.0"], paired.views["b0.1"]
    assert (gate.offset, up.offset) == (0, k) and gate.tensor == up.tensor == joined.name
    assert max(s for _, s in gate.strides) == 2 * k
    assert "2 products interleaved" in paired.describe()
    rows = np.arange(2 * 3 * 4).reshape(2, 3, 4)
    np.testing.assert_array_equal(interleave([rows[0], rows[1]], 0)[1::2], rows[1])
    np.testing.assert_array_equal(interleave([rows[0], rows[1]], 1)[:, ::2], rows[0][:, :4])


def test_a_paired_kernel_is_one_product_split_after_the_loop():
    """The plain and the persistent (TMA) forms each run one product over 2 × BLOCK_N rows of
    the joined weight (its descriptor's box twice BLOCK_N rows) and split it."""
    inst, mod, graph, match = _gate_up()
    paired, _ = pair_weights(match, weight_tensors(graph, mod[inst.func]))
    text = triton_gen.kernel_source(paired).text
    assert "= _tile_product2(" not in text and "acc = _tile_product(" in text
    assert text.count("acc0, acc1 = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))") == 2
    assert "_tile_product_tma(tl.zeros((BLOCK_M, 2 * BLOCK_N)" in text
    b_desc = tma_descriptors(paired)[1]
    assert b_desc.rows == 2 * match.segments[0].n and b_desc.block({"BLOCK_N": 64,
                                                                   "BLOCK_K": 32}) == [128, 32]
    assert ws_legality(paired) is None
    assert "= _tile_product2(" in triton_gen.kernel_source(match).text  # unpaired: two products


def test_paired_kernels_under_the_interpreter(tmp_path):
    """The paired kernel (plain, persistent, TMA stores, split k in 2 and 3) under Triton's
    interpreter gives what the two products give (its TE reference)."""
    pytest.importorskip("triton")
    script = Path(__file__).with_name("generated_interpret_cases.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TVM_STITCH_CACHE": str(tmp_path)}
    res = subprocess.run([sys.executable, str(script),
                          "llama-tiny:float16:seq=37,layers=1,only=2 products"],
                         capture_output=True, text=True, env=env, check=False, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    joined = [r for r in records if "joined weights" in r["case"]]
    assert len(joined) == 5 and all(r["ok"] for r in records), records


def _reference_builder(calls):
    def build(match, source, config, shapes):
        calls.append(match)
        return reference_func(match, source, shapes), []

    return build


@pytest.mark.parametrize("bound", [False, True])
def test_interleaved_weights_give_the_models_numbers_on_llvm(tmp_path, bound):
    """FuseMBCI with ``lift_params`` binds the interleave (a TE function of the two weights,
    for ``LiftTransformParams`` to move out); weights bound as constants are interleaved at
    compile time. Either way the module, its kernels as their TE references, gives PyTorch's
    numbers on llvm."""
    inst = get_workload("llama-tiny").instance("float32", layers=1, seq=19)
    if bound:
        inst = bound_weights(inst)
    mod, args = inst.mod, inst.args
    calls = []
    with CUDA:
        out = FuseMBCI(TuningDatabase(tmp_path / "t.json"), _reference_builder(calls),
                       tune="model", lift_params=not bound)(run_until(mod, CUDA,
                                                                      "StitchFuseMBCI"))
    assert [m.paired for m in calls].count(True) == 1
    script = out.script()
    assert ("pair_float32_0_" in script) != bound
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())[inst.func](
        *[tvm.runtime.tensor(a) for a in args]).numpy()
    np.testing.assert_allclose(got, inst.reference()[0], *inst.tolerance)


def test_from_torch_lifts_the_interleave(tmp_path, monkeypatch):
    """With ``lift_params`` (``from_torch``'s default on CUDA) the interleave runs in
    ``<entry>_transform_params``, once, and the gate × up kernel takes one weight of twice the
    rows."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("llama-tiny").instance("float16", layers=1)
    lifted = fused_module(inst.mod, CUDA, lift_params=True)
    transform = lifted[f"{inst.func}_transform_params"].script()
    assert "pair_float16_0_" in transform
    assert "pair_" not in lifted[inst.func].script()



def test_the_warp_specialized_form_of_a_pair_compiles_for_hopper():
    """The Gluon form of the paired GEMM: one ``m64n128`` wgmma a k step for 64 output columns
    (gate and up in turn), or one ``m64n256`` for 128 (the wide seed, LLaMA-3-8B's fastest),
    split in registers and brought to the epilogue's layout, no spills; the search seeds it
    at half the column tile of the others, and an epilogue partition is not offered (two
    products to stage)."""
    import re

    from tvm_stitch.benchmarks.harness import generated_gemms, ptxas_report

    from tvm_stitch.codegen import embed
    from tvm_stitch.codegen.kernel_text import gluon_version
    from tvm_stitch.families.gemm.gluon import staging_legality
    from tvm_stitch.families.gemm.gluon_launch import ws_config
    from tvm_stitch.families.gemm.tune import options

    if gluon_version():
        pytest.skip(gluon_version())
    (found,) = [g for g in generated_gemms("llama-tiny", "float16", joined=True, layers=1,
                                           seq=256) if g[0].paired]
    match, source, shapes, _ = found
    assert source.ws is not None and "two products" in staging_legality(match)
    _, seeds = options(match, source, True)
    assert {s["n"] for s in seeds if s["launch"].get("WS")} == {64, 128}
    assert not any(s["launch"].get("EW") for s in seeds)
    for n, slots in ((64, 5), (128, 3)):
        config = {**ws_config(2, n, 64, slots), "NUM_SMS": 132}
        ptx = embed.generated_launch(source, match, config, shapes).ptx
        assert set(re.findall(r"wgmma.mma_async\S*m64n(\d+)", ptx)) == {str(2 * n)}
        assert "spill stores 0" in ptxas_report(ptx)


def test_a_pair_takes_column_tiles_of_at_most_128():
    """A paired GEMM's product is twice its column tile: at most 256 columns (one wgmma, one
    TMA box), so column tiles above 128 are illegal for it and legal for its two products."""
    from types import SimpleNamespace

    from tvm_stitch.families.gemm.tune import space

    inst, mod, graph, match = _gate_up()
    paired, _ = pair_weights(match, weight_tensors(graph, mod[inst.func]))
    cand = SimpleNamespace(tile_dict={"m": 16, "n": 256, "k": 32})
    assert "512 columns" in space(paired).legal(cand)
    assert "512 columns" not in (space(match).legal(cand) or "")
