"""Column reductions in two phases (:mod:`tvm_stitch.stitch.columns`): what the former joins,
what the plans refuse, numerics against numpy on the CPU (the plans' loops lowered for llvm),
CUDA source through nvcc, and on the GPU against PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.graph.kernels import PARTIALS_ATTR
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.report import cuda_source, fused_module, fusion_report
from tvm_stitch.stitch.columns import apply_column_plan, column_plans
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


SHAPES = [
    ((1823, 781), [0]),
    ((5, 77, 33), [1]),
    ((6, 9, 13, 10), [1, 2]),
    ((4099, 24), [0]),
    ((1024, 96), [0]),
    ((3, 256, 64), [1]),
]


def _plan_kinds(shape, axes):
    """``sum(x, axes)``'s PrimFunc, one plan of each kind (phases, vector width, rows over
    ``threadIdx.y``), an input and numpy's sum."""
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
    chosen = {(p.chunks > 1, p.vector, p.rows > 1): p for p in reversed(plans)}
    assert {k[0] for k in chosen} == {True, False}
    # rows over threadIdx.y only where no predicate is needed (TVM's cross-thread reduction)
    exact = reduced % 2 == 0 and cols % 32 == 0
    assert any(k[2] for k in chosen) == exact
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    return func, list(chosen.values()), x, x.sum(axis=tuple(axes))


def _run_plan(func, plan, x, expected, target):
    gpu = target != "llvm"
    scheduled = apply_column_plan(func, plan, gpu=gpu)
    lifted = int(scheduled.attrs.get(PARTIALS_ATTR, 0)) if plan.chunks > 1 else 0
    assert lifted == (1 if plan.chunks > 1 else 0), plan.describe()
    lib = tvm.compile(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), target)
    dev = tvm.cuda(0) if gpu else tvm.cpu()
    out = np.zeros(expected.shape, "float32")
    extra = [np.zeros([int(d) for d in p.ty.shape], "float32") for p in scheduled.params[2:]]
    args = [tvm.runtime.tensor(a, device=dev) for a in [x, out, *extra]]
    lib(*args)
    np.testing.assert_allclose(
        args[1].numpy(), expected, rtol=1e-5, atol=1e-3, err_msg=plan.describe()
    )


@pytest.mark.parametrize(("shape", "axes"), SHAPES)
def test_every_column_plan_numerics(shape, axes):
    """Each kind of the evaluator's plans — one phase, two phases with a predicated last chunk,
    vector widths, rows over ``threadIdx.y`` — lowered for the CPU (threads serial), against
    numpy (partials allocated by the caller)."""
    func, plans, x, expected = _plan_kinds(shape, axes)
    for plan in plans:
        _run_plan(func, plan, x, expected, "llvm")


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "axes"), SHAPES)
def test_every_column_plan_on_the_gpu(shape, axes):
    """The same plans on the GPU: TVM's cross-thread reductions over ``threadIdx.y``, vector
    loads, predicated chunks."""
    func, plans, x, expected = _plan_kinds(shape, axes)
    for plan in plans:
        _run_plan(func, plan, x, expected, CUDA)


def test_rows_over_threads_need_an_unpredicated_block():
    """A plan putting rows on ``threadIdx.y`` where the chunk or the column tile needs a
    predicate is refused: TVM would leave the reduction as every thread adding into one
    element (a race it does not report) — found on the GPU."""
    import dataclasses

    from tvm_stitch.stitch.plan import IllegalPatternError

    func, plans, _, _ = _plan_kinds((5, 77, 33), [1])
    assert all(p.rows == 1 for p in plans)
    forced = dataclasses.replace(plans[0], chunks=4, rows=8, threads=32, vector=1)
    with pytest.raises(IllegalPatternError, match="predicate"):
        apply_column_plan(func, forced, gpu=True)


def test_reductions_of_one_input_share_a_pattern():
    """``x.max(0)`` and ``x.sum(0)`` of a function input, then ``max - sum``: one column
    pattern (the input read once, both reductions in one kernel), numpy's numbers."""

    def body(x):
        return [relax.op.subtract(relax.op.max(x, axis=[0]), relax.op.sum(x, axis=[0]))]

    mod = relax_function([("x", (1000, 72), "float32")], body)
    (func,) = _stitched(mod).values()
    from tvm_stitch.graph.classify import OpKind
    from tvm_stitch.graph.tdg import prim_func_nodes

    reductions = [n for n in prim_func_nodes(func, "p") if n.kind is OpKind.COLUMN_REDUCE]
    assert len({n.output for n in reductions if "rf" not in n.name}) >= 2
    assert fusion_report(mod, "llvm", "stitch").bytes < 1000 * 72 * 4 * 1.2
    x = np.random.default_rng(5).standard_normal((1000, 72)).astype("float32")
    np.testing.assert_allclose(_run(mod, [x]), x.max(0) - x.sum(0), rtol=1e-4, atol=1e-3)


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


def test_an_output_the_pattern_reads_is_not_left_behind(caplog):
    """``w2 = w * 2`` returned and read by ``(x * w2).sum(0)``: in two phases the output
    would be written by the last kernel after the first had read it (found in review: NaN),
    so the pattern is refused — TVM's kernels, the right numbers."""

    def body(x, w):
        w2 = relax.op.multiply(w, relax.const(2.0, "float32"))
        return [w2, relax.Tuple([w2, relax.op.sum(relax.op.multiply(x, w2), axis=[0])])]

    mod = relax_function([("x", (4096, 48), "float32"), ("w", (48,), "float32")], body)
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        assert not _stitched(mod)
    # the pattern's reason, said once (not once per plan tried)
    assert caplog.text.count("an output the pattern also reads") == 1
    rng = np.random.default_rng(3)
    x, w = (
        rng.standard_normal((4096, 48)).astype("float32"),
        rng.standard_normal(48).astype("float32"),
    )
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    w2, s = relax.VirtualMachine(ex, tvm.cpu())["main"](
        tvm.runtime.tensor(x), tvm.runtime.tensor(w)
    )
    np.testing.assert_allclose(w2.numpy(), 2 * w, rtol=1e-6)
    np.testing.assert_allclose(s.numpy(), (x * 2 * w).sum(0), rtol=1e-4, atol=1e-3)


def test_a_variance_over_the_rows_is_refused_with_its_reason(caplog):
    """``variance(x, axis=0)`` reduces ``(x - mean)²``, computed from another reduction: two
    passes over the column, not one pattern; the reason says so."""
    mod = relax_function([("x", (64, 40), "float32")], lambda x: [relax.op.variance(x, axis=[0])])
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        assert not _stitched(mod)
    assert "computed from another reduction" in caplog.text
    x = np.random.default_rng(4).standard_normal((64, 40)).astype("float32")
    np.testing.assert_allclose(_run(mod, [x]), x.var(0), rtol=1e-4, atol=1e-5)


def test_reduction_over_the_innermost_axis_and_another_is_refused(caplog):
    """Summing axes 0 and 2 of (a, b, c) sweeps the innermost axis too: neither rows nor
    columns; left to TVM with the reason, numbers still right."""
    mod = relax_function([("x", (6, 5, 7), "float32")], lambda x: [relax.op.sum(x, axis=[0, 2])])
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        assert not _stitched(mod)
    assert "innermost axis" in caplog.text
    x = np.random.default_rng(2).standard_normal((6, 5, 7)).astype("float32")
    np.testing.assert_allclose(_run(mod, [x]), x.sum(axis=(0, 2)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("mean-pool", {"batch": 8, "seq": 512, "hidden": 768}),
        ("mean-pool", {"batch": 1, "seq": 128, "hidden": 768}),
        ("column-mean", {"rows": 65536, "cols": 64}),
    ],
)
def test_column_patterns_cuda_source(nvcc_compiles, name, params):
    """Column patterns for the GPU: as many stitched kernels as the plan has phases; with two,
    both pass the partials, which are Relax-allocated outputs (no workspace asked at run
    time); a plan with rows over ``threadIdx.y`` reduces through shared memory; nvcc compiles
    the source."""
    inst = get_workload(name).instance("float16", **params)
    (func,) = _stitched(inst.mod, CUDA).values()
    two = bool(func.attrs.get(PARTIALS_ATTR))
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    src = cuda_source(ex)
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    stitched = [k for k in kernels if "stitched_" in k]
    assert len(stitched) == (2 if two else 1), kernels
    if two:
        assert all("rf_ptr" in k for k in stitched)
    if "threadIdx.y" in src:
        assert "red_buf" in src and "__syncthreads" in src
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
