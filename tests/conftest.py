"""Shared fixtures; GPU tests (``@pytest.mark.gpu``) are skipped where no CUDA device exists."""

from __future__ import annotations

import functools
import os

import pytest

# Triton 3.9 warns that its FP-fusion default will change; keep today's behaviour, quietly
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")


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
