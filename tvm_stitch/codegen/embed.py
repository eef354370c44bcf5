"""Triton kernels as TIR PrimFuncs of the TVM module (``T.call_kernel``).

``T.call_kernel`` compiles the Triton kernel for the GPU that is active while the TVMScript is
parsed, wraps its PTX in a CUDA module and records that module in the IRModule's
``external_mods`` attribute, which ``tvm.compile`` links into the executable.  It therefore needs
a GPU at compile time: :func:`can_embed` says whether this process has one, and passes fall back
to TVM's own kernels (with the reason logged) when it does not.
"""

from __future__ import annotations

import functools

import tvm

from .triton_kernels import kernel


@functools.cache
def can_embed() -> tuple[bool, str]:
    """Whether Triton kernels can be compiled and embedded here, and why not if they cannot."""
    try:
        import torch
        import triton  # noqa: F401
    except ImportError as err:
        return False, f"{err.name} is not installed"
    if not torch.cuda.is_available():
        return False, "no CUDA GPU in this process (T.call_kernel compiles for the active GPU)"
    if not tvm.cuda(0).exist:
        return False, "TVM's CUDA runtime sees no device"
    return True, ""


def linear_primfunc(
    m: int,
    n: int,
    k: int,
    dtype: str,
    has_res: bool,
    gelu: int,
    config: dict,
    num_warps: int = 4,
    num_stages: int = 3,
):
    """A PrimFunc ``y = act(x @ w.T + bias) + residual`` calling the Triton GEMM template.

    ``x`` is ``(m, k)``, ``w`` is ``(n, k)`` (a Linear weight), ``bias`` ``(n,)``, ``residual``
    and ``y`` ``(m, n)``; the buffers follow that order.  Returns ``(prim_func, external_mods)``.
    """
    from tvm.script import ir as I
    from tvm.script import tirx as T

    kern = kernel("gemm_epilogue")
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    grid = ((m + bm - 1) // bm, (n + bn - 1) // bn)
    hr = int(has_res)

    if has_res:

        @I.ir_module(s_tir=True)
        class WithResidual:
            @T.prim_func(s_tir=True)
            def main(
                x: T.Buffer((m, k), dtype),
                w: T.Buffer((n, k), dtype),
                bias: T.Buffer((n,), dtype),
                res: T.Buffer((m, n), dtype),
                y: T.Buffer((m, n), dtype),
            ):
                T.func_attr({"tirx.is_scheduled": True})
                with T.sblock("root"):
                    T.reads(x[0:m, 0:k], w[0:n, 0:k], bias[0:n], res[0:m, 0:n])
                    T.writes(y[0:m, 0:n])
                    T.call_kernel(
                        kern,
                        grid,
                        x.data,
                        w.data,
                        y.data,
                        bias.data,
                        res.data,
                        T.int32(m),
                        T.int32(n),
                        T.int32(k),
                        T.int32(k),
                        T.int32(1),
                        T.int32(1),
                        T.int32(k),
                        T.int32(n),
                        T.int32(1),
                        T.int32(n),
                        T.int32(1),
                        bm,
                        bn,
                        bk,
                        1,
                        gelu,
                        hr,
                        num_warps=num_warps,
                        num_stages=num_stages,
                    )

    else:

        @I.ir_module(s_tir=True)
        class Plain:
            @T.prim_func(s_tir=True)
            def main(
                x: T.Buffer((m, k), dtype),
                w: T.Buffer((n, k), dtype),
                bias: T.Buffer((n,), dtype),
                y: T.Buffer((m, n), dtype),
            ):
                T.func_attr({"tirx.is_scheduled": True})
                with T.sblock("root"):
                    T.reads(x[0:m, 0:k], w[0:n, 0:k], bias[0:n])
                    T.writes(y[0:m, 0:n])
                    T.call_kernel(
                        kern,
                        grid,
                        x.data,
                        w.data,
                        y.data,
                        bias.data,
                        y.data,
                        T.int32(m),
                        T.int32(n),
                        T.int32(k),
                        T.int32(k),
                        T.int32(1),
                        T.int32(1),
                        T.int32(k),
                        T.int32(n),
                        T.int32(1),
                        T.int32(n),
                        T.int32(1),
                        bm,
                        bn,
                        bk,
                        1,
                        gelu,
                        hr,
                        num_warps=num_warps,
                        num_stages=num_stages,
                    )

    built = WithResidual if has_res else Plain
    return built["main"], list(built.attrs["external_mods"])
