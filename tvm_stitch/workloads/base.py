"""What a workload is: a Relax module, its arguments, and PyTorch functions meaning the same."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import tvm

#: Per-dtype tolerances for comparing a compiled module with the PyTorch/numpy reference
#: (the reference always runs in float32 on the CPU).
#: (rtol, atol) of a whole model's output against float32: bfloat16 keeps 8 bits of mantissa
#: where float16 keeps 11
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (2e-2, 2e-2), "bfloat16": (8e-2, 8e-2)}


@dataclasses.dataclass
class Instance:
    """One workload at one shape and dtype.

    Attributes
    ----------
    name : str
        Workload name and shape, e.g. ``layernorm 4096x768 float16``.
    mod : tvm.IRModule
        Relax module, not yet legalized.
    func : str
        Entry function of ``mod``.
    args : list of numpy.ndarray
        Arguments in the entry function's order (inputs, then weights).
    torch_fns : dict of str to callable
        PyTorch implementations taking ``torch`` tensors in ``args`` order: ``"eager"`` always,
        ``"sdpa"`` where attention can use ``scaled_dot_product_attention``.  Each is a factory
        ``make(device, dtype) -> fn`` so that models are built where they run.
    flops : int
        Useful floating-point operations (2·M·N·K per GEMM); 0 for memory-bound workloads.
    ideal_bytes : int
        Bytes a perfect kernel moves: inputs read once plus outputs written once.
    dtype : str
        Compute dtype of the module.
    """

    name: str
    mod: tvm.IRModule
    func: str
    args: list[np.ndarray]
    torch_fns: dict[str, Callable]
    flops: int
    ideal_bytes: int
    dtype: str

    @property
    def tolerance(self) -> tuple[float, float]:
        """``(rtol, atol)`` for this instance's dtype."""
        return TOLERANCES.get(self.dtype, TOLERANCES["float16"])

    def reference(self) -> list[np.ndarray]:
        """Outputs of the eager PyTorch implementation in float32 on the CPU."""
        import torch

        fn = self.torch_fns["eager"]("cpu", torch.float32)
        tensors = [_to_torch(a, torch.float32, "cpu") for a in self.args]
        with torch.no_grad():
            out = fn(*tensors)
        outs = out if isinstance(out, (tuple, list)) else [out]
        return [o.float().numpy() for o in outs]

    def torch_args(self, device: str, dtype) -> list:
        """``args`` as torch tensors (floating ones cast to ``dtype``)."""
        return [_to_torch(a, dtype, device) for a in self.args]


def layers_suffix(layers: int) -> str:
    """The part of an instance's name saying it keeps ``layers`` layers (none for all)."""
    return f" {layers} layers" if layers else ""


def _to_torch(array: np.ndarray, dtype, device):
    import torch

    if array.dtype.name == "bfloat16":  # ml_dtypes' type, which torch.from_numpy cannot take
        array = array.astype(np.float32)
    t = torch.from_numpy(np.ascontiguousarray(array))
    if t.is_floating_point():
        t = t.to(dtype)
    return t.to(device)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A named workload with default shape parameters.

    Attributes
    ----------
    name : str
    family : str
        ``bert``, ``memory``, ``gemm-chain`` or ``attention`` (the benchmark studies).
    description : str
    defaults : dict
        Shape parameters and their defaults (``rows``, ``cols``, ``batch``, ``seq``, ...).
    build : callable
        ``build(dtype, rng, **params) -> Instance``.
    """

    name: str
    family: str
    description: str
    defaults: dict
    build: Callable[..., Instance]

    def instance(self, dtype: str = "float32", seed: int = 0, **params) -> Instance:
        """Build the workload at ``dtype`` with ``params`` overriding the default shape.

        Raises
        ------
        TypeError
            For a shape parameter this workload does not have.
        """
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise TypeError(
                f"workload {self.name!r} has no parameter(s) {unknown}; "
                f"it takes {sorted(self.defaults)}"
            )
        if dtype not in TOLERANCES:
            raise ValueError(f"dtype must be one of {sorted(TOLERANCES)}, got {dtype!r}")
        merged = {**self.defaults, **{k: int(v) for k, v in params.items()}}
        return self.build(dtype=dtype, rng=np.random.default_rng(seed), **merged)
