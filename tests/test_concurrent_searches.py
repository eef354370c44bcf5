"""A compile's measured searches run side by side (``KernelTuner.prefetch``): they take turns
on the interpreter and the device, and overlap only while their candidates compile."""

from __future__ import annotations

import re
import threading
import time
import types

import pytest
import torch
import tvm

from tvm_stitch.hardware import HardwareModel
from tvm_stitch.tune import policy
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.tune.measure import TURNS, Tuned, Turns

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def test_a_turn_is_held_alone_and_given_up_only_while_waiting():
    turns, log, inside = Turns(), [], []
    waiting = threading.Event()

    def first():
        with turns.hold():
            inside.append(1)
            log.append("first holds")
            inside.pop()
            with turns.waiting():
                waiting.set()
                time.sleep(0.2)  # the second runs meanwhile
                log.append("first waited")
            inside.append(1)
            log.append("first holds again")
            inside.pop()

    def second():
        waiting.wait()
        with turns.hold():
            assert not inside
            log.append("second holds")
            time.sleep(0.3)  # the first's wait ends: it cannot take its turn back yet
            log.append("second done")

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert log == ["first holds", "second holds", "first waited", "second done",
                   "first holds again"]
    with turns.waiting():  # not held: nothing given up, nothing waited for
        pass


def _request(name, m):
    match = types.SimpleNamespace(frame=types.SimpleNamespace(extents={"m": m, "n": 64}),
                                  dtype="float16", describe=lambda: f"gemm {name} {m}")
    return (match, types.SimpleNamespace(name=name), {}, {}), {}


def test_searches_run_side_by_side_once_each_and_their_configs_are_kept(tmp_path,
                                                                          monkeypatch):
    searched, state = [], {"held": 0, "waiting": 0, "most": 0}
    lock = threading.Lock()

    def search(match, source, shapes, constants, hw, on_device, cost, **_):
        # a search's Python and device work: in its turn, alone
        state["held"] += 1
        assert state["held"] == 1, "two searches ran at once outside their compiles"
        searched.append((source.name, match.frame.extents["m"]))
        state["held"] -= 1
        with TURNS.waiting():  # its candidates compiling in worker processes
            with lock:
                state["waiting"] += 1
                state["most"] = max(state["most"], state["waiting"])
            time.sleep(0.1)
            with lock:
                state["waiting"] -= 1
        config = {"BLOCK_M": 64, "m": match.frame.extents["m"]}
        return Tuned(None, types.SimpleNamespace(correlation=0.9), {}, 1e-5, 0.1, [], [],
                     phases={"compile": 0.1, "time": 0.0, "compiled": 4, "timed": 4},
                     config=config, workload={})

    monkeypatch.setattr(policy, "tune_generated", search)
    monkeypatch.setattr(policy, "record_legality", lambda *_: None)
    monkeypatch.setenv("TVM_STITCH_SEARCHES", "3")
    db = TuningDatabase(tmp_path / "tuning.json")
    tuner = policy.KernelTuner(HardwareModel.from_target(CUDA), db, on_device=True)
    monkeypatch.setattr(tuner.cost, "fit_database", lambda _db: 0)
    requests = [_request("a", 128), _request("b", 128), _request("a", 256), _request("c", 64),
                _request("a", 128)]  # the same kernel twice: one search
    tuner.prefetch(iter(requests))
    assert sorted(searched) == [("a", 128), ("a", 256), ("b", 128), ("c", 64)]
    assert state["most"] >= 2, "no two searches compiled their candidates at once"
    assert len(db.records) == 4
    # the calls that follow find the configs: nothing searched again
    for args, kwargs in requests:
        assert tuner.config(*args, **kwargs)["m"] == args[0].frame.extents["m"]
    assert len(searched) == 4
    # a record of the database is never searched ahead
    tuner.seen.clear()
    tuner.prefetch(iter(requests))
    assert len(searched) == 4
    assert "side by side" in tuner.summary()


def test_nothing_is_searched_ahead_without_a_gpu_or_one_search_at_a_time(tmp_path,
                                                                         monkeypatch):
    monkeypatch.setattr(policy, "tune_generated", lambda *a, **k: pytest.fail("searched"))
    tuner = policy.KernelTuner(HardwareModel.from_target(CUDA),
                               TuningDatabase(tmp_path / "t.json"), on_device=False)

    def untouched():
        pytest.fail("the requests were made without a search to run")
        yield

    tuner.prefetch(untouched())
    tuner.on_device = True
    monkeypatch.setenv("TVM_STITCH_SEARCHES", "1")
    tuner.prefetch(iter([_request("a", 128), _request("b", 128)]))


def _bert():
    import transformers

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=300, attn_implementation="eager")).eval()
    ids = torch.randint(0, 300, (2, 9))
    return model, ids, torch.ones(2, 9, dtype=torch.long)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_the_searches_ahead_are_the_ones_the_kernels_ask_for(tmp_path, monkeypatch, dynamic):
    """What a compile searches ahead is exactly what its kernels then ask the tuner for, and
    planning it ahead leaves the module as it would be (weights joined and derived bindings,
    runtime kernels' bucket points)."""
    pytest.importorskip("transformers")
    pytest.importorskip("triton")
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.report import fused_module

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    model, ids, mask = _bert()
    dims = {0: Dim("batch", min=1, max=8), 1: Dim("seq", min=1, max=64)}
    extra = {"dynamic_shapes": {"input_ids": dims, "attention_mask": dims}} if dynamic else {}
    imported = import_torch(model, (ids,), "float16", {"attention_mask": mask}, **extra)
    options = default_options(CUDA, fold_norms=True)
    plain = fused_module(imported.mod, CUDA, tune="model", **options)

    ahead, asked, quick = [], [], []
    original = policy.KernelTuner.config

    def prefetch(self, requests):
        ahead.extend(policy.tuning_key(self.db, a[0], a[1], self.hw) for a, _ in requests)

    def config(self, match, source, *args, **kwargs):
        asked.append(policy.tuning_key(self.db, match, source, self.hw))
        quick.append(kwargs.get("quick", False))
        return original(self, match, source, *args, **kwargs)

    monkeypatch.setattr(policy.KernelTuner, "prefetch", prefetch)
    monkeypatch.setattr(policy.KernelTuner, "config", config)
    planned = fused_module(imported.mod, CUDA, tune="model", **options)
    tvm.ir.assert_structural_equal(plain, planned)
    assert asked and set(ahead) == set(asked)
    assert any(quick) == dynamic  # the runtime kernels' bucket points' searches among them


@pytest.fixture
def tuning_server(tmp_path):
    """A fake tuning server (``tests/fake_tuning_server.py``) on this machine: ``(address,
    count file)``."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    count = tmp_path / "count"
    script = Path(__file__).with_name("fake_tuning_server.py")
    port = 9300 + os.getpid() % 500
    proc = subprocess.Popen([sys.executable, str(script), str(port), str(count)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("port "), line
        yield f"127.0.0.1:{line.split()[1]}", count
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _gemm_kernel():
    """A generated GEMM kernel of BERT-tiny (1 layer): its match, source and shapes."""
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.frontend import import_torch
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until

    model, ids, mask = _bert()
    imported = import_torch(model, (ids,), "float16", {"attention_mask": mask})
    mod = run_until(imported.mod, CUDA, "StitchFuseMBCI")
    graph = build_graph(mod, "main", legalize=False)
    match = next(m for m in recognize(graph).matches if m.family == "gemm")
    source = kernel_source(match)
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
              for t in (*source.inputs, *source.outputs)}
    return match, source, shapes


def test_a_search_times_its_candidates_on_a_tuning_server(tuning_server):
    """A search bound to a tuning server (TVM's RPC) sends it each batch of candidates and
    takes its timings: every measurement is the server's, failures (here, every split of k)
    recorded as such, the best its fastest; nothing is compiled or launched here."""
    pytest.importorskip("triton")
    import sys
    from pathlib import Path

    from tvm_stitch.tune import remote
    from tvm_stitch.tune.kernels import tune_generated

    sys.path.insert(0, str(Path(__file__).parent))
    from fake_tuning_server import fake_seconds

    address, count = tuning_server
    (device,) = remote.connect(address)
    match, source, shapes = _gemm_kernel()
    hw = HardwareModel.from_target(CUDA)
    with remote.using(device):
        tuned = tune_generated(match, source, shapes, {}, hw, on_device=True)
    timed = tuned.measurements
    assert timed and device.timed == sum(map(int, count.read_text().split()))
    for m in timed:  # the server's seconds, each
        params = {f"BLOCK_{x.upper()}": t for x, t in m["tiles"].items()}
        want = fake_seconds({**params, **m["launch"]})
        assert m["time_s"] == (float("inf") if isinstance(want, str) else pytest.approx(want))
    finite = [m for m in timed if m["time_s"] != float("inf")]
    assert finite and all(m["launch"].get("SPLIT_K", 1) == 1 for m in finite)
    assert all(m["launch"].get("SPLIT_K", 1) > 1 for m in timed if m["time_s"] == float("inf"))
    assert tuned.time == pytest.approx(min(m["time_s"] for m in finite))
    assert tuned.config.get("SPLIT_K", 1) == 1
    assert device.batches < device.timed  # candidates sent in batches, not one by one


def test_an_unreachable_tuning_server_is_left_out(caplog):
    from tvm_stitch.tune import remote

    with caplog.at_level("WARNING", logger="tvm_stitch.tune"):
        assert remote.connect("127.0.0.1:1, nonsense, tracker=127.0.0.1:1/k*2") == []
    assert caplog.text.count("not used") == 3
    assert remote.current() is None


def test_searches_take_the_devices_in_turn(tmp_path, monkeypatch):
    """With tuning servers, the searches ahead take this process's GPU and the servers in
    turn (each search on one device)."""
    from tvm_stitch.tune import remote

    seen = []

    def search(match, source, *args, **kwargs):
        seen.append((source.name, remote.current()))
        return Tuned(None, types.SimpleNamespace(correlation=0.9), {}, 1e-5, 0.1, [], [],
                     phases={}, config={"BLOCK_M": 64}, workload={})

    monkeypatch.setattr(policy, "tune_generated", search)
    tuner = policy.KernelTuner(HardwareModel.from_target(CUDA),
                               TuningDatabase(tmp_path / "t.json"), on_device=True)
    monkeypatch.setattr(tuner.cost, "fit_database", lambda _db: 0)
    server = types.SimpleNamespace(name="gpu1", timed=0, batches=0)
    monkeypatch.setattr(tuner, "remotes", lambda: [server])
    tuner.prefetch(iter([_request(n, 128) for n in "abcd"]))
    assert sorted(n for n, _ in seen) == list("abcd")
    on = {n: d for n, d in seen}
    assert [on[n] for n in "abcd"] == [None, server, None, server]


@pytest.mark.gpu
def test_a_compile_times_candidates_on_a_tuning_server_on_the_gpu(tmp_path, monkeypatch, caplog):
    """On the GPU host: a tuning server (``python -m tvm_stitch.tune.remote``) and a compile
    told of it (``TVM_STITCH_RPC``) with an empty tuning database: some searches time their
    candidates there, and the model gives PyTorch's numbers."""
    import os
    import signal
    import subprocess
    import sys

    import tvm_stitch

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    port = 9500 + os.getpid() % 400
    proc = subprocess.Popen([sys.executable, "-m", "tvm_stitch.tune.remote", "--host",
                             "127.0.0.1", "--port", str(port)], stdout=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("tuning server on"), line
        monkeypatch.setenv("TVM_STITCH_RPC", line.split()[-1])
        model, ids, mask = _bert()
        model = model.cuda().half()
        ids, mask = ids.cuda(), mask.cuda()
        with caplog.at_level("INFO", logger="tvm_stitch"):  # the tuner logs as mcfuser
            fn = tvm_stitch.from_torch(model, (ids,), example_kwargs={"attention_mask": mask})
        timed = [int(n) for n in re.findall(r"tuning server \S+: (\d+) candidates", caplog.text)]
        assert timed and sum(timed) > 0, caplog.text[-2000:]
        with torch.no_grad():
            want = model(ids, attention_mask=mask).last_hidden_state.float()
            got = fn(ids, mask).last_hidden_state.float()
        torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
