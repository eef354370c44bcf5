"""Weights pulled into L2 before a kernel waits for the one before it (``prefetch_weights``),
and where the next launch is released (``launch_dependents="auto"``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_stitch
from tvm_stitch.analysis.weights import prefetched
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def test_only_weights_that_fit_a_quarter_of_l2_are_prefetched():
    """The inputs that are weights, each once, in the kernel's order; none where together they
    exceed a quarter of L2 (a 48 x 64 float16 weight is 6144 bytes, bfloat16 as large)."""
    shapes = {"x": ((70, 64), "float16"), "w": ((48, 64), "float16"),
              "b": ((48,), "bfloat16")}
    assert prefetched(["x", "w", "b", "w"], {"w", "b"}, shapes, 4 * 6240) == ("w", "b")
    assert prefetched(["x", "w", "b"], {"w", "b"}, shapes, 4 * 6239) == ()
    assert prefetched(["x"], {"w"}, shapes, 1 << 30) == ()


def _kernels(options, tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=1, seq=32, layers=1)
    with CUDA:
        mod = tvm_stitch.pipeline(CUDA, tune="model", **options)(inst.mod)
    ptx = [m.inspect_source() for m in mod.attrs["external_mods"]]
    return {re.search(r"\.entry (\w+)", p).group(1): p for p in ptx}


def test_generated_gemms_prefetch_their_weights(tmp_path, monkeypatch):
    """By default every generated GEMM of BERT-tiny (its weights bound as parameters) pulls
    its weights (and biases) into L2 first, under a symbol of its own; attention, whose inputs
    a kernel before it writes, pulls nothing; ``prefetch_weights=False`` pulls nothing. Each
    small grid (a batch of 32 tokens) releases the next launch at its start (``"auto"``);
    ``"exit"`` at none."""
    kernels = _kernels({}, tmp_path, monkeypatch)
    gemms = [k for k in kernels if k.startswith("stitch_gemm")]
    assert len(gemms) >= 3 and all(re.search(r"_pf\d+(_\d+)*$", k) for k in gemms)
    for name, ptx in kernels.items():
        pulls = ptx.count("cp.async.bulk.prefetch.L2.global")
        assert bool(pulls) == (name in gemms), name  # a weight each (Q/K/V: 3, biases: 3)
        assert "griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" in ptx, name
    plain = _kernels({"prefetch_weights": False, "launch_dependents": "exit"}, tmp_path,
                     monkeypatch)
    assert sorted(plain) == sorted(re.sub(r"_pf[\d_]+$", "", k) for k in kernels)
    assert not any("prefetch" in p or "launch_dependents" in p for p in plain.values())


@pytest.mark.gpu
def test_prefetched_weights_change_no_number(tmp_path, monkeypatch):
    """On the GPU, BERT-tiny built with its weights prefetched and its small grids releasing
    the next launch early gives exactly the numbers of the build without either (the same
    tiles: the prefetch is a hint), and PyTorch's."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    dev = tvm.cuda(0)
    outs = []
    for options in ({}, {"prefetch_weights": False, "launch_dependents": "exit"}):
        pipe = tvm_stitch.pipeline(CUDA, tune="model", **options)
        vm = relax.VirtualMachine(tvm.compile(inst.mod, CUDA, relax_pipeline=pipe), dev)
        args = [tvm.runtime.tensor(a, device=dev) for a in inst.args]
        outs.append(vm[inst.func](*args).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_allclose(outs[0].astype("float32"), inst.reference()[0], *inst.tolerance)


def test_a_kernel_prefetching_other_inputs_has_a_symbol_of_its_own():
    """The symbol names the prefetched inputs' positions: the same kernel and tiles
    prefetching another input elsewhere is another kernel."""
    import dataclasses

    from tvm_stitch.codegen.embed import prefetch_tag
    from tvm_stitch.codegen.kernel_text import KernelSource

    source = KernelSource("k", "", ["x", "w", "b"], [], {}, "gemm")
    assert prefetch_tag(source) == ""
    assert prefetch_tag(dataclasses.replace(source, prefetch=("w",))) == "_pf1"
    assert prefetch_tag(dataclasses.replace(source, prefetch=("w", "b"))) == "_pf1_2"
