"""The Triton device functions every kernel shares — the product loops (plain, two
accumulators, TMA), split-K's partial sums, tile order, erf and paired roundings — and the
families' hand-written templates by name (:func:`kernel`; each family's ``template.py``).

A template's ``tl.constexpr`` parameters realise a candidate of the search space
(``tvm_stitch.explore.tiling``); generated kernels (:mod:`tvm_stitch.codegen.triton_gen`)
import the device functions here, so a generated kernel and its template run the same product
loop.  Functions are wrapped with ``triton.jit`` (templates on first use).  With
``TRITON_INTERPRET=1`` in the environment *when Triton is imported*, they run on the CPU with
torch tensors (CI checks their numerics that way, in a subprocess); otherwise they compile for
the GPU, and :func:`compile_ptx` compiles them ahead of time without one.
"""

from __future__ import annotations

import functools
import os

# Triton 3.9 warns that its default floating-point fusion will change; keep today's behaviour
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")

import triton
import triton.language as tl


@triton.jit
def _erf_abs(x):
    """``erf(x)`` of float32 ``x`` to 1.1e-7 absolute error (up to 2.3e-7 with the GPU's
    ``ex2.approx``, two units at 1): ``±(1 − 2**R(|x|))`` with ``R`` a degree-8 polynomial
    fitting ``log2(erfc)`` on [0, 3.92] (weighted least squares, no constant term: exact at 0)
    — one ``ex2`` and eight FMAs, branch-free, about half of libdevice's ``erff``, whose two
    branches a warp of mixed signs and sizes runs both of. Values near 0 keep their absolute,
    not relative, accuracy: for sums such as GELU's ``1 + erf``
    (:func:`tvm_stitch.analysis.elem.offset_erf`). NaN stays NaN."""
    t = tl.minimum(tl.abs(x), 3.92, propagate_nan=tl.PropagateNan.ALL)
    p = -4.535461630e-05 * t + 4.454722512e-04
    p = p * t - 1.489320071e-03
    p = p * t - 7.748364005e-04
    p = p * t + 2.825386636e-02
    p = p * t - 1.484816968e-01
    p = p * t - 9.184163809e-01
    p = p * t - 1.627908587e00
    r = 1.0 - tl.exp2(p * t)
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (r.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


def interpreting() -> bool:
    """Whether ``triton.jit`` makes interpreted functions (``TRITON_INTERPRET``, read as Triton
    reads it), which run no inline PTX."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


if interpreting():
    @triton.jit
    def _cvt_f16x2(x):
        return x.to(tl.float16)

    @triton.jit
    def _cvt_bf16x2(x):
        return x.to(tl.bfloat16)
else:
    @triton.jit
    def _cvt_f16x2(x):
        """float32 ``x`` rounded to float16 (to nearest, even), two values an instruction
        (``cvt.rn.f16x2.f32``): Triton 3.6 rounds a float32 tile one value at a time and
        ptxas joins the halves with a ``PRMT`` each — 3 instructions a pair where this is 1
        (an attention's float16 logits, every key block). Exactly ``x.to(tl.float16)``."""
        return tl.inline_asm_elementwise("cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.float16, is_pure=True, pack=2)

    @triton.jit
    def _cvt_bf16x2(x):
        """:func:`_cvt_f16x2` for bfloat16 (``cvt.rn.bf16x2.f32``, sm_80 and newer)."""
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [x],
                                         dtype=tl.bfloat16, is_pure=True, pack=2)


@triton.jit
def _tile_product(
    acc,
    A,
    B,
    rm,
    rn,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_bk,
    s_bn,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    OPERAND: tl.constexpr = None,
    K_LO=0,
    K_HI=None,
):
    """``acc + A[rm, K_LO:K_HI] @ B[K_LO:K_HI, rn]``, the reduction over ``K`` (default: all
    of it) in steps of ``BLOCK_K`` (masked at ``K``).  Shared by the GEMM-chain and GEMM
    templates; inlined by Triton.  ``OPERAND``: the type both tiles are converted to before the
    product (an operand stored in another precision, e.g. a float32 activation of a float16
    matrix product).  ``K_LO``/``K_HI``: one split of a split-K product (``K_LO`` a multiple
    of ``BLOCK_K``)."""
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(K_LO, K if K_HI is None else K_HI, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            A + rm[:, None] * s_am + kk[None, :] * s_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            B + kk[:, None] * s_bk + rn[None, :] * s_bn,
            mask=(kk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        if OPERAND is not None:
            a = a.to(OPERAND)
            b = b.to(OPERAND)
        acc += tl.dot(a, b, input_precision=DOT_PREC)
    return acc


@triton.jit
def _tile_product2(
    acc0,
    acc1,
    A,
    B0,
    B1,
    rm,
    rn,
    M,
    N,
    K,
    s_am,
    s_ak,
    s_b0k,
    s_b0n,
    s_b1k,
    s_b1n,
    BLOCK_K: tl.constexpr,
    DOT_PREC: tl.constexpr,
    OPERAND: tl.constexpr = None,
    K_LO=0,
    K_HI=None,
):
    """``(acc0 + A @ B0, acc1 + A @ B1)`` over the same rows and columns, each ``A`` tile loaded
    once for both products (a gate and an up projection); ``OPERAND``, ``K_LO`` and ``K_HI``
    as for _tile_product."""
    rk = tl.arange(0, BLOCK_K)
    for k0 in range(K_LO, K if K_HI is None else K_HI, BLOCK_K):
        kk = k0 + rk
        a = tl.load(
            A + rm[:, None] * s_am + kk[None, :] * s_ak,
            mask=(rm[:, None] < M) & (kk[None, :] < K),
            other=0.0,
        )
        mask_b = (kk[:, None] < K) & (rn[None, :] < N)
        b0 = tl.load(B0 + kk[:, None] * s_b0k + rn[None, :] * s_b0n, mask=mask_b, other=0.0)
        b1 = tl.load(B1 + kk[:, None] * s_b1k + rn[None, :] * s_b1n, mask=mask_b, other=0.0)
        if OPERAND is not None:
            a = a.to(OPERAND)
            b0 = b0.to(OPERAND)
            b1 = b1.to(OPERAND)
        acc0 += tl.dot(a, b0, input_precision=DOT_PREC)
        acc1 += tl.dot(a, b1, input_precision=DOT_PREC)
    return acc0, acc1


@triton.jit
def _tile_product_tma(
    acc,
    a_desc,
    b_desc,
    off_m,
    off_n,
    K,
    BLOCK_K: tl.constexpr,
    B_NK: tl.constexpr,
    OPERAND: tl.constexpr = None,
    DOT_PREC: tl.constexpr = None,
):
    """``acc + A[off_m:+BM, :K] @ B[:K, off_n:+BN]`` with both tiles brought in by TMA (tensor
    descriptors; out-of-bounds elements read as zero, so no masks).  ``B_NK``: B's descriptor
    is over (N, K) (a Linear weight) and its tiles are transposed in the product, else over
    (K, N).  ``OPERAND`` as for :func:`_tile_product`; ``DOT_PREC``: float32 products'
    precision (``ieee``: as PyTorch multiplies them)."""
    for k0 in range(0, K, BLOCK_K):
        a = a_desc.load([off_m, k0])
        if B_NK:
            b = b_desc.load([off_n, k0]).T
        else:
            b = b_desc.load([k0, off_n])
        if OPERAND is not None:
            a = a.to(OPERAND)
            b = b.to(OPERAND)
        if DOT_PREC is None:  # Triton's default (a string default fails in Triton 3.6)
            acc = tl.dot(a, b, acc)
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def _split_arrive(counter, SPLIT_K: tl.constexpr):
    """Count one split of a split-K tile in: True for the last of its ``SPLIT_K`` splits to
    arrive, which also sets the counter back to zero for the next launch.  The barrier puts
    every thread's partial-tile stores before the count, whose release (gpu scope) publishes
    them to the last split; its acquire and the broadcast of the count order that split's
    reads after them (CUTLASS's semaphore protocol)."""
    tl.debug_barrier()
    last = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1
    if last:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
    return last


@triton.jit
def _split_sum(ws, stride, rw, SPLIT_K: tl.constexpr):
    """The sum of a tile's ``SPLIT_K`` float32 partials (``ws + j * stride + rw``), in split
    order whatever order they arrived in: a split-K product is deterministic.  Read from L2
    (``.cg``): other SMs wrote them."""
    acc = tl.load(ws + rw, cache_modifier=".cg")
    for j in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws + j * stride + rw, cache_modifier=".cg")
    return acc


@triton.jit
def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Row and column tile of output tile number ``tile``: consecutive tiles walk ``GROUP_M``
    row tiles of one column band, so the B tiles they share are still in L2."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    group_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % group_m, (tile % per_group) // group_m


@functools.cache
def kernel(name: str):
    """The hand-written template of family ``name`` (its ``template.TEMPLATE``), jitted
    (interpreted when ``TRITON_INTERPRET=1``)."""
    from tvm_stitch.families import part  # the registry: data only

    return triton.jit(part(name, "template").TEMPLATE)


# -- legality: which candidates the templates express ----------------------------------------------
def powers_of_two(cand) -> str | None:
    """Why ``cand``'s tiles cannot be Triton blocks (``tl.arange`` needs powers of two), or None."""
    odd = {x: t for x, t in cand.tile_dict.items() if t & (t - 1)}
    if odd:
        return f"tile sizes {odd} are not powers of two (Triton's tl.arange needs them)"
    return None


#: rows of one Hopper warpgroup's matrix instruction (wgmma): a GEMM tile of fewer rows leaves
#: the warpgroup's instruction unusable (Triton falls back to Ampere's mma)
WARPGROUP_ROWS = 64


def num_warps(block_m: int, block_n: int) -> int:
    """Warps per program: 8 for tiles of 128x128 elements or more, else 4."""
    return 8 if block_m * block_n >= 128 * 128 else 4


def precision(dtype) -> dict:
    """The templates' ``DOT_PREC``: float32 products stay IEEE float32 (Triton's default is
    TF32, ~1e-3 relative error); other dtypes keep the default."""
    return {"DOT_PREC": "ieee"} if "32" in str(dtype) else {}


def _tma_allocator():
    """Give Triton the scratch memory its on-device TMA descriptors need (torch tensors)."""
    import torch

    triton.set_allocator(
        lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda")
    )


def compile_ptx(
    name: str, signature: dict, constexprs: dict, arch: int = 90, options: dict | None = None
) -> str:
    """Compile kernel ``name`` ahead of time for ``sm_<arch>`` (no GPU needed); return its PTX.

    Parameters
    ----------
    signature : dict
        Argument name to Triton type (``"*fp16"``, ``"i32"``, ``"fp32"``) for every non-constexpr
        argument.
    constexprs : dict
        Values of the ``tl.constexpr`` arguments.
    options : dict, optional
        Triton compile options (``num_warps``, ``num_stages``, ...).
    """
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = kernel(name)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}
    constexprs = {**defaults, "DOT_PREC": "tf32", **constexprs}
    src = ASTSource(
        fn, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs=constexprs
    )
    target = GPUTarget("cuda", arch, 32)
    return triton.compile(src, target=target, options=options or {}).asm["ptx"]
