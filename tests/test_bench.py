"""Benchmark harness on the CPU: records, numerics gate, JSON lines, table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tvm_stitch.benchmarks import run_study
from tvm_stitch.benchmarks.harness import Record, compare, format_table

from tvm_stitch.cli import main, parse_options
from tvm_stitch.workloads import get_workload


def test_memory_study_small(tmp_path):
    out = tmp_path / "bench.jsonl"
    lines = []
    records = run_study(
        "memory",
        "llvm",
        workloads=["softmax"],
        params={"rows": 64, "cols": 33},
        json_out=str(out),
        echo=lines.append,
    )
    impls = [r.impl for r in records]
    assert impls == ["tvm-default", "tvm-stitch", "torch-op"]
    for rec in records:
        assert rec.correct, rec
        assert rec.time_us > 0
        assert rec.gbps == (2 * 64 * 33 * 4) / rec.time_us / 1e3
    assert records[0].kernels == records[1].kernels == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["impl"] for r in rows] == impls and rows[0]["study"] == "memory"
    assert "tvm-stitch" in lines[-1] and "GB/s" in lines[-1]


def test_implementations_are_timed_in_turns_after_all_are_built(monkeypatch):
    """Every implementation of a workload is built and checked before any is timed, then all
    are timed together in rounds (the GPU's clock drifts under load, so one timed after
    another would be compared at different clocks); each figure is its timer's median, and a
    timer that fails leaves its row failed, not the others."""
    from tvm_stitch.benchmarks import bench, harness

    calls = []

    def spy(timers, rounds, budget_ms=200.0):
        calls.append(len(timers))
        assert rounds == bench.TURNS
        out = harness.in_turns(timers, rounds, budget_ms)
        return [err if i else RuntimeError("lost the device") for i, err in enumerate(out)]

    monkeypatch.setattr(bench, "in_turns", spy)
    records = run_study("memory", "llvm", workloads=["softmax"], params={"rows": 64, "cols": 33},
                        echo=lambda _: None, variants=[{"explore": "greedy"}])
    # one call with every implementation's timer: two stitch builds, TVM's default, PyTorch
    assert calls == [4]
    assert [r.impl for r in records] == ["tvm-default", "tvm-stitch",
                                         "tvm-stitch[explore=greedy]", "torch-op"]
    assert records[0].time_us is None and "lost the device" in records[0].note
    assert all(r.time_us > 0 and r.correct for r in records[1:])


def test_a_failing_pytorch_baseline_leaves_its_row_failed_and_the_others_timed(caplog):
    """A PyTorch baseline that raises is recorded like any failed row (its note says why, a
    warning is logged), and TVM's rows are still built, checked and timed."""
    import dataclasses

    from tvm_stitch.benchmarks.bench import bench_instance
    from tvm_stitch.benchmarks.harness import DeviceLimits

    from tvm_stitch.pipeline import as_target

    inst = get_workload("softmax").instance("float32", rows=16, cols=33)

    def broken(device, dtype):
        raise ValueError("no such kernel")

    inst = dataclasses.replace(inst, torch_fns={**inst.torch_fns, "sdpa": broken})
    with caplog.at_level("WARNING", logger="tvm_stitch.bench"):
        records = bench_instance("memory", inst, as_target("llvm"), DeviceLimits())
    torch_row = records[-1]
    assert torch_row.note == "failed: ValueError: no such kernel" and torch_row.time_us is None
    assert any("no such kernel" in r.getMessage() for r in caplog.records)
    assert all(r.correct and r.time_us > 0 for r in records[:-1])


def test_timers_are_called_in_turns_and_give_their_medians():
    """``in_turns``: round by round, each timer once with its share of the budget, medians
    per timer; a timer that raises is left out of later rounds and returns its error."""
    from tvm_stitch.benchmarks.harness import in_turns

    order, values = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 6.0])}

    def timer(name):
        def run(budget_ms):
            order.append((name, budget_ms))
            if name == "c":
                raise RuntimeError("capture failed")
            return next(values[name])
        return run

    a, b, c = in_turns([timer("a"), timer("b"), timer("c")], rounds=3, budget_ms=30.0)
    assert (a, b) == (2.0, 5.0) and isinstance(c, RuntimeError)
    assert order == [("a", 10.0), ("b", 10.0), ("c", 10.0), ("a", 10.0), ("b", 10.0),
                     ("a", 10.0), ("b", 10.0)]


def test_compare_flags_wrong_results():
    import numpy as np

    ref = [np.ones((3, 3), "float32")]
    assert compare([np.ones((3, 3))], ref, (1e-4, 1e-4)) == (0.0, True)
    err, ok = compare([np.full((3, 3), 1.1)], ref, (1e-4, 1e-4))
    assert not ok and abs(err - 0.1) < 1e-6
    assert compare([np.ones((3, 4))], ref, (1e-4, 1e-4))[1] is False
    table = format_table(
        [Record("s", "w", "tvm", "llvm", "cpu", "float32", time_us=1.5, correct=False)]
    )
    assert "NO" in table


def test_cli_bench_variants(capsys):
    """``--variant`` measures the stitch pipeline with other options in the same run; a bad
    option is refused before anything is built."""
    args = ["bench", "gemm-chains", "-w", "G1", "-p", "m=32", "-p", "n=48", "--no-torch"]
    assert main([*args, "--variant", "stitch=false,tune=model"]) == 0
    assert "tvm-stitch[stitch=False,tune=model]" in capsys.readouterr().out
    assert parse_options("mcfuser=gemm+attention,fold_norms=true") == {
        "mcfuser": ("gemm", "attention"),
        "fold_norms": True,
    }
    assert parse_options("mcfuser=none") == {"mcfuser": ()}
    for bad, why in (
        ("nope=1", "unknown"),
        ("stitch=2x", "takes True or False"),
        ("x", "KEY="),
        ("mcfuser=gemm+bert", "mcfuser takes"),
    ):
        with pytest.raises(SystemExit, match=why):
            main([*args, "--variant", bad])


def test_cli_bench_gemm_chain(capsys):
    assert main(["bench", "gemm-chains", "-w", "G1", "-p", "m=32", "-p", "n=48", "--no-torch"]) == 0
    out = capsys.readouterr().out
    assert "G1 1x32x48x64x64 float32" in out and "TFLOP/s" in out


@pytest.mark.slow
def test_params_override_dedupes_cases():
    records = run_study("bert", "llvm", params={"batch": 1, "seq": 8}, echo=lambda _: None)
    assert {r.workload for r in records} == {"bert-tiny 1x8 float32"}
    assert [r.impl for r in records] == ["tvm-default", "tvm-stitch", "torch-eager", "torch-sdpa"]
    assert all(r.correct for r in records)


def test_rates_flag_l2_resident_working_sets():
    from tvm_stitch.benchmarks.harness import DeviceLimits, fill_rates

    from tvm_stitch.workloads import get_workload

    inst = get_workload("softmax").instance("float32", rows=100, cols=10)
    limits = DeviceLimits(copy_gbps=2000.0, peak_tflops=700.0, l2_bytes=50 << 20, name="gpu")
    rec = fill_rates(Record("s", "w", "tvm", "cuda", "gpu", "float32", time_us=2.0), inst, limits)
    assert rec.gbps == 8000 / 2.0 / 1e3 and rec.pct_copy == 100 * rec.gbps / 2000.0
    assert rec.note == "fits in L2"
    chain = get_workload("G1").instance("float16")
    rec = fill_rates(Record("s", "w", "tvm", "cuda", "gpu", "f", time_us=10.0), chain, limits)
    assert rec.tflops == chain.flops / 10.0 / 1e6 and rec.gbps is None and rec.note == ""


def test_rates_use_the_cuda_graph_time_when_there_is_one():
    from tvm_stitch.benchmarks.harness import DeviceLimits, fill_rates

    from tvm_stitch.workloads import get_workload

    inst = get_workload("softmax").instance("float32", rows=100, cols=10)
    limits = DeviceLimits(copy_gbps=2000.0, name="gpu")
    rec = Record("s", "w", "tvm", "cuda", "gpu", "float32", time_us=4.0, graph_us=2.5)
    rec = fill_rates(rec, inst, limits)
    assert rec.gbps == 8000 / 2.5 / 1e3
    assert "graph us" in format_table([rec]) and "2.5" in format_table([rec])


def test_numerics_tool_pairs_kernels_and_finds_the_worst_positions():
    """``benchmarks.numerics``: calls are paired by symbol and occurrence (a call one build
    made and the other did not is skipped), and the per-position error names the position."""
    from tvm_stitch.benchmarks.numerics import divergence, kernel_outputs, position_errors

    ones = np.ones((2, 3), "float32")
    rows = [("a", ones), ("b", ones * 2), ("a", ones * 1.5), ("extra", ones)]
    ref = [("a", ones), ("a", ones), ("b", ones * 2)]
    table = divergence(rows, ref)
    assert [name for name, *_ in table] == ["a#0", "b#0", "a#1"]
    assert [d for _, d, _ in table] == [0.0, 0.0, 0.5]
    out = np.zeros((1, 5, 4), "float32")
    out[0, 3, 1] = 0.25
    assert "worst positions 3:0.25" in position_errors(out, np.zeros_like(out))

    inst = get_workload("softmax").instance("float32", rows=8, cols=40)
    calls = kernel_outputs(inst, "llvm")
    assert calls[-1][0] == "<outputs>" and len(calls) >= 2
    np.testing.assert_allclose(calls[-1][1], inst.reference()[0], rtol=1e-5, atol=1e-6)
    assert all(rel == 0 for *_, rel in divergence(calls, kernel_outputs(inst, "llvm")))


def test_timeline_attributes_a_replay_to_its_kernels():
    """``benchmarks/timeline.py``: each kernel adds the time from the latest end before it to
    its own end (nothing if it ends inside an earlier one) and waits from that end to its
    start; together they make the replay's span, launches counted per name."""
    from tvm_stitch.benchmarks.timeline import attribute

    events = [("gemm", 0.0, 10.0), ("attn", 8.0, 15.0), ("norm", 17.0, 20.0),
              ("gemm", 19.0, 19.5), ("gemm", 21.0, 30.0)]
    table = attribute(events)
    assert table["attn"] == [1, 7.0, 5.0, 0.0]  # launched early: adds 10 -> 15, no wait
    assert table["norm"] == [1, 3.0, 3.0, 2.0]  # a gap of 2 after the attention
    assert table["gemm"] == [3, 19.5, 19.0, 1.0]  # 10, 0 (inside the norm), 9; waits 1
    span = max(e[2] for e in events) - events[0][1]
    assert sum(r[2] + r[3] for r in table.values()) == span


def test_timeline_splits_back_to_back_calls():
    """``timeline --steady``: kernels of calls launched back to back are split into calls of
    a replay's launch count; per call the span (first start to last end), the idle time before
    the next call and the launch gaps inside a call."""
    from tvm_stitch.benchmarks.timeline import steady_report

    events = [("copy", 0.0, 1.0), ("gemm", 1.0, 10.0),  # call 1: span 10
              ("copy", 12.0, 13.0), ("gemm", 14.0, 24.0),  # call 2: 2 idle before, 1 gap
              ("copy", 24.0, 25.0), ("gemm", 25.0, 35.0)]  # call 3: none
    text = steady_report(events, ["copy", "gemm"], 3)
    assert text.startswith("3 calls back to back: a call every 12.0 us")
    assert "spans 11.0 (median; 10.0-12.0)" in text
    # idle 2 before call 2, none before call 3: median 1; the gap inside call 2 is 1 (of 0, 1, 0)
    assert "idle between calls 1.0" in text and "launch gaps inside a call 0.0" in text
    assert "gemm 10.0" in text and "copy 1.0" in text
    # a kernel more in one call (or one named otherwise) is not split into wrong calls
    extra = [*events[:2], ("memset", 10.5, 11.0), *events[2:]]
    assert "not split (7 kernels, not 3 x the 2" in steady_report(extra, ["copy", "gemm"], 3)
    renamed = [("gemm", 0.0, 1.0), *events[1:]]
    assert "not split" in steady_report(renamed, ["copy", "gemm"], 3)
    assert "no kernel seen" in steady_report([], ["copy", "gemm"], 3)


def test_profile_busy_counts_overlapping_kernels_once():
    """``profile_tvm._busy`` (through ``timeline.attribute``): the GPU's busy time per run is
    the union of the kernels' intervals; the span runs from the first start to the last end."""
    from tvm_stitch.benchmarks.profile_tvm import _busy

    spans = [(8.0, 15.0), (0.0, 10.0), (17.0, 20.0), (19.0, 19.5)]
    assert _busy(spans, 2) == (9.0, 10.0)  # busy 0-15 and 17-20 over two runs
    assert _busy([], 3) == (0.0, 0.0)


@pytest.mark.slow
def test_hf_families_sweep_reports_each_family(capsys):
    """The families sweep on the CPU: Falcon (negative gather indices, multi-query attention)
    and Phi-3 (an empty rotary part), called with a left-padded attention mask, import, build
    for sm_90a and match PyTorch, their attention recognized; a wrong answer would make it
    exit 1."""
    from tvm_stitch.benchmarks.hf_families import main as sweep

    assert sweep(["--mask", "--only", "falcon", "phi3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows] == ["falcon", "phi3"]
    assert all(r[2] == "ok," and "built" in r and "attention," in r for r in rows)


def test_hf_families_verdict_on_padding_rows():
    """The GPU sweep's verdict: a padding row whose value PyTorch's float16 and float32
    disagree on is reported apart (ours against each), not judged; a padding row they agree
    on is judged like any other."""
    from tvm_stitch.benchmarks.hf_families import _verdict

    ref = np.zeros((2, 5, 4), "float32")
    theirs = ref.copy()
    theirs[1, 0] = 0.9  # PyTorch float16's value for a row that sees no key
    padded = np.zeros((2, 5), bool)
    padded[1, :2] = True
    ours = ref + 1e-3
    ours[1, 0] = 0.8
    assert _verdict(ours, ref, 1e-2, 1e-2, padded, theirs) == (
        "ok, max err 1.0e-03 (PyTorch fp16 0.0e+00); 1 padding rows PyTorch leaves undefined: "
        "ours vs its float16 1.0e-01, vs its float32 8.0e-01")
    ours[1, 1] = 0.8  # a padding row both of PyTorch's precisions agree on
    assert _verdict(ours, ref, 1e-2, 1e-2, padded, theirs).startswith(
        "WRONG, max err 8.0e-01, 1 of 9 rows off (PyTorch fp16 0.0e+00)")
    # both outside the tolerance (a router's choice flipped by float16's rounding): each
    # one's rows off
    theirs[0, 3] = 0.5
    assert _verdict(ours, ref, 1e-2, 1e-2, None, theirs) == (
        "WRONG, max err 8.0e-01, 2 of 10 rows off (PyTorch fp16 9.0e-01, 2 of 10 rows off)")


@pytest.mark.gpu
def test_hf_families_on_the_gpu(capsys):
    """Families through ``from_torch`` on the GPU with a left-padded attention mask match
    PyTorch in float32 within float16's tolerance: every row but the padding rows whose value
    PyTorch's own float16 and float32 do not agree on (decoders' rows that see no key; an
    encoder's padding rows are judged). Falcon's boolean mask becomes ``-inf``, which the
    float16 conversion once saturated to -65504: its rows that see no key averaged V, where
    PyTorch's two precisions agree on zeros."""
    from tvm_stitch.benchmarks.hf_families import main as sweep

    names = ["gpt2", "llama", "falcon", "phi3", "t5-encoder"]
    assert sweep(["--gpu", "--mask", "--only", *names]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[0] for r in rows if r[0] in names] == names
    assert all(r[3] == "ok," for r in rows if r[0] in names)


def _scribble(nbytes: int, rounds: int = 8) -> list:
    """Tensors over the memory PyTorch's allocator has free, filled with NaN (held, so each
    takes new memory): whatever a replay reads from freed memory is NaN afterwards."""
    import torch

    return [torch.full((nbytes // 2,), float("nan"), dtype=torch.float16, device="cuda")
            for _ in range(rounds)]


@pytest.mark.gpu
def test_torch_timer_holds_what_its_replays_read():
    """A timer made by ``torch_timer`` is called later, in turns with others (``in_turns``),
    after its caller has dropped the model and its arguments: it holds them, or its CUDA graph
    replays over memory PyTorch gave to other tensors (session 53: BERT's replays read
    another baseline's memory as indices and asserted)."""
    import gc

    import torch

    from tvm_stitch.tune.measure import torch_timer

    torch.manual_seed(0)
    model = torch.nn.Linear(96, 80).cuda().half()
    x = torch.randn(37, 96, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        want = model(x).float()
    timer = torch_timer(model, [x], "cuda")
    del model, x
    gc.collect()
    junk = _scribble(1 << 20)
    assert timer(2.0) > 0
    torch.cuda.synchronize()
    got = timer.held[-1].float()
    assert torch.isfinite(got).all() and torch.allclose(got, want, rtol=1e-3, atol=1e-3)
    del junk


@pytest.mark.gpu
def test_bench_on_the_gpu_times_every_implementation_in_turns():
    """A study on CUDA: every implementation built and checked, then all timed in turns, each
    row with its figure and none failed. BERT-tiny has three PyTorch baselines, each timed
    as a CUDA graph replayed after the next was built (their token ids gathered: session 53's
    replays over freed memory asserted there)."""
    records = run_study("bert", "cuda", workloads=["bert-tiny"], params={"batch": 2, "seq": 96},
                        echo=lambda _: None)
    assert [r.impl for r in records] == ["tvm-default", "tvm-stitch", "torch-eager",
                                         "torch-sdpa", "torch-compile"]
    for rec in records:
        assert rec.correct and rec.time_us and rec.time_us > 0, rec
        assert not (rec.note or "").startswith("failed"), rec


def test_a_failed_row_gives_the_reason_not_a_closing_brace():
    """A row's failure note is the error's reason: its last line, or, where that is the
    closing brace of code printed after the reason (a CUDA failure in the bench read ``}``),
    its first worded line."""
    from tvm_stitch.errors import error_line

    traced = RuntimeError("Traceback (most recent call last):\n  File x\nValueError: bad tile\n")
    assert error_line(traced) == "ValueError: bad tile"
    printed = RuntimeError("CUDA error: an illegal memory access\nin kernel:\n"
                           "void k() {\n  x;\n}\n")
    assert error_line(printed) == "CUDA error: an illegal memory access"
    assert error_line(AssertionError(), "no message") == "no message"
