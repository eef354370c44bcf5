"""Whatever TVM's default pipeline accepts, the stitch pipeline builds: symbolic shapes, boolean
masks and scans, operators nobody recognizes.  Unsupported parts are left to TVM with a logged
reason; input-independent values are folded at compile time."""

from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_stitch
from tvm_stitch.workloads import get_workload


def _awkward_module():
    bb = relax.BlockBuilder()
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", R.Tensor((n, 64), "float32"))
    w = relax.Var("w", R.Tensor((64, 64), "float32"))
    keep = relax.Var("keep", R.Tensor((n, 64), "bool"))
    y = relax.Var("y", R.Tensor((4, 64), "float32"))
    with bb.function("main", [x, w, keep, y]):
        with bb.dataflow():
            h = bb.emit(relax.op.matmul(x, w))  # symbolic rows
            h = bb.emit(relax.op.where(keep, h, relax.const(-1e4, "float32")))  # a boolean mask
            h = bb.emit(relax.op.nn.softmax(h))
            c = bb.emit(relax.op.cumsum(keep, axis=1))  # a scan over bool (llvm cannot add bools)
            s = bb.emit(relax.op.sort(y, axis=1))  # an operator nothing recognizes
            t = relax.op.add(s, relax.op.sum(y, axis=1, keepdims=True))
            t = bb.emit(relax.op.nn.softmax(t))
            out = bb.emit_output(relax.Tuple([h, c, t]))
        bb.emit_func_output(out)
    return bb.get()


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_symbolic_shapes_bool_masks_and_unknown_ops_build(caplog):
    mod = _awkward_module()
    with caplog.at_level(logging.DEBUG, logger="tvm_stitch"):
        ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
        report = tvm_stitch.fusion_report(mod, "cuda")  # recognition for a GPU, on this machine
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 64)).astype("float32")
    w = (0.1 * rng.standard_normal((64, 64))).astype("float32")
    keep = rng.random((5, 64)) > 0.3
    y = rng.standard_normal((4, 64)).astype("float32")
    h, c, t = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in (x, w, keep, y)]
    )
    np.testing.assert_allclose(h.numpy(), _softmax(np.where(keep, x @ w, -1e4)), 1e-5, 1e-6)
    np.testing.assert_array_equal(c.numpy(), np.cumsum(keep, 1) > 0)
    s = np.sort(y, 1) + y.sum(1, keepdims=True)
    np.testing.assert_allclose(t.numpy(), _softmax(s), 1e-5, 1e-6)
    assert "symbolic or dynamic shapes" in caplog.text  # the graph leaves them to TVM
    assert "over bool accumulates in int32" in caplog.text
    # the symbolic kernels are counted, not dropped
    assert any(g.kinds == ["unanalysed"] for g in report.groups)
    assert report.kernels >= 4


def test_input_independent_values_are_folded(caplog):
    """GPT-2's causal mask (arange, comparisons, a cumsum over bool, index_tensor) becomes a
    constant before TVM's dispatch; llvm builds the model, which TVM's default pipeline cannot."""
    inst = get_workload("gpt2-tiny").instance("float32", seq=9)
    # inside a CUDA build that captures CUDA graphs (whose builtins a CPU machine lacks): the
    # values are still evaluated on the CPU, in a context of their own
    graphs = tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": True})
    with graphs, caplog.at_level(logging.INFO, logger="tvm_stitch.canonicalize"):
        folded = tvm_stitch.passes.FoldStaticShapes()(inst.mod)
    text = folded["main"].script()
    for op in ("R.arange", "R.cumsum", "R.index_tensor", "R.less_equal"):
        assert op not in text, op
    assert "folded into constants" in caplog.text
    # weights are inputs: nothing that reads one is folded
    assert text.count("R.matmul") == inst.mod["main"].script().count("R.matmul")


def _rotary_join(empty: bool):
    """``concat((rotated, q[..., 8:]))`` of a head of 8 (Phi-3's rotary embedding over the
    whole head: the pass-through part is empty); without ``empty``, the concat left out."""
    bb = relax.BlockBuilder()
    q = relax.Var("q", R.Tensor((2, 5, 8), "float32"))
    with bb.function("main", [q]):
        with bb.dataflow():
            rotated = bb.emit(relax.op.multiply(q, relax.const(2.0, "float32")))
            if empty:
                rest = bb.emit(relax.op.strided_slice(q, axes=[2], begin=[8], end=[8]))
                rotated = bb.emit(relax.op.concat([rotated, rest], axis=-1))
            out = bb.emit_output(relax.op.add(rotated, q))
        bb.emit_func_output(out)
    return bb.get()


def test_empty_parts_are_left_out_of_a_concat():
    """A concat of an empty tensor (a slice of no element) is its other part: TVM's GPU
    schedules fail on the empty slice's loops ("Divide by zero"), which Phi-3 hit."""
    folded = tvm_stitch.passes.FoldStaticShapes()(_rotary_join(True))
    tvm.ir.assert_structural_equal(folded, _rotary_join(False))
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    tvm.compile(_rotary_join(True), cuda, relax_pipeline=tvm_stitch.pipeline(cuda))


def test_infinite_fills_are_broadcasts_and_build_by_default():
    """``full`` of -inf (an imported ``torch.full`` mask) is a ``broadcast_to`` of the value, a
    finite fill is left alone; TVM's own pipeline, which refuses to legalize the infinite
    ``full``, then builds the imported module and computes what PyTorch does."""
    import torch

    from tvm_stitch.frontend import import_torch

    @tvm.script.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((3, 5), "float16")):
            a = R.full(R.shape([3, 5]), R.const(float("-inf"), "float16"), "float16")
            b = R.full(R.shape([3, 5]), R.const(0.5, "float16"), "float16")
            return R.add(R.add(x, a), b)

    @tvm.script.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((3, 5), "float16")):
            a = R.broadcast_to(R.const(float("-inf"), "float16"), R.shape([3, 5]))
            b = R.full(R.shape([3, 5]), R.const(0.5, "float16"), "float16")
            return R.add(R.add(x, a), b)

    tvm.ir.assert_structural_equal(tvm_stitch.passes.finite_fills(Before), Expected)

    class Banded(torch.nn.Module):
        def forward(self, x):
            n = x.shape[-1]
            inf = torch.full((n, n), float("-inf"), dtype=x.dtype)
            i = torch.arange(n)
            far = (i[None, :] - i[:, None]).abs() > 1
            return torch.softmax(x + torch.where(far, inf, torch.zeros_like(inf)), dim=-1)

    x = torch.randn(2, 7, 7)
    imported = import_torch(Banded(), (x,), "float32")
    ex = tvm.compile(imported.mod, "llvm")  # TVM's default pipeline
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    np.testing.assert_allclose(got, Banded()(x).numpy(), rtol=1e-5, atol=1e-6)


def test_negative_indices_count_from_the_end():
    """``x[..., [-2], :]`` (Falcon picks its K and V heads so from the fused Q/K/V): imported as
    a gather of the constant index -2, which TVM's ``take`` reads outside the tensor; counted
    from the end, the stitch pipeline computes what PyTorch does."""
    import torch

    from tvm_stitch.frontend import import_torch

    class Heads(torch.nn.Module):
        def forward(self, x):
            return x[..., [-2], :] * 2 + x[..., [-1], :]

    x = torch.randn(2, 3, 4, 5)
    imported = import_torch(Heads(), (x,), "float32")
    ex = tvm.compile(imported.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x.numpy())).numpy()
    np.testing.assert_array_equal(got, Heads()(x).numpy())


def test_gathers_wrap_their_indices():
    """``nn.Embedding``'s gather (``take`` in ``fast`` mode: no bounds check) wraps its indices:
    an id past the table reads a row of the table, not memory after it; a negative one counts
    from the end (PyTorch's indexing); the ids in range read what they did."""
    bb = relax.BlockBuilder()
    table = relax.Var("table", R.Tensor((5, 3), "float32"))
    ids = relax.Var("ids", R.Tensor((4,), "int32"))
    with bb.function("main", [ids, table]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.take(table, ids, axis=0, mode="fast"))
        bb.emit_func_output(out)
    mod = bb.get()
    assert 'mode="wrap"' in tvm_stitch.passes.FoldStaticShapes()(mod)["main"].script()
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    w = np.arange(15, dtype="float32").reshape(5, 3)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        tvm.runtime.tensor(np.array([0, -1, 2, 7], "int32")), tvm.runtime.tensor(w))
    np.testing.assert_array_equal(got.numpy(), w[[0, 4, 2, 2]])


def test_negative_index_tensors_count_from_the_end():
    """``table[idx]`` with ``idx`` an input holding -1: PyTorch reads the last row (TVM's
    ``take`` clamped it to row 0)."""
    import torch

    import tvm_stitch

    class Rows(torch.nn.Module):
        def forward(self, table, idx):
            return table[idx] * 2

    table, idx = torch.randn(6, 4), torch.tensor([-1, 0, 3, -6])
    fn = tvm_stitch.from_torch(Rows(), (table, idx), target="llvm")
    torch.testing.assert_close(fn(table, idx), Rows()(table, idx))


def test_a_reduction_over_axes_of_one_element_is_its_input():
    """``mean(x, -1)`` of ``(3, 1)`` rows (an RMSNorm of one-element rows): TVM's GPU schedule
    of it, fused with what follows, wrote its accumulator to the output and read it back (a
    wrong value on the GPU, TVM's default pipeline too); the stitch pipeline reshapes the input
    instead, and a reduction over a longer axis is left as it is."""

    def module(reduced):
        bb = relax.BlockBuilder()
        x = relax.Var("x", R.Tensor((3, 1), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                a = bb.emit(reduced(x))
                b = bb.emit(relax.op.max(x, axis=[0, 1]))
                out = bb.emit_output(relax.op.add(a, b))
            bb.emit_func_output(out)
        return bb.get()

    before = module(lambda x: relax.op.mean(x, axis=[1], keepdims=False))
    expected = module(lambda x: relax.op.reshape(x, (3,)))
    tvm.ir.assert_structural_equal(tvm_stitch.passes.FoldStaticShapes()(before), expected)
