"""Triton kernels as TIR PrimFuncs of the TVM module.

A kernel launch is planned in two steps.  :func:`plan_launch` compiles the Triton kernel ahead
of time for sm_90 (no GPU needed) and builds a PrimFunc whose body is one ``T.call_packed`` of
the kernel with every argument it takes: buffer pointers, integers, Triton's two scratch
pointers, then the launch dimensions.  :meth:`Launch.module` wraps the PTX in a TVM CUDA module
for the IRModule's ``external_mods`` attribute (``tvm.compile`` links it into the executable);
that needs TVM's CUDA runtime.  :func:`can_embed` says whether this process can embed and tune
(passes fall back to TVM's own kernels, with the reason logged, when it cannot).

TVM's own ``T.call_kernel`` passes ``tl.constexpr`` values as kernel arguments and omits
Triton's scratch pointers, which does not match the PTX of Triton 3.3+; the launch here is
built from the compiled signature instead.  Like Triton's JIT, pointers and integer arguments
that are multiples of 16 are declared 16-divisible and integer arguments equal to 1 are
compiled in as constants: without that the loads are not vectorised and kernels run ~10x slower.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib

import tvm

from .triton_kernels import kernel, precision

_SCRATCH_ARGS = 2  # Triton >= 3.3 appends global- and profile-scratch pointers to every kernel
_TRITON_TYPES = {"float16": "*fp16", "float32": "*fp32"}


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


@dataclasses.dataclass(frozen=True)
class Param:
    """A buffer parameter of the PrimFunc (the last one is the output)."""

    name: str
    shape: tuple
    dtype: str


@dataclasses.dataclass
class Launch:
    """A compiled Triton kernel and the PrimFunc that launches it."""

    func: tvm.tirx.PrimFunc
    ptx: str
    symbol: str
    arg_types: list
    tags: list

    def module(self):
        """The TVM CUDA module holding the PTX (needs TVM's CUDA runtime)."""
        from tvm.tirx.script.builder.external_kernel import BaseKernel

        return BaseKernel()._create_cuda_module(self.ptx, self.arg_types, self.tags, self.symbol)


def plan_launch(
    name: str,
    params: list[Param],
    args: dict,
    constexprs: dict,
    grid: tuple,
    launch: dict,
    symbol: str,
) -> Launch:
    """Compile kernel ``name`` for sm_90 and build the PrimFunc launching it.

    Parameters
    ----------
    name : str
        A template of :mod:`tvm_stitch.codegen.triton_kernels`.
    params : list of Param
        The PrimFunc's buffers, inputs first, the output last.
    args : dict
        Every runtime argument of the kernel: a parameter's name (its data pointer), an int or a
        float.  Ints equal to 1 become constants, like Triton's JIT does.
    constexprs : dict
        The template's ``tl.constexpr`` values.
    grid : tuple of int
        Programs along x (, y, z).
    launch : dict
        ``num_warps`` and ``num_stages``.
    symbol : str
        The kernel's name in the PTX; every variant needs its own, since the executable looks
        kernels up by name across all embedded modules.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script.builder import ir as T

    fn = kernel(name)
    dtypes = {p.name: p.dtype for p in params}
    # IEEE float32 products for float32 inputs (Triton's default is TF32)
    fp32 = any(p.dtype == "float32" for p in params[:-1])
    consts = {"DOT_PREC": "tf32", **precision("float32" if fp32 else "float16"), **constexprs}
    missing = [a for a in fn.arg_names if a not in args and a not in consts]
    if missing:
        raise ValueError(f"{name}: no value for kernel arguments {missing}")
    signature, attrs, values = {}, {}, []
    for arg in fn.arg_names:
        if arg in consts:
            continue
        value = args[arg]
        if isinstance(value, str):
            signature[arg] = _TRITON_TYPES[dtypes[value]]
            attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[arg] = "fp32"
        elif value == 1:
            consts[arg] = 1
            continue
        else:
            signature[arg] = "i32"
            if value % 16 == 0:
                attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
        values.append(value)
    src = ASTSource(
        fn, {**signature, **dict.fromkeys(consts, "constexpr")}, constexprs=consts, attrs=attrs
    )
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(launch))
    meta = compiled.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError(f"{name} needs Triton scratch memory")
    arg_types = [
        "handle" if t.startswith("*") else ("float32" if t == "fp32" else "int32")
        for t in signature.values()
    ]
    arg_types += ["int64"] * _SCRATCH_ARGS  # null scratch pointers
    tags = ["threadIdx.x", *["blockIdx.x", "blockIdx.y", "blockIdx.z"][: len(grid)]]
    extents = [meta.num_warps * 32, *grid]
    if meta.shared:
        tags.append("tirx.use_dyn_shared_memory")
        extents.append(meta.shared)
    ptx = compiled.asm["ptx"].replace(meta.name, symbol)

    with IRBuilder() as ib:
        with T.prim_func(is_private=False, s_tir=True):
            T.func_name("main")
            bufs = {
                p.name: T.arg(p.name, T.buffer(p.shape, p.dtype, buffer_name=p.name))
                for p in params
            }
            T.func_attr({"tirx.is_scheduled": True})

            def whole(p):
                return bufs[p.name][tuple(slice(0, s) for s in p.shape)]

            call = []
            for v in values:
                if isinstance(v, str):
                    call.append(bufs[v].data)
                elif isinstance(v, float):
                    call.append(T.float32(v))
                else:
                    call.append(T.int32(v))
            call += [T.int64(0)] * _SCRATCH_ARGS + [T.int32(e) for e in extents]
            with T.sblock("root"):
                T.reads(*[whole(p) for p in params[:-1]])
                T.writes(whole(params[-1]))
                T.evaluate(T.call_packed(symbol, *call))
    return Launch(ib.get(), ptx, symbol, arg_types, tags)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def linear_launch(m, n, k, dtype, has_res, gelu, config) -> Launch:
    """``y = act(x @ w.T + bias) + residual`` with the GEMM template.

    Buffers: ``x`` (m, k), ``w`` (n, k) (a Linear weight), ``bias`` (n,), ``residual`` (m, n)
    when ``has_res``, and the output ``y`` (m, n).  ``config`` holds the tiles
    (``BLOCK_M/N/K``) and the launch options (``num_warps``, ``num_stages``).
    """
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    params = [Param("x", (m, k), dtype), Param("w", (n, k), dtype), Param("bias", (n,), dtype)]
    if has_res:
        params.append(Param("res", (m, n), dtype))
    params.append(Param("y", (m, n), dtype))
    args = {
        "A": "x",
        "B": "w",
        "C": "y",
        "Bias": "bias",
        "Res": "res" if has_res else "y",
        "M": m,
        "N": n,
        "K": k,
        "s_am": k,
        "s_ak": 1,
        "s_bk": 1,
        "s_bn": k,
        "s_cm": n,
        "s_cn": 1,
        "s_rm": n,
        "s_rn": 1,
    }
    constexprs = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "HAS_BIAS": True,
        "GELU": gelu,
        "HAS_RES": bool(has_res),
        "GROUP_M": config.get("GROUP_M", 8),
    }
    symbol = f"stitch_gemm_{m}x{n}x{k}_{dtype}_g{gelu}_r{int(has_res)}_{_tag(config)}"
    grid = (_cdiv(m, bm) * _cdiv(n, bn),)
    return plan_launch("gemm_epilogue", params, args, constexprs, grid, _launch(config), symbol)


def _launch(config: dict) -> dict:
    return {"num_warps": config.get("num_warps", 4), "num_stages": config.get("num_stages", 3)}


def _tag(config: dict) -> str:
    tiles = "x".join(str(config[k]) for k in sorted(config) if k.startswith("BLOCK_"))
    return f"{tiles}_w{config.get('num_warps', 4)}s{config.get('num_stages', 3)}"


@dataclasses.dataclass(frozen=True)
class View:
    """A tensor read or written in place inside a parameter's memory.

    ``shape`` and ``strides`` (in elements) describe the logical tensor; ``param`` is the
    contiguous buffer holding it.
    """

    param: Param
    shape: tuple
    strides: tuple


def contiguous(shape) -> tuple:
    """Row-major strides of ``shape``."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def attention_launch(q: View, k: View, v: View, out: View, mask: View | None, scale, config):
    """``out = softmax(q @ k^T * scale + mask) @ v`` with the attention template.

    Each :class:`View` is (heads, seq, dim) or (batch, heads, seq, dim) over its buffer (the
    mask broadcasts to (…, m, n) with zero strides).  Buffers: q, k, v, [mask,] out — one per
    distinct parameter, in that order.
    """
    batch, heads, m, dk = _four(q.shape)
    n, dh = k.shape[-2], v.shape[-1]
    sq, sk, sv, so = (_four(x.strides, pad=0) for x in (q, k, v, out))
    sx = _four(mask.strides, pad=0) if mask is not None else (0, 0, 0, 0)
    views = [q, k, v] + ([mask] if mask is not None else []) + [out]
    params = list(dict.fromkeys(x.param for x in views))
    args = {
        "Q": q.param.name,
        "Kt": k.param.name,
        "V": v.param.name,
        "O": out.param.name,
        "Mask": (mask or out).param.name,
        "M": m,
        "N": n,
        "DK": dk,
        "DH": dh,
        "HEADS": heads,
        **dict(zip(("s_qb", "s_qg", "s_qm", "s_qk"), sq)),
        **dict(zip(("s_kb", "s_kg", "s_kn", "s_kk"), sk)),
        **dict(zip(("s_vb", "s_vg", "s_vn", "s_vh"), sv)),
        **dict(zip(("s_ob", "s_og", "s_om", "s_oh"), so)),
        **dict(zip(("s_xb", "s_xg", "s_xm", "s_xn"), sx)),
        "scale": float(scale),
    }
    constexprs = {
        "BLOCK_M": config["BLOCK_M"],
        "BLOCK_N": config["BLOCK_N"],
        "BLOCK_K": max(16, 1 << math.ceil(math.log2(dk))),
        "BLOCK_H": max(16, 1 << math.ceil(math.log2(dh))),
        "HAS_MASK": mask is not None,
    }
    shape = f"{batch}x{heads}x{m}x{n}x{dk}x{dh}"
    layout = "_".join("".join(map(str, s)) for s in (sq, sk, sv, so, sx))
    symbol = f"stitch_attn_{shape}_{q.param.dtype}_{zlib.crc32(layout.encode()):08x}_{_tag(config)}"
    grid = (_cdiv(m, config["BLOCK_M"]), batch * heads)
    return plan_launch("attention", params, args, constexprs, grid, _launch(config), symbol)


def _four(dims, pad=1) -> tuple:
    """(batch, heads, seq, dim) from 3-D or 4-D dims; a missing batch gets ``pad``."""
    dims = tuple(int(d) for d in dims)
    return dims if len(dims) == 4 else (pad, *dims)


def chain_launch(batch, m, n, k, h, dtype, config) -> Launch:
    """``e = (a @ b) @ d`` for contiguous ``a`` (batch, m, k), ``b`` (batch, k, n), ``d``
    (batch, n, h) with the GEMM-chain template."""
    params = [
        Param("a", (batch, m, k), dtype),
        Param("b", (batch, k, n), dtype),
        Param("d", (batch, n, h), dtype),
        Param("e", (batch, m, h), dtype),
    ]
    strides = {p.name: contiguous(p.shape) for p in params}
    args = {"A": "a", "B": "b", "D": "d", "E": "e", "M": m, "N": n, "K": k, "H": h}
    for prefix, name in (("s_a", "a"), ("s_b", "b"), ("s_d", "d"), ("s_e", "e")):
        dims = {"a": "bmk", "b": "bkn", "d": "bnh", "e": "bmh"}[name]
        args.update({prefix + x: s for x, s in zip(dims, strides[name])})
    constexprs = {
        key: config[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H", "HOIST_A")
    }
    symbol = f"stitch_chain_{batch}x{m}x{n}x{k}x{h}_{dtype}_{_tag(config)}"
    grid = (_cdiv(m, config["BLOCK_M"]), _cdiv(h, config["BLOCK_H"]), batch)
    return plan_launch("gemm_chain", params, args, constexprs, grid, _launch(config), symbol)
