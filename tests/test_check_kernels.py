"""A kernel TVM cannot build costs that kernel, not the build (issue 46, item 3).

``CheckKernels`` builds every kernel ahead of the build and gives one that fails TVM's own
schedule; a stitch plan TVM cannot lower gives way to the next plan.  Faults are injected where
the defects they stand for are fixed, so these tests keep the mechanism honest.
"""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
from tvm import relax

from tvm_stitch.fuzz.differential import CUDA, build, run
from tvm_stitch.report import cuda_source, nvcc_error
from tvm_stitch.stitch import injective


def _broadcast_plus_one():
    """float16 (16, 64) -> (3, 16, 64) + 1: an 8-lane kernel with arithmetic (issue 46 item 3)."""
    R = relax.op  # noqa: N806
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((16, 64), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = R.broadcast_to(R.reshape(x, (1, 16, 64)), (3, 16, 64))
            out = bb.emit_output(bb.emit(R.add(y, relax.const(1.0, "float16"))))
        bb.emit_func_output(out)
    return bb.get()


def test_8_lane_arithmetic_is_computed_in_registers_and_stored_in_one_piece(nvcc_compiles,
                                                                            caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_stitch"):
        ex = build(_broadcast_plus_one(), CUDA, "stitch")
    assert not caplog.records, [r.getMessage() for r in caplog.records]
    source = cuda_source(ex)
    kernel = re.search(r"void (?:__launch_bounds__\(\d+\) )?(\w*broadcast\w*)\(.*?\n\}", source,
                       re.S)
    assert kernel, "the kernel is TVM's, not the vectorized rule's"
    assert "*(uint4*)" in kernel.group(0)  # eight float16 values stored at once
    assert "make_ulonglong4" not in source
    nvcc_compiles(source)


@pytest.mark.slow
def test_a_kernel_nvcc_rejects_gets_tvms_schedule(monkeypatch, caplog, nvcc_compiles):
    """The 8-lane kernel scheduled as before the fix (vectors of float32 arithmetic): the
    check finds nvcc's error and the kernel is TVM's; the rest of the build is unchanged."""
    monkeypatch.setattr(injective, "_arithmetic", lambda block: False)
    mod = _broadcast_plus_one()
    unchecked = build(mod, CUDA, "stitch", check_kernels=False)
    assert "too many arguments" in (nvcc_error(unchecked) or "")
    with caplog.at_level(logging.WARNING, logger="tvm_stitch"):
        ex = build(mod, CUDA, "stitch")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "TVM's schedule instead" in warned[0], warned
    nvcc_compiles(cuda_source(ex))


def test_a_plan_tvm_cannot_lower_gives_way(monkeypatch, caplog):
    """Every stitch plan refused by TVM's lowering: the pattern is left to TVM with the reason,
    and the numbers stay right."""
    from tvm_stitch.codegen import check

    def refuse(mod, target):
        if any(gv.name_hint == "main" and "x_red" in str(f) for gv, f in mod.functions.items()):
            raise RuntimeError("variable used before definition")
        return real(mod, target)

    real = check.lower
    monkeypatch.setattr(check, "lower", refuse)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5, 7, 33), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.mean(x, axis=[-1])))
        bb.emit_func_output(out)
    a = np.random.default_rng(0).standard_normal((5, 7, 33)).astype("float32")
    with caplog.at_level(logging.INFO, logger="tvm_stitch.stitch"):
        (got,) = run(build(bb.get(), "llvm", "stitch"), [a])
    np.testing.assert_allclose(got, a.mean(-1), rtol=1e-5, atol=1e-6)
    said = [r.getMessage() for r in caplog.records]
    assert any("not formed" in m and "TVM cannot lower the plan" in m for m in said), said
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_check_is_an_option():
    with pytest.raises(ValueError, match="check_kernels"):
        build(_broadcast_plus_one(), CUDA, "stitch", check_kernels="yes")


@pytest.mark.gpu
def test_a_kernel_nvrtc_rejects_runs_with_tvms_schedule(monkeypatch, caplog):
    """On the GPU host the check compiles with NVRTC: the faulty kernel is TVM's, and the
    model runs and computes what the llvm build computes."""
    import tvm

    monkeypatch.setattr(injective, "_arithmetic", lambda block: False)
    mod = _broadcast_plus_one()
    x = np.random.default_rng(0).standard_normal((16, 64)).astype("float16")
    with caplog.at_level(logging.WARNING, logger="tvm_stitch"):
        (got,) = run(build(mod, CUDA, "stitch"), [x], tvm.cuda(0))
    assert any("TVM's schedule instead" in r.getMessage() for r in caplog.records)
    np.testing.assert_array_equal(got, np.broadcast_to(x + np.float16(1), (3, 16, 64)))
