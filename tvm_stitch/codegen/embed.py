"""Triton kernels as TIR PrimFuncs of the TVM module.

A kernel launch is planned in two steps.  :func:`plan_launch` compiles the Triton kernel ahead
of time for sm_90 (no GPU needed) and builds a PrimFunc whose body is one ``T.call_packed`` of
the kernel with every argument it takes: buffer pointers, integers, Triton's two scratch
pointers, then the launch dimensions.  :meth:`Launch.module` wraps the PTX in a TVM CUDA module
for the IRModule's ``external_mods`` attribute (``tvm.compile`` links it into the executable,
``export_library`` saves it), with or without a GPU here.  :func:`can_compile` says whether this
process can compile and embed, :func:`can_measure` whether it can also run the kernels to tune
them (passes fall back to TVM's own kernels, with the reason logged, when it cannot compile).

TVM's own ``T.call_kernel`` passes ``tl.constexpr`` values as kernel arguments and omits
Triton's scratch pointers, which does not match the PTX of Triton 3.3+; the launch here is
built from the compiled signature instead.  Like Triton's JIT, pointers and integer arguments
that are multiples of 16 are declared 16-divisible and integer arguments equal to 1 are
compiled in as constants: without that the loads are not vectorised and kernels run ~10x slower.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import logging
import math
import re

import tvm

from tvm_stitch.config import DEFAULT_LAUNCH_DEPENDENTS, release_point
from tvm_stitch.graph.tdg import dtype_bytes

from .dependent import PDL_TAG, dependent_launch, prefetch_inputs
from .kernel_text import UnsupportedKernelError
from .precompile import ast_source, compile_workers, is_gluon
from .ptx import TENSORMAP, build_module
from .triton_kernels import kernel, precision

logger = logging.getLogger("tvm_stitch.embed")

_SCRATCH_ARGS = 2  # Triton >= 3.3 appends global- and profile-scratch pointers to every kernel
#: PTX ISA of the kernels: 8.7 (CUDA 12.8) has everything sm_90a kernels use, and drivers from
#: R570 on compile it; a newer Triton would otherwise emit its own ptxas's ISA (9.4 for 13.4),
#: which the GPU host's driver may not know
PTX_ISA = 87
_TRITON_TYPES = {
    "float16": "*fp16",
    "bfloat16": "*bf16",
    "float32": "*fp32",
    "int8": "*i8",
    "uint8": "*u8",
    "int32": "*i32",
    "int64": "*i64",
    "bool": "*i1",
}


@functools.cache
def can_compile() -> tuple[bool, str]:
    """Whether Triton kernels can be compiled (for sm_90, no GPU needed) and embedded in a TVM
    module here, and why not if they cannot."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return False, f"{err.name} is not installed"
    return True, ""


@functools.cache
def can_measure() -> tuple[bool, str]:
    """Whether generated kernels can also be run here (tuned by timing them), and why not."""
    import tvm_ffi

    ok, why = can_compile()
    if not ok:
        return ok, why
    try:
        import torch
    except ImportError as err:
        return False, f"{err.name} is not installed"
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        return False, "this TVM has no CUDA runtime"
    if not tvm.cuda(0).exist or not torch.cuda.is_available():
        return False, "no CUDA GPU"
    return True, ""


#: PrimFunc attribute: how many parameters after the graph's inputs are inputs that must hold
#: zeros when the kernel starts (and that it leaves zero): split-K counters
ZEROED_INPUTS = "tvm_stitch.zeroed_inputs"


class SharedMemoryError(ValueError):
    """A compiled kernel needs more shared memory than a block can have."""


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
    #: the other kernels the PrimFunc may launch instead (:func:`plan_launch`), each a Launch
    #: whose ``func`` is None
    alternatives: tuple = ()
    #: what :func:`plan_launch` makes the PrimFunc's call of (:func:`compile_call`)
    plan: dict | None = None

    def modules(self) -> list:
        """The CUDA modules of the kernel and of its alternatives (:meth:`module`)."""
        return [self.module(), *(a.module() for a in self.alternatives)]

    def module(self):
        """The TVM CUDA module holding the PTX.

        With TVM's CUDA runtime it is a loaded module; without one (a CPU machine, or
        ``TVM_COMPILE_FORCE_FALLBACK=1``, TVM's own switch) it is the module TVM's CUDA code
        generator makes there, which ``export_library`` saves and a GPU host loads: the
        executable is compiled here and run there.
        """
        import os

        import tvm_ffi

        runtime = tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True)
        # TVM_COMPILE_FORCE_FALLBACK: TVM's switch for building as if it had no CUDA runtime
        forced = os.environ.get("TVM_COMPILE_FORCE_FALLBACK", "") not in ("", "0", "false",
                                                                        "False", "FALSE")
        if runtime is not None and not forced:
            if TENSORMAP in self.arg_types:
                return _tensormap_module(self.ptx, self.arg_types, self.tags, self.symbol)
            from tvm.tirx.script.builder.external_kernel import BaseKernel

            return BaseKernel()._create_cuda_module(
                self.ptx, self.arg_types, self.tags, self.symbol
            )
        return build_module(self.ptx, self.symbol, self.arg_types, self.tags)


def _tensormap_module(ptx: str, arg_types: list, tags: list, symbol: str):
    """A loaded CUDA module whose function table marks the TMA descriptor arguments (TVM's
    launcher then passes the 128 bytes they point to as the parameter's value)."""
    import json

    import tvm_ffi

    info = {"tvm_version": tvm.__version__, "func_info": {symbol: {
        "name": "",
        "arg_types": ["handle" if t == TENSORMAP else t for t in arg_types],
        "launch_param_tags": tags,
        "arg_extra_tags": [int(t == TENSORMAP) for t in arg_types],
    }}}
    fmap = tvm_ffi.get_global_func("runtime.LoadMetaDataFromJSON")(json.dumps(info))
    return tvm_ffi.get_global_func("ffi.Module.create.cuda")(ptx.encode(), "ptx", fmap, {})


def compile_call(
    name,
    params: list[Param],
    args: dict,
    constexprs: dict,
    grid: tuple,
    launch: dict,
    symbol: str,
    outputs: int = 1,
    smem_limit: int | None = None,
    descriptors: dict | None = None,
    dependent: bool = True,
    launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS,
    scalars: tuple = (),
    aligned: tuple = (),
    prefetch: tuple = (),
    num_sms: int | None = None,
) -> Launch:
    """Compile kernel ``name`` for sm_90: a Launch without a PrimFunc, which
    :func:`plan_launch` makes (launching it, or it among other kernels).

    Parameters
    ----------
    name : str or triton.JITFunction
        A template of :mod:`tvm_stitch.codegen.triton_kernels`, or a generated kernel.
    params : list of Param
        The PrimFunc's buffers, inputs first, the ``outputs`` outputs last.
    args : dict
        Every runtime argument of the kernel: a parameter's name (its data pointer), an int, a
        float, or an integer expression of ``scalars`` (computed at call time).  Ints equal to
        1 become constants, like Triton's JIT does.
    constexprs : dict
        The template's ``tl.constexpr`` values.
    grid : tuple of int
        Programs along x (, y, z); integer expressions of ``scalars`` where they vary.
    launch : dict
        ``num_warps`` and ``num_stages``.
    symbol : str
        The kernel's name in the PTX; every variant needs its own, since the executable looks
        kernels up by name across all embedded modules.
    outputs : int
        How many of ``params`` (the last ones) the kernel writes.
    smem_limit : int, optional
        Shared memory per block the device grants; a kernel needing more raises
        :class:`SharedMemoryError` (it would fail at launch).
    descriptors : dict, optional
        Kernel argument -> ``(Descriptor, parameter)``: a TMA descriptor the PrimFunc makes on
        the host (:class:`~tvm_stitch.codegen.kernel_text.Descriptor`) over that buffer
        parameter, passed by value as Triton's launcher would (descriptor, shape, strides).
    dependent : bool
        Launched with programmatic dependent launch (:data:`PDL_TAG`), the kernel first waiting
        for the grid before it (:func:`dependent_launch`); False: launched as TVM's own kernels.
    launch_dependents : {"auto", "start", "exit"}
        When a dependent kernel lets the next one be launched (:func:`dependent_launch`;
        ``"auto"``: :func:`~tvm_stitch.config.release_point` of its grid on ``num_sms`` SMs).
    scalars : tuple of tir.Var
        Symbolic dims the buffers' shapes use: integer parameters of the PrimFunc after its
        inputs (where TVM's own kernels take them), passed by the call.
    aligned : tuple of str
        Arguments computed at call time that the kernel is compiled to take as multiples of
        16 (Triton's ``tt.divisibility``, what its JIT specializes an int on): the caller
        launches it only where they are (``alternatives``).
    prefetch : tuple of str
        Input parameters in memory before the function runs (weights) that the kernel's
        blocks pull into L2 first thing, before waiting for the grid before it
        (:func:`prefetch_inputs`); each is passed once more, as a pointer after Triton's.
    num_sms : int, optional
        The device's SMs, for ``launch_dependents="auto"`` (None: released at exit).
    """
    import triton
    from triton.backends.compiler import GPUTarget

    fn = kernel(name) if isinstance(name, str) else name
    dtypes = {p.name: p.dtype for p in params}
    # IEEE float32 products for float32 inputs (Triton's default is TF32)
    fp32 = any(p.dtype == "float32" for p in params[:-outputs])
    consts = {"DOT_PREC": "tf32", **precision("float32" if fp32 else "float16"), **constexprs}
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    descriptors = descriptors or {}
    missing = [a for a in fn.arg_names if a not in args and a not in consts
               and a not in descriptors]
    if missing:
        raise ValueError(f"{name}: no value for kernel arguments {missing}")
    signature, attrs, values = {}, {}, []
    for arg in fn.arg_names:
        if arg in consts:
            continue
        if arg in descriptors:
            desc, _ = descriptors[arg]
            block = desc.block(consts)
            layout = ""  # a Gluon kernel's descriptor names its shared-memory layout
            if is_gluon(fn):
                from .kernel_text import smem_layout

                layout = f",{smem_layout(*block, desc.dtype)!r}"
            signature[arg] = (f"tensordesc<{_TRITON_TYPES[desc.dtype][1:]}"
                              f"[{block[0]},{block[1]}]{layout}>")
            values.append(descriptors[arg])
            continue
        value = args[arg]
        if isinstance(value, str):
            signature[arg] = _TRITON_TYPES[dtypes[value]]
            attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[arg] = "fp32"
        elif not isinstance(value, int):  # computed at call time
            signature[arg] = "i32"
            if _multiple_of_16(value) or arg in aligned:  # a stride of 768 x seq: vectorised
                attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
        elif value == 1:
            consts[arg] = 1
            continue
        else:
            signature[arg] = "i32"
            if value % 16 == 0:
                attrs[(fn.arg_names.index(arg),)] = [["tt.divisibility", 16]]
        values.append(value)
    src = ast_source(fn)(
        fn, {**signature, **dict.fromkeys(consts, "constexpr")}, constexprs=consts, attrs=attrs
    )
    compiled = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={**launch, "ptx_version": PTX_ISA}
    )
    meta = compiled.metadata
    if smem_limit is not None and meta.shared > smem_limit:
        raise SharedMemoryError(
            f"{symbol} needs {meta.shared} bytes of shared memory, the device has {smem_limit}"
        )
    if getattr(meta, "profile_scratch_size", 0):
        raise NotImplementedError(f"{symbol} needs Triton's profiling scratch memory")
    scratch = getattr(meta, "global_scratch_size", 0)
    if scratch:  # per program (TMA descriptors made on the device): one more output buffer
        if not all(isinstance(g, int) for g in grid):
            raise UnsupportedKernelError(f"{symbol} needs scratch memory per program of a "
                                         "grid known at run time")
        align = max(getattr(meta, "global_scratch_align", 1), 1)
        size = -(-scratch // align) * align * math.prod(grid)
        params = [*params, Param("scratch", (size,), "uint8")]
        outputs += 1
    arg_types = []
    for t in signature.values():
        if t.startswith("tensordesc"):  # the descriptor, its shape, its strides (rank 2)
            arg_types += [TENSORMAP, "int32", "int32", "int64", "int64"]
        else:
            arg_types.append(
                "handle" if t.startswith("*") else ("float32" if t == "fp32" else "int32"))
    # Triton's scratch pointers: the global one when the kernel needs it, else null
    arg_types += ["handle" if scratch else "int64", "int64"]
    tags = ["threadIdx.x", *["blockIdx.x", "blockIdx.y", "blockIdx.z"][: len(grid)]]
    tags += [PDL_TAG] if dependent else []
    extents = [meta.num_warps * 32, *grid]
    if meta.shared:
        tags.append("tirx.use_dyn_shared_memory")  # TVM wants it last
        extents.append(meta.shared)
    ptx = compiled.asm["ptx"].replace(meta.name, symbol)
    blocks = math.prod(grid) if all(isinstance(g, int) for g in grid) else None
    release = release_point(launch_dependents, blocks, num_sms)
    ptx = dependent_launch(ptx, release) if dependent else ptx
    if prefetch:
        sizes = {p.name: math.prod(p.shape) * dtype_bytes(p.dtype) for p in params}
        ptx = prefetch_inputs(ptx, [sizes[name] for name in prefetch])
        arg_types += ["handle"] * len(prefetch)

    plan = {"values": values, "extents": extents, "params": params, "outputs": outputs,
            "scalars": scalars, "scratch": scratch, "prefetch": tuple(prefetch),
            "boxes": list(getattr(meta, "tensordesc_meta", None) or [])}
    return Launch(None, ptx, symbol, arg_types, tags, plan=plan)


def plan_launch(name, params: list[Param], args: dict, constexprs: dict, grid: tuple,
                launch: dict, symbol: str, alternatives: tuple = (), **options) -> Launch:
    """Compile kernel ``name`` for sm_90 and build the PrimFunc launching it.

    Parameters
    ----------
    name, params, args, constexprs, grid, launch, symbol, **options
        The kernel, as :func:`compile_call` takes it.
    alternatives : tuple of (PrimExpr, Launch)
        Kernels launched instead where their condition (of ``scalars``) holds, the first that
        holds; each compiled by :func:`compile_call` on the same ``params`` and ``scalars``.
    """
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script.builder import ir as T

    main = compile_call(name, params, args, constexprs, grid, launch, symbol, **options)
    for _, other in alternatives:
        if other.plan["scratch"] or main.plan["scratch"]:
            raise UnsupportedKernelError(f"{symbol}: alternatives take no scratch memory")
    params, outputs = _merged_params([main, *(k for _, k in alternatives)])
    scalars = main.plan["scalars"]
    with IRBuilder() as ib:
        with T.prim_func(is_private=False, s_tir=True):
            T.func_name("main")
            inputs = len(params) - outputs
            bufs = {
                p.name: T.arg(p.name, T.buffer(p.shape, p.dtype, buffer_name=p.name))
                for p in params[:inputs]
            }
            for var in scalars:
                T.arg(var.name, var)
            bufs.update({
                p.name: T.arg(p.name, T.buffer(p.shape, p.dtype, buffer_name=p.name))
                for p in params[inputs:]
            })
            T.func_attr({"tirx.is_scheduled": True})

            def whole(p):
                return bufs[p.name][tuple(slice(0, s) for s in p.shape)]

            with T.sblock("root"):
                T.reads(*[whole(p) for p in params[:-outputs]])
                T.writes(*[whole(p) for p in params[-outputs:]])
                written = {p.name for p in params[-outputs:]}

                def launch_of(kernel):
                    plan, call = kernel.plan, []
                    boxes = iter(plan["boxes"])
                    for v in plan["values"]:
                        if isinstance(v, tuple):  # a TMA descriptor, made here on the host
                            mode = "w" if v[1] in written else "r"
                            call += _host_descriptor(T, bufs[v[1]], v[0], next(boxes), mode)
                        elif isinstance(v, str):
                            call.append(bufs[v].data)
                        elif isinstance(v, float):
                            call.append(T.float32(v))
                        else:
                            call.append(_int32(v))
                    nulls = [T.int64(0)] * _SCRATCH_ARGS
                    if plan["scratch"]:
                        nulls[0] = bufs["scratch"].data
                    call += nulls + [bufs[name].data for name in plan["prefetch"]]
                    call += [_int32(e) for e in plan["extents"]]
                    T.evaluate(T.call_packed(kernel.symbol, *call))

                def choose(options):  # the first whose condition holds, else the main kernel
                    if not options:
                        launch_of(main)
                        return
                    (condition, kernel), rest = options[0], options[1:]
                    with T.If(condition):
                        with T.Then():
                            launch_of(kernel)
                        with T.Else():
                            choose(rest)

                choose(list(alternatives))
    return dataclasses.replace(main, func=ib.get(), plan=None,
                               alternatives=tuple(k for _, k in alternatives))


def _merged_params(kernels) -> tuple[list, int]:
    """``(params, outputs)`` of a PrimFunc launching one of ``kernels`` (compiled by
    :func:`compile_call`, the first the main one): the first's parameters, with the buffers
    only others take (a split-K variant's counters among the inputs, its workspace among the
    outputs) after those of their kind, each buffer as large as the largest that takes it."""
    inputs, outs = {}, {}
    for launch in kernels:
        params, outputs = launch.plan["params"], launch.plan["outputs"]
        for i, param in enumerate(params):
            group = outs if i >= len(params) - outputs else inputs
            known = group.get(param.name)
            if known is not None and known.shape != param.shape:
                if len(param.shape) != 1 or len(known.shape) != 1 or known.dtype != param.dtype:
                    raise UnsupportedKernelError(f"{launch.symbol}: its {param.name} differs "
                                                 "from the other variants'")
                if known.shape[0] > param.shape[0]:
                    continue
            group[param.name] = param
    return [*inputs.values(), *outs.values()], len(outs)


def _multiple_of_16(expr) -> bool:
    """Whether an integer expression of symbolic dims is a multiple of 16 for every value."""
    return tvm.sym.Analyzer().can_prove(tvm.tirx.floormod(expr, 16) == 0)


def _int32(value):
    """An int32 argument: a constant, or an integer expression cast at call time."""
    if isinstance(value, int):
        return tvm.tirx.IntImm("int32", value)
    return tvm.tirx.Cast("int32", value)


def _host_descriptor(T, buf, desc, meta: dict, mode: str = "r") -> list:  # noqa: N803 - T
    """Encode ``desc`` over ``buf`` (read, or with ``mode="w"`` written through it) into a
    CUtensorMap on the host's stack, as Triton's launcher does for the box and swizzle its
    compiler chose (``meta``): the launch arguments ``[descriptor, rows, columns, row
    stride, 1]``."""
    rows, cols = meta["block_size"]
    tmap = T.Bind(T.tvm_stack_alloca("tensormap", 1))
    ptr = buf.access_ptr(mode, offset=desc.offset) if _nonzero(desc.offset) else buf.data
    width = {"float16": 2, "bfloat16": 2, "float32": 4}[desc.dtype]
    # a runtime kernel's sizes are expressions of the call's dims (:mod:`.runtime`)
    T.evaluate(T.tensormap_encode_tiled(
        tmap, ptr, _int32(desc.cols), _int32(desc.rows), _int64(desc.stride * width), cols,
        rows, 1, 1, descriptor_dtype=desc.dtype, rank=2, swizzle=int(meta["swizzle"]),
        l2_promotion=2, oob_fill=0))  # L2 promotion 128 B, zeros past the ends: Triton's
    return [tmap, _int32(desc.rows), _int32(desc.cols), _int64(desc.stride), T.int64(1)]


def _nonzero(value) -> bool:
    return not isinstance(value, int) or value != 0


def _int64(value):
    """An int64 argument: a constant, or an integer expression cast at call time."""
    if isinstance(value, int):
        return tvm.tirx.IntImm("int64", value)
    return tvm.tirx.Cast("int64", value)


#: a runtime kernel's config key: the configs of smaller sizes, ``((size, config), ...)``
#: ascending, each launched where the kernel's size (the product of its runtime extents, at
#: call time) is at most ``size`` (:func:`generated_launch`)
VARIANTS = "VARIANTS"


def generated_launch(source, match, config: dict, shapes: dict, smem_limit=None,
                     dependent: bool = True,
                     launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS,
                     num_sms: int | None = None) -> Launch:
    """The launch of a generated kernel (:mod:`.triton_gen`) with the tiles of ``config``.

    ``shapes`` maps each graph tensor of ``source`` to ``(shape, dtype)``.  The PrimFunc takes the
    inputs ``I0..`` then the outputs ``O0..``; every other value is compiled into the kernel.
    ``dependent``, ``launch_dependents``, ``num_sms``: programmatic dependent launch
    (:func:`compile_call`).

    A kernel with runtime extents (:mod:`.runtime`) has a ``match`` whose ``runtime`` axes'
    extents are expressions of the symbolic dims the ``shapes`` hold: the PrimFunc takes those
    dims after its inputs, passes the extents and computes the grid from them at call time.  It
    launches one of several compiled variants, chosen at call time as Triton's JIT chooses its
    specializations:

    - by size: ``config[VARIANTS]`` holds the tiles of smaller sizes (:data:`VARIANTS`);
    - by alignment: each is compiled twice where a runtime argument that scales an address
      (a batch stride of ``seq`` elements) may be no multiple of 16, once taking it as one
      (16-byte vector loads, asynchronous copies of narrow tensors such as a boolean padding
      mask), launched where it is, and once not.

    A kernel of static shape pulls ``source.prefetch`` into L2 first
    (:func:`prefetch_inputs`).
    """
    variants = tuple(config.get(VARIANTS, ()))
    config = {k: v for k, v in config.items() if k != VARIANTS}
    last = config  # what the launch runs where no variant's condition holds
    rest = (smem_limit, dependent, launch_dependents, num_sms)
    if match.runtime:  # the largest sizes: no bound to size a split-K workspace by
        from .runtime import bounded_splits

        last = config = {**config, "SPLIT_K": 1}
        variants = bounded_splits(source, match, variants)
    if match.runtime and speculative_arguments(source):  # sizes of any alignment
        unaligned = _compiled(source, match, config, shapes, rest)
        last, _ = _without_spills(source, match, config, shapes, rest, unaligned)
    kernel, options, split = _generated_call(source, match, last, shapes, *rest)
    if source.prefetch and not match.runtime:  # a symbol of its own: the same tiles may
        # run elsewhere without, or prefetching other inputs
        kernel = (*kernel[:6], f"{kernel[6]}{prefetch_tag(source)}", *kernel[7:])
        options["prefetch"] = tuple(f"I{source.inputs.index(t)}" for t in source.prefetch)
    alternatives = _alternatives(source, match, config, variants, shapes,
                                 *rest) if match.runtime else ()
    launch = plan_launch(*kernel, alternatives=alternatives, **options)
    if split or any(p.name == "CNT" for _, k in alternatives for p in k.plan["params"]):
        launch.func = launch.func.with_attr(ZEROED_INPUTS, 1)
    return launch


def prefetch_tag(source) -> str:
    """The suffix of a kernel that prefetches ``source.prefetch``: the inputs' positions."""
    if not source.prefetch:
        return ""
    return "_pf" + "_".join(str(source.inputs.index(t)) for t in source.prefetch)


def _alternatives(source, match, config, variants, shapes, *rest) -> tuple:
    """A runtime kernel's variants (:func:`generated_launch`): ``(condition, Launch)``, the
    first whose condition holds launched, compiled side by side (Triton's compiler leaves the
    interpreter while it works; its own asynchronous mode runs compiles on an executor the
    same way).  A variant that fails to compile is left out."""
    from .runtime import kernel_size
    from .triton_gen import load

    speculative = speculative_arguments(source)
    aligned = tvm.tirx.const(True, "bool")
    for name in speculative:
        aligned = tvm.tirx.And(aligned, tvm.tirx.floormod(source.arguments[name], 16) == 0)
    size = kernel_size(match.frame.extents, match.runtime)
    jobs = []  # (condition, config, aligned arguments, bound), the first that holds launched
    for bound, other in variants:
        fits = size <= bound
        if speculative:
            jobs.append((tvm.tirx.And(fits, aligned), other, speculative, bound))
        jobs.append((fits, other, (), bound))
    if speculative:
        jobs.append((aligned, config, speculative, None))
    for _, other, _, _ in jobs:  # each form of the text loaded here, once, not in the threads
        load(source, other)

    keys = [(repr(sorted(other.items())), given) for _, other, given, _ in jobs]
    unique = dict(zip(keys, jobs))  # equal configs compiled once
    bounds = {}  # ... a split's workspace sized at the largest bound of them
    for key, (_, _, _, bound) in zip(keys, jobs):
        if bound is not None:
            bounds[key] = max(bound, bounds.get(key, bound))
    with concurrent.futures.ThreadPoolExecutor(compile_workers(len(unique))) as pool:
        futures = {key: pool.submit(_compiled, source, match, other, shapes, rest, given,
                                    bounds.get(key))
                   for key, (_, other, given, _) in unique.items()}
        alternatives = []
        for key, (condition, other, given, _) in zip(keys, jobs):
            try:
                found = futures[key].result()
                if speculative and not given:  # the tiles of aligned sizes, at any size
                    _, found = _without_spills(source, match, other, shapes, rest, found,
                                               bounds.get(key))
                alternatives.append((condition, found))
            except Exception as err:  # noqa: BLE001 - any failure: that variant is left out
                # a kernel that failed to compile: the next variant serves its sizes, slower
                logger.warning("%s: variant %s left out: %s: %s", source.name, _tag(other),
                               type(err).__name__,
                               str(err).splitlines()[0] if str(err) else "")
                logger.debug("%s", err)
    return tuple(alternatives)


def _compiled(source, match, config, shapes, rest, aligned=(), bound=None) -> Launch:
    """``source`` compiled with ``config`` (:func:`compile_call`); ``rest``: the shared-memory
    limit, ``dependent``, ``launch_dependents`` and ``num_sms`` of :func:`generated_launch`,
    ``aligned`` the runtime arguments taken as multiples of 16, ``bound`` the largest size a runtime
    kernel's variant runs (its split-K workspace sized there). Where the kernel needs more
    shared memory than a block has, with fewer pipeline stages, as the pass builds its main
    kernel (:func:`with_fewer_stages`)."""

    def build(config):
        kernel, options, _ = _generated_call(source, match, config, shapes, *rest, aligned,
                                             bound=bound)
        return compile_call(*kernel, **options)

    return with_fewer_stages(build, config)[0]


def with_fewer_stages(build, config: dict) -> tuple:
    """``(build(config), config)``, with fewer pipeline stages in ``config`` while the kernel
    needs more shared memory than a block has (:class:`SharedMemoryError`: the search timed a
    template that needed less); the error of one stage where even that does not fit."""
    while True:
        try:
            return build(config), config
        except SharedMemoryError as err:
            stages = config.get("num_stages", 3)
            if stages <= 1:
                raise
            logger.info("%s; trying %d pipeline stages", err, stages - 1)
            config = {**config, "num_stages": stages - 1}


def _without_spills(source, match, config, shapes, rest, launch, bound=None):
    """``(config, launch)``: ``launch`` (``source`` compiled with ``config`` for sizes of any
    alignment, :func:`_compiled`), or, where ``ptxas`` reports it spilling registers, the
    first of ``config``'s smaller tiles (:func:`smaller_tiles`) the kernel takes that compiles
    without.

    A variant for sizes no multiple of 16 loads what an aligned one loads in 16-byte pieces
    element by element, each with its own address: a per-logit mask tile of 64 x 128 took
    255 registers and spilled 952 bytes (8 warps; 188 and none aligned), and GPT-2's
    attention ran 12x slower at 333 tokens than at 320 on the H200.  The tiles were chosen
    for the aligned form; the unaligned one gets tiles it holds in registers."""
    from .ptx import spill_bytes

    spilled = spill_bytes(launch.ptx)
    if not spilled:
        return config, launch
    for other in smaller_tiles(config):
        try:
            smaller = _compiled(source, match, other, shapes, rest, bound=bound)
        except Exception:  # noqa: BLE001 - any: the next smaller tiles
            continue
        if spill_bytes(smaller.ptx) == 0:
            logger.info("%s: unaligned variant %s spills %d bytes: %s taken", source.name,
                        _tag(config), spilled, _tag(other))
            return other, smaller
    logger.info("%s: unaligned variant %s spills %d bytes (no smaller tiles without)",
                source.name, _tag(config), spilled)
    return config, launch


def smaller_tiles(config) -> list[dict]:
    """``config`` with its column tile (``BLOCK_N``) halved, then its row tile (``BLOCK_M``),
    down to 16 (the smallest a product takes), the largest first; one the kernel cannot take
    fails to compile (:func:`_without_spills` goes on to the next)."""
    out, current = [], dict(config)
    for key in ("BLOCK_N", "BLOCK_M"):
        while current.get(key, 0) > 16:
            current = {**current, key: current[key] // 2}
            out.append(current)
    return out


def speculative_arguments(source) -> tuple:
    """The runtime arguments of ``source`` (:mod:`.runtime`) that scale an address (a factor of
    a product on a line of its text that reads a pointer argument, ``I<i>`` or ``O<i>``) and
    are not multiples of 16 for every size: those a variant compiled to take them as
    multiples of 16 vectorizes. A count of tiles (the warp-specialized attention's, batch
    times query blocks) is no address: taken for one, the aligned variant asked for batches
    that are multiples of 16 too (BERT-base at 8 × 512 ran the unaligned one: its attention
    2× the static build's)."""
    lines = [x for x in (source.text + "\n" + (source.ws or "")).splitlines()
             if re.search(r"\b[IO]\d+\b", x)]
    names = []
    for name, expr in sorted(source.arguments.items()):
        if _multiple_of_16(expr):
            continue
        if any(re.search(rf"\*\s*{name}\b|\b{name}\s*\*", x) for x in lines):
            names.append(name)
    return tuple(names)


def _generated_call(source, match, config, shapes, smem_limit, dependent, launch_dependents,
                    num_sms=None, aligned=(), bound=None):
    """:func:`compile_call`'s positional and keyword arguments for ``source`` with ``config``
    (``aligned``: runtime arguments taken as multiples of 16, under a symbol of its own), and
    the split-K buffers it launches with (a runtime kernel's sized at ``bound``, the largest
    size its variant runs)."""
    from .kernel_text import launch_buffers, launch_constexprs
    from .triton_gen import load

    fn = load(source, config)
    constexprs = launch_constexprs(source, match, config, fn.arg_names)
    params = [
        Param(f"I{i}", tuple(shapes[t][0]), shapes[t][1]) for i, t in enumerate(source.inputs)
    ]
    # a split-K launch's counters are an input that must hold zeros (the pass gives a zero
    # constant, which the kernel leaves zero); its workspace is one more output
    sized = match
    if match.runtime and constexprs.get("SPLIT_K", 1) > 1:
        from .runtime import at_bound

        sized = at_bound(match, bound) if bound is not None else None
        if sized is None:
            raise UnsupportedKernelError(f"{source.name}: a split of k with sizes known at run "
                                         "time needs a variant's bound")
    split = launch_buffers(source, sized, constexprs)
    if split:
        params.append(Param("CNT", (split["CNT"][0],), split["CNT"][1]))
    params += [
        Param(f"O{i}", tuple(shapes[t][0]), shapes[t][1]) for i, t in enumerate(source.outputs)
    ]
    if split:
        params.append(Param("WS", (split["WS"][0],), split["WS"][1]))
    symbol = f"{source.name}_{_tag({**constexprs, **_launch(config), 'WS': config.get('WS')})}"
    symbol += "_a16" if aligned else ""
    # TMA descriptors over parameters: the warp-specialized attention's Q, K and V, or the
    # kernel's own (a persistent GEMM's A and B, and its outputs for TMA_STORE)
    names = {t: f"I{i}" for i, t in enumerate(source.inputs)}
    names.update({t: f"O{i}" for i, t in enumerate(source.outputs)})
    descriptors = {d.name: (d, names[d.tensor]) for d in source.descriptors(config)}
    args = {p.name: p.name for p in params}
    scalars = ()
    if match.runtime:
        from .runtime import dims_of

        scalars = tuple(dims_of(p.shape for p in params))
        args.update(source.arguments)
    grid = source.grid({**constexprs, "WS": config.get("WS")}, match)
    positional = (fn, params, args, constexprs, grid, launch_options(source, config), symbol)
    keywords = {"outputs": len(source.outputs) + bool(split), "smem_limit": smem_limit,
                "descriptors": descriptors, "dependent": dependent,
                "launch_dependents": launch_dependents, "num_sms": num_sms, "scalars": scalars,
                "aligned": tuple(aligned)}
    return positional, keywords, split


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _launch(config: dict) -> dict:
    return {"num_warps": config.get("num_warps", 4), "num_stages": config.get("num_stages", 3)}


def launch_options(source, config: dict) -> dict:
    """Triton's compile options of ``source`` launched with ``config``: warps and pipeline
    stages, or for a warp-specialized form (``WS``) its 4 warps per partition and the register
    limit its partitions divide (the ring's slots are its constexpr ``NB``)."""
    if config.get("WS"):
        from tvm_stitch.families import family  # the registry: data only

        if not family(source.family).has("gluon"):
            raise UnsupportedKernelError(f"{source.name} has no warp-specialized form")
        return family(source.family).module("gluon").ws_launch_options(config)
    return _launch(config)


def _tag(config: dict) -> str:
    tiles = "x".join(str(config[k]) for k in sorted(config) if k.startswith("BLOCK_"))
    persistent = "p" if config.get("PERSISTENT") else ""
    persistent += "d" if config.get("TMA_STORE") else ""  # stores through descriptors
    ws = config.get("WS")
    tma = (f"ws{'' if ws is True else int(ws)}" if ws else "t" if config.get("TMA") else "")
    tma += f"e{config['EW']}" if ws and config.get("EW") else ""  # an epilogue partition
    tma += "g" if ws and config.get("EW") and config.get("PTR_STORE") else ""  # by pointers
    split = f"k{config['SPLIT_K']}" if config.get("SPLIT_K", 1) > 1 else ""
    return (f"{tiles}_w{config.get('num_warps', 4)}s{config.get('num_stages', 3)}"
            f"{persistent}{tma}{split}")
