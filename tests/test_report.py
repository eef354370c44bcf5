"""Fusion report: kernel counts and bytes moved by TVM's default fusion, per pattern."""

from __future__ import annotations

import json
import re

import pytest

from tvm_stitch import compare_pipelines, fusion_report
from tvm_stitch.cli import main
from tvm_stitch.workloads import get_workload


@pytest.mark.parametrize(
    "name, kernels, kinds",
    [
        ("layernorm", 1, ["row-reduce", "expensive-elementwise"]),
        ("softmax", 1, ["row-reduce", "expensive-elementwise"]),
        ("rmsnorm", 1, ["row-reduce", "expensive-elementwise", "light-elementwise"]),
        ("bias-gelu", 1, ["light-elementwise", "expensive-elementwise"]),
        # FuseOps: mean+subtract | square | mean+rsqrt+scale+shift
        ("layernorm-ops", 3, ["row-reduce", "light-elementwise", "expensive-elementwise"]),
        ("add-layernorm", 2, ["light-elementwise", "row-reduce", "expensive-elementwise"]),
    ],
)
def test_default_fusion_of_memory_patterns(name, kernels, kinds):
    rows, cols = 1823, 781
    inst = get_workload(name).instance("float32", rows=rows, cols=cols)
    report = fusion_report(inst.mod, "llvm", "default")
    assert report.kernels == kernels
    assert sorted({k for g in report.groups for k in g.kinds}) == sorted(kinds)
    assert report.bytes >= inst.ideal_bytes  # never less than reading inputs and writing outputs
    if kernels == 1:
        assert report.bytes == inst.ideal_bytes


def test_bytes_of_unfused_layernorm_count_every_round_trip():
    rows, cols = 64, 100
    inst = get_workload("layernorm-ops").instance("float32", rows=rows, cols=cols)
    report = fusion_report(inst.mod, "llvm", "default")
    x, vec = rows * cols * 4, cols * 4
    assert [g.func for g in report.groups] == [
        "fused_mean_subtract",  # reads x, writes d = x - mean
        "multiply",  # reads d, writes d*d
        "fused_mean_add_tir_rsqrt_multiply1_multiply2_add1",  # reads d*d, d, w, b; writes y
    ]
    assert report.bytes == (x + x) + (x + x) + (x + x + 2 * vec + x)
    assert report.groups[2].bytes_read == 2 * x + 2 * vec


def test_gemm_chain_and_attention_kernels():
    chain = fusion_report(get_workload("G1").instance("float32").mod, "llvm", "default")
    assert chain.kernels == 2 and all(g.kinds == ["compute-intensive"] for g in chain.groups)
    attention = fusion_report(get_workload("S7").instance("float32").mod, "cuda", "default")
    # transpose | Q·K^T + scale | softmax | P·V
    assert attention.kernels == 4


def test_compare_pipelines_reports_both():
    inst = get_workload("bert-tiny").instance("float32", batch=1, seq=16)
    reports = compare_pipelines(inst.mod, "llvm")
    assert set(reports) == {"default", "stitch"}
    # on llvm nothing is stitched; the canonicalization reads the position embeddings' rows
    # as a slice (two gathers fewer: one kernel each)
    assert reports["default"].kernels - reports["stitch"].kernels == 2
    assert reports["stitch"].kernels > 40
    text = reports["stitch"].format()
    assert "kernels" in text and "compute-intensive" in text


def test_cli_report_json(capsys):
    assert main(["report", "softmax", "--json", "-p", "rows=100", "-p", "cols=37"]) == 0
    data = json.loads(capsys.readouterr().out)
    for pipeline in ("default", "stitch"):
        assert data[pipeline]["kernels"] == 1
        assert data[pipeline]["bytes"] == 2 * 100 * 37 * 4
    assert data["workload"] == "softmax 100x37 float32"


def test_cli_rejects_bad_input(capsys):
    with pytest.raises(SystemExit, match="no parameter"):
        main(["report", "softmax", "-p", "batch=3"])
    with pytest.raises(SystemExit, match="unknown workload"):
        main(["report", "resnet"])
    with pytest.raises(SystemExit, match="KEY=INTEGER"):
        main(["report", "softmax", "-p", "rows"])


def test_cli_run_on_cuda_without_gpu_is_a_clear_error():
    import tvm

    if tvm.cuda(0).exist:
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["run", "--target", "cuda"])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["bench", "memory", "--target", "cuda"])


@pytest.mark.slow
def test_main_job_shows_the_gpu_plan_on_a_cpu(capsys):
    """README's main job on a machine without a GPU: what the GPU would run, then numerics, and
    why the llvm timings are not the point."""
    from tvm_stitch.cli import main

    assert main(["run", "bert-tiny", "-p", "batch=1", "-p", "seq=16"]) == 0
    out = capsys.readouterr().out
    assert "what the stitch pipeline makes of the model for a GPU" in out
    assert "generated in Triton:" in out and "attention 1x2x16x16 d64 float16" in out
    default, stitch = (int(x) for x in re.search(r"(\d+) kernels become (\d+)", out).groups())
    assert stitch < default / 2
    assert "tvm-stitch" in out and " yes " in out  # the llvm build matches PyTorch
    assert "llvm timings are not the point" in out


@pytest.mark.slow
def test_a_baseline_that_fails_is_a_row_with_its_reason(capsys, caplog):
    """TVM's default pipeline cannot build GPT-2 for llvm: its row says why; no traceback, and
    the stitch pipeline's row is checked as ever."""
    from tvm_stitch.cli import main

    assert main(["run", "gpt2-tiny", "-p", "seq=8"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "tvm-default" in line)
    assert "failed: " in row
    assert "Traceback" not in out + caplog.text
    assert re.search(r"tvm-stitch .* yes", out)


def test_a_module_tvm_cannot_compile_still_gets_its_stitch_report(caplog):
    """TVM 0.27's own pipeline fails to legalize a ``full`` of -inf (a mask written in Relax;
    ``from_torch`` rewrites the ones it imports); the report says so and shows the stitch
    pipeline's kernels instead of raising TVM's error."""
    from tvm.script import ir as I
    from tvm.script import relax as R

    @I.ir_module
    class Masked:
        @R.function
        def main(x: R.Tensor((4, 40), "float16")):
            hidden = R.full(R.shape([4, 40]), R.const(float("-inf"), "float16"), "float16")
            return R.nn.softmax(R.maximum(x, hidden), axis=-1)

    with caplog.at_level("WARNING", logger="tvm_stitch.report"):
        reports = compare_pipelines(Masked, "cuda")
    assert list(reports) == ["stitch"] and "default pipeline failed" in caplog.text
    assert reports["stitch"].groups == fusion_report(Masked, "cuda").groups
