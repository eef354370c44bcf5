"""The stitch pipeline through ``tvm.compile``: numerics on llvm, a CUDA build without a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.report import cuda_source, fused_module, fusion_report
from tvm_stitch.workloads import get_workload


def _run(ex, inst, dev=None):
    dev = dev or tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    return vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()


# the nn model in float16 is left out on the CPU: LLVM takes minutes over the float16 erf
@pytest.mark.parametrize(
    "workload, dtype",
    [("bert-tiny", "float32"), ("hf-bert-tiny", "float32"), ("hf-bert-tiny", "float16")],
)
def test_bert_tiny_matches_torch_on_llvm(workload, dtype):
    inst = get_workload(workload).instance(dtype, batch=2, seq=19)
    ex = tvm.compile(inst.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    out = _run(ex, inst)
    (ref,) = inst.reference()
    assert out.shape == ref.shape == (2, 19, 128)
    np.testing.assert_allclose(out.astype("float32"), ref, *inst.tolerance)
    # the padded tail of the last sequence must not change the others
    assert not np.allclose(out[1, :5], out[0, :5])


def test_pipeline_by_name_equals_pipeline_object():
    inst = get_workload("add-layernorm").instance("float32", rows=29, cols=131)
    by_name = _run(tvm.compile(inst.mod, "llvm", relax_pipeline="stitch"), inst)
    by_object = _run(tvm.compile(inst.mod, "llvm", relax_pipeline=tvm_stitch.pipeline()), inst)
    np.testing.assert_array_equal(by_name, by_object)
    np.testing.assert_allclose(by_name, inst.reference()[0], *inst.tolerance)


def test_stitch_off_equals_tvm_default():
    """With its fusion passes off, the stitch pipeline only adds analyses: same IR as TVM's."""
    inst = get_workload("layernorm-ops").instance("float32", rows=16, cols=40)
    tvm.ir.assert_structural_equal(
        fused_module(inst.mod, "llvm", "stitch", stitch=False),
        fused_module(inst.mod, "llvm", "default"),
    )
    assert fusion_report(inst.mod, "llvm", "default").kernels == 3
    assert fusion_report(inst.mod, "llvm", "stitch").kernels == 1


def test_analysis_passes_leave_the_module_unchanged():
    inst = get_workload("softmax").instance("float32", rows=8, cols=24)
    legal = relax.transform.LegalizeOps()(inst.mod)
    seen = []
    out = tvm_stitch.passes.AnalyzeTensorGraph(callback=seen.append)(legal)
    tvm.ir.assert_structural_equal(out, legal)
    assert len(seen) == 1 and len(seen[0]) == 4
    reports = []
    fused = relax.transform.FuseTIR()(
        relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(legal))
    )
    tvm.ir.assert_structural_equal(tvm_stitch.passes.ReportFusion(reports.append)(fused), fused)
    assert reports[0].kernels == 1


def test_cuda_build_for_sm90a_without_a_gpu():
    inst = get_workload("bert-tiny").instance("float16", batch=1, seq=32)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    ex = tvm.compile(inst.mod, target, relax_pipeline=tvm_stitch.pipeline(target))
    source = cuda_source(ex)
    # TVM's kernels as CUDA C, the Triton kernels (attention, GEMMs) as sm_90a PTX
    assert source.count("__global__") >= 10 and "blockIdx.x" in source and "half" in source
    assert source.count(".entry stitch_") >= 5 and ".target sm_90a" in source


def test_options_and_targets_are_checked():
    with pytest.raises(TypeError, match=r"unknown tvm_stitch\.pipeline option"):
        tvm_stitch.pipeline("llvm", fuse_everything=True)
    with pytest.raises(ValueError, match="fold_norms takes True or False"):
        tvm_stitch.pipeline("llvm", fold_norms="yes")
    with pytest.raises(ValueError, match="support targets"):
        tvm_stitch.phases(tvm.target.Target("opencl"))
    inst = get_workload("softmax").instance("float32", rows=2, cols=3)
    with pytest.raises(Exception, match="no target"):
        tvm_stitch.pipeline()(inst.mod)


@pytest.mark.gpu
@pytest.mark.parametrize("workload", ["bert-tiny", "hf-bert-tiny", "layernorm", "S4", "G11"])
def test_gpu_numerics(workload):
    params = {
        "bert-tiny": {"batch": 2, "seq": 64},
        "hf-bert-tiny": {"batch": 2, "seq": 64},
        "layernorm": {"rows": 1823, "cols": 781},
        "S4": {"heads": 3},
        "G11": {},  # K = 1024 reduction: float32 accumulation matters
    }[workload]
    inst = get_workload(workload).instance("float16", **params)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    # tiles from the cost model: numerics do not depend on them, and the measured search (and
    # the user's tuning database) is test_bert_kernels_on_the_gpu's
    ex = tvm.compile(inst.mod, target, relax_pipeline=tvm_stitch.pipeline(target, tune="model"))
    out = _run(ex, inst, tvm.cuda(0))
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)
