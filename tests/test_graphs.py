"""StageInputs: kernels reading model inputs no longer cut TVM's CUDA graphs."""

from __future__ import annotations

import pytest
import tvm
import tvm_stitch.passes
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T
from tvm_stitch.passes import StageInputs

import tvm_stitch
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
GRAPHS = {"relax.backend.use_cuda_graph": True}


@I.ir_module
class Before:
    @T.prim_func(private=True, s_tir=True)
    def add(a: T.Buffer((4, 8), "float16"), m: T.Buffer((4, 8), "float16"),
            out: T.Buffer((4, 8), "float16")):
        for i, j in T.grid(4, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = a[vi, vj] + m[vi, vj]

    @R.function
    def main(x: R.Tensor((4, 8), "float16"), mask: R.Tensor((4, 8), "float16"),
             w: R.Tensor((4, 8), "float16")) -> R.Tensor((4, 8), "float16"):
        R.func_attr({"num_input": 2})
        cls = Before
        with R.dataflow():
            y = R.call_tir(cls.add, (w, mask), out_ty=R.Tensor((4, 8), "float16"))
            z = R.call_tir(cls.add, (y, mask), out_ty=R.Tensor((4, 8), "float16"))
            R.output(z)
        return z


@I.ir_module
class Expected:
    @T.prim_func(private=True, s_tir=True)
    def add(a: T.Buffer((4, 8), "float16"), m: T.Buffer((4, 8), "float16"),
            out: T.Buffer((4, 8), "float16")):
        for i, j in T.grid(4, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = a[vi, vj] + m[vi, vj]

    @T.prim_func(s_tir=True)
    def stage_input_0(x: T.Buffer((4, 8), "float16"), staged: T.Buffer((4, 8), "float16")):
        T.func_attr({"global_symbol": "stage_input_0", "op_pattern": 0, "tirx.noalias": True})
        for i0, i1 in T.grid(4, 8):
            with T.sblock("staged"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                staged[v_i0, v_i1] = x[v_i0, v_i1]

    @R.function
    def main(x: R.Tensor((4, 8), "float16"), mask: R.Tensor((4, 8), "float16"),
             w: R.Tensor((4, 8), "float16")) -> R.Tensor((4, 8), "float16"):
        R.func_attr({"num_input": 2})
        cls = Expected
        with R.dataflow():
            mask_staged = R.call_tir(cls.stage_input_0, (mask,),
                                     out_ty=R.Tensor((4, 8), "float16"))
            y = R.call_tir(cls.add, (w, mask_staged), out_ty=R.Tensor((4, 8), "float16"))
            z = R.call_tir(cls.add, (y, mask_staged), out_ty=R.Tensor((4, 8), "float16"))
            R.output(mask_staged, z)
        return z


def test_an_input_read_by_kernels_is_copied_first():
    """The mask (an input) is copied once; the weight (after ``num_input``) and the unread
    input ``x`` are left alone."""
    with tvm.transform.PassContext(config=GRAPHS):
        after = StageInputs()(Before)
    tvm.ir.assert_structural_equal(after, Expected)


def test_nothing_changes_without_cuda_graphs():
    tvm.ir.assert_structural_equal(StageInputs()(Before), Before)


def _graph_regions(mod, func: str = "forward", **options) -> int:
    """CUDA graphs the stitch pipeline's executable replays in ``func`` (its last passes are
    TVM's)."""
    with tvm.transform.PassContext(config=GRAPHS):
        lowered = tvm_stitch.pipeline(CUDA, **options)(mod)
    return lowered[func].script().count("vm.builtin.cuda_graph.run_or_capture")


@pytest.mark.slow
def test_bert_runs_in_one_cuda_graph(tmp_path, monkeypatch):
    """HF BERT's attention kernels read the additive padding mask, an input of the imported
    model: without the copies the CUDA graph is cut at the second layer's attention (2 regions
    for 2 layers); with them, one graph.  The nn BERT's attention reads the mask its one small
    kernel computes from the input (materialized: every layer reads it), so it is one graph
    either way."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    hf = get_workload("hf-bert-tiny").instance("float16", batch=2, seq=67)
    nn_bert = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    assert _graph_regions(hf.mod, hf.func) == 1
    assert _graph_regions(nn_bert.mod, nn_bert.func) == 1
    monkeypatch.setattr(tvm_stitch.passes, "StageInputs", lambda: tvm.transform.module_pass(
        lambda mod, _ctx: mod, opt_level=0, name="Unstaged"))
    assert _graph_regions(hf.mod, hf.func) == 2
    assert _graph_regions(nn_bert.mod, nn_bert.func) == 1


def test_lifted_bert_runs_in_one_cuda_graph(tmp_path, monkeypatch):
    """With the weights' transform lifted out, ``forward`` still replays one graph: the input
    copies come after lifting, which would otherwise make them dataflow bindings that TVM's
    RewriteDataflowReshape turns back into views of the inputs (BERT-base: four graphs)."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    assert _graph_regions(inst.mod, lift_params=True) == 1
