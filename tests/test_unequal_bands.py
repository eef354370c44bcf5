"""GEMMs reading one input whose bands compute different numbers of products: Q/K/V (one
product a band) beside a gated MLP's gate × up (two), a MoE router beside a shared expert's
gate × up. Recognition groups them apart, one kernel per number of products a band, each
reading the shared input; no product is left to TVM.

Numerics on the CPU: the rewritten module with the kernels' TE references on llvm against
NumPy, and the generated Triton kernels under Triton's interpreter against those references
(``generated_interpret_cases.py``'s runner).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.codegen import embed, ptx
from tvm_stitch.codegen.te_reference import reference_func
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.graph import OpKind, build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads.subgraphs import relax_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
TOKENS, HIDDEN, FFN, EXPERTS = 40, 96, 64, 8
TOLERANCE = {"float32": 1e-4, "float16": 2e-2}


def _linear(x, w, dtype):
    """``x @ wᵀ`` as TVM's PyTorch importer writes it: 16-bit products accumulate in float32."""
    wt = relax.op.permute_dims(w)
    if dtype == "float32":
        return relax.op.matmul(x, wt)
    return relax.op.astype(relax.op.matmul(x, wt, out_dtype="float32"), dtype)


def _gated(x, wg, wu, dtype):
    return relax.op.multiply(relax.op.nn.silu(_linear(x, wg, dtype)), _linear(x, wu, dtype))


def _attention_and_mlp(x, wq, wk, wv, wg, wu, dtype):
    """A parallel block's projections: Q, K, V and SiLU(x·Wgᵀ) · (x·Wuᵀ)."""
    return [relax.Tuple([*(_linear(x, w, dtype) for w in (wq, wk, wv)),
                         _gated(x, wg, wu, dtype)])]


def _router_and_expert(x, wr, wg, wu, dtype):
    """A MoE router's logits beside a shared expert's SiLU(x·Wgᵀ) · (x·Wuᵀ)."""
    return [relax.Tuple([_linear(x, wr, dtype), _gated(x, wg, wu, dtype)])]


#: name -> (body, weight shapes, the kernels: (band widths, products a band))
CASES = {
    "qkv+gate×up": (_attention_and_mlp, [(HIDDEN, HIDDEN)] * 3 + [(FFN, HIDDEN)] * 2,
                    [([HIDDEN] * 3, 1), ([FFN], 2)]),
    "router+gate×up": (_router_and_expert, [(EXPERTS, HIDDEN)] + [(FFN, HIDDEN)] * 2,
                       [([EXPERTS], 1), ([FFN], 2)]),
}


def module(name: str, dtype: str) -> tvm.IRModule:
    """The Relax module of case ``name``: ``main(x, *weights)`` returning a tuple."""
    body, shapes, _ = CASES[name]
    params = [("x", (TOKENS, HIDDEN), dtype)]
    params += [(f"w{i}", shape, dtype) for i, shape in enumerate(shapes)]
    return relax_function(params, lambda *args: body(*args, dtype))


def inputs(name: str, dtype: str) -> list[np.ndarray]:
    """Random ``x`` and weights of case ``name``."""
    _, shapes, _ = CASES[name]
    rng = np.random.default_rng(0)
    return [(rng.standard_normal(s) * 0.5).astype(dtype) for s in [(TOKENS, HIDDEN), *shapes]]


def reference(args: list[np.ndarray]) -> list[np.ndarray]:
    """The cases' outputs in float64: a projection per weight but the last two, then
    SiLU(gate) · up."""
    x, *ws = (a.astype("float64") for a in args)
    gate, up = (x @ w.T for w in ws[-2:])
    return [x @ w.T for w in ws[:-2]] + [gate / (1 + np.exp(-gate)) * up]


def legalized(mod):
    """``mod`` as FuseMBCI sees it in the stitch pipeline for the H100."""
    return run_until(mod, CUDA, "StitchFuseMBCI")


@pytest.mark.parametrize("name", list(CASES))
def test_every_gemm_is_a_kernel(name, caplog):
    """One kernel per number of products a band, both reading ``x``, covering every product;
    the split is logged."""
    graph = build_graph(legalized(module(name, "float16")), legalize=False)
    with caplog.at_level("INFO", logger="tvm_stitch.recognize"):
        matches = recognize(graph, ("gemm",)).matches
    _, _, expected = CASES[name]
    found = [([s.n for s in m.segments], len(m.segments[0].products)) for m in matches]
    assert found == expected
    products = {n.name for n in graph.nodes.values() if n.kind is OpKind.COMPUTE_INTENSIVE}
    assert products <= {c for m in matches for c in m.covered}
    assert {m.accesses["a"].tensor for m in matches} == {"x"}
    assert all(kernel_source(m).name for m in matches)  # each one generated
    assert "grouped apart, one kernel per number of products a band" in caplog.text


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", list(CASES))
def test_rewritten_module_matches_numpy(name, dtype, tmp_path, caplog):
    """Both kernels put in place (their TE references on the CPU), nothing left to TVM."""
    built = []

    def build(match, source, config, shapes):
        built.append(match.describe())
        return reference_func(match, source, shapes), []

    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build)(legalized(module(name, dtype)))
    assert len(built) == 2 and "left to TVM" not in caplog.text, (built, caplog.text)
    assert "R.call_tir(cls.matmul" not in out.script()
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    args = inputs(name, dtype)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    for g, want in zip(got, reference(args), strict=True):
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(g.numpy().astype("float64"), want, rtol=tol, atol=tol)


#: tiles for the interpreter: ragged row tiles (40 rows), the router's 8 columns in a 32-wide
#: tile, a last step of 32 in k; few programs, so that the interpreter takes seconds
INTERPRET_TILES = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 64, "BLOCK_H": 16, "GROUP_M": 2}


def interpret_cases() -> None:
    """Run every case's kernels under Triton's interpreter, printing a JSON line per output
    (``generated_interpret_cases.run_case``); needs ``TRITON_INTERPRET=1``."""
    import generated_interpret_cases as cases

    cases.TILES = INTERPRET_TILES
    rng = np.random.default_rng(0)
    for name in CASES:
        for dtype in ("float32", "float16"):
            graph = build_graph(legalized(module(name, dtype)), legalize=False)
            for match in recognize(graph, ("gemm",)).matches:
                cases.run_case(f"{name} {dtype}", match, graph, rng)


@pytest.mark.slow
def test_generated_kernels_under_the_interpreter(tmp_path):
    """The Triton text of each kernel against its TE reference (float32 and float16)."""
    here = Path(__file__).parent
    code = (f"import sys; sys.path.insert(0, {str(here)!r}); "
            "import test_unequal_bands as t; t.interpret_cases()")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TVM_STITCH_CACHE": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=False, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    # per dtype: Q, K, V, SiLU(gate)·up; the router's logits, SiLU(gate)·up
    outputs = {(r["case"].split(" gemm")[0], r["case"].split()[-1]) for r in records}
    assert len(outputs) == 12, sorted(outputs)
    bad = [r for r in records if not r["ok"]]
    assert not bad, bad


@pytest.mark.parametrize("name", list(CASES))
def test_cuda_build_on_a_cpu_embeds_both_kernels(name, tmp_path, monkeypatch):
    """The stitch pipeline for the H100, built on this CPU machine: two Triton kernels (sm_90a
    PTX) in the executable."""
    if embed.can_measure()[0]:
        pytest.skip("this machine has a GPU: kernels are loaded, not saved for another")
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    ex = tvm.compile(module(name, "float16"), CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    kernels = [
        m.inspect_source() for host in ex.mod.imports for m in host.imports
        if m.kind == "cuda" and m.inspect_source().startswith(ptx.PREFIX)
    ]
    assert len(kernels) == 2
    assert all(".target sm_90a" in k for k in kernels)
