"""GPU facts used by every cost model, in one frozen dataclass.

``HardwareModel.from_target(target)`` reads the compute capability from a ``tvm.target.Target``
(``{"kind": "cuda", "arch": "sm_90a"}``, the tag ``nvidia/nvidia-h100``, ...) and returns the table
for that architecture, overridden by whatever the target states itself (shared memory per block,
registers, warp size, thread limit).  Only NVIDIA sm_80 and sm_90 are tabulated; anything else is a
clear ``UnsupportedTargetError`` rather than a silent guess.
"""

from __future__ import annotations

import dataclasses
import re


class UnsupportedTargetError(ValueError):
    """The target is not a GPU that tvm-stitch has hardware facts for."""


@dataclasses.dataclass(frozen=True)
class HardwareModel:
    """Facts about one GPU.

    Attributes
    ----------
    name : str
        Human-readable device name.
    arch : str
        ``sm_XY`` compute capability (without a trailing ``a``).
    num_sms : int
        Streaming multiprocessors.
    smem_per_sm : int
        Shared memory per SM in bytes (the carve-out maximum).
    smem_per_block : int
        Shared memory a block may use after opting in, in bytes.
    smem_per_block_default : int
        Shared memory a block gets without opting in (48 KiB on every NVIDIA GPU).
    registers_per_sm : int
        32-bit registers per SM.
    max_registers_per_thread : int
        Hardware limit on registers per thread.
    warp_size : int
        Threads per warp.
    max_threads_per_block : int
        Threads per block.
    max_threads_per_sm : int
        Resident threads per SM.
    max_blocks_per_sm : int
        Resident blocks per SM.
    mem_bandwidth : float
        Achievable DRAM bandwidth in bytes/s (bytes read + written by a device-to-device copy).
    peak_flops_fp16 : float
        Dense fp16 tensor-core FLOP/s achievable on large GEMMs.
    peak_flops_fp32 : float
        fp32 CUDA-core FLOP/s (FMA counted as two).
    l2_bytes : int
        L2 cache size in bytes.
    clock_hz : float
        SM clock used to convert cycles to seconds.
    launch_overhead : float
        Seconds one kernel launch costs on the device side (back-to-back launches in a graph).
    cpi_light, cpi_expensive, cpi_shuffle, cpi_barrier, cpi_smem : float
        Cycles per warp instruction by class, for FusionStitching's latency-evaluator: light
        elementwise (add, mul, cast), expensive elementwise (exp, erf, rsqrt, divide), a warp
        shuffle, a block barrier, a shared-memory access.  Estimates, not measurements.
    mem_latency_cycles : float
        Cycles of one global-memory round trip.
    l2_bandwidth_ratio : float
        L2 hit bandwidth over DRAM bandwidth (re-reading data the kernel just loaded).
        An estimate, not a measurement.
    sfu_per_sm : int
        Results per clock of the special-function units of one SM (exp2, reciprocal, reciprocal
        square root): 16 on sm_80 and sm_90 (CUDA C++ Programming Guide, arithmetic instruction
        throughput).  Bounds patterns that evaluate an expensive op per element.
    block_overhead_cycles : float
        Cycles an SM spends per thread block it runs beyond the block's memory traffic
        (scheduling, index set-up, the reduction tail).  Fitted to the H100 plan sweep
        (``python -m tvm_stitch.benchmarks.stitch_plans``: 49152 one-warp blocks of a softmax
        take ~32 µs where their bytes need 8 µs).
    sm_l2_bytes_per_cycle : float
        Bytes per clock one SM pulls from L2 with the loads a pipelined main loop keeps in
        flight, however idle the other SMs are.  Fitted to the H100 GEMMs at 128 tokens, whose
        grids leave most SMs idle (32 B/clk ranks their tilings at Spearman 0.55-0.93 where the
        port's nominal 64 gave 0.49-0.86); below the share of L2 bandwidth every SM gets when all
        pull, so large GEMMs are unaffected.
    sm_l2_tma_bytes_per_cycle : float
        The same for tiles brought in by the TMA unit (a persistent GEMM's operands, an
        attention's with TMA loads): no address arithmetic or load instructions in the SM's
        warps.  Fitted to the H100's BERT GEMMs at 4096 tokens, whose persistent TMA kernels
        stream 11-15% more bytes per SM and clock than the same tiles loaded by pointers
        (e.g. 4096×768×3072, 128×256 tiles: 38.6 vs 44.5 µs).
    loop_overhead_cycles : float
        Cycles a tiled main loop spends per iteration beyond its loads and products (barrier
        waits, wgmma issue and commit).  Fitted to the H100 GEMM measurements of the tuning
        database (``python -m tvm_stitch.benchmarks.model_study``).
    vm_launch : float
        Seconds each launch the Relax VM issues itself costs a call: a replay of one of TVM's
        CUDA graphs, or a kernel launched outside them.  Measured on the H100: BERT-base at
        1×128 spent 78 µs between its kernels with its graph cut at every layer (13 graphs and
        15 kernels launched by the VM), 33.5 µs with its two inputs copied first (one graph and
        the two copies; ``h100-split-k-graphs-2026-11-24.md``): 44.5 µs for 25 launches, about
        1.8 µs a launch, the small copies' own time included.
    """

    name: str
    arch: str
    num_sms: int
    smem_per_sm: int
    smem_per_block: int
    smem_per_block_default: int
    registers_per_sm: int
    max_registers_per_thread: int
    warp_size: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    mem_bandwidth: float
    peak_flops_fp16: float
    peak_flops_fp32: float
    l2_bytes: int
    clock_hz: float
    launch_overhead: float
    cpi_light: float = 4.0
    cpi_expensive: float = 16.0
    cpi_shuffle: float = 8.0
    cpi_barrier: float = 40.0
    cpi_smem: float = 6.0
    mem_latency_cycles: float = 600.0
    l2_bandwidth_ratio: float = 2.0
    sfu_per_sm: int = 16
    block_overhead_cycles: float = 150.0
    sm_l2_bytes_per_cycle: float = 32.0
    sm_l2_tma_bytes_per_cycle: float = 36.0
    loop_overhead_cycles: float = 100.0
    vm_launch: float = 1.8e-6

    @property
    def max_warps_per_sm(self) -> int:
        """Resident warps per SM."""
        return self.max_threads_per_sm // self.warp_size

    def ridge_point(self, dtype: str = "float16") -> float:
        """FLOP per byte above which a kernel is compute-bound (peak FLOP/s over bandwidth)."""
        peak = self.peak_flops_fp16 if dtype in ("float16", "bfloat16") else self.peak_flops_fp32
        return peak / self.mem_bandwidth

    @staticmethod
    def from_target(target) -> HardwareModel:
        """Hardware facts for a TVM target.

        Parameters
        ----------
        target : tvm.target.Target or str or dict
            A CUDA target whose ``arch`` is ``sm_80``/``sm_86``/``sm_89`` (table sm_80) or
            ``sm_90``/``sm_90a`` (table sm_90).

        Returns
        -------
        HardwareModel

        Raises
        ------
        UnsupportedTargetError
            If the target is not CUDA or its architecture has no table.
        """
        import tvm

        if not isinstance(target, tvm.target.Target):
            target = tvm.target.Target(target)
        if target.kind.name != "cuda":
            raise UnsupportedTargetError(
                f"no GPU hardware facts for target kind {target.kind.name!r}: tvm-stitch's cost "
                f"models describe NVIDIA GPUs ({', '.join(sorted(_TABLES))})"
            )
        arch = str(target.attrs.get("arch", ""))
        match = re.fullmatch(r"sm_(\d)(\d)a?", arch)
        family = f"sm_{match.group(1)}0" if match else None
        if family not in _TABLES:
            raise UnsupportedTargetError(
                f"no hardware table for CUDA arch {arch!r}; known: {', '.join(sorted(_TABLES))}. "
                'Name the arch in the target, e.g. {"kind": "cuda", "arch": "sm_90a"}.'
            )
        base = _TABLES[family]
        overrides = {}
        for attr, field in (
            ("max_shared_memory_per_block", "smem_per_block_default"),
            ("thread_warp_size", "warp_size"),
            ("max_threads_per_block", "max_threads_per_block"),
            ("l2_cache_size_bytes", "l2_bytes"),
        ):
            if attr in target.attrs:
                overrides[field] = int(target.attrs[attr])
        return dataclasses.replace(base, **overrides)


_TABLES = {
    # NVIDIA A100-SXM4-80GB datasheet; bandwidth and FLOP/s derated to ~88% / ~80% of spec as is
    # typically achieved (2039 GB/s, 312 TFLOP/s fp16 dense, 19.5 TFLOP/s fp32).
    "sm_80": HardwareModel(
        name="NVIDIA A100 (sm_80)",
        arch="sm_80",
        num_sms=108,
        smem_per_sm=164 * 1024,
        smem_per_block=163 * 1024,
        smem_per_block_default=48 * 1024,
        registers_per_sm=65536,
        max_registers_per_thread=255,
        warp_size=32,
        max_threads_per_block=1024,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        mem_bandwidth=1.80e12,
        peak_flops_fp16=250e12,
        peak_flops_fp32=19.5e12,
        l2_bytes=40 * 1024 * 1024,
        clock_hz=1.41e9,
        launch_overhead=2.5e-6,
    ),
    # NVIDIA H100 80GB HBM3 (132 SMs). Bandwidth and fp16 FLOP/s as measured on the lent H100
    # (../shared/ANCHORS.md: 2956 GB/s copy, ~790 TFLOP/s at 8192^3); spec: 3350 GB/s, 989 TFLOP/s.
    "sm_90": HardwareModel(
        name="NVIDIA H100 (sm_90)",
        arch="sm_90",
        num_sms=132,
        smem_per_sm=228 * 1024,
        smem_per_block=227 * 1024,
        smem_per_block_default=48 * 1024,
        registers_per_sm=65536,
        max_registers_per_thread=255,
        warp_size=32,
        max_threads_per_block=1024,
        max_threads_per_sm=2048,
        max_blocks_per_sm=32,
        mem_bandwidth=2.956e12,
        peak_flops_fp16=790e12,
        peak_flops_fp32=67e12,
        l2_bytes=50 * 1024 * 1024,
        clock_hz=1.755e9,
        launch_overhead=2.0e-6,
    ),
}
