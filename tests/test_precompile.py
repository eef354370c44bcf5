"""Triton kernels compiled ahead in worker processes (``tvm_stitch.codegen.precompile``)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

triton = pytest.importorskip("triton")

KERNEL = '''
import triton
import triton.language as tl

from tvm_stitch.codegen.triton_kernels import _tile_of


@triton.jit
def scaled_copy(X, Y, N, BLOCK: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = _tile_of(tl.program_id(0), 4, 4, GROUP_M)
    r = (pid_m * 4 + pid_n) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + r, tl.load(X + r, mask=r < N) * 2.0, mask=r < N)
'''


def _generated_kernel(tmp_path, monkeypatch):
    """:data:`KERNEL` written and imported as tvm-stitch imports its generated kernels, with a
    Triton cache of its own (``tmp_path/triton-cache``) and worker processes not yet started
    (they start with that cache)."""
    from tvm_stitch.codegen import precompile

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.setattr(precompile, "_STATE", {"pool": None, "broken": None})
    path = tmp_path / "generated_scaled_copy.py"
    path.write_text(KERNEL)
    spec = importlib.util.spec_from_file_location("tvm_stitch_test_generated", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tvm_stitch_test_generated", module)
    spec.loader.exec_module(module)
    return module.scaled_copy


def _files(folder) -> set:
    return {p for p in folder.rglob("*") if p.is_file()}


def test_a_kernel_compiled_in_a_worker_process_is_the_jits_from_its_cache(tmp_path, monkeypatch):
    """A specialization as Triton's JIT serializes it (its ``preload`` data) is compiled in a
    worker process into Triton's cache; the same compile here (what the JIT does at its first
    launch) then writes nothing: it found the worker's."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import serialize_specialization_data

    from tvm_stitch.codegen import precompile

    cache = tmp_path / "triton-cache"
    fn = _generated_kernel(tmp_path, monkeypatch)

    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": 4, "num_stages": 3})
    signature = {"X": "*fp16", "Y": "*fp16", "N": "i32", "BLOCK": "constexpr",
                 "GROUP_M": "constexpr"}
    constants = {(3,): 256, (4,): 8}  # by argument index, as the JIT keys them
    attrs = {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]}
    data = serialize_specialization_data("scaled_copy", signature, constants, attrs, options,
                                         "key", target)
    try:
        assert precompile.compile_ahead([(fn, data)]) == 1
        compiled = _files(cache)
        assert any(p.suffix == ".cubin" for p in compiled)
        src = ASTSource(fn, signature, {k: v for k, v in constants.items()}, attrs)
        kernel = triton.compile(src, target=target, options=options.__dict__)
        assert _files(cache) == compiled  # found, not compiled again
        assert "scaled_copy" in kernel.asm["ptx"]
        # a specialization the workers cannot compile is left to the JIT, not an error
        assert precompile.compile_ahead([(fn, data.replace('"i32"', '"i7"'))]) == 0
    finally:
        if precompile._STATE["pool"] is not None:
            precompile._STATE["pool"].shutdown(cancel_futures=True)


def test_compiles_stay_in_this_process_when_asked(monkeypatch):
    from tvm_stitch.codegen import precompile

    monkeypatch.setenv("TVM_STITCH_COMPILE_PROCESSES", "0")
    assert not precompile.available()


@pytest.mark.gpu
def test_a_launch_specialized_here_and_compiled_by_a_worker_runs(tmp_path, monkeypatch):
    """On the GPU: the specialization the JIT makes for real arguments (found without a
    compile), compiled by a worker, is the kernel the launch then runs."""
    import torch

    from tvm_stitch.codegen import precompile

    if not torch.cuda.is_available():
        pytest.skip("no GPU")
    fn = _generated_kernel(tmp_path, monkeypatch)
    x = torch.randn(3000, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    try:
        data = precompile.specialization(fn, [x, y, 3000], {"BLOCK": 256, "GROUP_M": 8},
                                         (16,))
        assert data is not None and precompile.compile_ahead([(fn, data)]) == 1
        fn[(16,)](x, y, 3000, BLOCK=256, GROUP_M=8)
        torch.testing.assert_close(y[:3000], x * 2)
    finally:
        if precompile._STATE["pool"] is not None:
            precompile._STATE["pool"].shutdown(cancel_futures=True)
