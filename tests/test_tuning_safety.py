"""Trusting the tuning database and the kernel cache: shared by processes compiling at once,
copied from another machine, unwritable or holding a bad record, they cost no kernel but the
one concerned (and a warning), never the rest of the module.

Builds are for the H100 on this machine (no GPU needed): tiles come from the database or the
cost model, kernels are compiled to PTX.
"""

from __future__ import annotations

import json
import lzma
import math
import multiprocessing
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.codegen import triton_gen
from tvm_stitch.codegen.te_reference import reference_func
from tvm_stitch.cost.model import CostModel, Workload, analytical
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
H100 = Path(__file__).resolve().parents[1] / "benchmarks" / "tuning" / "h100.json.xz"
HW = tvm_stitch.HardwareModel.from_target(CUDA)


# -- concurrent writers ----------------------------------------------------------------------
def _writer(path, worker, count):
    db = TuningDatabase(path)
    for i in range(count):
        db.put(f"k{worker}_{i}", {"BLOCK_M": 64, "BLOCK_N": i})


def test_concurrent_writers_lose_no_record(tmp_path):
    """4 processes storing 100 records each into one file keep all 400, and a reader polling
    the file meanwhile only ever sees whole, valid files."""
    path = tmp_path / "tuning.json"
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
    procs = [ctx.Process(target=_writer, args=(path, w, 100)) for w in range(4)]
    for p in procs:
        p.start()
    reads, invalid = 0, []
    while any(p.is_alive() for p in procs):
        try:
            text = path.read_text()
        except FileNotFoundError:
            continue
        reads += 1
        try:
            assert isinstance(json.loads(text)["records"], dict)
        except (ValueError, KeyError, AssertionError) as err:
            invalid.append(repr(err))
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0] * 4
    assert not invalid, invalid[:3]
    assert reads > 0
    records = TuningDatabase(path).records
    assert len(records) == 400
    assert records["k3_99"]["config"] == {"BLOCK_M": 64, "BLOCK_N": 99}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tuning.json", "tuning.json.lock"]


def test_a_store_keeps_what_another_process_stored(tmp_path):
    """Two databases opened on one file before either stores: both records stay."""
    path = tmp_path / "tuning.json"
    first, second = TuningDatabase(path), TuningDatabase(path)
    first.put("a", {"BLOCK_M": 64})
    second.put("b", {"BLOCK_M": 128})
    assert set(TuningDatabase(path).records) == {"a", "b"}
    assert set(second.records) == {"a", "b"}  # and the writer sees the other's


def test_an_unwritable_database_stores_in_a_temporary_file(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the fallback goes
    (tmp_path / "file").write_text("")  # a directory under a regular file: not even root makes it
    path = tmp_path / "file" / "tuning.json"
    with caplog.at_level("WARNING", logger="tvm_stitch.tune"):
        db = TuningDatabase(path)
        db.put("k", {"BLOCK_M": 64})
    assert db.path.parent.parent == tmp_path and db.path.name == "tuning.json"
    assert TuningDatabase(db.path).get("k")["config"] == {"BLOCK_M": 64}
    assert f"tuning database {path} not written" in caplog.text and str(db.path) in caplog.text


def test_an_unreadable_database_is_ignored(tmp_path, monkeypatch, caplog):
    """A file in a folder this user may not search (as root, simulated): ignored, no error."""
    path = tmp_path / "tuning.json"
    path.write_text('{"version": 1, "records": {}}')
    real_stat, real_read = Path.stat, Path.read_text

    def denied(real):
        def call(self, *args, **kwargs):
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)

        return call

    monkeypatch.setattr(Path, "stat", denied(real_stat))
    monkeypatch.setattr(Path, "read_text", denied(real_read))
    with caplog.at_level("WARNING", logger="tvm_stitch.tune"):
        assert TuningDatabase(path).records == {}
    assert "ignored" in caplog.text


# -- builds for the H100 on this machine -----------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """bert-tiny's module, its kernels with an empty database (count and PrimFunc names) and
    the tuning keys they look up."""
    mod = get_workload("bert-tiny").instance("float16").mod
    keys = []
    get = TuningDatabase.get
    tmp = tmp_path_factory.mktemp("tiny")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TuningDatabase, "get", lambda self, key: keys.append(key) or get(self, key))
        mp.setenv("TVM_STITCH_TUNING_DB", str(tmp / "tuning.json"))
        mp.setenv("TVM_STITCH_CACHE", str(tmp / "cache"))
        baseline = generated(mod)
    return mod, baseline, sorted(set(keys))


def generated(mod):
    """``(kernels, names of the generated kernels' PrimFuncs)`` of ``mod`` built for the H100."""
    report = tvm_stitch.fusion_report(mod, CUDA)
    return report.kernels, sorted(g.func for g in report.groups if g.kernel)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Database and kernel cache under ``tmp_path``; kernels loaded by other tests forgotten."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(triton_gen, "_LOADED", {})
    return tmp_path


#: records the kernel cannot launch: tiles no template takes, none at all, odd warps, the
#: warp-specialized attention at 64 rows (it takes 128)
BAD_RECORDS = {
    "48-rows": {"BLOCK_M": 48, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3},
    "empty": {},
    "3-warps": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "num_warps": 3, "num_stages": 3},
    "ws-64": {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "WS": True},
}


@pytest.mark.parametrize(("family", "bad"), [
    ("attention", "48-rows"), ("attention", "empty"), ("attention", "ws-64"),
    ("gemm", "48-rows"), ("gemm", "3-warps"),
])
def test_a_bad_record_is_skipped_alone(tiny, isolated, caplog, family, bad):
    """One bad record: the same kernels as without it, the record named in a warning."""
    mod, baseline, keys = tiny
    key = next(k for k in keys if k.startswith(f"stitch_{family}_"))
    TuningDatabase().put(key, BAD_RECORDS[bad])
    with caplog.at_level("WARNING", logger="tvm_stitch.mcfuser"):
        assert generated(mod) == baseline
    assert f"tuning record {key} ignored" in caplog.text


def test_good_records_are_still_used(tiny, isolated):
    """A record the kernel can launch is taken as it is."""
    mod, (kernels, names), keys = tiny
    key = next(k for k in keys if k.startswith("stitch_attention_"))
    TuningDatabase().put(key, {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3})
    got, got_names = generated(mod)
    assert got == kernels and got_names != names
    assert any(n.startswith(key.split("|")[0] + "_") and "_w4s3" in n for n in got_names)


def test_the_shipped_h100_database_keeps_every_attention(tiny, isolated, caplog):
    """The repository's H100 database on a machine without a GPU (its measurements fit the
    cost model's correction): every kernel of an empty database's build is still made."""
    mod, (kernels, names), _ = tiny
    db = isolated / "h100.json"
    db.write_bytes(lzma.decompress(H100.read_bytes()))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TVM_STITCH_TUNING_DB", str(db))
        got, got_names = generated(mod)
    assert got == kernels
    assert sum(n.startswith("stitch_attention_") for n in got_names) == sum(
        n.startswith("stitch_attention_") for n in names) > 0
    assert len(got_names) == len(names)


def test_an_unwritable_kernel_cache_keeps_the_kernels(tiny, isolated, monkeypatch, caplog):
    mod, baseline, _ = tiny
    (isolated / "file").write_text("")
    monkeypatch.setenv("TVM_STITCH_CACHE", str(isolated / "file" / "cache"))
    with caplog.at_level("WARNING", logger="tvm_stitch.codegen"):
        assert generated(mod) == baseline
    assert "not writable" in caplog.text
    folder = triton_gen.cache_dir()
    assert folder.is_dir() and any(folder.glob("stitch_*.py"))


# -- one kernel failing ----------------------------------------------------------------------
def _placeholder(match, source, config, shapes):
    """A PrimFunc of the launch's signature computing nothing (structure only)."""
    ins = [te.placeholder(shapes[t][0], shapes[t][1], f"I{i}") for i, t in
           enumerate(source.inputs)]
    outs = [_zeros(*shapes[t]) for t in source.outputs]
    return te.create_prim_func([*ins, *outs]), []


def _zeros(shape, dtype):
    return te.compute(shape, lambda *_: tvm.tirx.const(0, dtype))


def _failing(fails):
    def build(match, source, config, shapes):
        if fails(match):
            raise RuntimeError(f"no kernel for {match.family}")
        return _placeholder(match, source, config, shapes)

    return build


def _calls(mod) -> dict:
    text = mod.script()
    return {f: text.count(f"R.call_tir(cls.stitch_{f}_") for f in ("attention", "gemm")}


def test_a_kernel_failing_to_build_costs_only_itself(tmp_path, caplog):
    mod = run_until(get_workload("bert-tiny").instance("float32", batch=2, seq=19).mod, CUDA,
                    "StitchFuseMBCI")
    db = TuningDatabase(tmp_path / "tuning.json")
    with CUDA:
        whole = _calls(FuseMBCI(db, _placeholder)(mod))
        with caplog.at_level("WARNING", logger="tvm_stitch.mcfuser"):
            out = FuseMBCI(db, _failing(lambda m: m.family == "attention"))(mod)
    assert whole == {"attention": 2, "gemm": 8}
    assert _calls(out) == {"attention": 0, "gemm": 8}
    assert "left to TVM: RuntimeError: no kernel for attention" in caplog.text


@pytest.mark.slow
def test_a_failed_moments_writer_leaves_its_readers_to_tvm(tmp_path, caplog):
    """The GEMMs normalizing their rows read the moments another kernel writes: where that
    kernel fails, they are left to TVM too, and the rest of the function is still rewritten,
    computing what the model does (the kernels as their TE references, on the CPU)."""
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=19)
    mod = run_until(inst.mod, CUDA, "StitchFuseMBCI")

    def build(match, source, config, shapes):
        if any(o.chunk for o in match.all_outputs):
            raise RuntimeError("no kernel writing moments")
        return reference_func(match, source, shapes), []

    with CUDA, caplog.at_level("WARNING", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI(TuningDatabase(tmp_path / "tuning.json"), build, fold_norms=True)(mod)
    calls = _calls(out)
    assert calls["attention"] == 2 and 0 < calls["gemm"] < 8, calls
    assert "which no kernel writes" in caplog.text
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    got = vm[inst.func](*[tvm.runtime.tensor(a) for a in inst.args]).numpy()
    np.testing.assert_allclose(got, inst.reference()[0], *inst.tolerance)


# -- the cost model --------------------------------------------------------------------------
ATTENTION = Workload("attention", {"m": 512, "n": 512, "k": 64, "h": 64}, 64)
WS = {"num_warps": 4, "num_stages": 2, "WS": True}


def _measured(n=60):
    """Measurements the correction can be fitted on (the analytical model's times, scaled)."""
    out = []
    for i in range(n):
        tiles = {"m": 64 * (1 + i % 2), "n": 16 * 2 ** (i % 3), "k": 64, "h": 64}
        launch = {"num_warps": 4 * (1 + i % 2), "num_stages": 2 + i % 2}
        out.append((ATTENTION, tiles, launch, 1.3 * analytical(ATTENTION, tiles, launch, HW)))
    return out


def test_an_infeasible_candidate_is_not_priced():
    """A warp-specialized attention of 64-row tiles (it takes 128): infinite, whether or not
    a correction is fitted — no model's terms of it reach xgboost."""
    cost = CostModel(HW)
    assert cost.fit(_measured())
    assert cost.predict(ATTENTION, {"m": 64, "n": 64, "k": 64, "h": 64}, WS) == math.inf
    assert math.isfinite(cost.predict(ATTENTION, {"m": 128, "n": 64, "k": 64, "h": 64}, WS))
    assert cost.booster is not None


def test_measurements_of_infeasible_candidates_are_left_out_of_the_fit():
    cost = CostModel(HW)
    bad = [(ATTENTION, {"m": 64, "n": 64, "k": 64, "h": 64}, WS, 1e-5)] * 5
    assert cost.fit(_measured() + bad)
    assert cost.fitted_on == 60


def test_a_failing_correction_falls_back_to_the_analytical_model(caplog):
    class Broken:
        def predict(self, *args, **kwargs):
            raise RuntimeError("corrupt booster")

        inplace_predict = predict

    cost = CostModel(HW)
    cost.booster = Broken()
    tiles, launch = {"m": 64, "n": 64, "k": 64, "h": 64}, {"num_warps": 4, "num_stages": 2}
    with caplog.at_level("WARNING", logger="tvm_stitch.cost"):
        assert cost.predict(ATTENTION, tiles, launch) == analytical(ATTENTION, tiles, launch, HW)
    assert "corrupt booster" in caplog.text and cost.booster is None


def test_a_failing_fit_falls_back_to_the_analytical_model(monkeypatch, caplog):
    import xgboost

    def broken(*args, **kwargs):
        raise xgboost.core.XGBoostError("out of memory")

    monkeypatch.setattr(xgboost, "train", broken)
    cost = CostModel(HW)
    with caplog.at_level("WARNING", logger="tvm_stitch.cost"):
        assert not cost.fit(_measured())
    assert cost.booster is None and "out of memory" in caplog.text
