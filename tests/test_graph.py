"""Tensor dependency graph: op kinds, access maps, footprints, FLOPs and reuse on small modules."""

from __future__ import annotations

import dataclasses

import pytest
from tvm import relax
from tvm.script import relax as R

from tvm_stitch.graph import Dependence, OpKind, build_graph
from tvm_stitch.workloads.subgraphs import relax_function as _module


def _nodes(graph):
    return list(graph.nodes.values())


def test_layer_norm_kinds_and_maps():
    rows, cols = 37, 781
    mod = _module(
        [("x", (rows, cols), "float32"), ("w", (cols,), "float32"), ("b", (cols,), "float32")],
        lambda x, w, b: [relax.op.nn.layer_norm(x, w, b, axes=[-1])],
    )
    graph = build_graph(mod)
    nodes = _nodes(graph)
    assert [n.kind for n in nodes] == [
        OpKind.ROW_REDUCE,  # sum(x)
        OpKind.EXPENSIVE_ELEMWISE,  # mean = sum / n (a float division)
        OpKind.ROW_REDUCE,  # sum((x - mean)^2)
        OpKind.EXPENSIVE_ELEMWISE,  # (x - mean) * rsqrt(var + eps) * w + b
    ]
    total = nodes[0].inputs[0]
    assert total.tensor == "x"
    assert total.dependence is Dependence.ONE_TO_MANY
    assert total.matrix == ((1, 0), (0, 1))  # x[v0, k] over (v0, k)
    assert total.reduce_region == ((total.out_vars[1], 0, cols),)
    assert total.footprint == rows * cols
    out = {m.tensor: m for m in nodes[3].inputs}
    assert out["x"].dependence is Dependence.ONE_TO_ONE and out["x"].is_identity
    assert out["w"].matrix == ((0, 1),) and out["w"].is_broadcast  # w[v1]: one per column
    mean = next(m for t, m in out.items() if t.endswith("mean"))
    assert mean.matrix == ((1, 0),) and mean.is_broadcast  # mean[v0]: one per row
    assert graph.tensors[mean.tensor].scope == "local"
    # bytes: x read once per reduction, the output written once
    assert nodes[0].bytes_read == rows * cols * 4 and nodes[0].bytes_written == rows * 4
    assert nodes[3].bytes_written == rows * cols * 4


def test_softmax_is_two_reductions_and_two_expensive_maps():
    mod = _module([("x", (33, 129), "float16")], lambda x: [relax.op.nn.softmax(x, axis=-1)])
    nodes = _nodes(build_graph(mod))
    assert [n.kind for n in nodes] == [
        OpKind.ROW_REDUCE,
        OpKind.EXPENSIVE_ELEMWISE,
        OpKind.ROW_REDUCE,
        OpKind.EXPENSIVE_ELEMWISE,
    ]
    assert all(n.memory_intensive for n in nodes)
    assert nodes[0].flops == 33 * 129  # one max per element
    assert nodes[0].bytes_read == 33 * 129 * 2  # float16


def test_transpose_and_reshape_maps():
    mod = _module(
        [("x", (8, 64), "float32")],
        lambda x: [
            relax.op.reshape(x, (512,)),  # flat[v] = x[v // 64, v % 64]
            relax.op.permute_dims(x, [1, 0]),  # t[i, j] = x[j, i]
            relax.op.reshape(x, (8, 4, 16)),  # r[a, b, c] = x[a, b*16 + c]
        ],
    )
    flat, trans, split = _nodes(build_graph(mod))
    assert flat.kind is OpKind.INJECTIVE and flat.detail == "reshape"
    (m,) = flat.inputs
    assert m.quasi_affine and m.matrix is None
    assert m.exprs == ("v_ax0 // T.int64(64)", "v_ax0 % T.int64(64)")
    assert trans.detail == "transpose"
    assert trans.inputs[0].matrix == ((0, 1), (1, 0)) and trans.inputs[0].offset == (0, 0)
    assert split.detail == "reshape"
    assert split.inputs[0].matrix == ((1, 0, 0), (0, 16, 1))
    assert all(n.flops == 0 for n in (flat, trans, split))


def test_slice_map_has_offset():
    mod = _module(
        [("x", (10, 20), "float32")],
        lambda x: [relax.op.strided_slice(x, axes=[1], begin=[3], end=[13])],
    )
    (node,) = _nodes(build_graph(mod))
    assert node.kind is OpKind.INJECTIVE and node.detail == "slice"
    assert node.inputs[0].matrix == ((1, 0), (0, 1)) and node.inputs[0].offset == (0, 3)
    assert node.inputs[0].footprint == 10 * 10


def test_gemm_is_compute_intensive():
    m, k, n = 64, 48, 80
    mod = _module(
        [("a", (m, k), "float16"), ("b", (k, n), "float16")],
        lambda a, b: [relax.op.matmul(a, b)],
    )
    (node,) = _nodes(build_graph(mod))
    assert node.kind is OpKind.COMPUTE_INTENSIVE and node.detail == "gemm"
    assert node.flops == 2 * m * n * k
    assert node.compute_memory_ratio > 3
    a, b = sorted(node.inputs, key=lambda x: x.tensor)
    assert a.dependence is Dependence.ONE_TO_MANY and a.matrix == ((1, 0, 0), (0, 0, 1))
    assert b.matrix == ((0, 0, 1), (0, 1, 0))


def test_batched_matmul_and_gemv():
    mod = _module(
        [
            ("a", (4, 32, 16), "float32"),
            ("b", (4, 16, 24), "float32"),
            ("v", (1, 16), "float32"),
            ("w", (16, 1), "float32"),
        ],
        lambda a, b, v, w: [relax.op.matmul(a, b), relax.op.matmul(v, w)],
    )
    bmm, dot = _nodes(build_graph(mod))
    assert bmm.kind is OpKind.COMPUTE_INTENSIVE and bmm.detail == "bmm"
    # a 1x16 by 16x1 product moves as many elements as it computes: memory-bound (ratio < 3)
    assert dot.compute_memory_ratio < 3 and dot.kind is OpKind.ROW_REDUCE


def test_column_reduction_and_gather():
    mod = _module(
        [("x", (50, 30), "float32"), ("table", (100, 30), "float32"), ("ids", (7,), "int32")],
        lambda x, t, i: [relax.op.sum(x, axis=[0]), relax.op.take(t, i, axis=0)],
    )
    col, gather = _nodes(build_graph(mod))
    assert col.kind is OpKind.COLUMN_REDUCE
    assert gather.kind is OpKind.INJECTIVE and gather.detail == "gather"
    table = next(m for m in gather.inputs if m.tensor == "table")
    assert table.dependence is Dependence.DATA_DEPENDENT and table.matrix is None
    assert table.footprint == 7 * 30  # seven rows, not the whole table


def test_shared_tensors_spatial_temporal_both():
    mod = _module(
        [("x", (16, 16), "float32"), ("y", (16, 16), "float32")],
        lambda x, y: [relax.op.exp(x), relax.op.tanh(x), relax.op.add(x, y)],
    )
    graph = build_graph(mod)
    (reuse,) = graph.shared_tensors()
    assert reuse.tensor == "x" and reuse.kind == "spatial" and len(reuse.readers) == 3

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((16, 16), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x))
            t = bb.emit(relax.op.tanh(x))
            out = bb.emit_output(relax.op.add(relax.op.add(e, t), x))
        bb.emit_func_output(out)
    graph = build_graph(bb.get())
    reuse = {r.tensor: r for r in graph.shared_tensors()}
    assert reuse["x"].kind == "both"  # exp and tanh are independent; the add depends on both
    assert not graph.reaches(graph.consumers("x")[0].name, graph.consumers("x")[1].name)
    # what a node reaches is kept, and found again once a node is added
    exp, tanh = (n.name for n in graph.consumers("x")[:2])
    adds = [n for n in graph.nodes.values() if n.name not in (exp, tanh)]
    assert graph.reaches(exp, adds[-1].name) and graph.reaches(exp, exp)
    late = dataclasses.replace(graph.nodes[tanh], name="late/tanh", output="late_out",
                               inputs=[dataclasses.replace(graph.nodes[tanh].inputs[0],
                                                           tensor=graph.nodes[exp].output)])
    graph.add_tensor(dataclasses.replace(graph.tensors[graph.nodes[tanh].output],
                                         name="late_out"))
    graph.add_node(late)
    assert graph.reaches(exp, "late/tanh") and not graph.reaches(tanh, "late/tanh")


def test_graph_of_bert_tiny_relations():
    from tvm_stitch.workloads import get_workload

    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=16)
    graph = build_graph(inst.mod)
    counts = graph.kind_counts()
    # 2 layers x (Q, K, V, out, FFN1, FFN2 linears + 2 attention bmm)
    assert counts["compute-intensive"] == 16
    assert counts["row-reduce"] == 5 * 2 + 2 * 2  # 5 LayerNorms x 2 sums, 2 softmaxes x 2
    gemms = [n for n in graph.nodes.values() if n.detail == "bmm"]
    assert len(gemms) == 4
    for node in graph.nodes.values():
        for producer in graph.producers_of(node):
            assert node in graph.successors(producer)
    assert graph.to_dict()["nodes"][0]["kind"]


def test_entry_function_must_be_named_when_ambiguous():
    mod = _module([("x", (4,), "float32")], lambda x: [relax.op.exp(x)])
    mod["second"] = mod["main"].with_attr("global_symbol", "second")
    assert len(build_graph(mod)) == 1  # "main" is taken by default
    del mod["main"]
    mod["third"] = mod["second"].with_attr("global_symbol", "third")
    with pytest.raises(ValueError, match="func_name"):
        build_graph(mod)
    assert len(build_graph(mod, "third")) == 1


def test_extent_one_dimensions_do_not_make_broadcasts():
    mod = _module(
        [("m", (1, 40), "int32"), ("x", (1, 40), "float32")],
        lambda m, x: [relax.op.astype(m, "float32"), relax.op.add(x, x)],
    )
    cast, add = _nodes(build_graph(mod))
    assert (cast.kind, cast.detail) == (OpKind.LIGHT_ELEMWISE, "cast")
    assert cast.inputs[0].is_identity and not cast.inputs[0].is_broadcast
    assert add.inputs[0].is_identity
