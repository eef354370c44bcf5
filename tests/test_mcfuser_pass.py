"""The MCFuser Relax pass: Linear layers (+ GELU / + residual) become one kernel call each."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi
from tvm_stitch.passes import FuseLinearTriton

import tvm_stitch
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _te_builder(calls):
    """Stands in for the Triton PrimFunc on a CPU: same signature, same math, in TE."""

    def build(m, n, k, dtype, has_res, gelu, config, num_warps=4):
        calls.append((m, n, k, has_res, gelu, config["BLOCK_M"]))
        x = te.placeholder((m, k), dtype, "x")
        w = te.placeholder((n, k), dtype, "w")
        b = te.placeholder((n,), dtype, "b")
        y = topi.nn.dense(x, w, b, out_dtype="float32")
        if gelu:
            y = topi.multiply(topi.multiply(y, 0.5), topi.add(topi.erf(y * 0.7071067811865476), 1))
        ins = [x, w, b]
        if has_res:
            r = te.placeholder((m, n), dtype, "r")
            ins.append(r)
            y = topi.add(y, topi.cast(r, "float32"))
        return te.create_prim_func([*ins, topi.cast(y, dtype)]), []

    return build


@pytest.fixture
def database(tmp_path):
    db = TuningDatabase(tmp_path / "tuning.json")
    for shape in [(38, 128, 128), (38, 512, 128), (38, 128, 512)]:
        db.put(
            db.key("gemm", shape, "float32", "sm_90"), {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32}
        )
    return db


def test_linear_layers_become_single_calls(database):
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=19)
    calls = []
    with CUDA:
        out = FuseLinearTriton(database, _te_builder(calls))(inst.mod)
    kinds = sorted({c[3:5] for c in calls})
    # QKV and FFN-in without epilogue/with GELU, attention-out and FFN-out with the residual
    assert kinds == [(False, 0), (False, 1), (True, 0)]
    assert len(calls) == 4  # one PrimFunc per distinct (shape, epilogue); layers share them
    text = out["forward"].script()
    assert text.count("R.call_tir(stitch_linear_") == 12  # 2 layers x 6 Linear layers
    assert "R.nn.gelu" not in text  # every GELU went into a GEMM epilogue
    before = tvm_stitch.fusion_report(inst.mod, "llvm", "default")
    after = tvm_stitch.fusion_report(out, "llvm", "default")
    assert after.kernels == before.kernels - 10  # bias-adds, GELUs, residual adds fused away
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm["forward"](*[tvm.runtime.tensor(a) for a in inst.args]).numpy()
    np.testing.assert_allclose(got, inst.reference()[0], *inst.tolerance)


def test_no_gpu_means_no_rewrite(caplog):
    from tvm_stitch.codegen.embed import can_embed

    if can_embed()[0]:
        pytest.skip("this machine can embed Triton kernels")
    inst = get_workload("bert-tiny").instance("float32", batch=1, seq=8)
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseLinearTriton()(inst.mod)
    tvm.ir.assert_structural_equal(out, inst.mod)
    assert "Triton GEMMs not used" in caplog.text


def test_illegal_linear_is_left_alone(database, caplog):
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    w = relax.Var("w", R.Tensor((6, 8), "float32"))
    b = relax.Var("b", R.Tensor((4, 6), "float32"))  # a 2-D "bias" is not a Linear layer's
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, relax.op.permute_dims(w)), b))
        bb.emit_func_output(out)
    mod = bb.get()
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseLinearTriton(database, _te_builder([]))(mod)
    tvm.ir.assert_structural_equal(out, mod)
    assert "left to TVM: not a Linear layer" in caplog.text


def test_corrupt_tuning_database_is_ignored(tmp_path, caplog):
    path = tmp_path / "tuning.json"
    path.write_text("{not json")
    with caplog.at_level("WARNING", logger="tvm_stitch.tune"):
        db = TuningDatabase(path)
    assert db.records == {} and "ignored" in caplog.text
    db.put("k", {"BLOCK_M": 64})
    assert TuningDatabase(path).get("k")["config"] == {"BLOCK_M": 64}
    path.write_text('{"version": 99, "records": {}}')
    assert TuningDatabase(path).records == {}


@pytest.mark.gpu
def test_triton_linear_layers_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=64)
    fused = tvm_stitch.report.fused_module(inst.mod, CUDA, "stitch")
    names = [gv.name_hint for gv in fused.functions if gv.name_hint.startswith("stitch_linear")]
    assert len(names) == 4 and "external_mods" in fused.attrs
    assert TuningDatabase(tmp_path / "db.json").records  # the search ran and was kept
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    vm = relax.VirtualMachine(ex, tvm.cuda(0))
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=tvm.cuda(0)) for a in inst.args]).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)
