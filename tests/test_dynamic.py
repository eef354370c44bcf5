"""Symbolic dims with ranges (issue 48, first step): shapes simplified under the ranges, so models
exported with a dynamic batch and sequence length build once and run at any shape in range."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, tirx
from tvm.relax.frontend import detach_params
from tvm.relax.frontend.torch import from_exported_program
from tvm_stitch.passes import BoundSymbolicShapes

import tvm_stitch
from tvm_stitch.frontend import decompositions

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _sliced_table(upper: int | None):
    """``x + table[:n]`` for ``x`` (n, 8), ``n`` in [2, upper] (no range when None)."""
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 8], "float32"))
    table = relax.const(np.arange(512 * 8, dtype="float32").reshape(512, 8))
    bb = relax.BlockBuilder()
    attrs = {} if upper is None else {"tir_var_lower_bound": {"n": 2},
                                      "tir_var_upper_bound": {"n": upper}}
    with bb.function("main", [x], attrs):
        with bb.dataflow():
            rows = bb.emit(relax.op.strided_slice(table, [0], [0], [n]))
            out = bb.emit_output(relax.op.add(x, rows))
        bb.emit_func_output(out)
    return bb.get(), n, x, table


def test_a_slice_inside_its_table_is_a_gather_of_its_rows():
    """``table[:n]`` of a 512-row table with n ≤ 512: shape inference gives it ``min(n, 512)``
    rows (then ``x + rows`` has no known shape and TVM 0.27 cannot build it); under the range
    it is a gather of ``arange(0, n)``, of n rows."""
    before, n, x, table = _sliced_table(512)
    assert "T.min(n, 512)" in before.script()
    after = BoundSymbolicShapes()(before)

    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"tir_var_lower_bound": {"n": 2},
                                   "tir_var_upper_bound": {"n": 512}}):
        with bb.dataflow():
            index = bb.emit(relax.op.arange(0, n, 1, "int64"))
            rows = bb.emit(relax.op.take(table, index, axis=0))
            out = bb.emit_output(relax.op.add(x, rows))
        bb.emit_func_output(out)
    tvm.ir.assert_structural_equal(after, bb.get())
    assert after["main"].ret_ty.shape.values[0].same_as(n)


@pytest.mark.parametrize("upper", [None, 1024])
def test_a_slice_that_may_leave_its_table_stays(upper):
    """Without ranges, or where ``n`` may exceed the table's 512 rows, nothing changes."""
    before, *_ = _sliced_table(upper)
    assert BoundSymbolicShapes()(before).same_as(before)


def _bert():
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
        vocab_size=300, attn_implementation="eager")).eval()

    def inputs(b, s):
        mask = torch.ones(b, s, dtype=torch.long)
        mask[0, s // 2:] = 0  # padding in the first sequence
        return torch.randint(0, 300, (b, s)), mask

    return model, inputs, lambda out: out.last_hidden_state


def _gpt2():
    import transformers

    torch.manual_seed(0)
    inner = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=64, n_layer=1, n_head=2, vocab_size=300, attn_implementation="eager")).eval()

    class NoCache(torch.nn.Module):  # a cache object is no exported output
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids, use_cache=False).last_hidden_state

    return NoCache().eval(), lambda b, s: (torch.randint(0, 300, (b, s)),), lambda out: out


def _tuner_configs(monkeypatch, change):
    """The tuner's configs passed through ``change(match, source, kwargs, config) -> config``
    (``kwargs``: the call's ``quick``, for a bucket point's short search)."""
    from tvm_stitch.tune import policy

    original = policy.KernelTuner.config

    def chosen(self, match, source, shapes, constants, like=None, **kwargs):
        got = original(self, match, source, shapes, constants, like, **kwargs)
        return change(match, source, kwargs, got)

    monkeypatch.setattr(policy.KernelTuner, "config", chosen)


def _gpu_dynamic_bert():
    """On the GPU: HF BERT (2 layers, hidden 128) in float32, ``inputs(b, s)`` (the first
    sequence padded by a third), and its float16 build for batch 1-16 × length 1-256 (the
    model's tiles, through the tuner's configs as they stand)."""
    import copy

    import transformers
    from torch.export import Dim

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256,
        vocab_size=300, attn_implementation="eager")).eval().cuda()

    def inputs(b, s):
        mask = torch.ones(b, s, dtype=torch.long, device="cuda")
        mask[0, s - s // 3:] = 0
        return torch.randint(0, 300, (b, s), device="cuda"), mask

    dims = {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=1, max=256)}
    fn = tvm_stitch.from_torch(copy.deepcopy(model).half(), inputs(2, 9), tune="model",
                               dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    return model, inputs, fn


@pytest.mark.parametrize("make", [_bert, _gpt2], ids=["hf-bert", "gpt2"])
def test_a_model_exported_with_dynamic_dims_builds_once_and_runs_at_any_shape(make):
    """Hugging Face BERT (a slice of its position ids, a padding mask) and GPT-2 (its causal
    mask's slices, negative axes) exported with a dynamic batch and sequence length: one llvm
    build of the stitch pipeline gives PyTorch's numbers at three shapes; the CUDA build (sm_90a,
    on this machine) succeeds too."""
    from torch.export import Dim

    model, inputs, output = make()
    batch, seq = Dim("batch", min=2, max=16), Dim("seq", min=2, max=128)
    example = inputs(2, 9)
    names = ["input_ids", "attention_mask"][: len(example)]
    exported = torch.export.export(model, example,
                                   dynamic_shapes={k: {0: batch, 1: seq} for k in names})
    mod = from_exported_program(exported.run_decompositions(decompositions()),
                                keep_params_as_input=True, unwrap_unit_return_tuple=True,
                                run_ep_decomposition=False)
    mod, params = detach_params(mod)
    weights = [tvm.runtime.tensor(p.numpy()) for p in params["main"]]
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    for b, s in ((2, 5), (3, 17), (2, 40)):
        args = inputs(b, s)
        with torch.no_grad():
            want = output(model(*args)).numpy()
        got = vm["main"](*[tvm.runtime.tensor(a.numpy()) for a in args], *weights)
        got = got[0] if type(got).__name__ in ("Array", "list", "tuple") else got
        assert got.numpy().shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))


def test_from_torch_with_dynamic_shapes_compiles_once_for_every_length():
    """``from_torch(..., dynamic_shapes=...)`` (torch.export's own spelling): one compile of
    Hugging Face BERT with a padding mask serves three batch sizes and lengths with PyTorch's
    numbers; a length outside the range, or inputs that disagree on a dim, raise ValueError."""
    from torch.export import Dim

    model, inputs, output = _bert()
    batch, seq = Dim("batch", min=2, max=16), Dim("seq", min=2, max=64)
    fn = tvm_stitch.from_torch(model, inputs(2, 9), target="llvm", dynamic_shapes={
        "input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}})
    (_, (b_dim, s_dim), _), (_, mask_dims, _) = fn.inputs  # symbolic, shared by both inputs
    assert mask_dims == (b_dim, s_dim) and fn.ranges == {b_dim: (2, 16), s_dim: (2, 64)}
    for b, s in ((2, 5), (3, 17), (2, 40)):
        args = inputs(b, s)
        with torch.no_grad():
            want = output(model(*args)).numpy()
        got = fn(*args)
        got = output(got) if not isinstance(got, torch.Tensor) else got
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="outside the compiled range"):
        fn(*inputs(2, 65))
    ids, mask = inputs(2, 9)
    with pytest.raises(ValueError, match="compiled for"):
        fn(ids, mask[:, :8])


def test_from_torch_names_a_refused_dynamic_dim():
    """A dim PyTorch cannot let vary (the model fixes it) is a ValueError naming the spec."""
    from torch.export import Dim

    model = torch.nn.Linear(8, 4).eval()
    with pytest.raises(ValueError, match=r"torch\.export refused dynamic_shapes"):
        tvm_stitch.from_torch(model, (torch.randn(3, 8),), target="llvm",
                              dynamic_shapes={"input": {1: Dim("width", min=2, max=16)}})


def test_a_dynamic_gpt2_in_float16_compiles_once_and_runs_at_three_lengths():
    """GPT-2 with a dynamic batch and length in float16: TVM 0.27's ToMixedPrecision cannot
    make the weights float16 parameters of a function of symbolic shape (even a Linear's); the
    casts it leaves (and those of the embedding tables and norm parameters the activations
    then read in float16) are made float16 parameters after it, as in a static import: no
    kernel reads a float32 weight (twice the bytes: GPT-2-base ran 2.2x slower than static on
    the H200 with them), and no split of the Q/K/V product goes through float32. One llvm
    build gives PyTorch's float32 numbers, within float16's error, at three shapes."""
    from torch.export import Dim

    from tvm_stitch.frontend import import_torch

    model, inputs, output = _gpt2()
    dims = {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=64)}
    imported = import_torch(model, inputs(2, 9), "float16", dynamic_shapes={"input_ids": dims})
    weights = imported.mod["main"].params[imported.num_inputs:]
    assert weights and {str(w.ty.dtype) for w in weights} == {"float16"}
    assert {str(w.dtype) for w in imported.weights} == {"float16"}
    text = imported.mod["main"].script()
    assert "R.split(" in text and not re.search(r"float32.*= R\.split\(", text)
    fn = tvm_stitch.from_torch(model, inputs(2, 9), target="llvm", dtype="float16",
                               dynamic_shapes={"input_ids": dims})
    for b, s in ((1, 5), (3, 17), (2, 40)):
        args = inputs(b, s)
        with torch.no_grad():
            want = output(model(*args)).numpy()
        got = fn(*args)
        got = (got if isinstance(got, torch.Tensor) else output(got)).float().numpy()
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)


def test_a_dynamic_model_tvm_cannot_convert_to_16_bits_is_a_clear_error(monkeypatch):
    """Where TVM's ToMixedPrecision fails however it is applied, ``import_torch`` says so, and
    what to do, instead of TVM's internal error."""
    from torch.export import Dim

    from tvm_stitch.frontend import import_torch

    def failing(*_args, **_kwargs):
        def convert(_mod):
            raise tvm.error.InternalError("no block is being built")
        return convert

    model, inputs, _ = _gpt2()
    shapes = {"input_ids": {0: Dim("batch", min=2, max=16), 1: Dim("seq", min=2, max=64)}}
    monkeypatch.setattr(relax.transform, "ToMixedPrecision", failing)
    with pytest.raises(NotImplementedError, match="compile it in float32"):
        import_torch(model, inputs(2, 9), "float16", dynamic_shapes=shapes)
    assert import_torch(model, inputs(2, 9), "float32", dynamic_shapes=shapes).num_inputs == 1


# -- symbolic extents in the tensor graph, the former and the kernel plans ------------------------
def _weights(cols=96):
    rng = np.random.default_rng(0)
    return [*(rng.standard_normal(cols).astype("float32") for _ in range(2)),
            rng.standard_normal((cols, 32)).astype("float32")]


def _residual_norm(rows, cols=96, ranges=True):
    """``layer_norm(x + y) * 2`` over ``(rows, cols)`` and a product ``x @ w`` beside it; ``rows``
    an int or a symbolic dim ``n`` in [1, 300] (its range in TVM's attributes when ``ranges``)."""
    x = relax.Var("x", relax.TensorType([rows, cols], "float32"))
    y = relax.Var("y", relax.TensorType([rows, cols], "float32"))
    gamma, beta, w = (relax.const(c) for c in _weights(cols))
    attrs = {"tir_var_lower_bound": {"n": 1}, "tir_var_upper_bound": {"n": 300}} if (
        ranges and not isinstance(rows, int)) else {}
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y], attrs):
        with bb.dataflow():
            s = bb.emit(relax.op.add(x, y))
            n = bb.emit(relax.op.nn.layer_norm(s, gamma, beta, axes=[-1]))
            out = bb.emit(relax.op.multiply(n, relax.const(2.0, "float32")))
            prod = bb.emit(relax.op.matmul(x, w))
            gv = bb.emit_output(relax.Tuple([out, prod]))
        bb.emit_func_output(gv)
    return bb.get()


def test_a_symbolic_function_is_analysed_at_the_upper_bounds_of_its_dims():
    """The tensor graph of a function whose rows are a symbolic ``n`` in [1, 300] has the nodes,
    kinds and access maps of the same function at n = 300, marked symbolic; without a range
    its kernels stay opaque, as before."""
    from tvm_stitch.graph import build_graph

    n = tirx.Var("n", "int64")
    legal = relax.transform.LegalizeOps()
    graph = build_graph(legal(_residual_norm(n)))
    static = build_graph(legal(_residual_norm(300)))
    assert graph.point == {"n": 300} and not graph.opaque_calls
    assert [(d.kind, d.detail, d.out_shape, [m.describe() for m in d.inputs])
            for d in graph.nodes.values()] == [
        (d.kind, d.detail, d.out_shape, [m.describe() for m in d.inputs])
        for d in static.nodes.values()]
    assert all(d.symbolic for d in graph.nodes.values())
    assert not any(d.symbolic for d in static.nodes.values())
    unranged = build_graph(legal(_residual_norm(n, ranges=False)))
    assert not unranged.nodes and len(unranged.opaque_calls) == 4


def test_symbolic_extents_compare_by_expression_not_by_their_size_at_the_point():
    """A symbolic extent is sized at the point (orderings, products, ``int()``) but equal only
    to an extent TVM proves equal: ``seq`` at 512 is not the static 512."""
    import math

    from tvm_stitch.graph.specialize import Extent

    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    point = {"b": 8, "s": 512}
    seq, batch = Extent.of(s, point), Extent.of(b, point)
    assert seq != 512 and int(seq) == 512 and seq > 511
    assert math.prod((batch, seq, 64)) == math.prod((Extent.of(s * b, point), 64))
    assert Extent.of(s * b, point) == Extent.of(b * s, point)
    assert Extent.of(s, point) != Extent.of(b * 64, point)  # equal sizes at the point
    assert Extent.of(s, {"b": 8}) is None


def test_one_primfunc_called_for_two_dims_is_read_at_each_calls_own_size():
    """TVM shares one ``arange`` PrimFunc between ``arange(batch)`` and ``arange(seq)``: each
    call's node is specialized at the size of the dim it is called for."""
    from tvm_stitch.graph import build_graph

    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([b, s], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"tir_var_lower_bound": {"b": 1, "s": 1},
                                   "tir_var_upper_bound": {"b": 8, "s": 40}}):
        with bb.dataflow():
            rows = bb.emit(relax.op.arange(relax.prim_value(b), dtype="float32")
                           if hasattr(relax, "prim_value") else relax.op.arange(b))
            cols = bb.emit(relax.op.arange(s))
            out = bb.emit(relax.op.add(relax.op.add(x, relax.op.astype(cols, "float32")),
                                       relax.op.expand_dims(relax.op.astype(rows, "float32"),
                                                            1)))
            gv = bb.emit_output(out)
        bb.emit_func_output(gv)
    graph = build_graph(relax.transform.LegalizeOps()(bb.get()))
    extents = sorted(d.out_shape for d in graph.nodes.values() if d.detail != "elementwise"
                     and len(d.out_shape) == 1)
    assert (8,) in extents and (40,) in extents, extents


@pytest.mark.parametrize("rows", [1, 7, 300])
def test_a_stitched_pattern_of_symbolic_rows_is_planned_at_the_point_and_runs_at_any_size(rows):
    """The residual + LayerNorm + scale pattern over symbolic rows is formed and scheduled by a
    kernel plan (made at n = 300, applied to the symbolic function): one llvm build gives
    numpy's numbers at 1, 7 and 300 rows, the product beside it too."""
    n = tirx.Var("n", "int64")
    mod = _residual_norm(n)
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(rows)
    x, y = (rng.standard_normal((rows, 96)).astype("float32") for _ in range(2))
    out, prod = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(y))
    gamma, beta, w = _weights()
    s = x + y
    want = (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(out.numpy(), (want * gamma + beta) * 2, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(prod.numpy(), x @ w, rtol=1e-4, atol=1e-4)


def test_a_symbolic_row_pattern_reduces_its_rows_across_threads_on_the_gpu():
    """The plan of a LayerNorm over symbolic ``(batch, seq)`` rows lowers for CUDA with its row
    sums as cross-thread reductions (TVM's ``red_buf``): rows in blocks of several, which need
    not divide ``batch * seq``, would leave each thread a partial sum of its own (TVM does not
    lower a reduction under a guard on its rows); such plans are refused, by TVM's checks."""
    from tvm_stitch.codegen.check import lower
    from tvm_stitch.hardware import HardwareModel
    from tvm_stitch.stitch.schedule import schedule_pattern

    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([b, s, 768], "float16"))
    ones, zeros = (relax.const(np.full(768, v, "float16")) for v in (1, 0))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, ones, zeros, axes=[-1]))
        bb.emit_func_output(out)
    func = relax.transform.LegalizeOps()(bb.get())["layer_norm"]
    hw = HardwareModel.from_target(CUDA)
    scheduled, plan, _ = schedule_pattern(func, hw, True, point={"b": 64, "s": 512})
    assert plan is not None and plan.composition in ("warp", "block")
    (device,) = lower(tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}),
                      CUDA).values()
    assert "red_buf" in device.script()


def test_the_symbolic_report_has_the_static_stitched_kernel():
    """CUDA fusion report (sm_90a, on this machine): the symbolic module's residual + LayerNorm
    + scale is one stitched kernel, as at n = 300; nothing is unanalysed."""
    n = tirx.Var("n", "int64")
    dynamic = tvm_stitch.fusion_report(_residual_norm(n), CUDA, tune="model")
    static = tvm_stitch.fusion_report(_residual_norm(300), CUDA, tune="model")

    def stitched(report):
        return sorted(tuple(g.kinds) for g in report.groups if "row-reduce" in g.kinds)

    assert stitched(dynamic) == stitched(static) and len(stitched(dynamic)) == 1
    assert not any("unanalysed" in g.kinds for g in dynamic.groups)



# -- generated kernels with runtime extents ------------------------------------------------------
def test_kernels_of_symbolic_shape_take_their_sizes_as_arguments():
    """A Linear + bias + GELU + residual over symbolic ``(batch, seq)`` rows, and an attention
    over symbolic batch and length with a padding mask: each kernel is printed once with the
    literals that depend on the dims as arguments (rows; batch strides, query and key counts),
    the texts at two sentinel points equal but for those, and Triton's interpreter gives
    torch's numbers at 1×1, 2×7 and 3×37, in float32 and float16; the Linear's kernel also
    with k split in 2 (a bucket variant's form: workspace and counters sized at a bound of
    rows, the counters left zero)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).with_name("runtime_interpret_cases.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=script.parent, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    cases = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [c["rows"] for c in cases] == [1, 14, 111] * 6
    assert sum(c["case"].startswith("attention") for c in cases) == 6
    assert sum(c["case"].endswith("split 2") for c in cases) == 6
    assert all(c["ok"] for c in cases), cases


def test_a_kernel_whose_literals_depend_on_more_than_its_rows_is_refused():
    """``x @ xᵀ`` over symbolic rows: both of its output's extents vary, so no kernel takes it
    at run time (it stays TVM's); the Linear's kernel takes exactly the rows."""
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen import runtime
    from tvm_stitch.codegen.kernel_text import UnsupportedKernelError
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until

    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType([n, 64], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"tir_var_lower_bound": {"n": 1},
                                   "tir_var_upper_bound": {"n": 256}}):
        with bb.dataflow():
            out = bb.emit_output(relax.op.matmul(x, relax.op.permute_dims(x)))
        bb.emit_func_output(out)
    mod = run_until(bb.get(), CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    assert len(recognize(graph, runtime=True).matches) == 1
    points = runtime.sentinel_points(graph.point)
    pair = [recognize(build_graph(mod, legalize=False, point=p), runtime=True).matches[0]
            for p in points]
    with pytest.raises(UnsupportedKernelError, match=r"extents \['m', 'n'\]"):
        runtime.runtime_kernel(pair, points, graph.values, ("m",))
    assert not recognize(graph).matches  # without runtime extents: nothing of symbolic shape


def test_the_stitch_pipeline_logs_the_time_of_each_phase(caplog):
    """Compile time is logged by phase, with each phase's slowest passes (issue 48's item 4
    asks where a compile's minutes go)."""
    import logging

    with caplog.at_level(logging.INFO, logger="tvm_stitch.pipeline"):
        tvm.compile(_residual_norm(tirx.Var("n", "int64")), "llvm",
                    relax_pipeline=tvm_stitch.pipeline("llvm"))
    (line,) = [r.getMessage() for r in caplog.records if "stitch pipeline:" in r.getMessage()]
    phases = [part.split(" ")[0] for part in line.split(": ", 1)[1].split("; ")]
    assert phases == ["dispatch", "fusion", "schedule", "lower", "finalize"]
    assert "StitchFusion" in line


def test_a_dim_without_a_range_elsewhere_leaves_the_other_kernels_their_runtime_sizes():
    """``x @ w`` over rows ``n`` in [1, 256] beside ``y * 2`` over an unranged ``m``: the
    product's kernel takes ``n`` at run time (the unranged dim is not one of its tensors'),
    and the analysis at a point never reads ``m``."""
    import dataclasses

    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen import runtime
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until

    n, m = tirx.Var("n", "int64"), tirx.Var("m", "int64")
    x = relax.Var("x", relax.TensorType([n, 64], "float16"))
    y = relax.Var("y", relax.TensorType([m, 8], "float16"))
    w = relax.const(np.ones((64, 48), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, y], {"tir_var_lower_bound": {"n": 1},
                                      "tir_var_upper_bound": {"n": 256}}):
        with bb.dataflow():
            out = bb.emit_output(relax.Tuple([relax.op.matmul(x, w),
                                              relax.op.multiply(y, relax.const(2, "float16"))]))
        bb.emit_func_output(out)
    mod = run_until(bb.get(), CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    assert graph.point == {"n": 256}
    (match,) = recognize(graph, runtime=True).matches
    points = runtime.sentinel_points(graph.point)
    pair = [recognize(build_graph(mod, legalize=False, point=p), runtime=True).matches[0]
            for p in points]
    kernel = runtime.runtime_kernel(pair, points, graph.values, ("m",), at_point=match,
                                    upper=graph.point)
    assert [str(e) for e in kernel.source.arguments.values()] == ["n"]
    assert str(kernel.extents["m"]) == "n"
    with pytest.raises(runtime.UnsupportedKernelError, match="is not 255"):
        wrong = dataclasses.replace(match, frame=_copy_frame(match.frame, m=255))
        runtime.runtime_kernel(pair, points, graph.values, ("m",), at_point=wrong,
                               upper=graph.point)


def _copy_frame(frame, **extents):
    import copy

    out = copy.copy(frame)
    out.extents = {**frame.extents, **extents}
    return out


# -- variants chosen at call time ----------------------------------------------------------------
def test_bucket_points_halve_the_smallest_dim_within_its_range():
    from tvm_stitch.codegen.runtime import bucket_points

    points = bucket_points({"b": (1, 64), "s": (1, 512)})
    assert points == [{"b": 2 ** k, "s": 512} for k in range(5, -1, -1)] + [
        {"b": 1, "s": 2 ** k} for k in range(8, 3, -1)]
    # the rows of a GEMM (b * s) fall by 2 at each point: every power of two from 16 tokens
    assert [p["b"] * p["s"] for p in points] == [2 ** k for k in range(14, 3, -1)]
    # a lower bound holds (odd sizes rounded up); nothing below the smallest bucket
    assert bucket_points({"s": (100, 128)}) == [{"s": 100}]
    assert bucket_points({"b": (3, 3), "s": (1, 77)}) == [
        {"b": 3, "s": 39}, {"b": 3, "s": 20}, {"b": 3, "s": 10}]
    assert bucket_points({"b": (2, 8), "s": (2, 8)}) == [{"b": 4, "s": 8}, {"b": 2, "s": 8}]
    assert bucket_points({"s": (1, 1)}) == []


def test_a_size_takes_the_tiles_of_the_nearest_bucket_point_in_ratio():
    """On the H200, BERT-base at 17 x 301 (5117 rows) ran the tiles of the 8192-row point
    (1.14x the static build's GEMM time), and an attention of 3 x 77 the 128-key blocks of
    1 x 256; the points of 4096 rows and 1 x 128 are nearer."""
    from tvm_stitch.codegen.runtime import variant_bounds

    found = [(8192, "b"), (4096, "c"), (2048, "c"), (1024, "d"), (512, "d")]
    bounds = variant_bounds((32768, "a"), found)
    # equal tiles are one variant, bounded halfway (geometrically) to the next larger point
    assert bounds == ((1448, "d"), (5792, "c"), (16384, "b"))

    def chosen(size):
        return next((tiles for bound, tiles in bounds if size <= bound), "a")

    assert chosen(17 * 301) == "c" and chosen(6000) == "b" and chosen(1449) == "c"
    assert chosen(100) == "d" and chosen(10 ** 6) == "a"
    # an attention's size is b * s * s: 3 x 77 nearer 1 x 128 than 1 x 256
    attention = variant_bounds((512 * 512, "k512"), [(256 * 256, "k128"), (128 * 128, "k64")])
    assert next(t for b, t in attention if 3 * 77 * 77 <= b) == "k64"
    # points of the size of a larger one (a dim the kernel does not vary with) add nothing
    assert variant_bounds((4096, "a"), [(4096, "b"), (2048, "a")]) == ()
    assert variant_bounds((None, "a"), found) == ()


def test_a_dynamic_bert_has_one_runtime_kernel_per_computation_with_variants_chosen_at_call_time():
    """HF BERT-tiny (2 layers) with dynamic batch and length, fused for CUDA: each layer's
    attention and GEMMs are the same runtime kernels (one PrimFunc each, called by both
    layers); each launch chooses at call time among tiles of smaller sizes (conditions on the
    product of its runtime extents) and, for the attention whose padding mask is read at
    ``b * seq``, a variant compiled for a length that is a multiple of 16."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    model, inputs, _ = _bert()
    model = type(model)(type(model.config)(**{**model.config.to_dict(), "num_hidden_layers": 2,
                                              "attn_implementation": "eager"})).eval()
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    calls = {}

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir":
            calls[e.args[0].name_hint] = calls.get(e.args[0].name_hint, 0) + 1

    relax.analysis.post_order_visit(fused["main"].body, visit)
    runtime = {k: n for k, n in calls.items() if "_rt_" in k}
    attention = [k for k in runtime if k.startswith("attention_rt_")]
    assert len(attention) == 1 and runtime[attention[0]] == 2
    # Q/K/V, the output projection, the two FFN GEMMs: once a layer; the pooler's once
    assert sorted(n for k, n in runtime.items() if k.startswith("gemm_rt_")) == [1, 2, 2, 2, 2]
    text = fused[attention[0]].script()
    launches = text.count("T.call_packed(")
    assert launches >= 3 and "% T.int64(16) == T.int64(0)" in text and " <= " in text
    assert text.count("_a16\"") >= 1  # the aligned variant's symbol


def test_a_runtime_gemm_takes_the_warp_specialized_form_with_descriptors_made_at_call_time(
        monkeypatch):
    """With the warp-specialized tiles (what a measured search picks; forced here), a GEMM of
    symbolic rows is the Gluon form: its partitions take the rows as an argument, and its TMA
    descriptors are made on the host from the rows at call time (a persistent grid of at most
    one program an SM). On the H200 this form gave PyTorch's numbers and the static build's
    speed (``benchmarks/studies/runtime_gemm.py``)."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    ws = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3,
          "WS": 2, "NUM_SMS": 132}
    _tuner_configs(monkeypatch, lambda match, source, _, got: (
        {**got, **ws} if match.family == "gemm" and source.ws else got))
    model, inputs, _ = _bert()
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    launches = [f.script() for gv, f in fused.functions.items()
                if gv.name_hint.startswith("gemm_rt_") and "ws2" in f.script()]
    assert launches
    dims = {str(v) for v in fused["main"].attrs["tir_var_upper_bound"]}
    products = set()
    for text in launches:
        # the A descriptor's rows are the call's rows (batch × seq; the pooler's, batch)
        a = re.search(r"tensormap_encode_tiled\(v, I0\.data, \d+, T\.Cast\(\"int32\", "
                      r"([\w ]+?(?: \* [\w ]+?)?)\)", text)
        assert a, text
        assert set(a.group(1).split(" * ")) <= dims
        products.add(len(a.group(1).split(" * ")))
        assert "T.min(T.int64(132), " in text  # persistent: at most a program an SM
    assert products == {1, 2}


def test_partitions_of_a_warp_specialized_kernel_take_its_runtime_arguments():
    from tvm_stitch.codegen.runtime import _partitions_take

    text = '''@gluon.jit
def _load(a_desc, n):
    x = RT_0 * n


@gluon.jit
def _consume(I0, k):
    _helper(I0)
    _load(a, RT_0)


@gluon.jit
def _helper(I0):
    y = I0


@gluon.jit
def KERNEL(RT_0, I0, a_desc):
    gl.warp_specialize([
        (_consume, (I0, 1)),
        (_load, (a_desc, 2)),
    ], [4], [24])
'''
    text = text.replace("    y = I0", "    y = I0\n    z = gl.where(c, (acc * 0.01), acc)")
    out = _partitions_take(text, ["RT_0"])
    assert "gl.where(c, (acc * 0.01), acc)" in out  # a parenthesized expression, no partition
    assert "def _load(RT_0, a_desc, n)" in out and "def _consume(RT_0, I0, k)" in out
    assert "(_consume, (RT_0, I0, 1))" in out and "(_load, (RT_0, a_desc, 2))" in out
    assert "_load(RT_0, a, RT_0)" in out and "def _helper(I0)" in out
    assert "def KERNEL(RT_0, I0, a_desc)" in out
    # a helper that reads the argument takes it too, from each of its callers
    helper = _partitions_take(text.replace("y = I0", "y = RT_0"), ["RT_0"])
    assert "def _helper(RT_0, I0)" in helper and "    _helper(RT_0, I0)" in helper
    # a module-level constant of the sizes: no such form
    assert _partitions_take("N = gl.constexpr(RT_0)\n" + text, ["RT_0"]) is None


def test_an_attention_of_one_sequence_of_symbolic_length_takes_its_length_at_run_time():
    """BERT-tiny with a fixed batch of 1 and a symbolic length: its attention has no batch
    axis, yet is a runtime kernel (the variants' size is the product of the extents that vary:
    seq × seq, not a missing batch)."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    model, inputs, _ = _bert()
    ids, mask = inputs(1, 9)
    mask[:] = 1
    seq = {1: Dim("seq", min=2, max=512)}
    imported = import_torch(model, (ids, mask), "float16",
                            dynamic_shapes={"input_ids": seq, "attention_mask": seq})
    fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    attention = [f for gv, f in fused.functions.items() if gv.name_hint.startswith("attention_rt_")]
    assert len(attention) == 1
    (dim,) = [str(v) for v in fused["main"].attrs["tir_var_upper_bound"]]
    assert f"{dim} * {dim} <= " in attention[0].script()


def test_from_torch_keeps_the_callers_pass_context_and_its_cuda_graph_setting(monkeypatch):
    """``from_torch`` compiles in the caller's PassContext (its disabled passes kept), with CUDA
    graphs as ``cuda_graph`` says, or as the caller's config says when it is not given."""
    seen = []
    real = tvm.compile

    def compile_(*args, **kwargs):
        ctx = tvm.transform.PassContext.current()
        seen.append((list(ctx.disabled_pass), ctx.config.get("relax.backend.use_cuda_graph")))
        return real(*args, **kwargs)

    monkeypatch.setattr(tvm, "compile", compile_)
    model = torch.nn.Linear(8, 4).eval()
    x = torch.randn(2, 8)
    with tvm.transform.PassContext(opt_level=3, disabled_pass=["SomePass"],
                                   config={"relax.backend.use_cuda_graph": True}):
        tvm_stitch.from_torch(model, (x,), target="llvm")
        tvm_stitch.from_torch(model, (x,), target="llvm", cuda_graph=True)
    tvm_stitch.from_torch(model, (x,), target="llvm")
    # the caller's setting kept; on llvm an explicit request still means no graphs; none set
    assert [s[0] for s in seen] == [["SomePass"], ["SomePass"], []]
    assert [bool(s[1]) for s in seen] == [True, False, False]


def _gather_module(start=0, swap=False):
    """``mask[arange(b)[:, None, None, None], arange(s)[None, None, None, :]]`` over a boolean
    cast of an int64 input of symbolic ``(b, s)`` (Hugging Face's padding-mask gather)."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([b, s], "int64"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x], {"tir_var_lower_bound": {"b": 1, "s": 1},
                                   "tir_var_upper_bound": {"b": 8, "s": 64}}):
        with bb.dataflow():
            mask = bb.emit(relax.op.astype(x, "bool"))
            rows = bb.emit(relax.op.arange(0, b, 1, "int64"))
            cols = bb.emit(relax.op.add(relax.op.arange(start, s + start, 1, "int64"),
                                        relax.const(0, "int64")))
            rows = bb.emit(relax.op.expand_dims(rows, [1, 2, 3]))
            cols = bb.emit(relax.op.expand_dims(cols, [0, 1, 2]))
            indices = (cols, rows) if swap else (rows, cols)
            out = bb.emit_output(relax.op.index_tensor(mask, relax.Tuple(indices)))
        bb.emit_func_output(out)
    return bb.get()


def test_a_gather_by_arange_indices_reads_its_input_in_place():
    """``x[arange(b), arange(s)]`` placed on two axes of the output is ``x`` reshaped: the
    symbolic BERT's padding mask is then read by the attention, not copied by a kernel first.
    An index not counted from 0, or indices in another order than ``x``'s axes, stays a
    gather; the folded module gives the gather's values on llvm."""
    from tvm_stitch.passes import FoldStaticShapes

    folded = FoldStaticShapes()(_gather_module())
    text = folded["main"].script()
    assert "index_tensor" not in text and "R.reshape(" in text and "[b, 1, 1, s]" in text
    for kept in (_gather_module(start=1), _gather_module(swap=True)):
        assert "index_tensor" in FoldStaticShapes()(kept)["main"].script()
    ex = tvm.compile(folded, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    x = np.random.default_rng(0).integers(0, 2, (3, 5)).astype("int64")
    got = vm["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_array_equal(got, x.astype(bool)[:, None, None, :])


def _embedding_module(flat=True, rows=lambda b, s: [b, s, 8]):
    """``table[ids]`` for ids of symbolic ``(b, s)``, as TVM's importer writes PyTorch's
    ``nn.Embedding``: the ids flattened, gathered, the rows reshaped to ``rows(b, s)``
    (``flat``); or the gather by the ids themselves."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    ids = relax.Var("ids", relax.TensorType([b, s], "int64"))
    table = relax.Var("table", relax.TensorType([50, 8], "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, table]):
        with bb.dataflow():
            if flat:
                gathered = bb.emit(relax.op.take(table, relax.op.reshape(ids, [b * s]), axis=0,
                                                 mode="wrap"))
                out = bb.emit_output(relax.op.reshape(gathered, rows(b, s)))
            else:
                out = bb.emit_output(relax.op.take(table, ids, axis=0, mode="wrap"))
        bb.emit_func_output(out)
    return bb.get()


def test_a_gather_by_flattened_indices_unflattened_gathers_by_them():
    """The flattened ids and the reshape back cost a dynamic build's embedding lookup
    divisions by ``seq`` for every element; the gather by the ids is the same values."""
    from tvm_stitch.passes import FoldStaticShapes

    got = FoldStaticShapes()(_embedding_module())
    tvm.ir.assert_structural_equal(got, FoldStaticShapes()(_embedding_module(flat=False)))
    ex = tvm.compile(got, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 8)).astype("float16")
    for shape in ((3, 7), (1, 13)):
        ids = rng.integers(-50, 50, shape)
        out = vm["main"](tvm.runtime.tensor(ids), tvm.runtime.tensor(table)).numpy()
        np.testing.assert_array_equal(out, table[ids % 50])
    # rows regrouped otherwise than the ids' shape are left as they are
    regrouped = _embedding_module(rows=lambda b, s: [b, s * 8])
    assert "R.reshape" in FoldStaticShapes()(regrouped)["main"].script()


def _dynamic_bert_fused(layers=1):
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    model, inputs, _ = _bert()
    if layers != 1:
        model = type(model)(type(model.config)(**{
            **model.config.to_dict(), "num_hidden_layers": layers,
            "attn_implementation": "eager"})).eval()
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    return fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))


def _calls(func, prefix):
    found = []

    def visit(e):
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.call_tir" and \
                e.args[0].name_hint.startswith(prefix):
            found.append(e)

    relax.analysis.post_order_visit(func.body, visit)
    return found


def test_a_dynamic_bert_attention_is_warp_specialized_at_large_sizes():
    """HF BERT-tiny (2 layers) with dynamic batch and length: the attention's variants for
    the large sizes are the warp-specialized form (its partitions take the runtime sizes, its
    TMA descriptors are made at call time over the call's batch × length rows), the padding
    mask is read without a gather kernel copying it first, and the embeddings gather the
    words' rows only."""
    fused = _dynamic_bert_fused(layers=2)
    calls = _calls(fused["main"], "attention_rt_")
    assert len(calls) == 2 and len({c.args[0].name_hint for c in calls}) == 1
    text = fused[calls[0].args[0].name_hint].script()
    assert re.search(r'"attention_rt_\w+ws"', text)  # the warp-specialized variant
    rows = re.findall(r'tensormap_encode_tiled\(v\w*, I\d\.data, \d+, T\.Cast\("int32", '
                      r'(\w+) \* (\w+)\)', text)
    dims = {str(v) for v in fused["main"].attrs["tir_var_upper_bound"]}
    # Q, K and V of each warp-specialized variant
    assert rows and len(rows) % 3 == 0 and all(set(r) == dims for r in rows)
    assert not _calls(fused["main"], "advanced_index") and "index_tensor" not in str(
        [gv.name_hint for gv in fused.functions])
    # two gathers, as in the static build: the word embeddings' rows and the pooler's first
    # token; position and token-type ids are known whatever the length (a slice, a broadcast
    # row), and no kernel computes them
    kernels = [c.args[0].name_hint for c in _calls(fused["main"], "")]
    gathers = [k for k in kernels if re.search(r"(^|_)(take|gather)\d*(_|$)", k)]
    assert len(gathers) == 2 and not [k for k in kernels if k.startswith("arange")], kernels


@pytest.mark.gpu
def test_warp_specialized_runtime_kernels_give_pytorchs_numbers_on_the_gpu(monkeypatch):
    """On the GPU: HF BERT (2 layers, head dim 64) in float16 with dynamic batch and length,
    every GEMM and attention forced to the warp-specialized form (descriptors made at call
    time, sizes passed to the partitions): PyTorch's numbers at lengths that are and are not
    multiples of 16, and at a batch of one."""
    forced = {
        "gemm": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4,
                 "num_stages": 3, "WS": 2, "NUM_SMS": 132},
        "attention": {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 4,
                      "WS": True, "NUM_SMS": 132},
    }
    _tuner_configs(monkeypatch, lambda match, source, _, got: (
        {**got, **forced[match.family]} if source.ws and match.family in forced else got))
    reference, inputs, fn = _gpu_dynamic_bert()  # float32
    with torch.no_grad():
        for b, s in ((3, 77), (2, 130), (1, 5), (8, 64), (16, 256)):
            args = inputs(b, s)
            got = fn(*args).last_hidden_state.float()
            want = reference(*args).last_hidden_state
            torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def _embeddings_module(positions=None, types=None):
    """Position and token-type embeddings of symbolic ``(b, s)`` as Hugging Face exports them:
    ``take(table, ids)`` with ids gathered from buffers by ``arange(s)``."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    ids = relax.Var("ids", relax.TensorType([b, s], "int64"))
    pos = relax.Var("pos", relax.TensorType([16, 8], "float32"))
    typ = relax.Var("typ", relax.TensorType([2, 8], "float32"))
    positions = np.arange(16)[None] if positions is None else positions
    types = np.zeros((1, 16), "int64") if types is None else types
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, pos, typ], {"tir_var_lower_bound": {"b": 1, "s": 1},
                                               "tir_var_upper_bound": {"b": 4, "s": 16}}):
        with bb.dataflow():
            r = bb.emit(relax.op.arange(0, s, 1, "int64"))
            p = bb.emit(relax.op.take(relax.const(positions.astype("int64")), r, axis=1))
            t = bb.emit(relax.op.gather_elements(relax.const(types.astype("int64")), p, 1))
            t = bb.emit(relax.op.reshape(relax.op.broadcast_to(t, [b, s]), [b * s]))
            te = bb.emit(relax.op.take(typ, relax.op.astype(t, "int32"), axis=0))
            pe = bb.emit(relax.op.take(pos, relax.op.reshape(relax.op.astype(p, "int32"), [s]),
                                       axis=0))
            out = bb.emit_output(relax.op.add(relax.op.reshape(te, [b, s, 8]), pe))
        bb.emit_func_output(out)
    return bb.get()


def test_gathers_by_indices_known_whatever_the_length_are_slices_and_broadcast_rows():
    """Position ids (a buffer of ``arange`` gathered by ``arange(s)``) read the first ``s``
    rows of their table: a slice; token-type ids (a zero buffer gathered by anything) read
    row 0 everywhere: that row broadcast. Values not known that way stay gathers (a buffer
    that is no ``arange``, a row past the table). On llvm the folded module gives numpy's
    values at two lengths."""
    from tvm_stitch.passes import FoldStaticShapes

    folded = FoldStaticShapes()(_embeddings_module())
    text = folded["main"].script()
    assert "R.take(" not in text and "gather_elements" not in text
    assert text.count("R.strided_slice(") == 2 and "R.broadcast_to(" in text
    shuffled = FoldStaticShapes()(_embeddings_module(positions=np.arange(16)[::-1][None]))
    assert "R.take(pos" in shuffled["main"].script()  # reversed positions: still a gather
    past = FoldStaticShapes()(_embeddings_module(types=np.full((1, 16), 5)))
    assert "R.take(typ" in past["main"].script()  # row 5 of a 2-row table: left as it was
    ex = tvm.compile(folded, target="llvm")
    vm = relax.VirtualMachine(ex, tvm.cpu())
    rng = np.random.default_rng(0)
    pos, typ = rng.standard_normal((16, 8), "float32"), rng.standard_normal((2, 8), "float32")
    for b, s in ((2, 5), (3, 16)):
        ids = np.zeros((b, s), "int64")
        got = vm["main"](*(tvm.runtime.tensor(a) for a in (ids, pos, typ))).numpy()
        np.testing.assert_allclose(got, np.broadcast_to(typ[0] + pos[:s], (b, s, 8)))


def test_bucket_points_are_searched_short_and_the_representative_point_at_length(
        tmp_path, monkeypatch):
    """Item 4: from an empty database, a dynamic build measures a dozen bucket points a
    runtime kernel; each is a short search (one round of the model's best, the seeds, the
    best refined: ``QUICK_SEARCH``), the representative point the full one, and the short
    one's record says so."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module
    from tvm_stitch.tune import policy
    from tvm_stitch.tune.database import TuningDatabase
    from tvm_stitch.tune.kernels import PASS_SEARCH, QUICK_SEARCH

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    model, inputs, _ = _bert()
    dims = {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    searches = []
    original = policy.tune_generated

    def searched(match, source, shapes, constants, hw, on_device, cost, **search):
        searches.append((bool(match.runtime), search.get("config", PASS_SEARCH),
                         search.get("refine_top", 2)))
        # the cost model stands in for the GPU; the tuner stores it as measured
        return original(match, source, shapes, constants, hw, on_device=False, cost=cost,
                        **search)

    monkeypatch.setattr(policy, "tune_generated", searched)
    monkeypatch.setattr("tvm_stitch.passes.mcfuser.can_measure", lambda: (True, ""))
    fused_module(imported.mod, CUDA, tune="measure", **default_options(CUDA))
    runtime = [s for s in searches if s[0]]
    quick = [s for s in runtime if s[1] is QUICK_SEARCH and s[2] == 1]
    full = [s for s in runtime if s[1] is PASS_SEARCH and s[2] == 2]
    assert quick and full and len(quick) + len(full) == len(runtime)
    assert len(quick) > len(full)  # several points a kernel, one representative
    records = TuningDatabase().records.values()
    assert sum(r.get("search") == "quick" for r in records) == len(quick)


def test_a_bucket_point_takes_the_static_kernels_best_timing_it_can_launch(tmp_path, monkeypatch):
    """Item 3: the tuning database's timings of the static kernel at a bucket point's extents
    (a static compile's measured search, or a service's earlier tuning) are the runtime
    kernel's at that point: the fastest config the runtime form can launch (no persistent
    grid), not the cost model's pick. Without such a record the model picks as before."""
    from torch.export import Dim

    from tvm_stitch.codegen import runtime
    from tvm_stitch.explore.tiling import build_search_space
    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module
    from tvm_stitch.tune import policy
    from tvm_stitch.tune.database import TuningDatabase
    from tvm_stitch.tune.kernels import _tune

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    model, inputs, _ = _bert()
    dims = {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    original, seen = policy.KernelTuner.config, []

    def spy(self, match, source, shapes, constants, like=None, **kwargs):
        got = original(self, match, source, shapes, constants, like, **kwargs)
        seen.append((match, source, like, got))
        return got

    monkeypatch.setattr(policy.KernelTuner, "config", spy)
    fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    # a GEMM's runtime kernel at a bucket point of 64 rows, and the static kernel there
    rows = [(m, s, like, got) for m, s, like, got in seen if m.family == "gemm" and like
            and m.runtime and m.frame.extents["m"] == 64]
    assert rows, "no runtime GEMM at the 64-row bucket point"
    match, source, (other, other_source), model_pick = rows[0]
    kernel = _tune("gemm").space(match)
    space = build_search_space(kernel.spec, 228 * 1024, kernel.legal, count=False)
    pick = {x: model_pick[p] for x, p in (("m", "BLOCK_M"), ("n", "BLOCK_N"), ("k", "BLOCK_K"))}
    tiles = next(dict(c.tile_dict) for c in space.candidates() if dict(c.tile_dict) != pick)
    launch = {"num_warps": 4, "num_stages": 2}
    db = TuningDatabase()
    key = policy.tuning_key(db, other, other_source, tvm_stitch.HardwareModel.from_target(CUDA))
    db.put(key, {"BLOCK_M": 64}, measurements=[
        {"tiles": pick, "launch": {**launch, "PERSISTENT": True}, "time_s": 1e-6},  # not here
        {"tiles": tiles, "launch": launch, "time_s": 2e-6},
        {"tiles": pick, "launch": launch, "time_s": 3e-6},
        {"tiles": pick, "launch": {"num_warps": 8}, "time_s": float("inf")}])
    seen.clear()
    fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    got = [g for m, s, like, g in seen if m.family == "gemm" and s.name == source.name
           and m.frame.extents == match.frame.extents]
    assert got
    want = {"BLOCK_M": tiles["m"], "BLOCK_N": tiles["n"], "BLOCK_K": tiles["k"], **launch}
    assert all({k: g.get(k) for k in want} == want for g in got), (got, want)
    assert runtime.fixed(got[0], source)["PERSISTENT"] is False


def test_an_unaligned_variant_that_spills_takes_smaller_tiles(monkeypatch, caplog):
    """A runtime attention reading a per-logit mask (GPT-2's causal and padding mask, ``[b, 1,
    s, s]``) at a length no multiple of 16 loads it element by element: with the 64 x 128
    tiles and 8 warps chosen for aligned lengths, its variant for other lengths spilled 952
    bytes (ptxas) and ran 12x slower on the H200 (4 x 333 against 4 x 320). That variant now
    takes the largest smaller tiles that compile without spilling; the aligned one keeps its
    tiles."""
    import transformers
    from torch.export import Dim

    from tvm_stitch.codegen.ptx import spill_bytes
    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    wide = {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}
    _tuner_configs(monkeypatch, lambda match, _, __, got: got if match.family != "attention"
                   else {**{k: v for k, v in got.items() if k not in ("WS", "NUM_SMS", "TMA")},
                         **wide})
    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=768, n_layer=2, n_head=12, vocab_size=300, attn_implementation="eager")).eval()
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    ids, mask = torch.randint(0, 300, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    imported = import_torch(model, (ids,), "float16", {"attention_mask": mask},
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    with caplog.at_level("INFO", logger="tvm_stitch.embed"):
        fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    texts = [f.script() for gv, f in fused.functions.items()
             if gv.name_hint.startswith("attention_rt_")]
    assert texts
    probe = ".version 8.7\n.target sm_90a\n.address_size 64\n.visible .entry k()\n{\nret;\n}\n"
    if spill_bytes(probe) is None:
        pytest.skip("no ptxas to report spills")
    assert re.search(r"unaligned variant \S+ spills \d+ bytes: \S+ taken", caplog.text)
    symbols = set(re.findall(r"attention_rt_\w+_w\d+s\d+\w*", "\n".join(texts)))
    # the unaligned launch: 64 x 64 tiles; the aligned variant keeps 64 x 128
    assert any(s.endswith("x64x64_w8s2") for s in symbols), symbols
    assert any(s.endswith("x64x128_w8s2_a16") for s in symbols), symbols


def test_reshapes_of_symbolic_shape_are_injective():
    """TVM marks a legalized reshape of symbolic shape opaque (its indices divide by a dim
    known at run time); ``InjectiveViews`` marks it injective, as the static one is, and leaves
    a computation of symbolic shape, and a static reshape, as they were."""
    from tvm.script import relax as R
    from tvm.script import tirx as T
    from tvm_stitch.passes import InjectiveViews

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor(("n", 6), "float32"), y: R.Tensor((4, 6), "float32")):
            n = T.int64()
            with R.dataflow():
                a = R.reshape(x, R.shape([n * 2, 3]))
                b = R.add(x, x)
                c = R.reshape(y, R.shape([8, 3]))
                R.output(a, b, c)
            return (a, b, c)

    mod = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(Before))
    patterns = {gv.name_hint: int(f.attrs["op_pattern"]) for gv, f in mod.functions.items()
                if isinstance(f, tirx.PrimFunc)}
    assert patterns["reshape"] == 8  # TVM's
    after = InjectiveViews()(mod)
    got = {gv.name_hint: int(f.attrs["op_pattern"]) for gv, f in after.functions.items()
           if isinstance(f, tirx.PrimFunc)}
    assert got == {**patterns, "reshape": 2}


def test_a_dynamic_gpt2_fuses_as_many_kernels_as_the_static_one():
    """GPT-2 (2 layers) with a padding mask, dynamic batch and length, fused for CUDA in
    float16: the prologue's casts, gathers and mask fuse through reshapes of symbolic shape as
    the static build's do, and the dynamic build has the static build's kernel count."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    torch.manual_seed(0)
    import transformers

    model = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=2, vocab_size=300, attn_implementation="eager")).eval()
    ids, mask = torch.randint(0, 300, (3, 17)), torch.ones(3, 17, dtype=torch.long)
    mask[1, 12:] = 0
    counts = []
    for dynamic in (True, False):
        dims = {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=1, max=64)}
        imported = import_torch(
            model, (ids,), "float16", {"attention_mask": mask},
            dynamic_shapes={"input_ids": dims, "attention_mask": dims} if dynamic else None)
        fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
        counts.append(len(_calls(fused["main"], "")))
    assert counts[0] == counts[1], counts


def _split_variants(monkeypatch, split=2):
    """The tuner's configs with the GEMMs' bucket variants (its short searches) splitting k
    in ``split``, 16-deep k steps; the tiles at the representative point as chosen."""

    def change(match, source, kwargs, got):
        if match.family != "gemm" or not kwargs.get("quick") or not source.split_k:
            return got
        return {**got, "BLOCK_K": 16, "SPLIT_K": split, "PERSISTENT": False, "WS": None}

    _tuner_configs(monkeypatch, change)


def test_runtime_gemm_variants_of_bounded_rows_split_k(monkeypatch):
    """A runtime GEMM's variants for small row counts may split k (the H200's 1×128 BERT-base
    FFN-out took 105 µs unsplit, 84 split in the static build): each split variant's
    workspace and counters are sized at its bound of rows, the PrimFunc takes the largest of
    them (counters a zero constant, the workspace one more output), and the variant for the
    largest sizes, which no bound sizes, never splits."""
    from torch.export import Dim

    from tvm_stitch.codegen import embed
    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    _split_variants(monkeypatch)
    model, inputs, _ = _bert()
    dims = {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}
    imported = import_torch(model, inputs(2, 9), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    gemms = {gv.name_hint: f for gv, f in fused.functions.items()
             if gv.name_hint.startswith("gemm_rt_")}
    assert gemms
    for name, func in gemms.items():
        assert int(func.attrs[embed.ZEROED_INPUTS]) == 1, name
        buffers = {b.name: b for b in func.params if hasattr(b, "shape")}
        cnt, ws = buffers["CNT"], buffers["WS"]
        assert (str(cnt.dtype), str(ws.dtype)) == ("int32", "float32")
        text = func.script()
        symbols = set(re.findall(r'"(gemm_rt_\w+?)"', text))
        split = [s for s in symbols if s.endswith("k2")]
        assert split and len(split) < len(symbols), symbols  # the largest sizes' unsplit
        # the largest bound of 8 x 64 = 512 rows below the top: 16-row tiles, 2 splits
        n = int(ws.shape[0]) // int(cnt.shape[0])
        assert n % (2 * 16) == 0 and int(cnt.shape[0]) <= -(-512 // 16) * 64, (name, n)
    # each call passes a zero constant for the counters; the workspace is an output
    for call in _calls(fused["main"], "gemm_rt_"):
        consts = [a for a in call.args[1].fields if isinstance(a, tvm.ir.expr.Constant)]
        assert len(consts) == 1 and not consts[0].value.numpy().any()
        assert isinstance(call.ty, relax.TupleType)


@pytest.mark.gpu
def test_runtime_gemm_split_variants_give_pytorchs_numbers_on_the_gpu(monkeypatch):
    """On the GPU: HF BERT (2 layers) with dynamic batch and length, the GEMMs' bucket
    variants splitting k in 4: PyTorch's numbers at sizes each variant runs, twice each (the
    counters the first call used are zero again for the second)."""
    _split_variants(monkeypatch, split=4)
    model, inputs, fn = _gpu_dynamic_bert()
    with torch.no_grad():
        for b, s in ((1, 5), (1, 77), (3, 77), (2, 130), (16, 256), (1, 5)):
            args = inputs(b, s)
            for _ in range(2):
                got = fn(*args).last_hidden_state.float()
                want = model(*args).last_hidden_state
                torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def test_a_runtime_variant_that_needs_more_shared_memory_takes_fewer_stages(monkeypatch, caplog):
    """A runtime kernel's variant whose tiles need more shared memory than a block has (a
    64 x 64 tile over 256-deep k steps in 4 stages: 256 KiB) is built with fewer stages, as the
    pass builds a kernel's main config; before, it was left out and its sizes ran the next
    larger variant's tiles (BERT-base's FFN-out at 1×128 on the H200: 128.7 µs against 84.5
    in the static build)."""
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    deep = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4,
            "PERSISTENT": False, "WS": None}
    _tuner_configs(monkeypatch, lambda match, _, kwargs, got: (
        {**got, **deep} if match.family == "gemm" and kwargs.get("quick") else got))
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(  # FFN-out: k of 1024, 4 steps
        hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=1024,
        vocab_size=300, attn_implementation="eager")).eval()
    ids, mask = torch.randint(0, 300, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    dims = {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}
    imported = import_torch(model, (ids,), "float16", {"attention_mask": mask},
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    with caplog.at_level("INFO", logger="tvm_stitch.embed"):
        fused = fused_module(imported.mod, CUDA, tune="model", **default_options(CUDA))
    assert "left out" not in caplog.text
    assert re.search(r"needs \d+ bytes of shared memory.*; trying 3 pipeline stages",
                     caplog.text)
    text = "\n".join(f.script() for gv, f in fused.functions.items()
                     if gv.name_hint.startswith("gemm_rt_"))
    assert re.search(r'"gemm_rt_\w+_256x64x64_w4s3(k\d+)?"', text)  # FFN-out's variants
