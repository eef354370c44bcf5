"""The differential fuzzer and the cases it (and issue 46) found, kept as regression tests.

Each case is checked the way the fuzzer checks a program: the stitch pipeline against TVM's
default pipeline (and numpy) on llvm, then built for sm_90a with its CUDA C compiled by nvcc.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.fuzz import Program, check, generate, minimize
from tvm_stitch.fuzz.differential import CUDA, build, run
from tvm_stitch.report import nvcc_error

CASES = Path(__file__).parent / "data" / "fuzz_regressions.json"


def _module(shape, body, dtype="float32"):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, dtype))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(body(x)))
        bb.emit_func_output(out)
    return bb.get()


def _scaled_norm(x):
    R = relax.op  # noqa: N806
    return R.multiply(R.sqrt(R.sum(R.multiply(x, x), axis=[-1])), relax.const(0.5))


ROW_REDUCTIONS = {
    # (shape, Relax body, numpy reference): rows reduced without keepdims, issue 46 item 2
    "mean-5x7x33": ((5, 7, 33), lambda x: relax.op.mean(x, axis=[-1], keepdims=False),
                    lambda a: a.mean(-1)),
    "sum-times-2": ((8, 128, 100),
                    lambda x: relax.op.multiply(relax.op.sum(x, axis=[-1]), relax.const(2.0)),
                    lambda a: a.sum(-1) * 2),
    "max-8x128x100": ((8, 128, 100), lambda x: relax.op.max(x, axis=[-1]), lambda a: a.max(-1)),
    "norm-times-half": ((4, 16, 100), _scaled_norm,
                        lambda a: np.sqrt((a * a).sum(-1)) * 0.5),
    "mean-1d": ((33,), lambda x: relax.op.mean(x, axis=[-1]), lambda a: a.mean(-1)),
}


@pytest.mark.parametrize("case", sorted(ROW_REDUCTIONS))
def test_row_reductions_without_keepdims_are_right_and_build(case, nvcc_compiles):
    shape, body, ref = ROW_REDUCTIONS[case]
    mod = _module(shape, body)
    a = np.random.default_rng(0).standard_normal(shape).astype("float32")
    (got,) = run(build(mod, "llvm", "stitch"), [a])
    np.testing.assert_allclose(got, ref(a.astype("float64")), rtol=1e-5, atol=1e-4)
    ex = build(mod, CUDA, "stitch")
    assert nvcc_error(ex) is None


def test_a_reduction_without_keepdims_is_planned_one_value_per_row():
    from tvm_stitch.hardware import HardwareModel
    from tvm_stitch.stitch.plan import plan_pattern

    mod = _module((5, 7, 33), lambda x: relax.op.mean(x, axis=[-1], keepdims=False))
    func = tvm.ir.transform.Sequential([relax.transform.LegalizeOps()])(mod)["mean"]
    plan = plan_pattern(func, HardwareModel.from_target(CUDA))
    assert (plan.rows, plan.cols) == (35, 1)


def test_a_large_mean_builds_for_cuda(nvcc_compiles):
    """(64, 512, 768) mean: 'variable ax0_ax1_ax2_fused_0 has been used before definition'."""
    mod = _module((64, 512, 768), lambda x: relax.op.mean(x, axis=[-1]))
    assert nvcc_error(build(mod, CUDA, "stitch")) is None


def test_torch_norm_through_from_torch_is_right():
    torch = pytest.importorskip("torch")

    class Norm(torch.nn.Module):
        def forward(self, a):
            return a.norm(dim=-1) * 0.5

    a = torch.randn(4, 16, 100)
    fn = tvm_stitch.from_torch(Norm(), (a,), target="llvm")
    torch.testing.assert_close(fn(a), Norm()(a), rtol=1e-5, atol=1e-4)


# -- the fuzzer -------------------------------------------------------------------------------
def test_programs_are_data():
    program = generate(11)
    again = Program.from_json(program.to_json())
    assert again.to_json() == program.to_json()
    tvm.ir.assert_structural_equal(again.module(), program.module())
    for a, b in zip(again.arguments(), program.arguments()):
        np.testing.assert_array_equal(a, b)


def test_the_checker_finds_a_wrong_pipeline(monkeypatch):
    """A stitch build that computes something else is a mismatch, shrunk to the op at fault."""
    from tvm_stitch.fuzz import differential as checker
    from tvm_stitch.fuzz.programs import Input, Op

    real = checker.build

    def wrong(mod, target, pipeline, **options):
        if pipeline == "stitch":  # every exp computes tanh
            mod = _exp_as_tanh(mod)
        return real(mod, target, pipeline, **options)

    monkeypatch.setattr(checker, "build", wrong)
    program = Program(3, "float32", [Input((5, 33), "float32")], [
        Op("unary", (0,), {"fn": "abs"}),
        Op("unary", (1,), {"fn": "exp"}),
        Op("reduce", (2,), {"fn": "sum", "axes": (1,), "keepdims": False}),
        Op("unary", (0,), {"fn": "neg"}),
    ])
    assert check(program).status == "mismatch"
    small = minimize(program, lambda p: check(p).status == "mismatch")
    assert [op.kind for op in small.ops] == ["unary"] and small.ops[0].attrs["fn"] == "exp"
    assert len(small.inputs) == 1


def _exp_as_tanh(mod):
    @relax.expr_functor.mutator
    class Swap(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.exp":
                return relax.op.tanh(call.args[0])
            return call

    out = tvm.IRModule(dict(mod.functions))
    out["main"] = Swap().visit_expr(mod["main"])
    return out


def test_generated_programs_cover_what_the_issue_asks():
    programs = [generate(s) for s in range(300)]
    kinds = {op.kind for p in programs for op in p.ops}
    assert {"reduce", "softmax", "layer_norm_ops", "rms_norm_ops", "where", "matmul",
            "permute", "slice", "concat", "reshape", "broadcast_to", "cast", "take"} <= kinds
    assert sum(p.dtype == "float16" for p in programs) >= 0.3 * len(programs)
    # rotations (a rotary embedding's halves swapped along the last axis): shifted reads
    halves = [op for p in programs for op in p.ops if op.kind == "slice" and op.attrs["begin"]
              and op.attrs["end"] == 2 * op.attrs["begin"] and op.attrs["stride"] == 1]
    assert len(halves) >= 10
    assert sum(p.reduces_without_keepdims for p in programs) >= 0.3 * len(programs)
    # attention under folded masks (issue 49): bands of every kind of limit, documents, none
    masks = [op.attrs for p in programs for op in p.ops if op.kind == "key_mask"]
    assert {m["pattern"] for m in masks} == {"band", "documents", "random"}
    bands = [(m["lo"] is None, m["hi"] is None) for m in masks if m["pattern"] == "band"]
    assert {(True, False), (False, True), (False, False)} <= set(bands)
    # a half-precision mask that leaves a query no key fills with -inf: with a finite fill
    # that row's probabilities are rounding noise the float64 reference cannot judge (seed 473)
    from tvm_stitch.fuzz.programs import key_mask

    empty = [m for m in masks if m["dtype"] in ("float16", "bfloat16")
             and (key_mask(m) != 0).all(axis=-1).any()]
    assert empty and all(m["fill"] == float("-inf") for m in empty)


def test_a_key_mask_program_is_data_and_is_recognized_as_its_band():
    """A program's folded mask survives JSON (``-inf``, limits of None) and its attention is
    recognized with the band the mask draws (a sliding window, here)."""
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.fuzz.programs import Input, Op, key_mask
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until

    mask = {"n": 45, "pattern": "band", "dtype": "float32", "fill": float("-inf"), "lo": -9,
            "hi": 0}
    program = Program(5, "float32", [Input((2, 45, 16), "float32")], [
        Op("permute", (0,), {"axes": (0, 2, 1)}),
        Op("matmul", (0, 1), {}),
        Op("key_mask", (), mask),
        Op("binary", (2, 3), {"fn": "add"}),
        Op("softmax", (4,), {"axis": -1, "log": False}),
        Op("matmul", (5, 0), {}),
    ])
    again = Program.from_json(program.to_json())
    np.testing.assert_array_equal(key_mask(again.ops[2].attrs), key_mask(mask))
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    graph = build_graph(run_until(again.module(), cuda, "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    assert (match.window, match.causal) == (-9, 0)
    assert check(again, cuda=True).status == "ok"


@pytest.mark.parametrize("first, count", [
    (0, 50), pytest.param(50, 150, marks=pytest.mark.slow)])
def test_seeded_programs_agree_with_tvm(tmp_path, first, count):
    """The test suite's share of the campaign, ``python -m tvm_stitch.fuzz --count 200`` on
    llvm: seeds 0-49 in the fast suite, 50-199 in the slow one."""
    from tvm_stitch.fuzz.campaign import main

    args = ["--count", str(count), "--seed", str(first), "--jobs", "2", "--out", str(tmp_path)]
    assert main(args) == 0, (tmp_path / "failures.jsonl").read_text()


def _cases():
    return json.loads(CASES.read_text())


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_found_cases_stay_fixed(case):
    """Programs the fuzzer found failing, shrunk: llvm numerics, the sm_90a build and nvcc."""
    outcome = check(Program.from_json(case["program"]), cuda=True)
    assert outcome.status == "ok", f"{case['found']}\n{outcome.detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_found_cases_run_right_on_the_gpu(case):
    outcome = check(Program.from_json(case["program"]), gpu=True)
    assert outcome.status == "ok", f"{case['found']}\n{outcome.detail}"
