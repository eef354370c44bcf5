"""BERT-base's GEMMs at a batch of one chained in one persistent kernel with grid-wide barriers
(SOUFFLE's one-wave kernels) against the same GEMMs launched one kernel each (issue 49 item 4).

    python benchmarks/studies/grid_chain.py [--layers 12] [--tokens 128] [--rounds 5] [--ptx]

Each layer runs its four GEMMs: Q/K/V (768 -> 2304), the out-projection (the first 768 columns
of Q/K/V -> 768, + residual), FFN-in (768 -> 3072, + GELU) and FFN-out (3072 -> 768, +
residual); attention and the LayerNorms are left out, so the chain is 48 dependent GEMMs. Every
form computes each output tile with the same Triton code (``_tile``); the forms differ only in
how the tiles of one GEMM wait for the previous GEMM:

- ``kernels``: one launch per GEMM, a program per tile, in a CUDA graph;
- ``kernels+pdl``: the same launched dependently (each program releases the next launch at its
  start and waits with ``griddepcontrol.wait``), with its weights prefetched into L2 before the
  wait, as the pipeline launches its GEMMs at this size (``launch_dependents="auto"``,
  ``prefetch_weights``);
- ``chained sync S``: one cooperative launch of one program per SM that walks the 48 GEMMs'
  tiles and meets the other programs at a grid-wide barrier after each GEMM (the barrier forms
  of :func:`_grid_sync`; ``-1``: none, for the work alone), the next GEMM's weights prefetched
  before the barrier.

The ``(empty)`` rows time the same forms with no tiles: what a launch, a dependent launch and
a barrier cost alone. All forms are timed in turns (CUDA-graph replays,
:func:`~tvm_stitch.benchmarks.harness.in_turns`), and their outputs are checked against each
other and against PyTorch in float32. ``--ptx`` only compiles the chained kernel for sm_90a (no
GPU needed).
"""

from __future__ import annotations

import argparse

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

#: tiles (rows, columns, k) of every GEMM; 2 x 36 tiles for Q/K/V, 2 x 24 for the 768-wide ones
BM, BK = tl.constexpr(64), tl.constexpr(128)


@triton.jit
def _prefetch(w_ptr, tile, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr):
    """Pull the ``K x BN`` slice of row-major weights that ``tile`` reads into L2, a 128-byte
    line per lane (``prefetch.global.L2``)."""
    LINE: tl.constexpr = 64  # float16 elements in a 128-byte line
    tiles_n: tl.constexpr = N // BN
    LINES: tl.constexpr = BN // LINE if BN >= LINE else 1
    cols = (tile % tiles_n) * BN + tl.arange(0, LINES) * LINE
    for r0 in range(0, K, 128):
        rows = r0 + tl.arange(0, 128)
        ptrs = w_ptr + rows[:, None] * N + cols[None, :]
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
        )


@triton.jit
def _tile(
    a_ptr,
    lda,
    w_ptr,
    c_ptr,
    r_ptr,
    M,
    tile,
    N: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    EPI: tl.constexpr,
):
    """One ``BM x BN`` tile of ``c = epi(a @ w)``: EPI 0 none, 1 GELU (erf), 2 + ``r``.
    Activations are read past L1 (``.cg``): other programs wrote them."""
    tiles_n: tl.constexpr = N // BN
    rm = (tile // tiles_n) * BM + tl.arange(0, BM)
    rn = (tile % tiles_n) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(
            a_ptr + rm[:, None] * lda + (k + rk)[None, :],
            mask=rm[:, None] < M,
            other=0.0,
            cache_modifier=".cg",
        )
        w = tl.load(w_ptr + (k + rk)[:, None] * N + rn[None, :])
        acc = tl.dot(a, w, acc)
    if EPI == 1:
        acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
    if EPI == 2:
        acc += tl.load(
            r_ptr + rm[:, None] * N + rn[None, :],
            mask=rm[:, None] < M,
            other=0.0,
            cache_modifier=".cg",
        ).to(tl.float32)
    tl.store(
        c_ptr + rm[:, None] * N + rn[None, :], acc.to(c_ptr.dtype.element_ty), mask=rm[:, None] < M
    )


@triton.jit
def one_gemm(
    a_ptr,
    lda,
    w_ptr,
    c_ptr,
    r_ptr,
    M,
    N: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    EPI: tl.constexpr,
    PDL: tl.constexpr,
    EMPTY: tl.constexpr,
):
    """One GEMM, a program per tile (``kernels`` and ``kernels+pdl``)."""
    tile = tl.program_id(0)
    if PDL:
        _prefetch(w_ptr, tile, N, K, BN)
        gdc_launch_dependents()
        gdc_wait()
    if not EMPTY:
        _tile(a_ptr, lda, w_ptr, c_ptr, r_ptr, M, tile, N, K, BN, EPI)


@triton.jit
def _nap():
    """Back off between polls (``nanosleep``): fewer loads on the polled line."""
    tl.inline_asm_elementwise("nanosleep.u32 20;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _grid_sync(bar, flags, pid, nprog, phase, SYNC: tl.constexpr):
    """Wait until all ``nprog`` programs have arrived here for the ``phase``-th time (counting
    from 1; the caller zeroes ``bar`` and ``flags`` before the launch). Stores before it are
    seen by every program after it.

    SYNC 0: one counter, ``red.release`` then acquire loads until it reads ``phase * nprog``;
    1: the same, polled with relaxed (volatile) loads and a back-off, one acquire fence after;
    2: a flag per program (its own 128-byte line) stored with release; program 0 reads all
    flags at once until each holds ``phase``, then stores ``phase`` to ``bar``, which the
    others poll as in 1; -1: no barrier (wrong results; the work alone, for timing)."""
    if SYNC >= 0:
        tl.debug_barrier()
    if SYNC == 0:
        tl.atomic_add(bar, 1, sem="release", scope="gpu")
        seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
        while seen < phase * nprog:
            seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    if SYNC == 1:
        tl.atomic_add(bar, 1, sem="release", scope="gpu")
        seen = tl.load(bar, volatile=True)
        while seen < phase * nprog:
            _nap()
            seen = tl.load(bar, volatile=True)
        tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    if SYNC == 2:
        tl.atomic_xchg(flags + pid * 32, phase, sem="release", scope="gpu")
        if pid == 0:
            lanes = tl.arange(0, 256)
            waiting = 1
            while waiting > 0:  # a reduction in the loop's condition crashes Triton 3.6
                mine = tl.load(flags + lanes * 32, mask=lanes < nprog, other=phase, volatile=True)
                waiting = tl.sum((mine < phase).to(tl.int32), axis=0)
            tl.atomic_xchg(bar, phase, sem="acq_rel", scope="gpu")
        else:
            seen = tl.load(bar, volatile=True)
            while seen < phase:
                _nap()
                seen = tl.load(bar, volatile=True)
            tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
    if SYNC >= 0:
        tl.debug_barrier()


@triton.jit
def _phase(
    a_ptr,
    lda,
    w_ptr,
    c_ptr,
    r_ptr,
    M,
    pid,
    nprog,
    N: tl.constexpr,
    K: tl.constexpr,
    BN: tl.constexpr,
    EPI: tl.constexpr,
    EMPTY: tl.constexpr,
):
    """Program ``pid`` of ``nprog`` computes its share of one GEMM's tiles."""
    if not EMPTY:
        tiles = tl.cdiv(M, BM) * (N // BN)
        for tile in range(pid, tiles, nprog):
            _tile(a_ptr, lda, w_ptr, c_ptr, r_ptr, M, tile, N, K, BN, EPI)


@triton.jit
def chained(
    xs,
    wqkv,
    wo,
    wi,
    wf,
    qkv,
    y,
    h,
    bar,
    flags,
    M,
    nprog,
    LAYERS: tl.constexpr,
    D: tl.constexpr,
    F: tl.constexpr,
    BN_QKV: tl.constexpr,
    BN_D: tl.constexpr,
    BN_F: tl.constexpr,
    EMPTY: tl.constexpr,
    SYNC: tl.constexpr,
):
    """Every layer's four GEMMs in one launch of ``nprog`` co-resident programs; activations of
    layer ``l`` at ``xs[l]``, ``qkv[l]``, ``y[l]``, ``h[l]`` (none is written twice)."""
    pid = tl.program_id(0)
    _prefetch(wqkv, pid, 3 * D, D, BN_QKV)
    for layer in range(LAYERS):
        x = xs + layer * M * D
        q = qkv + layer * M * 3 * D
        yl = y + layer * M * D
        hl = h + layer * M * F
        _phase(x, D, wqkv + layer * D * 3 * D, q, x, M, pid, nprog, 3 * D, D, BN_QKV, 0, EMPTY)
        _prefetch(wo + layer * D * D, pid, D, D, BN_D)
        _grid_sync(bar, flags, pid, nprog, 4 * layer + 1, SYNC)
        _phase(q, 3 * D, wo + layer * D * D, yl, x, M, pid, nprog, D, D, BN_D, 2, EMPTY)
        _prefetch(wi + layer * D * F, pid, F, D, BN_F)
        _grid_sync(bar, flags, pid, nprog, 4 * layer + 2, SYNC)
        _phase(yl, D, wi + layer * D * F, hl, yl, M, pid, nprog, F, D, BN_F, 1, EMPTY)
        _prefetch(wf + layer * F * D, pid, D, F, BN_D)
        _grid_sync(bar, flags, pid, nprog, 4 * layer + 3, SYNC)
        _phase(
            hl,
            F,
            wf + layer * F * D,
            xs + (layer + 1) * M * D,
            yl,
            M,
            pid,
            nprog,
            D,
            F,
            BN_D,
            2,
            EMPTY,
        )
        if layer + 1 < LAYERS:
            _prefetch(wqkv + (layer + 1) * D * 3 * D, pid, 3 * D, D, BN_QKV)
        _grid_sync(bar, flags, pid, nprog, 4 * layer + 4, SYNC)


#: the barriers timed (``_grid_sync``'s SYNC); -1 times the chained work without barriers
SYNCS = (0, 1, 2, -1)

#: columns of a tile for each GEMM's width (Q/K/V 2304, FFN-in 3072, the others 768)
BN = {"qkv": 64, "d": 32, "f": 128}
WARPS, STAGES = 4, 3


def ptx(layers: int = 12, sync: int = 0) -> str:
    """The chained kernel compiled for sm_90a (no GPU needed)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {n: "*fp16" for n in ("xs", "wqkv", "wo", "wi", "wf", "qkv", "y", "h")}
    sig.update(bar="*i32", flags="*i32", M="i32", nprog="i32")
    consts = dict(
        LAYERS=layers,
        D=768,
        F=3072,
        BN_QKV=BN["qkv"],
        BN_D=BN["d"],
        BN_F=BN["f"],
        EMPTY=False,
        SYNC=sync,
    )
    # as the launch specializes them: 16-byte aligned pointers, M a multiple of 16
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(11)}
    src = ASTSource(
        chained, {**sig, **dict.fromkeys(consts, "constexpr")}, constexprs=consts, attrs=attrs
    )
    out = triton.compile(
        src, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS, "num_stages": STAGES}
    )
    return out.asm["ptx"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--ptx", action="store_true", help="compile the chained kernel only")
    args = parser.parse_args(argv)
    if args.ptx:
        for sync in SYNCS:
            text = ptx(args.layers, sync)
            print(
                f"chained kernel, sync {sync}: {len(text.splitlines())} lines of PTX, "
                f"{text.count('.release')} release stores, "
                f"{text.count('nanosleep')} back-offs, "
                f"{text.count('prefetch.global.L2')} prefetches, "
                f"{text.count('cp.async.cg')} pipelined loads, "
                f"{text.count('wgmma.mma_async')} wgmma"
            )
        return 0

    import torch
    from tvm_stitch.benchmarks.harness import in_turns

    from tvm_stitch.errors import error_line
    from tvm_stitch.tune.measure import torch_timer

    torch.manual_seed(0)
    L, M, D, F = args.layers, args.tokens, 768, 3072
    dev, f16 = "cuda", torch.float16
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def weights(k, n):
        return (torch.randn(L, k, n, device=dev) / k**0.5).to(f16)

    wqkv, wo, wi, wf = weights(D, 3 * D), weights(D, D), weights(D, F), weights(F, D)
    x0 = torch.randn(M, D, device=dev).to(f16)

    def buffers():
        xs = torch.empty(L + 1, M, D, device=dev, dtype=f16)
        xs[0] = x0
        return (
            xs,
            torch.empty(L, M, 3 * D, device=dev, dtype=f16),
            torch.empty(L, M, D, device=dev, dtype=f16),
            torch.empty(L, M, F, device=dev, dtype=f16),
        )

    def launches(pdl, empty, bufs):
        xs, qkv, y, h = bufs
        opts = {"num_warps": WARPS, "num_stages": STAGES}
        if pdl:
            opts["launch_pdl"] = True

        def gemm(a, lda, w, c, r, n, k, bn, epi):
            grid = (triton.cdiv(M, BM) * (n // bn),)
            one_gemm[grid](a, lda, w, c, r, M, n, k, bn, epi, pdl, empty, **opts)

        def run():
            for l in range(L):
                gemm(xs[l], D, wqkv[l], qkv[l], xs[l], 3 * D, D, BN["qkv"], 0)
                gemm(qkv[l], 3 * D, wo[l], y[l], xs[l], D, D, BN["d"], 2)
                gemm(y[l], D, wi[l], h[l], y[l], F, D, BN["f"], 1)
                gemm(h[l], F, wf[l], xs[l + 1], y[l], D, F, BN["d"], 2)
            return xs[L]

        return run

    def one_launch(empty, sync, bufs):
        xs, qkv, y, h = bufs
        bar = torch.zeros(1, device=dev, dtype=torch.int32)
        flags = torch.zeros(sms * 32, device=dev, dtype=torch.int32)
        consts = (L, D, F, BN["qkv"], BN["d"], BN["f"], empty, sync)
        args = (xs, wqkv, wo, wi, wf, qkv, y, h, bar, flags, M, sms, *consts)

        def run():
            bar.zero_()
            flags.zero_()
            chained[(sms,)](*args, num_warps=WARPS, num_stages=STAGES, launch_cooperative_grid=True)
            return xs[L]

        return run

    forms = {}
    for empty in (False, True):
        tag = " (empty)" if empty else ""
        forms["kernels" + tag] = launches(False, empty, buffers())
        forms["kernels+pdl" + tag] = launches(True, empty, buffers())
        for sync in SYNCS:
            forms[f"chained sync {sync}" + tag] = one_launch(empty, sync, buffers())

    # numerics: every form against PyTorch in float32
    with torch.no_grad():
        ref = x0.float()
        for l in range(L):
            q = ref @ wqkv[l].float()
            yy = q[:, :D] @ wo[l].float() + ref
            hh = torch.nn.functional.gelu(yy @ wi[l].float())
            ref = hh @ wf[l].float() + yy
    scale = ref.abs().max().item()
    outs = {}
    for name, fn in list(forms.items()):
        try:
            out = fn().float()
        except Exception as err:  # noqa: BLE001 - a form Triton cannot compile is reported
            print(f"{name}: failed ({error_line(err)})", flush=True)
            forms.pop(name)
            continue
        if "empty" in name:
            continue
        outs[name] = out
        torch.cuda.synchronize()
        err = (outs[name] - ref).abs().max().item() / scale
        same = torch.equal(outs[name], outs["kernels"])
        print(
            f"{name:24s} max error / max |float32| {err:.2e}; equal to 'kernels' bit for bit: "
            f"{same}" + (" (no barrier: wrong by design)" if name.endswith("-1") else ""),
            flush=True,
        )

    timers = {}
    for name, fn in forms.items():
        try:
            timers[name] = torch_timer(fn, [], "cuda")
        except Exception as err:  # noqa: BLE001 - a form the graph cannot capture
            print(
                f"{name}: not captured in a CUDA graph ({error_line(err)}); timed between events",
                flush=True,
            )
            timers[name] = torch_timer(fn, [], "cuda", graph=False)
    medians = in_turns(list(timers.values()), args.rounds, budget_ms=40.0 * args.rounds)
    gemms = 4 * L
    print(
        f"\n{L} layers x 4 GEMMs at {M} tokens, {sms} SMs, tiles {BM.value} x {BN} x {BK.value}, "
        f"{WARPS} warps, {STAGES} stages; median of {args.rounds} rounds in turns"
    )
    print(f"{'form':24s} {'us':>9s} {'us/GEMM':>9s}")
    for name, med in zip(timers, medians):
        if isinstance(med, Exception):
            print(f"{name:24s} failed: {error_line(med)}")
            continue
        print(f"{name:24s} {med:9.1f} {med / gemms:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
