"""Hardware model: tables for sm_80 and sm_90, target overrides, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import tvm

from tvm_stitch import HardwareModel, UnsupportedTargetError


def test_sm90_table():
    hw = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
    assert hw.arch == "sm_90"
    assert hw.num_sms == 132
    assert hw.smem_per_sm == 228 * 1024 and hw.smem_per_block == 227 * 1024
    assert hw.smem_per_block_default == 48 * 1024
    assert hw.registers_per_sm == 65536 and hw.warp_size == 32
    assert hw.max_threads_per_block == 1024 and hw.max_warps_per_sm == 64
    assert hw.mem_bandwidth == pytest.approx(2.956e12)  # measured copy rate, ANCHORS.md
    assert hw.peak_flops_fp16 > 10 * hw.peak_flops_fp32
    # fp16 GEMMs become compute-bound above ~267 FLOP/byte on the H100
    assert 200 < hw.ridge_point("float16") < 350
    with pytest.raises(dataclasses.FrozenInstanceError):
        hw.num_sms = 1


def test_tag_and_family_and_overrides():
    tag = HardwareModel.from_target(tvm.target.Target("nvidia/nvidia-h100"))
    assert tag.arch == "sm_90" and tag.l2_bytes == 50 * 1024 * 1024
    ampere = HardwareModel.from_target({"kind": "cuda", "arch": "sm_86"})
    assert ampere.arch == "sm_80" and ampere.num_sms == 108
    custom = HardwareModel.from_target(
        {"kind": "cuda", "arch": "sm_90", "max_shared_memory_per_block": 1024}
    )
    assert custom.smem_per_block_default == 1024


@pytest.mark.parametrize(
    "target, message",
    [("llvm", "target kind 'llvm'"), ({"kind": "cuda", "arch": "sm_75"}, "sm_75")],
)
def test_unknown_targets_are_clear_errors(target, message):
    with pytest.raises(UnsupportedTargetError, match=message):
        HardwareModel.from_target(target)
