"""Shared fixtures; GPU tests (``@pytest.mark.gpu``) are skipped where no CUDA device exists."""

from __future__ import annotations

import functools
import os

import pytest

# Triton 3.9 warns that its FP-fusion default will change; keep today's behaviour, quietly
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
# every test compiles what it compiles (a test of the executable cache turns it on, in a
# folder of its own)
os.environ["TVM_STITCH_EXECUTABLES"] = "0"


@functools.lru_cache(maxsize=1)
def has_gpu() -> bool:
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA runtime at all
        return False


def pytest_collection_modifyitems(config, items):
    if has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def nvcc_compiles(tmp_path):
    """``check(source) -> ptx``: compile generated CUDA C for sm_90a with nvcc (TVM without a
    CUDA runtime only generates the source) and return its PTX; skipped where nvcc is missing."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")

    def check(source: str) -> str:
        """Compile ``source``; returns the PTX nvcc made of it."""
        path = tmp_path / "kernels.cu"
        path.write_text(source)
        ptx = tmp_path / "kernels.ptx"
        for what in (["-c", "-o", str(tmp_path / "kernels.o")], ["-ptx", "-o", str(ptx)]):
            res = subprocess.run(
                [nvcc, "-arch=sm_90a", str(path), *what],
                capture_output=True,
                text=True,
                check=False,
            )
            errors = [ln for ln in res.stderr.splitlines() if "error" in ln]
            assert res.returncode == 0, "\n".join(errors[:10])
        return ptx.read_text()

    return check
