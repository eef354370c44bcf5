"""Workloads: every subgraph matches its PyTorch reference through the stitch pipeline on llvm."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.workloads import ATTENTION, GEMM_CHAINS, WORKLOADS, get_workload

SMALL = {
    "layernorm": {"rows": 37, "cols": 781},
    "layernorm-ops": {"rows": 37, "cols": 781},
    "add-layernorm": {"rows": 29, "cols": 383},
    "softmax": {"rows": 41, "cols": 129},
    "bias-gelu": {"rows": 23, "cols": 300},
    "rmsnorm": {"rows": 37, "cols": 781},
    "G3": {"m": 67, "n": 33},
    "G6": {"m": 31, "n": 47, "k": 64, "h": 48},
    "S6": {"heads": 2, "m": 33, "n": 17},
    "S9": {"m": 45, "n": 29},
    "qk-norms": {"batch": 2, "seq": 37, "heads": 4, "kv_heads": 1, "dim": 64},
    "mask-layernorms": {"batch": 3, "seq": 17, "hidden": 96},
}


def _check(inst):
    ex = tvm.compile(inst.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm", report=False))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm[inst.func](*[tvm.runtime.tensor(a) for a in inst.args])
    outs = [out] if isinstance(out, tvm.runtime.Tensor) else list(out)
    refs = inst.reference()
    assert len(outs) == len(refs)
    for got, ref in zip(outs, refs):
        assert got.shape == ref.shape
        np.testing.assert_allclose(got.numpy().astype("float32"), ref, *inst.tolerance)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_subgraph_numerics_fp32(name):
    _check(get_workload(name).instance("float32", **SMALL[name]))


# bias-gelu is left out: LLVM takes minutes to compile the fp16 erf on the CPU
@pytest.mark.parametrize("name", ["layernorm", "softmax", "rmsnorm", "add-layernorm"])
def test_subgraph_numerics_fp16(name):
    _check(get_workload(name).instance("float16", **SMALL[name]))


def test_bias_gelu_tanh_form_differs_from_erf():
    erf = get_workload("bias-gelu").instance("float32", rows=4, cols=8)
    tanh = get_workload("bias-gelu").instance("float32", rows=4, cols=8, tanh=1)
    _check(tanh)
    assert not np.array_equal(erf.reference()[0], tanh.reference()[0])


def test_tables_match_mcfuser():
    assert len(GEMM_CHAINS) == 12 and len(ATTENTION) == 9
    assert GEMM_CHAINS["G12"] == (8, 1024, 1024, 128, 128)
    assert ATTENTION["S6"] == (16, 256, 256, 80, 80)
    g = get_workload("G12").instance("float16")
    assert [a.shape for a in g.args] == [(8, 1024, 128), (8, 128, 1024), (8, 1024, 128)]
    assert g.flops == 2 * 8 * 1024 * 1024 * (128 + 128)
    s = get_workload("S2").instance("float16")
    assert [a.shape for a in s.args] == [(12, 512, 64)] * 3 and "sdpa" in s.torch_fns


def test_bert_configs_and_parameters():
    inst = get_workload("bert-base").instance("float16", batch=1, seq=8)
    names = [p.name for p in inst.mod["forward"].params]
    assert names[:2] == ["input_ids", "attention_mask"]
    assert len(inst.args) == 2 + 5 + 12 * 16  # embeddings + 16 tensors per layer
    assert inst.args[2].shape == (30522, 768) and inst.args[2].dtype == np.float16


def test_workload_errors():
    with pytest.raises(TypeError, match="has no parameter"):
        get_workload("softmax").instance("float32", seq=3)
    with pytest.raises(ValueError, match="dtype"):
        get_workload("softmax").instance("bfloat8")
    with pytest.raises(KeyError, match="known"):
        get_workload("gpt")
    families = {w.family for w in WORKLOADS.values()}
    assert families == {"bert", "memory", "gemm-chain", "attention", "zoo"}


@pytest.mark.parametrize("name, params", [("G1", {}), ("S4", {}), ("bert-tiny", {"seq": 16})])
def test_fp16_products_accumulate_in_fp32(name, params):
    from tvm_stitch.graph import OpKind, build_graph

    graph = build_graph(get_workload(name).instance("float16", **params).mod)
    products = [n for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE]
    assert products and all(n.out_dtype == "float32" for n in products)
    for node in products:  # each product is cast back to float16 by its consumer
        assert [c.detail for c in graph.successors(node)] == ["cast"]


def test_hf_bert_float16_import_uses_mixed_precision():
    from tvm_stitch.graph import OpKind, build_graph

    inst = get_workload("hf-bert-tiny").instance("float16", batch=1, seq=8)
    assert inst.args[0].dtype == np.int64
    assert all(w.dtype == np.float16 for w in inst.args[2:])
    params = inst.mod["main"].params
    assert all(str(p.ty.dtype) == "float16" for p in params[2:])
    graph = build_graph(inst.mod)
    products = [n for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE]
    assert len(products) == 16
    for node in products:  # ToMixedPrecision: float16 operands, float32 accumulation
        assert {graph.tensors[m.tensor].dtype for m in node.inputs} == {"float16"}
        assert node.out_dtype == "float32"


@pytest.mark.slow
def test_zoo_models_keep_the_layers_asked_for():
    """``layers=N`` builds the zoo model with its first N layers (for bisecting a model's
    numerics or timing one layer); the PyTorch baselines are built alike."""

    full = get_workload("llama-tiny").instance("float32", seq=16)
    one = get_workload("llama-tiny").instance("float32", seq=16, layers=1)
    assert "1 layers" in one.name and "layers" not in full.name
    per_layer = 9  # q, k, v, o, gate, up, down and two norms
    assert len(full.args) - len(one.args) == per_layer
    # the PyTorch reference has one layer too: the compiled module matches it
    ex = tvm.compile(one.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in one.args])
    np.testing.assert_allclose(got.numpy(), one.reference()[0], rtol=1e-4, atol=1e-4)
    for name in ("bert-tiny", "hf-bert-tiny"):  # BERT's 16 weights per layer
        full = get_workload(name).instance("float32", seq=16)
        one = get_workload(name).instance("float32", seq=16, layers=1)
        assert len(full.args) - len(one.args) == 16 and one.flops * 2 == full.flops
        ex = tvm.compile(one.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = vm[one.func](*[tvm.runtime.tensor(a) for a in one.args])
        got = got[0] if isinstance(got, (list, tuple)) or type(got).__name__ == "Array" else got
        np.testing.assert_allclose(got.numpy(), one.reference()[0], rtol=1e-4, atol=1e-4)
