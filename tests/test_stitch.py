"""FusionStitching: pattern former, kernel plans, latency-evaluator, dominance-tree allocator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_stitch.passes import AccumulateFloat32, StitchFusion, StitchSchedule

import tvm_stitch
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.report import cuda_source, fused_module, fusion_report, nvcc_error
from tvm_stitch.stitch.plan import IllegalPatternError, candidate_plans, pattern_ops, plan_pattern
from tvm_stitch.stitch.schedule import apply_plan
from tvm_stitch.stitch.smem import SmemRequest, allocate, dominators
from tvm_stitch.workloads import get_workload
from tvm_stitch.workloads.subgraphs import relax_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
H100 = HardwareModel.from_target(CUDA)

#: (workload, extra parameters): every pattern of the issue's coverage list
PATTERNS = [
    ("layernorm-ops", {}),
    ("layernorm", {}),
    ("add-layernorm", {}),
    ("transpose-layernorm", {}),
    ("softmax-ops", {}),
    ("softmax", {}),
    ("rmsnorm", {}),
    ("bias-gelu", {"tanh": 0}),
    ("bias-gelu", {"tanh": 1}),
]


def _instance(name, dtype, rows, cols, extra):
    return get_workload(name).instance(dtype, rows=rows, cols=cols, **extra)


def _run(mod, inst, target="llvm"):
    ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))
    dev = tvm.cpu() if target == "llvm" else tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args])
    return out.numpy()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("name", "extra"), PATTERNS)
def test_each_pattern_is_one_kernel_with_numpy_numerics(name, extra, dtype):
    if dtype == "float16" and name == "bias-gelu" and not extra["tanh"]:
        pytest.skip("LLVM takes minutes over TVM's float16 erf; checked on the GPU host")
    inst = _instance(name, dtype, 1823, 781, extra)
    assert fusion_report(inst.mod, "llvm", "stitch").kernels == 1
    got = _run(inst.mod, inst)
    np.testing.assert_allclose(got.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize(
    ("name", "rows", "cols"), [("layernorm-ops", 4096, 768), ("softmax-ops", 4096, 128)]
)
def test_bert_shapes_numerics(name, rows, cols):
    inst = _instance(name, "float32", rows, cols, {})
    np.testing.assert_allclose(_run(inst.mod, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    ("name", "rows", "cols", "extra"),
    [
        ("layernorm-ops", 300, 768, {}),  # warp, row cached in registers, 128-bit accesses
        ("add-layernorm", 37, 640, {}),  # two cached inputs; 640 = 32 lanes x 20
        ("softmax-ops", 45, 128, {}),
        ("rmsnorm", 3, 4096, {}),  # block composition, cached
        ("bias-gelu", 37, 520, {"tanh": 1}),  # thread composition, vectors with a tail block
    ],
)
def test_cached_and_vectorized_plans_numerics(name, rows, cols, extra, dtype):
    """Row lengths the register cache and 128-bit accesses cover, lowered for llvm."""
    inst = _instance(name, dtype, rows, cols, extra)
    got = _run(inst.mod, inst)
    np.testing.assert_allclose(got.astype("float32"), inst.reference()[0], *inst.tolerance)


def _plans(inst):
    """The plans ``StitchSchedule`` picks for ``inst`` on the H100."""
    p = StitchSchedule()
    with CUDA:
        p(_unscheduled(inst))
    return p.plans


def _unscheduled(inst):
    return relax.transform.FuseTIR()(
        relax.transform.FuseOps()(
            StitchFusion()(
                relax.transform.AnnotateTIROpPattern()(
                    relax.transform.LegalizeOps()(AccumulateFloat32()(inst.mod))
                )
            )
        )
    )


@pytest.mark.parametrize(
    ("dtype", "vector", "load"), [("float16", 8, "uint4"), ("float32", 4, "float4")]
)
def test_bert_layernorm_keeps_the_row_in_registers(dtype, vector, load, nvcc_compiles):
    """768 columns, one warp per row: each lane loads its 24 elements once, 128 bits at a time,
    into a register array that both reductions and the output read."""
    inst = _instance("layernorm-ops", dtype, 4096, 768, {})
    (plan,) = _plans(inst).values()
    assert (plan.composition, plan.vector, plan.cached) == ("warp", vector, 24)
    src = cuda_source(tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    ctype = "half" if dtype == "float16" else "float"
    assert f"{ctype} x_local_ptr[24];" in src  # not the whole row: the thread's slice
    assert src.count(f"*({load}*)(x_ptr") == 768 // (32 * vector)  # one load per vector
    assert f"*({load}*)(T_" in src  # 128-bit stores of the output
    nvcc_compiles(src)


def test_unaligned_rows_are_streamed():
    """781 columns: no 128-bit access fits, the row is streamed (no register cache)."""
    inst = _instance("layernorm-ops", "float32", 1823, 781, {})
    (plan,) = _plans(inst).values()
    assert (plan.vector, plan.cached) == (1, 0)


def test_elementwise_pattern_gets_thread_composition(nvcc_compiles):
    """bias + GELU (one FuseOps kernel): 8 halves per thread, loaded and stored as 128 bits,
    ``erf`` computed on registers."""
    inst = _instance("bias-gelu", "float16", 4096, 3072, {"tanh": 0})
    (plan,) = _plans(inst).values()
    assert (plan.composition, plan.vector) == ("thread", 8) and plan.threads in (128, 256, 512)
    src = cuda_source(tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    assert "*(uint4*)(x_local_ptr + 0) = *(uint4*)(x_ptr" in src
    assert "*(uint4*)(T_multiply_intermediate_ptr" in src and "erff" in src
    nvcc_compiles(src)


#: the memory study's shapes on the GPU (benchmarks/bench.py), BERT's among them
BENCH_SHAPES = [
    ("layernorm", 4096, 768),
    ("layernorm", 4096, 1024),
    ("layernorm-ops", 4096, 768),
    ("softmax", 49152, 128),
    ("softmax", 65536, 512),
    ("softmax-ops", 65536, 512),
    ("add-layernorm", 4096, 768),
    ("transpose-layernorm", 4096, 768),
    ("bias-gelu", 4096, 3072),
    ("rmsnorm", 4096, 768),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("name", "rows", "cols"), BENCH_SHAPES)
def test_benchmark_shapes_build_for_sm90(name, rows, cols, dtype, nvcc_compiles):
    """Every plan the benchmark runs is valid CUDA (nvcc, sm_90a) and one kernel."""
    inst = _instance(name, dtype, rows, cols, {})
    assert _plans(inst), "the plan was not applied (TVM's schedule was used)"
    src = cuda_source(tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert len(kernels) == 1
    nvcc_compiles(src)


@pytest.mark.parametrize(("name", "rows", "cols"), BENCH_SHAPES)
def test_every_candidate_plan_schedules(name, rows, cols):
    """Whatever the latency-evaluator picks, TVM accepts the schedule (float16: the widest
    vectors); the plan sweep on the GPU times all of them."""
    inst = _instance(name, "float16", 64, cols, {})
    (func,) = [
        f
        for gv, f in _unscheduled(inst).functions.items()
        if gv.name_hint.startswith("stitched_") or gv.name_hint == "fused_add_gelu"
    ]
    plans = [p for p in candidate_plans(func, H100) if math.isfinite(p.latency_us)]
    assert len({(p.composition, p.threads, p.rows_per_block, p.vector) for p in plans}) > 2
    for plan in plans:
        apply_plan(func, plan, gpu=True)


def _layernorm_then_heads(batch, seq, dtype, also_plain=False):
    """LayerNorm, then the attention head split: reshape to (B, S, 12, 64), transpose (0,2,1,3)."""
    hidden = 768

    def body(x, w, b):
        ln = relax.op.nn.layer_norm(x, w, b, axes=[-1])
        heads = relax.op.permute_dims(
            relax.op.reshape(ln, (batch, seq, 12, hidden // 12)), [0, 2, 1, 3]
        )
        return [relax.Tuple([heads, relax.op.exp(ln)])] if also_plain else [heads]

    shapes = [("x", (batch, seq, hidden)), ("w", (hidden,)), ("b", (hidden,))]
    mod = relax_function([(n, sh, dtype) for n, sh in shapes], body)
    rng = np.random.default_rng(0)
    x, w, b = [rng.standard_normal(sh).astype(dtype) for _, sh in shapes]
    xf = x.astype("float32")
    ln = (xf - xf.mean(-1, keepdims=True)) / np.sqrt(xf.var(-1, keepdims=True) + 1e-5) * w + b
    ref = ln.reshape(batch, seq, 12, hidden // 12).transpose(0, 2, 1, 3)
    return mod, (x, w, b), ref


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("float16", 2e-2)])
def test_transpose_after_a_pattern_is_written_through(dtype, tol, nvcc_compiles):
    """The head split after a LayerNorm joins the pattern: one kernel that writes each element
    straight to its (B, H, S, D) place (TVM's default: a LayerNorm and a transpose kernel)."""
    mod, args, ref = _layernorm_then_heads(3, 37, dtype)
    assert fusion_report(mod, "llvm", "default").kernels == 2
    assert fusion_report(mod, "llvm", "stitch").kernels == 1
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=tol, atol=tol)
    big, _, _ = _layernorm_then_heads(32, 128, dtype)
    src = cuda_source(tvm.compile(big, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert len(kernels) == 1 and "transpose" in kernels[0]
    assert "T_transpose_intermediate_ptr" in src and "x_local_ptr" in src  # row in registers
    nvcc_compiles(src)


def test_elementwise_group_with_a_layout_op_stays_on_the_device():
    """add + reshape + transpose (one FuseOps group): not a thread-composition pattern; every
    block of the kernel runs on the GPU (regression: the add was once left on the host)."""

    def body(x, b):
        y = relax.op.reshape(relax.op.add(x, b), (2, 67, 2, 64))
        return [relax.op.permute_dims(y, [0, 2, 1, 3])]

    mod = relax_function([("x", (2, 67, 128), "float16"), ("b", (128,), "float16")], body)
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    (kernel,) = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert "x_ptr" in kernel and "b_ptr" in kernel  # the kernel reads the inputs itself


def test_transpose_is_not_joined_when_the_result_has_other_readers(caplog):
    mod, _, _ = _layernorm_then_heads(2, 16, "float32", also_plain=True)
    # the LayerNorm's result is also read by exp: the transpose stays TVM's (the explorer's
    # plan too: the pattern writes the LayerNorm's result, not through the transpose)
    for explore in ("greedy", "search"):
        assert fusion_report(mod, "llvm", "stitch", explore=explore).kernels == 2


def test_default_pipeline_needs_several_kernels_for_these_patterns():
    """TVM's FuseOps stops at reductions; the stitch pipeline does not."""
    counts = {
        name: fusion_report(_instance(name, "float32", 64, 96, {}).mod, "llvm", "default").kernels
        for name in ("layernorm-ops", "softmax-ops", "add-layernorm", "transpose-layernorm")
    }
    assert counts == {
        "layernorm-ops": 3,
        "softmax-ops": 5,
        "add-layernorm": 2,
        "transpose-layernorm": 2,
    }


def test_transposed_input_is_read_through_the_transpose(nvcc_compiles):
    """A channels-first input: the LayerNorm reads x[c, r] itself (no transpose kernel, no
    register cache: the loads are not at the pattern's own (row, column))."""
    inst = _instance("transpose-layernorm", "float16", 4096, 768, {})
    (plan,) = _plans(inst).values()
    assert plan.cached == 0 and any("transpose" in n for n in plan.inlined)
    src = cuda_source(tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.endswith("{")]
    assert len(kernels) == 1 and "T_transpose" not in src
    nvcc_compiles(src)


def test_transpose_with_other_readers_joins_the_explorers_pattern():
    """A transposed input read by a LayerNorm and an add (and, in the second module, returned):
    the greedy rule leaves the transpose a kernel of its own; the explorer reads the input
    through it in the pattern (column reductions over ``x``), one kernel that also writes
    the transpose where it is returned; numerics on llvm either way."""
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((96, 64), (96,), (96,)))
    t = x.T
    ln = (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5) * w + b

    def body(x, w, b):
        t = relax.op.permute_dims(x, [1, 0])
        return [t, relax.op.add(relax.op.nn.layer_norm(t, w, b, axes=[-1]), t)]

    def returned(x, w, b):
        t = relax.op.permute_dims(x, [1, 0])
        return [relax.Tuple([t, relax.op.nn.layer_norm(t, w, b, axes=[-1])])]

    params = [("x", (96, 64), "float32"), ("w", (96,), "float32"), ("b", (96,), "float32")]
    for make, expected in ((body, [ln + t]), (returned, [t, ln])):
        mod = relax_function(params, make)
        assert fusion_report(mod, "llvm", "stitch", explore="greedy").kernels == 2
        assert fusion_report(mod, "llvm", "stitch", explore="search").kernels == 1
        for explore in ("greedy", "search"):
            ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm",
                                                                             explore=explore))
            out = relax.VirtualMachine(ex, tvm.cpu())["main"](
                *[tvm.runtime.tensor(a) for a in (x, w, b)])
            got = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
            for g, e in zip(got, expected, strict=True):
                np.testing.assert_allclose(g.numpy(), e, rtol=1e-4, atol=1e-4)


def _stitched(inst):
    fused = fused_module(inst.mod, CUDA, "stitch")
    (gv,) = [gv for gv in fused.functions if gv.name_hint.startswith("stitched_")]
    return fused, gv


@pytest.mark.parametrize(
    ("rows", "cols", "composition"), [(1823, 781, "warp"), (4096, 128, "warp"), (64, 4096, "block")]
)
def test_latency_evaluator_picks_the_composition(rows, cols, composition):
    inst = _instance("layernorm-ops", "float32", rows, cols, {})
    fused = _unscheduled(inst)
    (func,) = [f for gv, f in fused.functions.items() if gv.name_hint.startswith("stitched_")]
    plan = plan_pattern(func, H100)
    assert plan.composition == composition
    assert (plan.rows, plan.cols) == (rows, cols)
    # the two reductions are the sub-roots; every elementwise op is recomputed in registers
    assert len(plan.subroots) == 2 and len(plan.inlined) == 8  # 11 blocks, the output anchors
    assert plan.smem_allocated <= plan.smem_requested and plan.latency_us > 0


@pytest.mark.parametrize(
    ("cols", "marks"), [(781, ["__shfl"]), (4096, ["__shfl", "__syncthreads"])]
)
def test_cuda_source_shows_the_composition(cols, marks, nvcc_compiles):
    """Built for sm_90a on the CPU: one kernel; shuffles (warp), shared memory, barriers (block)."""
    inst = _instance("layernorm-ops", "float32", 64, cols, {})
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    src = cuda_source(ex)
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert len(kernels) == 1 and "stitched_" in kernels[0]
    for mark in marks:
        assert mark in src, mark
    if "__syncthreads" in marks:
        assert "__shared__" in src
    nvcc_compiles(src)


def test_former_keeps_patterns_convex(caplog):
    """``flip`` (not stitchable) reads the pattern and feeds it again: joining would be a cycle."""

    def body(x):
        s = relax.op.sum(x, axis=[-1], keepdims=True)
        u = relax.op.flip(s, axis=0)
        y = relax.op.subtract(relax.op.exp(relax.op.subtract(x, s)), u)
        return [s, u, y]

    mod = relax_function([("x", (32, 40), "float32")], body)
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        out = StitchFusion()(legal)
    assert "non-convex" in caplog.text
    # still a valid module, same numbers
    x = np.random.default_rng(0).standard_normal((32, 40)).astype("float32")
    ex = tvm.compile(out, "llvm")
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    s = x.sum(-1, keepdims=True)
    np.testing.assert_allclose(got, np.exp(x - s) - s[::-1], rtol=1e-5, atol=1e-5)


def _two_patterns(rows_y=1823, dtype="float32", x=(1823, 781), cols_y=100):
    """A LayerNorm over ``x`` and a softmax over ``(rows_y, cols_y)`` on independent inputs."""

    def body(x, y, w, b):
        ln = relax.op.nn.layer_norm(x, w, b, axes=[-1])
        return [relax.Tuple([ln, relax.op.nn.softmax(y, axis=-1)])]

    shapes = [("x", x), ("y", (rows_y, cols_y)), ("w", x[-1:]), ("b", x[-1:])]
    mod = relax_function([(n, s, dtype) for n, s in shapes], body)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(dtype) for _, s in shapes]
    x, y, w, b = args
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    e = np.exp(y - y.max(-1, keepdims=True))
    refs = [(x - mean) / np.sqrt(var + 1e-5) * w + b, e / e.sum(-1, keepdims=True)]
    return mod, args, refs


def test_independent_patterns_are_packed_into_one_kernel():
    mod, args, refs = _two_patterns()
    assert fusion_report(mod, "llvm", "default").kernels == 2
    assert fusion_report(mod, "llvm", "stitch").kernels == 1
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert len(kernels) == 1 and "layer_norm_softmax" in kernels[0]


def test_patterns_of_different_row_counts_are_packed_by_the_explorer():
    """A LayerNorm over 1823 rows and a softmax over 301, independent: the explorer's packing
    model (:func:`~tvm_stitch.explore.fusion.packing_gain`) packs them into one kernel whose
    thread blocks take the most rows, the softmax's rows guarded; the greedy rule packs equal
    row counts only. The llvm numbers are numpy's, the CUDA source has one kernel."""
    mod, args, refs = _two_patterns(rows_y=301)
    assert fusion_report(mod, "llvm", "stitch", explore="greedy").kernels == 2
    assert fusion_report(mod, "llvm", "stitch", explore="search").kernels == 1
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)
    kernels = _stitched_kernels(mod)
    assert len(kernels) == 1 and "layer_norm_softmax" in kernels[0]


def test_a_packed_pattern_is_one_value_per_row_only_by_its_own_rows():
    """A LayerNorm over 1024 rows of 64 packed with a softmax over 16 rows of 64: the softmax
    writes 1024 elements, as many as the LayerNorm has rows, yet it is no pattern of one value
    per row. Taken as one, its loops were fused into a row loop and one thread wrote each
    element from the columns it had cached (wrong on the GPU). Its stores go across the row's
    threads, its rows guarded."""
    mod, args, refs = _two_patterns(16, x=(1024, 64), cols_y=64)
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    kernels = [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]
    assert len(kernels) == 1 and "layer_norm_softmax" in kernels[0]
    stores = [ln for ln in src.splitlines() if "T_softmax_norm_intermediate_ptr +" in ln
              or "T_softmax_norm_intermediate_ptr[" in ln]
    assert stores and all("threadIdx.x" in ln for ln in stores)
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_packed_plan_takes_the_most_rows_and_the_widest_row():
    """The row space of a kernel packing patterns of different row counts: the most rows and
    the widest row of any, the ops of both."""
    mod, _, _ = _two_patterns(rows_y=301)
    fused = fused_module(mod, "llvm")
    func = next(f for gv, f in fused.functions.items() if gv.name_hint.startswith("stitched"))
    ops, rows, cols = pattern_ops(func)
    assert (rows, cols) == (1823, 781)
    kinds = [o.kind.value for o in ops]
    assert kinds.count("row-reduce") == 4  # the LayerNorm's mean and variance, softmax's two


def _norms_to_heads(heads=(4, 4), seq=37, dim=64):
    """A q-norm and a k-norm (RMSNorm over each head), each written through its transpose to
    ``(batch, heads, seq, dim)``: two independent patterns with layout tails, of equal row
    counts when ``heads`` are."""
    shapes = [("q", (2, seq, heads[0], dim)), ("k", (2, seq, heads[1], dim)),
              ("wq", (dim,)), ("wk", (dim,))]

    def body(q, k, wq, wk):
        def norm(x, w):
            return relax.op.permute_dims(relax.op.nn.rms_norm(x, w, axes=[-1], epsilon=1e-6),
                                         [0, 2, 1, 3])
        return [relax.Tuple([norm(q, wq), norm(k, wk)])]

    mod = relax_function([(n, s, "float32") for n, s in shapes], body)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype("float32") for _, s in shapes]

    def norm(x, w):
        return (x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w).transpose(0, 2, 1, 3)

    return mod, args, [norm(args[0], args[2]), norm(args[1], args[3])]


def _stitched_kernels(mod) -> list[str]:
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    return [ln for ln in src.splitlines() if "__global__" in ln and ln.rstrip().endswith("{")]


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_patterns_written_through_layout_ops_are_packed_apart(heads):
    """A q-norm and a k-norm, each written through its transpose to heads, with as many K/V
    heads as query heads and with fewer (GQA: rows of different counts). The explorer packs
    them into one kernel in which each pattern writes through its own transpose (the plan's
    epilogue is each packed pattern's); the greedy rule keeps them two stitched kernels (TVM's
    default: an RMSNorm kernel and a transpose kernel each, four). The llvm numbers are
    numpy's."""
    mod, args, refs = _norms_to_heads(heads)
    assert fusion_report(mod, "llvm", "default").kernels == 4
    assert fusion_report(mod, "llvm", "stitch", explore="greedy").kernels == 2
    assert fusion_report(mod, "llvm", "stitch", explore="search").kernels == 1
    kernels = _stitched_kernels(mod)
    assert len(kernels) == 1 and "stitched_rms_norm_transpose" in kernels[0]
    assert kernels[0].count("__restrict__") == 6  # both norms' inputs, weights and outputs
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4, atol=1e-4)


def test_a_refused_packed_kernel_is_formed_again_as_its_patterns(monkeypatch, caplog):
    """Where a packed kernel has no plan (refused here for every kernel that packs), the
    patterns it packed are formed one by one and checked again, rather than all left to TVM's
    fusion."""
    from tvm_stitch.stitch import plan

    packed = plan._packed

    def refuse(nodes):
        if len(plan._components(nodes)) > 1:
            raise IllegalPatternError("packed kernels refused by the test")
        return packed(nodes)

    monkeypatch.setattr(plan, "_packed", refuse)
    mod, _, _ = _norms_to_heads()
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        assert fusion_report(mod, "llvm", "stitch").kernels == 2
    assert "formed one by one" in caplog.text
    kernels = _stitched_kernels(mod)  # the two are alike: one definition, called twice
    assert kernels and all("stitched_rms_norm_transpose" in k and k.count("__restrict__") == 3
                           for k in kernels)  # one norm's input, weight and output each


# -- shared memory along the dominance tree -----------------------------------------------------
def test_allocator_reuses_dead_dominating_buffers_on_a_chain():
    reqs = [SmemRequest("a", 0, 100, 1), SmemRequest("b", 2, 80, 3), SmemRequest("c", 3, 120, 4)]
    alloc = allocate(reqs)
    # b takes a's buffer (a is dead at 2 and dominates it); c cannot take b's (b read at 3)
    assert alloc.buffer_of == {"a": 0, "b": 0, "c": 1}
    assert (alloc.requested, alloc.total) == (300, 220)


def test_allocator_respects_dominance_on_a_diamond():
    # 0 -> 1 -> 3, 0 -> 2 -> 3: neither branch dominates the other or the join
    preds = {0: [], 1: [0], 2: [0], 3: [1, 2]}
    assert dominators(preds)[3] == {0, 3}
    reqs = [
        SmemRequest("root", 0, 64, 0),
        SmemRequest("left", 1, 64, 1),
        SmemRequest("right", 2, 32, 2),
        SmemRequest("join", 3, 64, 3),
    ]
    alloc = allocate(reqs, preds)
    assert alloc.buffer_of["left"] == alloc.buffer_of["root"]  # root dominates and is dead
    # right: root's buffer is held by left now, whose owner (1) does not dominate 2 -> new buffer
    assert alloc.buffer_of["right"] != alloc.buffer_of["left"]
    # join: left (1) and right (2) are dead but dominate nothing here -> a new buffer
    assert alloc.buffer_of["join"] not in (alloc.buffer_of["left"], alloc.buffer_of["right"])
    assert (alloc.requested, alloc.total) == (224, 160)


# -- on the GPU host -----------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("float16", 2e-2)])
@pytest.mark.parametrize(("rows_y", "x", "cols_y"), [
    (1823, (1823, 781), 100), (301, (1823, 781), 100), (37, (1823, 781), 100),
    (4099, (1823, 781), 100), (16, (1024, 64), 64)])
def test_packed_patterns_on_the_gpu(rows_y, x, cols_y, dtype, tol):
    mod, args, refs = _two_patterns(rows_y, dtype, x, cols_y)
    assert len(_stitched_kernels(mod)) == 1
    ex = tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    outs = vm["main"](*[tvm.runtime.tensor(a, device=dev) for a in args])
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=tol, atol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("name", "extra"), PATTERNS)
def test_patterns_on_the_gpu(name, extra, dtype):
    for rows, cols in ((1823, 781), (64, 4096), (4096, 128), (300, 768), (37, 520)):
        inst = _instance(name, dtype, rows, cols, extra)
        got = _run(inst.mod, inst, CUDA)
        np.testing.assert_allclose(got.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("float16", 2e-2)])
def test_transpose_after_a_pattern_on_the_gpu(dtype, tol):
    for batch, seq in ((32, 128), (3, 37)):
        mod, args, ref = _layernorm_then_heads(batch, seq, dtype)
        ex = tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
        dev = tvm.cuda(0)
        vm = relax.VirtualMachine(ex, dev)
        got = vm["main"](*[tvm.runtime.tensor(a, device=dev) for a in args]).numpy()
        np.testing.assert_allclose(got.astype("float32"), ref, rtol=tol, atol=tol)


def test_division_by_a_row_value_becomes_a_reciprocal():
    from tvm import s_tir
    from tvm.script import tirx as T

    from tvm_stitch.stitch.schedule import hoist_row_reciprocals

    @T.prim_func(private=True, s_tir=True)
    def before(
        x: T.Buffer((4, 8), "float32"),
        s: T.Buffer((4, 1), "float32"),
        y: T.Buffer((4, 8), "float32"),
    ):
        for i, j in T.grid(4, 8):
            with T.sblock("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                # by a row value: rewritten; by a constant or by a column value: kept
                y[vi, vj] = (
                    T.Cast("float32", x[vi, vj] / s[vi, 0])
                    + x[vi, vj] / T.float32(3)
                    + (s[vi, 0] / x[vi, vj])
                )

    @T.prim_func(private=True, s_tir=True)
    def expected(
        x: T.Buffer((4, 8), "float32"),
        s: T.Buffer((4, 1), "float32"),
        y: T.Buffer((4, 8), "float32"),
    ):
        for i, j in T.grid(4, 8):
            with T.sblock("norm"):
                vi, vj = T.axis.remap("SS", [i, j])
                y[vi, vj] = (
                    T.Cast("float32", x[vi, vj] * (T.float32(1) / s[vi, 0]))
                    + (x[vi, vj] / T.float32(3))
                    + s[vi, 0] / x[vi, vj]
                )

    sch = s_tir.Schedule(before)
    hoist_row_reciprocals(sch)
    tvm.ir.assert_structural_equal(sch.mod["main"], expected)


@pytest.mark.parametrize("name", ["softmax", "softmax-ops"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_softmax_evaluates_each_exponential_once(name, dtype, nvcc_compiles):
    """128 columns, 16 lanes per row, 8 elements per lane: the exponentials are computed once
    into the lane's registers (read by the sum and the output), and the normalisation is one
    reciprocal per row, not a division per element."""
    inst = _instance(name, dtype, 49152, 128, {})
    (plan,) = _plans(inst).values()
    assert (plan.composition, plan.threads, plan.cached) == ("warp", 16, 8)
    assert len(plan.registers) == 1 and plan.registers[0] in plan.subroots
    src = cuda_source(tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    assert src.count("expf(") == 8  # not 16: the sum and the output share them
    ptx = nvcc_compiles(src)
    assert ptx.count("ex2.approx") == 8 and ptx.count("rcp.rn.f32") == 1
    assert "div.rn.f32" not in ptx  # exp * (1 / sum): one reciprocal per lane


def test_a_refused_plan_falls_back_to_the_next_one(monkeypatch, caplog):
    from tvm_stitch.stitch import schedule

    original, calls = schedule.apply_plan, []

    def refuse_first(func, plan, gpu=True, point=None):
        calls.append(plan)
        if len(calls) == 1:
            raise IllegalPatternError("refused for the test")
        return original(func, plan, gpu, point)

    inst = _instance("layernorm", "float16", 4096, 768, {})
    mod = _unscheduled(inst)
    monkeypatch.setattr(schedule, "apply_plan", refuse_first)
    (gv,) = [gv for gv in mod.functions if gv.name_hint.startswith("stitched_")]
    expected = candidate_plans(mod[gv], H100)
    stitch = StitchSchedule()
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        out = stitch(mod)
    assert calls == expected[:2]
    assert stitch.plans[gv.name_hint] == expected[1]
    assert out[gv].attrs["tirx.is_scheduled"]
    assert "plan refused" in caplog.text and "refused for the test" in caplog.text


def test_a_transpose_alone_is_left_to_tvm():
    """Only a transpose inside a row pattern is read through; a transpose kernel of its own
    keeps TVM's schedule (BERT's head merge: a thread plan would make its loads strided)."""

    class Inst:
        mod = relax_function(
            [("x", (4, 128, 12, 64), "float16")],
            lambda x: [relax.op.permute_dims(x, [0, 2, 1, 3])],
        )

    assert _plans(Inst) == {}


@pytest.mark.parametrize("batch", [1, 4])
def test_batched_layernorm_keeps_the_row_in_registers(batch, nvcc_compiles):
    """(batch, 128, 768): TVM's loop normalisation drops a batch of one from the iterators, the
    loads keep an index 0; the row is still recognised as the lane's own and cached."""
    mod = relax_function(
        [("x", (batch, 128, 768), "float16"), ("w", (768,), "float16"), ("b", (768,), "float16")],
        lambda x, w, b: [relax.op.nn.layer_norm(x, w, b, axes=[-1])],
    )
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    reads = [ln for ln in src.splitlines() if "x_ptr +" in ln or "x_ptr[" in ln]
    assert reads and all("x_local_ptr" in ln.split("=")[0] for ln in reads)  # only into registers
    nvcc_compiles(src)


#: (shape, dtype): an irregular row in float32, GPT-2's embeddings in float16
RESIDUAL_CASES = [((3, 37, 520), "float32"), ((1, 256, 768), "float16")]


def _residual_stream(shape, dtype):
    """A pre-norm residual stream: ``h = x + y`` is returned *and* normalized (GPT-2's
    embeddings, every pre-norm block's residual add)."""

    def body(x, y, w, b):
        h = relax.op.add(x, y)
        return [relax.Tuple([h, relax.op.nn.layer_norm(h, w, b, axes=[-1])])]

    cols = shape[-1]
    shapes = [("x", shape), ("y", shape), ("w", (cols,)), ("b", (cols,))]
    mod = relax_function([(n, s, dtype) for n, s in shapes], body)
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(dtype) for _, s in shapes]
    x, y, w, b = (a.astype("float32") for a in args)
    h = x + y
    ln = (h - h.mean(-1, keepdims=True)) / np.sqrt(h.var(-1, keepdims=True) + 1e-5) * w + b
    return mod, args, [h, ln]


@pytest.mark.parametrize(("shape", "dtype"), RESIDUAL_CASES)
def test_an_output_the_pattern_reads_is_recomputed_by_its_readers(shape, dtype, nvcc_compiles):
    """The add's result leaves the kernel and feeds its reductions: the readers recompute it
    (no read-back of global memory across threads), one kernel instead of TVM's fallback."""
    mod, args, refs = _residual_stream(shape, dtype)
    assert fusion_report(mod, "llvm", "default").kernels == 2
    assert fusion_report(mod, "llvm", "stitch").kernels == 1
    (plan,) = _plans(type("Inst", (), {"mod": mod})).values()
    assert plan.composition in ("warp", "block")  # planned, not left to TVM's schedule
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    outs = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    tol = 1e-4 if dtype == "float32" else 2e-2
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=tol, atol=tol)
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    assert len([ln for ln in src.splitlines() if "__global__" in ln and ln.endswith("{")]) == 1
    nvcc_compiles(src)


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "dtype"), RESIDUAL_CASES)
def test_an_output_the_pattern_reads_on_the_gpu(shape, dtype):
    mod, args, refs = _residual_stream(shape, dtype)
    ex = tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    dev = tvm.cuda(0)
    outs = relax.VirtualMachine(ex, dev)["main"](*[tvm.runtime.tensor(a, device=dev) for a in args])
    tol = 1e-4 if dtype == "float32" else 2e-2
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=tol, atol=tol)


def test_a_pattern_no_plan_schedules_is_left_to_tvms_fusion(monkeypatch, caplog):
    """Legality before fusion: a pattern that no kernel plan schedules is not formed, so its ops
    get TVM's own fusion and schedules (formed, it would have gone to TVM's fallback schedule as
    one fused function: one thread per row, the rows' columns summed serially)."""
    from tvm_stitch.stitch import schedule

    def refuse(func, plan, gpu=True, point=None):
        raise IllegalPatternError("refused for the test")

    monkeypatch.setattr(schedule, "apply_plan", refuse)
    inst = _instance("layernorm-ops", "float32", 300, 781, {})
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        stitch = fusion_report(inst.mod, CUDA, "stitch")
    assert stitch.kernels == fusion_report(inst.mod, CUDA, "default").kernels > 1
    assert "not formed, left to TVM's fusion" in caplog.text
    assert "refused for the test" in caplog.text
    np.testing.assert_allclose(_run(inst.mod, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize("shape", [(64, 781), (2, 32, 781)])
def test_a_row_value_kept_as_a_column_is_planned(shape, nvcc_compiles):
    """A float16 row sum (accumulated in float32) returned as (rows, 1), packed with a softmax
    of the same rows: TVM's normalisation drops the output's unit column loop; the plan still
    schedules it (one kernel, not TVM's fallback schedule), with numerics on llvm."""
    mod = relax_function(
        [("x", shape, "float16")],
        lambda x: [
            relax.Tuple(
                [relax.op.sum(x, axis=[-1], keepdims=True), relax.op.nn.softmax(x, axis=-1)]
            )
        ],
    )
    (plan,) = _plans(type("Inst", (), {"mod": mod})).values()
    assert plan.composition in ("warp", "block")
    x = np.random.default_rng(2).standard_normal(shape).astype("float16")
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    total, soft = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    x64 = x.astype("float64")
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    np.testing.assert_allclose(total.numpy(), x64.sum(-1, keepdims=True), rtol=2e-3, atol=2e-2)
    np.testing.assert_allclose(soft.numpy(), e / e.sum(-1, keepdims=True), rtol=2e-3, atol=1e-5)
    src = cuda_source(tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA)))
    assert len([ln for ln in src.splitlines() if "__global__" in ln and ln.endswith("{")]) == 1
    nvcc_compiles(src)


def test_a_gpu_without_kernel_plans_keeps_tvms_fusion(caplog):
    """A CUDA target whose GPU the hardware table does not know: no pattern is formed (none
    could be scheduled), TVM's fusion and schedules throughout, the reason logged."""
    inst = _instance("layernorm-ops", "float32", 300, 781, {})
    turing = tvm.target.Target({"kind": "cuda", "arch": "sm_75"})
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        stitch = fusion_report(inst.mod, turing, "stitch")
    assert stitch.kernels == fusion_report(inst.mod, turing, "default").kernels > 1
    assert "no kernel plans" in caplog.text


def test_each_pattern_is_scheduled_once(monkeypatch, tmp_path):
    """The fusion's legality check and the scheduling pass share their schedules: a pipeline
    build schedules each pattern once, not once to check it and once to build it."""
    from tvm_stitch.stitch import schedule

    original, calls = schedule.apply_plan, []

    def counted(func, plan, gpu=True, point=None):
        calls.append(func)
        return original(func, plan, gpu, point)

    monkeypatch.setattr(schedule, "apply_plan", counted)
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=19)
    tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    assert calls, "nothing was scheduled"
    assert len(calls) == len({tvm.ir.save_json(f) for f in calls})


def test_a_barrier_is_never_planned_inside_a_guard(caplog, tmp_path, monkeypatch):
    """GPT-2 at one token: the product of one-key attention probabilities with V (a reduction
    over one element, its row kept in shared memory) and the softmax of one logit, over the
    heads' rows. A warp plan of 8 rows a block guards the last block's rows, and the barrier
    after the shared row would sit inside that guard, which TVM cannot lower (the build
    raised). A plan TVM cannot lower is refused with the reason; the next plan, or TVM, takes
    the pattern. (BERT at one token met it in its whole attention pattern.)"""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("gpt2-tiny").instance("float16", batch=1, seq=1)
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    assert "Cannot insert syncs inside condition" in caplog.text


@pytest.mark.parametrize("seq, rows_per_block", [(37, 2), (38, 4)])
def test_rows_over_three_loops_take_a_grouping_that_nests(seq, rows_per_block, caplog):
    """A per-head RMSNorm written heads first (Qwen3's Q/K norm) over rows
    ``(batch, seq, heads)`` of 48 elements.
    Blocks of 16 or 8 rows do not nest in ``(2, 37, 2)``: the sub-root's row index is then no
    iterator map TVM expresses and it refuses to bind its threads, and the four cheapest plans
    all group rows so (the pattern was left to TVM). The cheapest plan of another grouping is
    tried too and takes it: 2 rows a block of ``(2, 37, 2)``, 4 of ``(2, 38, 2)``; built for
    sm_90a, and the same plan on llvm computes what numpy does."""
    import torch

    from tvm_stitch.frontend import import_torch

    class HeadNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 48))

        def forward(self, x):
            q = x.view(2, seq, 2, 48)
            v = q.pow(2).mean(-1, keepdim=True)
            return ((q * torch.rsqrt(v + 1e-6)) * self.w).transpose(1, 2)  # heads first

    x = np.random.default_rng(0).standard_normal((2, seq, 96)).astype("float32")
    imported = import_torch(HeadNorm(), (torch.from_numpy(x),), "float32")
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        tvm.compile(imported.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    planned = [m for m in (r.getMessage() for r in caplog.records) if "composition" in m
               and not any(w in m for w in ("not formed", "left to TVM", "plan refused"))]
    assert any(f"32 threads/row x {rows_per_block} rows/block" in m for m in planned), planned
    assert "plan refused (warp composition, 16 threads/row x 16 rows/block" in caplog.text
    llvm = tvm.target.Target("llvm")
    ex = tvm.compile(imported.mod, llvm, relax_pipeline=tvm_stitch.pipeline(llvm))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(imported.weights[0])).numpy()
    q = x.reshape(2, seq, 2, 48)
    ref = q / np.sqrt((q * q).mean(-1, keepdims=True) + 1e-6) * np.linspace(0.5, 1.5, 48)
    ref = ref.transpose(0, 2, 1, 3)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_a_squeeze_after_a_row_reduction_keeps_its_rows(caplog):
    """A batched product with one output column (a GEMV over gathered weights, as
    transformers' ``batched_mm`` experts compute) squeezed: written through the squeeze, the
    plan's rows of one column would become columns, and the sub-root reduced across rows —
    wrong on llvm (9.5 off), an undefined loop variable in the CUDA code.  The pattern is
    refused, with the reason, and left to TVM."""
    def body(x, w):
        m = relax.op.matmul(x, w, out_dtype="float32")
        return [relax.op.squeeze(relax.op.astype(m, "float16"), axis=[-1])]

    mod = relax_function([("x", (8, 40, 24), "float16"), ("w", (8, 24, 1), "float16")], body)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 40, 24)).astype("float16")
    w = rng.standard_normal((8, 24, 1)).astype("float16")
    with caplog.at_level("INFO", logger="tvm_stitch.stitch"):
        ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    assert "T_squeeze makes rows of (1,) elements (40,)" in caplog.text
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(w))
    ref = (x.astype("float32") @ w.astype("float32"))[..., 0]
    np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=1e-2, atol=1e-2)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    ex = tvm.compile(mod, target, relax_pipeline=tvm_stitch.pipeline(target))
    assert nvcc_error(ex) is None  # (None also where no nvcc is found)
