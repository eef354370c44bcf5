"""The family registry: one name per family, from the pipeline option to the tuning database."""

from __future__ import annotations

import tvm

from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.config import PipelineOptions
from tvm_stitch.families import FAMILIES, REGISTRY
from tvm_stitch.graph import build_graph
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.tune.policy import tuning_key
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


#: what each module of a family folder provides (tvm_stitch/families/__init__.py's contract)
CONTRACT = {
    "recognize": ("PRODUCTS", "describe"),
    "cost": ("program",),
    "triton": ("kernel", "grid"),
    "reference": ("reference",),
    "tune": ("space", "options", "LAUNCHES", "SEEDS", "default_launch"),
}


def test_one_name_per_family_everywhere():
    """The registry's names are the option's values and recognition's vocabulary; every
    family's folder keeps the contract (its recognizer named after it; two-product families
    claim and finalize; a Gluon form, where there is one, has its four names)."""
    names = set(REGISTRY)
    assert names == {"attention", "chain", "gemm"}
    assert set(PipelineOptions().mcfuser) == names and set(FAMILIES) == names
    for name, family in REGISTRY.items():
        assert family.name == name and family.computes
        assert callable(tk.kernel(name).fn)  # the family's hand-written template
        for part, attrs in CONTRACT.items():
            module = family.module(part)
            assert module.__name__ == f"tvm_stitch.families.{name}.{part}"
            assert all(hasattr(module, a) for a in attrs), (name, part)
        recognizer = family.module("recognize")
        assert callable(getattr(recognizer, name))
        if recognizer.PRODUCTS == 2:
            assert callable(recognizer.claim) and callable(recognizer.finalize)
        if family.has("gluon"):
            gluon = family.module("gluon")
            assert all(callable(getattr(gluon, a)) for a in (
                "ws_legality", "ws_descriptors", "ws_source", "ws_launch_options"))
    assert {n for n, f in REGISTRY.items() if f.has("gluon")} == {"attention", "gemm"}


def test_no_family_is_named_outside_its_folder():
    """The shared code (recognition's driver, the cost model, the printers' dispatch, the
    references, the searches, the passes) reaches families through the registry only: no string
    naming a family in its code outside ``families/`` (docstrings may)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    names = {*REGISTRY, "gemm_epilogue", "gemm_chain"}
    # the graph's op classes ("gemm" / "bmm") and the workloads' names are other vocabularies
    other = {"tvm_stitch/graph/classify.py"}
    found = []
    for path in [*root.glob("tvm_stitch/**/*.py"), *root.glob("passes/*.py")]:
        rel = str(path.relative_to(root))
        if "families" in path.parts or "workloads" in path.parts or rel in other:
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef))
                and n.body and isinstance(n.body[0], ast.Expr)}
        found += [f"{rel}:{n.lineno}: {n.value!r}" for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value in names and id(n) not in docs]
    assert not found, "\n".join(found)


def test_the_family_names_its_kernels_tuning_records_and_log_lines(tmp_path):
    """Every match of BERT (attention, GEMMs) and of a GEMM chain: its kernel is
    ``stitch_<family>_<digest>``, its tuning record is keyed by that kernel, and what the logs
    say of it starts with the family's name."""
    hw = HardwareModel.from_target(CUDA)
    db = TuningDatabase(tmp_path / "db.json")
    seen = set()
    for name, params in (("bert-tiny", {"seq": 32}), ("G1", {})):
        mod = run_until(get_workload(name).instance("float16", **params).mod, CUDA,
                        "StitchFuseMBCI")
        for match in recognize(build_graph(mod, legalize=False)).matches:
            assert match.family in REGISTRY
            source = kernel_source(match)
            assert source.name.startswith(f"stitch_{match.family}_")
            assert tuning_key(db, match, source, hw).startswith(f"stitch_{match.family}_")
            assert match.describe().split()[0] == match.family
            seen.add(match.family)
    assert seen == set(REGISTRY)


def _toy_module():
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Toy:
        @R.function
        def main(x: R.Tensor((200, 96), "float16"), w: R.Tensor((96, 80), "float16"),
                 bias: R.Tensor((80,), "float16")):
            with R.dataflow():
                y = R.matmul(x, w)
                z = R.add(y, bias)
                R.output(z)
            return z

    return Toy


def test_a_new_family_is_one_folder_and_one_registry_line(tmp_path, monkeypatch):
    """``tests/toy_family`` (a plain product, written only against the family contract),
    registered by one line: recognized, printed, tuned with the cost model, checked against
    its TE reference on llvm, and built for CUDA by the stitch pipeline."""
    import numpy as np
    from tvm import relax
    from tvm_stitch.passes import FuseMBCI

    import tvm_stitch
    from tvm_stitch.codegen.te_reference import reference_func
    from tvm_stitch.families import Family
    from tvm_stitch.tune.kernels import record_legality, tune_generated

    monkeypatch.setitem(REGISTRY, "toy", Family("toy", "C = A·B", package="toy_family"))
    mod = run_until(_toy_module(), CUDA, "StitchFuseMBCI")
    found = recognize(build_graph(mod, legalize=False), families=("toy",))
    (match,) = found.matches
    assert match.describe() == "toy 200x80x96 float16"
    source = kernel_source(match)
    assert source.name.startswith("stitch_toy_") and "tl.dot(x, y" in source.text
    hw = HardwareModel.from_target(CUDA)
    shapes = {v.tensor: (v.shape, v.dtype) for v in match.views.values()}
    tuned = tune_generated(match, source, shapes, hw=hw, on_device=False)
    config = tuned.config
    assert {"BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages"} <= set(config)
    assert record_legality(match, source, config, hw) is None
    assert tuned.workload["family"] == "toy"
    assert source.grid(config, match) == (-(-200 // config["BLOCK_M"]),
                                          -(-80 // config["BLOCK_N"]))

    # its TE reference in place of the kernel: the model's numbers on llvm
    calls = []

    def build(m, src, cfg, shp):
        calls.append(m.family)
        return reference_func(m, src, shp), []

    with CUDA:
        fused = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build, mcfuser=("toy",),
                         tune="model")(mod)
    assert calls == ["toy"]
    rng = np.random.default_rng(0)
    x, w, bias = (rng.standard_normal(s).astype("float16") for s in ((200, 96), (96, 80), (80,)))
    ex = tvm.compile(fused, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *(tvm.runtime.tensor(a) for a in (x, w, bias))).numpy()
    want = x.astype("float32") @ w.astype("float32") + bias.astype("float32")
    np.testing.assert_allclose(got.astype("float32"), want, rtol=2e-2, atol=2e-2)

    # built for CUDA by the stitch pipeline: the toy's kernel in the executable
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    ex = tvm.compile(_toy_module(), CUDA,
                     relax_pipeline=tvm_stitch.pipeline(CUDA, mcfuser=("toy",), tune="model"))
    assert "stitch_toy_" in ex.mod.inspect_source() or any(
        "stitch_toy_" in m.inspect_source() for m in ex.mod.imports)
