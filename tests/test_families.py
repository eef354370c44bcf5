"""The family registry: one name per family, from the pipeline option to the tuning database."""

from __future__ import annotations

import tvm

from tvm_stitch.analysis.recognize import FAMILIES, recognize
from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.codegen.triton_gen import PRINTERS, kernel_source
from tvm_stitch.config import PipelineOptions
from tvm_stitch.families import REGISTRY
from tvm_stitch.graph import build_graph
from tvm_stitch.hardware import HardwareModel
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.tune.kernels import SEEDS
from tvm_stitch.tune.policy import tuning_key
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def test_one_name_per_family_everywhere():
    """The registry's names are the option's values, recognition's vocabulary, the printers',
    the searches' seeds and launches and the templates' keys."""
    names = set(REGISTRY)
    assert names == {"attention", "chain", "gemm"}
    assert set(PipelineOptions().mcfuser) == names and set(FAMILIES) == names
    assert set(PRINTERS) == names and set(SEEDS) == names and set(tk.LAUNCHES) == names
    for name, family in REGISTRY.items():
        assert family.name == name and family.computes
        assert callable(tk.kernel(name).fn)  # the hand-written template of the family
        assert callable(getattr(family.module("recognize"), name))  # its recognizer
        assert family.module("triton").__name__ == f"tvm_stitch.families.{name}.triton"


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
