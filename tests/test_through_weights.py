"""A normalization folded through a GEMM's weights: the algebra on element expressions (numpy),
what recognition makes of BERT's LayerNorms, and what the pass binds."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_stitch.analysis.elem import Const, Leaf, Op, evaluate
from tvm_stitch.analysis.indexing import new_var
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.analysis.through_weights import NotAffineError, affine_parts
from tvm_stitch.analysis.weights import weight_tensors
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.report import fusion_report
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
M, K = 5, 7
m, k = new_var("m"), new_var("k")
x = Leaf("x", (m, k), "float16")
mu, rstd = Leaf("mu", (m,), "float32"), Leaf("rstd", (m,), "float32")
gamma, beta = Leaf("gamma", (k,), "float16"), Leaf("beta", (k,), "float16")


def f32(e):
    return Op("cast", (e,), "float32")


def f16(e):
    return Op("cast", (e,), "float16")


def mul(a, b, dtype="float32"):
    return Op("mul", (a, b), dtype)


def add(a, b, dtype="float32"):
    return Op("add", (a, b), dtype)


def sub(a, b, dtype="float32"):
    return Op("sub", (a, b), dtype)


VALUES = {
    name: np.random.default_rng(i).standard_normal(shape).astype("float32")
    for i, (name, shape) in enumerate({"x": (M, K), "mu": (M,), "rstd": (M,), "gamma": (K,),
                                       "beta": (K,), "w": (M, K)}.items())
}


def _value(elem):
    """``elem`` evaluated over the (m, k) grid."""
    coords = {"m": np.arange(M)[:, None], "k": np.arange(K)[None, :]}

    def read(leaf):
        names = [str(i) for i in leaf.index]
        return VALUES[leaf.tensor][tuple(coords[n] for n in names)]

    return np.broadcast_to(evaluate(elem, coords, read), (M, K)).astype("float64")


def _check(prologue):
    r, g, consts = affine_parts(prologue, x, k)
    rebuilt = mul(mul(r, g), f32(x))
    for c, h in consts:
        rebuilt = add(rebuilt, mul(c, h))
    # the prologue rounds to float16 where the model did; the rebuilt form does not
    np.testing.assert_allclose(_value(rebuilt), _value(prologue), rtol=2e-3, atol=2e-3)
    return r, g, consts


def test_layernorm_as_tvm_legalizes_it():
    """``float16((x - μ)·rstd)·γ + β`` (the cast in the middle is TVM's): one row factor on
    ``x`` (rstd) with γ, and two constant terms (-μ·rstd with γ, 1 with β)."""
    ln = add(mul(f16(mul(sub(f32(x), mu), rstd)), gamma, "float16"), beta, "float16")
    _, g, consts = _check(ln)
    assert {leaf.tensor for leaf in _leaves(g)} == {"gamma"}
    assert sorted(sorted(leaf.tensor for leaf in _leaves(h)) for _, h in consts) == [
        ["beta"], ["gamma"]]


def test_rmsnorm_and_one_plus_gamma():
    """RMSNorm has no constant term; Gemma's ``(1 + γ)`` is one column factor (two terms of
    the same row factor added)."""
    _, _, consts = _check(mul(gamma, f16(mul(f32(x), rstd)), "float16"))
    assert consts == []
    _, g, consts = _check(mul(f16(mul(f32(x), rstd)), add(Const(1.0, "float16"), gamma,
                                                          "float16"), "float16"))
    assert consts == [] and {leaf.tensor for leaf in _leaves(g)} == {"gamma"}


def test_what_is_not_folded():
    """``x`` squared or inside another function, and a coefficient varying with both the row
    and ``k``, cannot be split into scaled weights and row factors."""
    with pytest.raises(NotAffineError, match="squared"):
        affine_parts(mul(f32(x), f32(x)), x, k)
    with pytest.raises(NotAffineError, match="not a polynomial"):
        affine_parts(Op("erf", (f32(x),), "float32"), x, k)
    with pytest.raises(NotAffineError, match="varies with the row and k"):
        affine_parts(mul(f32(x), Leaf("w", (m, k), "float32")), x, k)
    with pytest.raises(NotAffineError, match="different row factors"):
        affine_parts(add(mul(f32(x), rstd), mul(mul(f32(x), mu), gamma)), x, k)


def _leaves(e):
    from tvm_stitch.analysis.elem import leaves

    return leaves(e)


def test_bert_norms_through_the_weights(tmp_path, monkeypatch):
    """BERT-tiny, two layers: the attention block's LayerNorm reaches FFN-in through its
    weights (one scaled weight, two column sums: γ and β), FFN-out through its residual; the
    second layer's Q/K/V likewise; the embeddings' LayerNorm (its input a sum of three
    lookups, read modulo the sequence) and the model's last (its output) stay kernels."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=19)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    found = recognize(graph, fold_norms=True, weights=weight_tensors(graph, mod[inst.func]))
    through = [mt for mt in found.matches if mt.derived]
    assert len(through) == 3  # FFN-in of both layers, Q/K/V of the second
    for mt in through:
        assert mt.prologue is None
        kinds = sorted(d.kind for d in mt.derived)
        products = sum(len(s.products) for s in mt.segments)
        assert kinds == ["colsum"] * 2 * products + ["scaled"] * products
        scaled = {d.name for d in mt.derived if d.kind == "scaled"}
        assert {b.tensor for s in mt.segments for _, b in s.products} == scaled
        assert graph.tensors[mt.accesses["a"].tensor].dtype == "float16"
    assert "normalization not folded" in dict(found.rejected)["layer_norm"]
    lifted = fusion_report(inst.mod, CUDA, lift_params=True)
    folded = fusion_report(inst.mod, CUDA, lift_params=True, fold_norms=True)
    assert lifted.kernels - folded.kernels == 3


def test_derived_weights_are_made_once(tmp_path, monkeypatch):
    """With ``lift_params`` the scaled weights and column sums are computed in
    ``forward_transform_params`` (once), and ``forward`` takes them as weights."""
    from tvm_stitch.report import fused_module

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", layers=1)
    mod = fused_module(inst.mod, CUDA, lift_params=True, fold_norms=True)
    transform = mod[f"{inst.func}_transform_params"].script()
    forward = mod[inst.func]
    assert "R.call_tir(scaled_float16_512x128_" in transform
    assert transform.count("R.call_tir(colsum_float32_512_") == 2  # γ and β
    assert "scaled_float16" not in forward.script() and "colsum_float32" not in forward.script()
    params = [p.name for p in forward.params]
    assert any("__scaled_" in p for p in params) and any("__colsum_" in p for p in params)


@pytest.mark.parametrize("axis", [0, 1], ids=["k-by-n", "n-by-k"])
def test_derived_weights_against_numpy(axis):
    """The scaled weight (float16, ``B``'s layout) and the weighted column sums (float32) of
    an irregular weight, for both layouts, with a column factor ``1 + γ`` (Gemma's)."""
    from tvm_stitch.analysis.through_weights import DerivedWeight
    from tvm_stitch.codegen.derived import derived_weight_func

    kk, n = 37, 23
    rng = np.random.default_rng(1)
    shape = (kk, n) if axis == 0 else (n, kk)
    w = rng.standard_normal(shape).astype("float16")
    g = rng.standard_normal(kk).astype("float16")
    column = add(Const(1.0, "float32"), f32(Leaf("g", (k,), "float16")))
    shapes = {"w": (shape, "float16"), "g": ((kk,), "float16")}
    wk = w.astype("float64") if axis == 0 else w.astype("float64").T  # (k, n)
    factor = 1.0 + g.astype("float64")
    for kind, dshape, dtype, want in [
        ("scaled", shape, "float16", (factor[:, None] * wk) if axis == 0
         else (factor[:, None] * wk).T),
        ("colsum", (n,), "float32", (factor[:, None] * wk).sum(axis=0)),
    ]:
        d = DerivedWeight("d", kind, "w", axis, column, k, dshape, dtype)
        func = derived_weight_func(d, shapes)
        ex = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
        out = tvm.runtime.tensor(np.zeros(dshape, dtype))
        ex["main"](tvm.runtime.tensor(w), tvm.runtime.tensor(g), out)
        np.testing.assert_allclose(out.numpy().astype("float64"), want, rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize(("batch", "seq", "chunk"), [(1, 19, 16), (8, 512, 32)])
def test_moment_pieces_follow_the_rows(batch, seq, chunk):
    """A producer of many rows sums a row's moments over wider chunks of columns (fewer pieces
    for each reader tile to load), one of few rows over 16; its column tiles are whole pieces.
    BERT-tiny's rows are 128 wide: at 4096 rows, 32-column pieces leave 256 tiles of 64×32."""
    from tvm_stitch.explore.tiling import Candidate, ChainSpec
    from tvm_stitch.families.gemm.recognize import moment_chunk
    from tvm_stitch.families.gemm.template import GEMM_MAX_TILE
    from tvm_stitch.families.gemm.tune import legality

    assert (moment_chunk(128, 768), moment_chunk(1024, 768), moment_chunk(4096, 768)) == (
        16, 32, 128)
    inst = get_workload("bert-tiny").instance("float16", batch=batch, seq=seq)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    found = recognize(graph, fold_norms=True, weights=weight_tensors(graph, mod[inst.func]))
    writers = [mt for mt in found.matches if any(o.chunk for o in mt.all_outputs)]
    readers = [mt for mt in found.matches if mt.statistics]
    assert writers and readers
    for mt in writers:
        assert {o.chunk for o in mt.all_outputs if o.chunk} == {chunk}
        ext = mt.frame.extents
        spec = ChainSpec.gemm(ext["m"], ext["n"], ext["k"], dtype_bytes=2)
        legal = [n for n in (16, 32, 64, 128, GEMM_MAX_TILE) if legality(
            mt, spec, Candidate("mnk", (("m", 64), ("n", n), ("k", 64)))) is None]
        assert legal == [n for n in (16, 32, 64, 128, GEMM_MAX_TILE) if n % chunk == 0]
    for mt in readers:  # one piece of each moment per chunk of the row
        assert {r.extent for r in mt.statistics} == {128 // chunk}
