"""Triton kernels as TIR PrimFuncs of the TVM module.

The Triton kernel is compiled ahead of time for sm_90, its PTX wrapped in a TVM CUDA module that
goes into the IRModule's ``external_mods`` attribute (``tvm.compile`` links it into the
executable), and the PrimFunc launches it with ``T.call_packed``.  Creating a CUDA module needs
TVM's CUDA runtime, and the tile search measures on the GPU: :func:`can_embed` says whether this
process can, and passes fall back to TVM's own kernels (with the reason logged) when it cannot.
"""

from __future__ import annotations

import functools

import tvm

from .triton_kernels import kernel


@functools.cache
def can_embed() -> tuple[bool, str]:
    """Whether Triton kernels can be compiled and embedded here, and why not if they cannot."""
    import tvm_ffi

    try:
        import torch
        import triton  # noqa: F401
    except ImportError as err:
        return False, f"{err.name} is not installed"
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        return False, "this TVM has no CUDA runtime to load the kernels into"
    if not tvm.cuda(0).exist or not torch.cuda.is_available():
        return False, "no CUDA GPU to tune the kernels on"
    return True, ""


_SCRATCH_ARGS = 2  # Triton >= 3.3 appends global- and profile-scratch pointers to every kernel


def _cuda_module(
    name: str,
    signature: dict,
    constexprs: dict,
    num_warps: int,
    num_stages: int,
    grid_dims: int,
    symbol: str,
    values: dict,
):
    """Compile kernel ``name`` for sm_90 and wrap its PTX in a TVM CUDA module.

    The kernel is renamed ``symbol`` in the PTX: every variant needs its own name, since the
    executable looks kernels up by name across all embedded modules.  Like Triton's JIT, pointers
    and the integer arguments in ``values`` that are multiples of 16 are declared 16-divisible:
    without that the loads are not vectorised and the kernel runs ~10x slower.
    Returns ``(module, symbol, num_threads, shared_bytes)``.  TVM's own ``T.call_kernel``
    passes ``tl.constexpr`` values as kernel arguments and omits Triton's scratch pointers, which
    does not match the PTX of Triton 3.3+; this builds the launch from the compiled signature.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from tvm.tirx.script.builder.external_kernel import BaseKernel

    fn = kernel(name)
    attrs = {
        (fn.arg_names.index(arg),): [["tt.divisibility", 16]]
        for arg, ty in signature.items()
        if ty.startswith("*") or values.get(arg, 1) % 16 == 0
    }
    src = ASTSource(
        fn,
        {**signature, **dict.fromkeys(constexprs, "constexpr")},
        constexprs=constexprs,
        attrs=attrs,
    )
    compiled = triton.compile(
        src,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError(f"{name} needs Triton scratch memory")
    arg_types = ["handle" if t.startswith("*") else "int32" for t in signature.values()]
    arg_types += ["int64"] * _SCRATCH_ARGS  # null scratch pointers
    tags = ["threadIdx.x", *["blockIdx.x", "blockIdx.y", "blockIdx.z"][:grid_dims]]
    if meta.shared:
        tags.append("tirx.use_dyn_shared_memory")
    ptx = compiled.asm["ptx"].replace(meta.name, symbol)
    module = BaseKernel()._create_cuda_module(ptx, arg_types, tags, symbol)
    return module, symbol, meta.num_warps * 32, meta.shared


#: runtime arguments of the GEMM template as launched here; the unit strides are compiled in as
#: constants (Triton's JIT specialises arguments equal to 1 the same way)
_LINEAR_SIG = {
    **dict.fromkeys(["A", "B", "C", "Bias", "Res"], "*fp16"),
    **dict.fromkeys(["M", "N", "K", "s_am", "s_bn", "s_cm", "s_rm"], "i32"),
}
_UNIT_STRIDES = {"s_ak": 1, "s_bk": 1, "s_cn": 1, "s_rn": 1}


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

    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    ptr = "*fp16" if dtype == "float16" else "*fp32"
    signature = {a: (ptr if t.startswith("*") else t) for a, t in _LINEAR_SIG.items()}
    constexprs = {
        **_UNIT_STRIDES,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "HAS_BIAS": True,
        "GELU": gelu,
        "HAS_RES": bool(has_res),
    }
    values = {"M": m, "N": n, "K": k, "s_am": k, "s_bn": k, "s_cm": n, "s_rm": n}
    variant = f"stitch_gemm_{m}x{n}x{k}_{dtype}_g{gelu}_r{int(has_res)}_{bm}x{bn}x{bk}"
    module, symbol, threads, smem = _cuda_module(
        "gemm_epilogue", signature, constexprs, num_warps, num_stages, 2, variant, values
    )
    gx, gy = (m + bm - 1) // bm, (n + bn - 1) // bn
    launch = [T.int32(threads), T.int32(gx), T.int32(gy)] + ([T.int32(smem)] if smem else [])
    # the integer arguments in signature order, null scratch pointers, then the launch shape
    scalars = [T.int32(values[a]) for a in signature if not signature[a].startswith("*")]
    scalars += [T.int64(0)] * _SCRATCH_ARGS + launch

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
                    T.evaluate(
                        T.call_packed(
                            symbol,
                            x.data,
                            w.data,
                            y.data,
                            bias.data,
                            res.data,
                            *scalars,
                        )
                    )

        func = WithResidual["main"]
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
                    T.evaluate(
                        T.call_packed(
                            symbol,
                            x.data,
                            w.data,
                            y.data,
                            bias.data,
                            y.data,
                            *scalars,
                        )
                    )

        func = Plain["main"]
    return func, [module]
