"""Column reductions in two phases (:mod:`tvm_stitch.stitch.columns`): what the former joins,
what the plans refuse, numerics against numpy on the CPU (the plans' loops lowered for llvm),
CUDA source through nvcc, and on the GPU against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.report import cuda_source, fused_module, fusion_report
from tvm_stitch.stitch.columns import PARTIALS_ATTR, apply_column_plan, column_plans
from tvm_stitch.workloads import get_workload
from tvm_stitch.workloads.subgraphs import relax_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
H100 = HardwareModel.from_target(CUDA)


def _run(mod, args, target="llvm"):
    ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))
    dev = tvm.cpu() if target == "llvm" else tvm.cuda(0)
    out = relax.VirtualMachine(ex, dev)["main"](*[tvm.runtime.tensor(a, device=dev) for a in args])
    return out.numpy()


def _stitched(mod, target="llvm"):
    fused = fused_module(mod, target, "stitch")
    return {
        gv.name_hint: f for gv, f in fused.functions.items() if gv.name_hint.startswith("stitched_")
    }


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("batch", "seq", "hidden"), [(3, 77, 90), (2, 5, 33)])
def test_mean_pool_is_one_column_pattern(dtype, batch, seq, hidden):
    """Masked mean pooling: the mask's broadcast, the product and both sums over the sequence
    and the division are one pattern (the input read once); numpy's numbers."""
    inst = get_workload("mean-pool").instance(dtype, batch=batch, seq=seq, hidden=hidden)
    (func,) = _stitched(inst.mod).values()
    assert func.attrs.get("tirx.is_scheduled")
    report = fusion_report(inst.mod, "llvm", "stitch")
    assert report.kernels == (2 if func.attrs.get(PARTIALS_ATTR) else 1)
    count = int(func.attrs.get(PARTIALS_ATTR, 0))
    partials = (
        sum(
            int(np.prod([int(d) for d in p.ty.shape])) * 4
            for p in func.params[len(func.params) - count :]
        )
        if count
        else 0
    )
    # h and the mask read once, the partials written once and read once
    assert report.bytes <= inst.ideal_bytes + 2 * partials + 64
    assert fusion_report(inst.mod, "llvm", "default").bytes > report.bytes + inst.ideal_bytes // 2
    np.testing.assert_allclose(_run(inst.mod, inst.args), inst.reference()[0], *inst.tolerance)


def _column_func(shape, axes, dtype="float32"):
    """The legalized PrimFunc of ``sum(x * 2, axes) + 1``."""
    mod = relax_function(
        [("x", shape, dtype)],
        lambda x: [
            relax.op.add(
                relax.op.sum(relax.op.multiply(x, relax.const(2.0, dtype)), axis=axes),
                relax.const(1.0, dtype),
            )
        ],
    )
    return mod, _stitched(mod)


@pytest.mark.parametrize(
    ("shape", "axes"), [((1823, 781), [0]), ((5, 77, 33), [1]), ((6, 9, 13, 10), [1, 2])]
)
def test_every_column_plan_numerics(shape, axes):
    """Each of the evaluator's plans — one phase, two phases with a predicated last chunk,
    vector widths — lowered for the CPU, against numpy (partials allocated by the caller)."""
    from tvm_stitch.graph.tdg import prim_func_nodes
    from tvm_stitch.stitch.columns import column_space

    mod = relax_function([("x", shape, "float32")], lambda x: [relax.op.sum(x, axis=axes)])
    legal = relax.transform.FuseTIR()(
        relax.transform.FuseOps()(
            relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
        )
    )
    (func,) = [f for f in legal.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    outer, reduced, cols, _ = column_space(prim_func_nodes(func, "p"))
    assert outer * cols * reduced == int(np.prod(shape))
    assert reduced == int(np.prod([shape[a] for a in axes]))
    plans = column_plans(func, H100)
    chosen = {(p.chunks > 1, p.vector): p for p in reversed(plans)}
    assert any(k[0] for k in chosen) and any(not k[0] for k in chosen)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype("float32")
    expected = x.sum(axis=tuple(axes))
    for plan in chosen.values():
        scheduled = apply_column_plan(func, plan, gpu=False)
        lifted = int(scheduled.attrs.get(PARTIALS_ATTR, 0)) if plan.chunks > 1 else 0
        assert lifted == (1 if plan.chunks > 1 else 0), plan.describe()
        lib = tvm.compile(
            tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), "llvm"
        )
        out = np.zeros(expected.shape, "float32")
        extra = [np.zeros([int(d) for d in p.ty.shape], "float32") for p in scheduled.params[2:]]
        args = [tvm.runtime.tensor(a) for a in [x, out, *extra]]
        lib(*args)
        np.testing.assert_allclose(
            args[1].numpy(), expected, rtol=1e-5, atol=1e-4, err_msg=plan.describe()
        )


def test_broadcast_back_is_a_pattern_of_its_own(caplog):
    """``x - x.mean(0)``: the mean is a column pattern; the subtraction reads every column's
    mean, so it is not joined (it would need every block's result) — the reason logged."""

    def body(x):
        return [relax.op.subtract(x, relax.op.mean(x, axis=[0], keepdims=True))]

    mod = relax_function([("x", (64, 48), "float32")], body)
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        stitched = _stitched(mod)
    assert len(stitched) == 1 and "mean" in next(iter(stitched))
    assert "not a column pattern's" in caplog.text
    x = np.random.default_rng(1).standard_normal((64, 48)).astype("float32")
    np.testing.assert_allclose(_run(mod, [x]), x - x.mean(0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_reduction_over_the_innermost_axis_and_another_is_refused(caplog):
    """Summing axes 0 and 2 of (a, b, c) sweeps the innermost axis too: neither rows nor
    columns; left to TVM with the reason, numbers still right."""
    mod = relax_function([("x", (6, 5, 7), "float32")], lambda x: [relax.op.sum(x, axis=[0, 2])])
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        assert not _stitched(mod)
    assert "innermost axis" in caplog.text
    x = np.random.default_rng(2).standard_normal((6, 5, 7)).astype("float32")
    np.testing.assert_allclose(_run(mod, [x]), x.sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)


def test_two_phase_cuda_source(nvcc_compiles):
    """BERT-sized mean pooling for the GPU: a first-phase kernel reading ``h`` and the mask
    with vector loads, a second adding the partials; the partials are Relax-allocated
    outputs (no workspace asked at run time); nvcc compiles the source."""
    inst = get_workload("mean-pool").instance("float16", batch=8, seq=512, hidden=768)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    src = cuda_source(ex)
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    stitched = [k for k in kernels if "stitched_" in k]
    assert len(stitched) == 2, kernels
    assert "rf_ptr" in stitched[0] and "rf_ptr" in stitched[1]
    nvcc_compiles(src)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mean-pool", {"batch": 8, "seq": 512, "hidden": 768}),
        ("mean-pool", {"batch": 3, "seq": 77, "hidden": 90}),
        ("column-mean", {"rows": 4096, "cols": 768}),
        ("column-mean", {"rows": 1823, "cols": 781}),
    ],
)
def test_column_patterns_on_the_gpu(name, params):
    """Both phases on the GPU (CUDA graphs: the partials are planned memory) against PyTorch."""
    import torch

    inst = get_workload(name).instance("float16", **params)
    out = _run(inst.mod, inst.args, CUDA)
    args = [torch.from_numpy(a).cuda() for a in inst.args]
    ref = inst.torch_fns["eager"]("cuda", torch.float16)(*args).float().cpu().numpy()
    np.testing.assert_allclose(out.astype("float32"), ref, *inst.tolerance)
