"""Weights of banded GEMMs joined into one tensor, lifted into ``<func>_transform_params``
(``lift_params``). The kernels' numerics under the interpreter are in
``generated_interpret_cases.py`` (``test_zoo``); on the GPU, ``test_zoo``'s
``test_joined_weights_on_the_gpu``."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_stitch.benchmarks.harness import bound, run_tvm

import tvm_stitch
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.analysis.weights import join_weights, weight_tensors
from tvm_stitch.codegen import triton_gen
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.report import fused_module, fusion_report
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _kernel_args(mod, func, describe):
    """The argument expressions of each call of a generated kernel whose description contains
    ``describe``."""
    found = []
    for block in mod[func].body.blocks:
        for b in block.bindings:
            call = b.value
            if not isinstance(call, relax.Call) or call.op.name != "relax.call_tir":
                continue
            prim = mod[call.args[0]]
            if describe in str((prim.attrs or {}).get("tvm_stitch.kernel", "")):
                found.append(list(call.args[1].fields))
    return found


def _kernel_inputs(mod, func, describe):
    """Shapes of the arguments of each call of a generated kernel whose description contains
    ``describe``."""
    return [[tuple(int(d) for d in a.ty.shape.values) for a in args]
            for args in _kernel_args(mod, func, describe)]


def test_bands_read_one_joined_weight(tmp_path, monkeypatch):
    """With ``lift_params`` the Q/K/V kernel takes one (384, 128) weight, concatenated in
    ``forward_transform_params``; without, its three (128, 128) weights."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", layers=1)
    lifted = fused_module(inst.mod, CUDA, lift_params=True)
    plain = fused_module(inst.mod, CUDA)
    names = {gv.name_hint for gv in lifted.get_global_vars()}
    assert f"{inst.func}_transform_params" in names
    assert f"{inst.func}_transform_params" not in {gv.name_hint for gv in plain.get_global_vars()}
    (joined,) = _kernel_inputs(lifted, inst.func, "3 bands")
    (separate,) = _kernel_inputs(plain, inst.func, "3 bands")
    assert (384, 128) in joined and (128, 128) not in joined
    assert separate.count((128, 128)) == 3
    transform = lifted[f"{inst.func}_transform_params"].script()
    assert "join_float16_0_128x128_128x128_128x128" in transform


def test_fusion_report_of_a_lifted_module(tmp_path, monkeypatch):
    """The fusion report of a lifted module counts its entry's kernels (not the transform's,
    which runs once): BERT's position- and token-type-embedding lookups depend on weights only
    and leave ``forward``, so it launches fewer kernels."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", layers=1)
    lifted = fusion_report(inst.mod, CUDA, lift_params=True)
    plain = fusion_report(inst.mod, CUDA)
    assert all("join_" not in g.func for g in lifted.groups)
    assert 0 < len(lifted.groups) < len(plain.groups)


def test_join_needs_weights():
    """Bands whose B are not weights (no ``num_input``: nothing says which parameters are) are
    not joined; the views of joined bands are consecutive column ranges of one tensor."""
    inst = get_workload("bert-tiny").instance("float16", layers=1)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    (banded,) = [m for m in recognize(graph).matches if len(m.segments) > 1]
    weights = weight_tensors(graph, mod[inst.func])
    no_attr = mod[inst.func].without_attr("num_input")
    assert weight_tensors(graph, no_attr) == set()
    missing, why = join_weights(banded, set())
    assert missing is None and "weights" in why
    joined, info = join_weights(banded, weights)
    assert info.axis == 0 and info.shape == (384, 128)
    offsets = [joined.views[f"b{i}.0"].offset for i in range(3)]
    assert offsets == [0, 128 * 128, 256 * 128]
    assert {joined.views[f"b{i}.0"].tensor for i in range(3)} == {info.name}


def test_lifted_module_runs_on_the_cpu():
    """An llvm build with ``lift_params``: the runners transform the weights once (embedding
    lookups of constant positions, moved out of ``forward``) and the numbers are numpy's."""
    inst = get_workload("bert-tiny").instance("float32", layers=1, seq=19)
    ex = tvm.compile(inst.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm",
                                                                         lift_params=True))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    assert vm.module.implements_function(f"{inst.func}_transform_params")
    args, outs = run_tvm(vm, inst, tvm.cpu())
    assert len(args) != len(inst.args)  # the entry takes the transformed weights
    np.testing.assert_allclose(outs[0], inst.reference()[0], *inst.tolerance)


def _banded_sources(name, dtype="float16", **params):
    """The kernel sources of ``name``'s banded GEMMs (one layer), their weights joined."""
    inst = get_workload(name).instance(dtype, layers=1, **params)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    weights = weight_tensors(graph, mod[inst.func])
    sources = []
    for match in recognize(graph).matches:
        if match.family == "gemm" and len(match.segments) > 1:
            joined, _ = join_weights(match, weights)
            sources.append(triton_gen.kernel_source(joined))
    return sources


def _persistent_part(text):
    return text[text.index("if PERSISTENT:"):text.index("    else:\n        pid_b")]


def test_alike_bands_share_one_epilogue():
    """Q, K and V's epilogues differ only in their bias and output: the persistent kernel runs
    one epilogue over pointers chosen by the tile's band (one store, no band predicates);
    LLaMA's bands of 160, 80 and 80 columns also differ in their width and row stride, which
    are chosen by the band too."""
    (bert,) = _banded_sources("bert-tiny")
    part = _persistent_part(bert.text)
    assert part.count("tl.store(") == 1 and "in_band" not in part
    assert "= tl.where(pid_n < t0, O0, tl.where(pid_n < t0 + t1, O1, O2))" in part
    (llama,) = _banded_sources("llama-tiny")
    part = _persistent_part(llama.text)
    assert part.count("tl.store(") == 1 and "in_band" not in part
    assert "N0 = tl.where(pid_n < t0, 160, tl.where(pid_n < t0 + t1, 80, 80))" in part
    assert "rm[:, None] * N0" in part and "(rn < N0)" in part


def test_bands_that_differ_keep_their_own_epilogues():
    """Bands whose epilogues differ in more than tensors and integers (a float constant, an
    operation, a dtype) get no shared epilogue: each runs its own, predicated."""
    from tvm_stitch.families.gemm.triton import _shared_epilogue

    class Seg:
        outputs = ()

    def shared(*bodies, dtypes=("float16",) * 3):
        def band_body(si, seg, names, prefix):
            return [line.replace("{X}", names[f"x{si}"]) for line in bodies[si]]
        views = {f"v{i}": type("V", (), {"tensor": f"x{i}", "dtype": d})()
                 for i, d in enumerate(dtypes)}
        return _shared_epilogue([Seg()] * 3, band_body, {f"x{i}": f"I{i}" for i in range(3)},
                                views)

    same = ["e_0 = tl.load({X} + rn * 64)", "e_1 = e_0 * 0.5"]
    choices, lines = shared(same, same, same)
    assert choices == [("P0", ["I0", "I1", "I2"])] and lines[0] == "e_0 = tl.load(P0 + rn * 64)"
    choices, lines = shared(same, [same[0].replace("64", "32"), same[1]], same)
    assert ("N0", ["64", "32", "64"]) in choices and "rn * N0" in lines[0]
    swapped = ["e_0 = tl.load({X} + rm * 64 + rn * 1)", same[1]]
    choices, lines = shared(swapped, ["e_0 = tl.load({X} + rm * 1 + rn * 64)", same[1]], swapped)
    assert [c for c in choices if c[0][0] == "N"] == [("N0", ["64", "1", "64"]),
                                                       ("N1", ["1", "64", "1"])]
    assert lines[0] == "e_0 = tl.load(P0 + rm * N0 + rn * N1)"
    assert shared(same, [same[0], "e_1 = e_0 * 0.25"], same) is None  # a float
    tiny = [same[0], "e_1 = e_0 * 1e-05"]
    assert shared(tiny, [same[0], "e_1 = e_0 * 1e-06"], tiny) is None  # its exponent
    assert shared(same, [same[0], "e_1 = e_0 + 1"], same) is None  # an operation
    assert shared(same, same, same, dtypes=("float16", "float32", "float16")) is None


def test_from_torch_joins_the_weights_on_cuda(tmp_path, monkeypatch):
    """``from_torch`` compiles for CUDA with ``lift_params`` unless told otherwise (its
    module runs the transform when it loads the weights): an imported Hugging Face BERT's
    Q/K/V kernels read one joined weight each. An explicit choice is kept; llvm gets no
    default."""
    import torch

    from tvm_stitch.frontend import default_options
    from tvm_stitch.pipeline import as_target

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    assert default_options(CUDA) == {"lift_params": True}
    assert default_options("cuda", lift_params=False, tune="model") == {"lift_params": False,
                                                                        "tune": "model"}
    assert default_options("llvm", tune="model") == {"tune": "model"}

    class CompiledError(Exception):
        pass

    def pipeline(target, **options):  # what from_torch compiles with, then stop
        raise CompiledError(as_target(target).kind.name, options)

    monkeypatch.setattr(tvm_stitch, "pipeline", pipeline)
    for target, given, want in (("cuda", {}, {"lift_params": True}),
                                ("cuda", {"lift_params": False}, {"lift_params": False}),
                                ("llvm", {}, {})):
        try:
            tvm_stitch.from_torch(torch.nn.Linear(4, 3), (torch.randn(2, 4),), target=target,
                                  **given)
        except CompiledError as stop:
            assert stop.args == (target, want)
        else:
            raise AssertionError("from_torch did not compile")
    monkeypatch.undo()

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("hf-bert-tiny").instance("float16", batch=2, seq=19)
    lifted = fused_module(inst.mod, CUDA, **default_options(CUDA))
    assert lifted.get_global_var(f"{inst.func}_transform_params")
    hidden = int(inst.mod[inst.func].params[-1].ty.shape[0])  # the last LayerNorm's width
    layers = _kernel_inputs(lifted, inst.func, "3 bands")
    assert len(layers) == 2
    assert all((3 * hidden, hidden) in shapes for shapes in layers)


@pytest.mark.slow
def test_bound_weights_are_joined_at_compile_time(tmp_path, monkeypatch):
    """Weights bound into the module as constants are joined without ``lift_params``: the
    Q/K/V kernel reads one constant, the bands' constants concatenated in band order (as the
    analysis joins them), and no function is added (the entry takes the inputs only)."""
    from tvm_stitch.analysis.weights import bound_weights

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", layers=1, seq=19)
    case = bound(inst)
    weights = inst.args[len(case.args):]
    graph = build_graph(run_until(case.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    (banded,) = [m for m in recognize(graph).matches if len(m.segments) > 1]
    parts = [graph.values[banded.views[f"b{i}.0"].tensor].value.numpy() for i in range(3)]
    # three distinct weights of the model, as bound (a transpose may have been folded in)
    for part in parts:
        assert sum(np.array_equal(part, w) or np.array_equal(part, np.asarray(w).T)
                   for w in weights if np.asarray(w).shape == part.T.shape) >= 1
    _, info = join_weights(banded, bound_weights(graph))
    assert info.parts == tuple(banded.views[f"b{i}.0"].tensor for i in range(3))
    assert weight_tensors(graph, case.mod[inst.func]) == set()  # no parameter is a weight now
    mod = fused_module(case.mod, CUDA)
    names = {g.name_hint for g in mod.get_global_vars()}
    assert f"{inst.func}_transform_params" not in names
    (joined,) = _kernel_args(mod, inst.func, "3 bands")
    (matrix,) = [a.value.numpy() for a in joined
                 if isinstance(a, tvm.ir.expr.Constant) and len(a.ty.shape) == 2]
    np.testing.assert_array_equal(matrix, np.concatenate(parts, info.axis))


@pytest.mark.gpu
def test_bound_weights_on_the_gpu(tmp_path, monkeypatch):
    """A module whose weights are bound constants, compiled with the default options (its
    Q/K/V weights joined into one constant): the reference's numbers on the GPU."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=19)
    case = bound(inst)
    ex = tvm.compile(case.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in case.args])
    out = out[0] if type(out).__name__ == "Array" else out
    np.testing.assert_allclose(out.numpy().astype("float32"), inst.reference()[0],
                               *inst.tolerance)
