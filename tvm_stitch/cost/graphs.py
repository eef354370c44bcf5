"""Which model inputs to copy before TVM's CUDA graphs (``passes.StageInputs``).

``RewriteCUDAGraph`` captures runs of kernel launches whose tensors are weights or its own
allocations; a kernel that reads a model input runs outside, launched by the VM, and cuts the
run in two. Copying the input first lets every later kernel read the copy, at the price of the
copy: a launch, and the input's bytes read and written once. A padding mask is worth copying
(BERT: 28 launches by the VM become 3); three attention inputs of 64 MB each, read by one
kernel, are not (the copies took 100-190 µs a call, the kernel itself 125-395 µs:
``h200-sustained-power-2026-11-30.md``).
"""

from __future__ import annotations

import itertools

from tvm_stitch.hardware import HardwareModel

#: at most this many inputs are decided by trying every subset; more, one at a time
EXHAUSTIVE = 8


def vm_launches(reads: list[frozenset], staged: frozenset) -> int:
    """Launches the VM issues for kernels in the order ``reads`` (each kernel's set of the
    inputs it reads) when the inputs ``staged`` are copied first: each copy, each kernel that
    reads an input not copied, and each run of the other kernels (one CUDA graph; a run of one
    kernel is one launch all the same)."""
    launches, in_run = len(staged), False
    for read in reads:
        if read - staged:
            launches, in_run = launches + 1, False
        elif not in_run:
            launches, in_run = launches + 1, True
    return launches


def staging_cost(reads: list[frozenset], nbytes: dict, staged: frozenset,
                 hw: HardwareModel) -> float:
    """Seconds a call spends on the VM's launches and the copies of ``staged``: a copy is one
    of the VM's launches, and its bytes read and written once (``hw.vm_launch`` was measured
    with the copies of a mask and token ids among the launches: their device time is in it)."""
    copies = sum(2 * nbytes[p] / hw.mem_bandwidth for p in staged)
    return vm_launches(reads, staged) * hw.vm_launch + copies


def inputs_to_stage(reads: list[frozenset], nbytes: dict, hw: HardwareModel) -> frozenset:
    """The inputs (keys of ``nbytes``: the bytes of each, at its shape's bound) whose copies
    cost the least with the VM's launches, by :func:`staging_cost`; ties keep fewer copies."""
    inputs = sorted(nbytes, key=lambda p: (nbytes[p], str(p)))

    def cost(staged):
        return (staging_cost(reads, nbytes, staged, hw), len(staged))

    if len(inputs) <= EXHAUSTIVE:
        subsets = (frozenset(c) for n in range(len(inputs) + 1)
                   for c in itertools.combinations(inputs, n))
        return min(subsets, key=cost)
    staged = frozenset(inputs)  # many inputs: drop copies one at a time while that pays
    while True:
        best = min((staged - {p} for p in staged), key=cost, default=staged)
        if cost(best) >= cost(staged):
            return staged
        staged = best
