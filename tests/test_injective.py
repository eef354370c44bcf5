"""Kernels without reductions in 16-byte pieces (:mod:`tvm_stitch.stitch.injective`)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import te
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T

import tvm_stitch
from tvm_stitch.report import cuda_source
from tvm_stitch.stitch.injective import VectorizedInjective

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


@T.prim_func(private=True, s_tir=True)
def _gather(table: T.Buffer((50, 40), "float16"), idx: T.Buffer((13,), "int32"),
            out: T.Buffer((13, 40), "float16")):
    T.func_attr({"tirx.noalias": True})
    for i, j in T.grid(13, 40):
        with T.sblock("out"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            out[v_i, v_j] = table[idx[v_i], v_j]


@T.prim_func(private=True, s_tir=True)
def _gather_vectorized(table: T.Buffer((50, 40), "float16"), idx: T.Buffer((13,), "int32"),
                       out: T.Buffer((13, 40), "float16")):
    T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
    for ax0_ax1_0_fused_0 in T.thread_binding(3, thread="blockIdx.x"):
        for ax0_ax1_0_fused_1 in T.thread_binding(32, thread="threadIdx.x"):
            for ax1_1 in T.vectorized(8):
                with T.sblock("out"):
                    v0 = T.axis.spatial(13, (ax0_ax1_0_fused_0 * 32 + ax0_ax1_0_fused_1) // 5)
                    v1 = T.axis.spatial(
                        40, (ax0_ax1_0_fused_0 * 32 + ax0_ax1_0_fused_1) % 5 * 8 + ax1_1)
                    T.where(ax0_ax1_0_fused_0 * 32 + ax0_ax1_0_fused_1 < 65)
                    T.reads(table[idx[v0], v1], idx[v0])
                    T.writes(out[v0, v1])
                    out[v0, v1] = table[idx[v0], v1]


@T.prim_func(private=True, s_tir=True)
def _symbolic_gather(var_ids: T.handle, table: T.Buffer((50, 40), "float16"), var_out: T.handle):
    T.func_attr({"tirx.noalias": True})
    b, s = T.int64(), T.int64()
    ids = T.match_buffer(var_ids, (b, s), "int32")
    out = T.match_buffer(var_out, (b, s, 40), "float16")
    for i, j, k in T.grid(b, s, 40):
        with T.sblock("out"):
            v_i, v_j, v_k = T.axis.remap("SSS", [i, j, k])
            out[v_i, v_j, v_k] = table[ids[v_i, v_j], v_k]


def _schedule(func, threads: int = 128):
    """``func`` scheduled by the rule alone, or None where the rule refused it."""
    with CUDA:
        out = dl.ApplyDefaultSchedule(VectorizedInjective(threads))(tvm.IRModule({"main": func}))
    return out["main"] if "tirx.is_scheduled" in (out["main"].attrs or {}) else None


def test_a_gather_moves_rows_in_16_byte_pieces():
    """An embedding lookup (13 rows of 40 float16 values picked by index): the row index is one
    per thread, the 8 columns of a thread one vector; the last block is masked (65 pieces)."""
    tvm.ir.assert_structural_equal(_schedule(_gather, threads=32), _gather_vectorized)
    func = _gather_vectorized.with_attr("global_symbol", "main")
    src = cuda_source(tvm.compile(tvm.IRModule({"main": func}), CUDA))
    assert src.count("*(uint4*)") == 2  # one vector load, one vector store


def test_a_gather_of_symbolic_rows_moves_them_in_16_byte_pieces():
    """``table[ids]`` for ``[batch, seq]`` ids of symbolic shape (an embedding lookup of a
    dynamic build): the rows are any number, the columns a constant one, so a thread still
    moves 8 columns with one vector load and store. TVM's fallback moved one element a
    thread, its indices divided by ``seq`` in 64 bits: 22 us against 4 for the static
    lookup at 4096 tokens on the H200."""
    scheduled = _schedule(_symbolic_gather)
    assert scheduled is not None
    assert scheduled.script().count("T.vectorized(8)") == 1
    func = scheduled.with_attr("global_symbol", "main")
    src = cuda_source(tvm.compile(tvm.IRModule({"main": func}), CUDA))
    assert src.count("*(uint4*)") == 2


def _elementwise(shape, fn, dtypes):
    args = [te.placeholder(s, d, f"x{i}") for i, (s, d) in enumerate(dtypes)]
    return te.create_prim_func([*args, te.compute(shape, lambda *i: fn(*args, *i), name="y")])


def test_only_accesses_contiguous_along_the_last_axis_are_vectorized():
    """Bias-add (a broadcast row): 8 float16 lanes; casts from float32, float16 and float64:
    as many lanes as 16 bytes of the widest access hold (4, 8, 2); each compiles for sm_90a.
    Left to TVM's rules: a transpose (columns pick the input's rows), a column gather
    (``x[i, idx[j]]``: the column index inside a buffer load), columns of a wider row
    (``x[i, j]`` of a 28-wide ``x``: not aligned), a last axis of 20 (not a multiple of 8), a
    boolean output and a reduction.  A scalar operand (a zero-dimensional buffer) is the same
    value for every lane."""
    f16, f32 = "float16", "float32"
    vectorized = [
        (8, _elementwise((37, 24), lambda x, b, i, j: x[i, j] + b[j],
                         [((37, 24), f16), ((24,), f16)])),
        (4, _elementwise((5, 37, 24), lambda x, a, i, j: x[a, i, j].astype(f16),
                         [((5, 37, 24), f32)])),
        (8, _elementwise((4, 32), lambda x, i, j: x[i, j].astype("int8"), [((4, 32), f16)])),
        (2, _elementwise((4, 16), lambda x, i, j: x[i, j].astype(f16), [((4, 16), "float64")])),
        # a zero-dimensional operand (BLOOM's scalar factor): one value for every lane
        (8, _elementwise((3, 40), lambda x, s, i, j: x[i, j] * s[()], [((3, 40), f16), ((), f16)])),
    ]
    for lanes, func in vectorized:
        scheduled = _schedule(func).with_attr("global_symbol", "main")
        assert f"T.vectorized({lanes})" in scheduled.script()
        tvm.compile(tvm.IRModule({"main": scheduled}), CUDA)
    x = te.placeholder((37, 28), f16, "x")
    idx = te.placeholder((24,), "int32", "idx")
    k = te.reduce_axis((0, 28))
    refused = [
        _elementwise((24, 32), lambda x, i, j: x[j, i], [((32, 24), f16)]),
        te.create_prim_func([x, idx, te.compute((37, 24), lambda i, j: x[i, idx[j]])]),
        te.create_prim_func([x, te.compute((37, 24), lambda i, j: x[i, j])]),
        _elementwise((37, 20), lambda x, i, j: x[i, j] * 2, [((37, 20), f16)]),
        _elementwise((4, 32), lambda x, i, j: x[i, j] > 0, [((4, 32), f16)]),
        te.create_prim_func([x, te.compute((37,), lambda i: te.sum(x[i, k], axis=k))]),
    ]
    for func in refused:
        assert _schedule(func) is None, func.script()


def _rotate_half(rows, heads, dim, shift):
    """``x·c + rotate_half(x)·s`` of ``(rows, heads·dim)`` viewed as ``(heads, rows, dim)``, the
    halves ``shift`` columns apart (``dim // 2``: a rotation)."""
    f16 = "float16"

    def fn(x, c, s, h, i, j):
        col = h * dim + j
        turned = te.if_then_else(j < dim - shift, -x[i, col + shift], x[i, col - (dim - shift)])
        return x[i, col] * c[i, j] + turned * s[i, j]

    return _elementwise((heads, rows, dim), fn,
                        [((rows, heads * dim), f16), ((rows, dim), f16), ((rows, dim), f16)])


def test_reads_shifted_along_the_columns_are_vectorized():
    """A rotation's ``rotate_half`` (LLaMA's queries moved to heads: reads shifted by half a
    head of 128 or 64 columns): 8 lanes, the arithmetic computed element by element and stored
    in one piece; ``cos`` and ``sin``, read at the thread's own piece only, come in by one
    vector load each (``x``, read at two pieces, element by element); a shift that is not a
    multiple of the piece (3) or a column read with a stride (``x[i, 2j]``) is left to TVM's
    rules."""
    for dim in (128, 64):
        scheduled = _schedule(_rotate_half(37, 3, dim, dim // 2))
        assert scheduled is not None and "T.vectorized(8)" in scheduled.script()
        assert "local" in scheduled.script()  # computed per element, stored in one piece
        src = cuda_source(tvm.compile(
            tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), CUDA))
        vector_reads = re.findall(r"= \*\(uint4\*\)\((x\d)_ptr", src)  # from global memory
        assert sorted(vector_reads) == ["x1", "x2"], vector_reads
    assert _schedule(_rotate_half(37, 3, 64, 3)) is None
    strided = _elementwise((4, 16), lambda x, i, j: x[i, 2 * j], [((4, 32), "float16")])
    assert _schedule(strided) is None


def _one_sequence():
    """An embedding lookup of one sequence (13 ids, a table of 40 columns) and a rotation of
    one sequence's 3 heads of 64: outputs with a leading axis of one element."""
    f16 = "float16"
    table = te.placeholder((50, 40), f16, "table")
    ids = te.placeholder((1, 13), "int32", "ids")
    lookup = te.compute((1, 13, 40), lambda b, i, j: table[ids[b, i], j], name="y")
    x = te.placeholder((1, 37, 3, 64), f16, "x")
    c = te.placeholder((1, 1, 37, 64), f16, "c")
    s = te.placeholder((1, 1, 37, 64), f16, "s")

    def rotation(b, h, i, j):
        turned = te.if_then_else(j < 32, -x[b, i, h, j + 32], x[b, i, h, j - 32])
        return x[b, i, h, j] * c[0, 0, i, j] + turned * s[0, 0, i, j]

    rotated = te.compute((1, 3, 37, 64), rotation, name="y")
    return te.create_prim_func([table, ids, lookup]), te.create_prim_func([x, c, s, rotated])


def test_axes_of_one_element_do_not_stop_the_pieces():
    """A batch of one (LLaMA at 1×2048): the output's unit axis has no iterator left after
    normalization and is written at index 0. An embedding lookup of one sequence and a rotation
    of one sequence's heads are still moved in 16-byte pieces (both fell back to TVM's
    one-element threads: 36.6 and 33.5 µs at 1×2048 on the H200, session 50)."""
    for func in _one_sequence():
        scheduled = _schedule(func)
        assert scheduled is not None, func.script()
        assert "T.vectorized(8)" in scheduled.script()
        src = cuda_source(tvm.compile(
            tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), CUDA))
        assert "*(uint4*)(y_ptr" in src


def _stacked():
    """``concat([x (5, 16), z (4, 16)]) · 2``: each input read at the thread's own piece, in
    the rows where it is read at all."""
    x = te.placeholder((5, 16), "float16", "x")
    z = te.placeholder((4, 16), "float16", "z")
    two = tvm.tirx.const(2, "float16")
    y = te.compute((9, 16), lambda i, j: te.if_then_else(i < 5, x[i, j], z[i - 5, j]) * two,
                   name="y")
    return te.create_prim_func([x, z, y])


def test_inputs_read_in_some_rows_are_loaded_in_those_rows_only():
    """Rows stacked from two inputs: each comes in by vector loads, guarded by the rows it
    covers (TVM's region analysis clips the thread's piece to the buffer), so no thread reads
    past either input."""
    scheduled = _schedule(_stacked())
    assert scheduled is not None
    script = scheduled.script()
    assert "T.where(ax0_ax1_0_fused_1 < 10)" in script  # x's 5 rows: 10 pieces
    assert "T.where(10 <= ax0_ax1_0_fused_1 and ax0_ax1_0_fused_1 < 18)" in script  # z's


def test_a_reduction_of_one_element_reads_its_input_in_pieces():
    """``matmul`` of ``(1,)`` by ``(1, 16)`` legalizes to a block that reads its own output
    back (``y[j] = y[j] + a[0] * b[0, j]``, the reduction of one element gone): the input
    ``b`` comes in by vector loads, the output is no input to cache (found by the fuzzer,
    seed 104: the rule failed and the kernel fell back)."""
    a = te.placeholder((1,), "float32", "a")
    b = te.placeholder((1, 16), "float32", "b")
    k = te.reduce_axis((0, 1), "k")
    y = te.compute((16,), lambda j: te.sum(a[k] * b[k, j], axis=k), name="y")
    scheduled = _schedule(te.create_prim_func([a, b, y]))
    assert scheduled is not None
    src = cuda_source(tvm.compile(
        tvm.IRModule({"main": scheduled.with_attr("global_symbol", "main")}), CUDA))
    assert re.findall(r"= \*\(float4\*\)\(([ab])_ptr", src) == ["b"], src


def test_the_stitch_pipeline_gathers_embeddings_in_vectors():
    """BERT's embedding lookups through the pipeline for sm_90a: 16-byte loads and stores."""
    from tvm_stitch.workloads import get_workload

    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=24, layers=1)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    src = cuda_source(ex)
    take = re.search(r"void (?:__launch_bounds__\(\d+\) )?take_kernel\([^;{]*\) \{(.*?)\n\}",
                     src, re.S)
    assert take and "*(uint4*)" in take.group(1)


@pytest.mark.gpu
def test_vectorized_kernels_compute_what_numpy_does():
    """Irregular shapes on the GPU: a gather with a masked last block, a broadcast add, a
    three-axis cast, a product with a scalar."""
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 40)).astype("float16")
    idx = rng.integers(0, 50, 13).astype("int32")
    x = rng.standard_normal((37, 24)).astype("float16")
    b = rng.standard_normal(24).astype("float16")
    x3 = rng.standard_normal((5, 37, 24)).astype("float32")
    xr, cr, sr = (rng.standard_normal(s).astype("float16") for s in ((37, 192), (37, 64), (37, 64)))
    heads = xr.reshape(37, 3, 64).transpose(1, 0, 2)
    turned = np.concatenate([-heads[..., 32:], heads[..., :32]], -1)
    rotated = (heads * cr + turned * sr).astype("float16")
    top, bottom = (rng.standard_normal(s).astype("float16") for s in ((5, 16), (4, 16)))
    ids = rng.integers(0, 50, (1, 13)).astype("int32")
    one_x = xr[None].reshape(1, 37, 3, 64)
    lookup, one_rotation = _one_sequence()
    cases = [
        (_gather, [table, idx], table[idx]),
        (_elementwise((37, 24), lambda x, b, i, j: x[i, j] + b[j],
                      [((37, 24), "float16"), ((24,), "float16")]), [x, b], x + b),
        (_elementwise((5, 37, 24), lambda x, a, i, j: x[a, i, j].astype("float16"),
                      [((5, 37, 24), "float32")]), [x3], x3.astype("float16")),
        (_elementwise((37, 24), lambda x, s, i, j: x[i, j] * s[()],
                      [((37, 24), "float16"), ((), "float16")]),
         [x, np.array(1.5, "float16")], x * np.float16(1.5)),
        (_rotate_half(37, 3, 64, 32), [xr, cr, sr], rotated),
        (lookup, [table, ids], table[ids]),
        (one_rotation, [one_x, cr[None, None], sr[None, None]], rotated[None]),
        (_stacked(), [top, bottom], np.concatenate([top, bottom]) * np.float16(2)),
    ]
    for func, inputs, expected in cases:
        scheduled = _schedule(func).with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": scheduled}), CUDA)
        args = [tvm.runtime.tensor(a, device=dev) for a in inputs]
        out = tvm.runtime.tensor(np.zeros(expected.shape, expected.dtype), device=dev)
        lib["main"](*args, out)
        # moves are exact; the rotation's products may be fused into one rounding (an FMA)
        tol = 2e-3 * np.abs(expected).max() if expected is rotated or func is one_rotation else 0
        np.testing.assert_allclose(out.numpy().astype("float32"), expected.astype("float32"),
                                   rtol=0, atol=tol)
