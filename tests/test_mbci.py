"""MBCI chain detection (MCFuser §II-A) on the tensor dependency graph."""

from __future__ import annotations

import pytest

from tvm_stitch.analysis.mbci import find_chains, tile_ratio
from tvm_stitch.graph import OpKind, build_graph
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.workloads import get_workload

H100 = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})


def test_tile_ratio_by_hand():
    # 256x256 output tile over K=64: 2*256*256*64 / (2*256*256 + 256*64 + 256*64)
    assert tile_ratio(512, 256, 64) == pytest.approx(8388608 / 163840)
    assert tile_ratio(64, 64, 4096) < 64  # bounded by the tile: phi -> T as K grows
    assert tile_ratio(4096, 4096, 64) < tile_ratio(4096, 4096, 1024)  # small K: memory-bound


def _chains(name, **params):
    graph = build_graph(get_workload(name).instance("float16", **params).mod)
    return graph, find_chains(graph, H100)


def test_gemm_chain_and_attention():
    _, (chain,) = _chains("G1")
    assert chain.kind == "gemm-chain" and len(chain.products) == 2 and chain.memory_bound
    graph, (attn,) = _chains("S4")
    assert attn.kind == "attention"
    kinds = {graph.nodes[b].kind for b in attn.between}
    assert OpKind.ROW_REDUCE in kinds  # the softmax sits between the two products
    assert attn.ridge == pytest.approx(H100.ridge_point("float16") * 2)


def test_bert_layers():
    _, chains = _chains("bert-tiny", seq=16)
    kinds = [c.kind for c in chains]
    # per layer: Q, K, V projections; attention; output projection; the FFN (GEMM-GELU-GEMM)
    assert kinds == ["gemm"] * 3 + ["attention", "gemm", "gemm-chain"] + ["gemm"] * 3 + [
        "attention",
        "gemm",
        "gemm-chain",
    ]
    assert all(len(c.epilogue) >= 1 for c in chains)  # the casts/bias adds that follow
    assert sum(len(c.products) for c in chains) == 16  # every product in exactly one chain
