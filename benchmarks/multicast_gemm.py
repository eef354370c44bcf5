"""Two-CTA clusters with TMA multicast for the warp-specialized 192 x 128 GEMM: a study (issue 11).

    python -m tvm_stitch.benchmarks.multicast_gemm [--out build/multicast_gemm]  # Triton 3.9
    python benchmarks/multicast_gemm_run.py build/multicast_gemm [--rounds 5]    # the GPU host

cuBLAS runs BERT's 768-column GEMMs as ``nvjet_sm90_hsh_192x128_64x5_1x2``: 192 x 128 tiles in
clusters of two CTAs side by side along N whose TMA loads **multicast** A, the operand both
read. Our generated form (:mod:`tvm_stitch.codegen.gluon_gemm`: three 64-row consumer
warpgroups and a loading warp) has the tile, not the cluster, and Nsight Compute gave it ~1.7x
cuBLAS's L2 traffic on the out-projection (session 34). Triton 3.6, on the GPU host, has no
multicast; Triton 3.9, on the CPU machine, does (Gluon's CTA layouts). So the kernels are
compiled there, to cubin (and PTX), and :mod:`multicast_gemm_run` launches them on the GPU host
through the CUDA driver, beside ``torch.matmul``.

The kernel (``gemm_mc``) is the generated form's product, ``C = A · Wᵀ`` (W stored (N, K) as
nn.Linear keeps it), in these variants (:data:`VARIANTS`):

* ``MC = 1``: no cluster, the control (the generated form's ring, tile and consumers);
* ``MC = 2``: a program is a cluster of two CTAs computing a 192 x 256 tile, 128 columns each.
  A's ring slots are **broadcast** (CTA layout ``[[0, 0]]``), W's and the output **split**
  along N. Gluon has the lead CTA's loading warp issue every piece of a broadcast tile, for
  both; a slot is refilled once both CTAs' consumers released it (a pair barrier of the
  lead's, ``two_ctas=True``, counts the other CTA's);
* ``BAL`` (PTX patched by :func:`balance`): each CTA issues half of A's pieces, as cuBLAS's
  kernels do, and each CTA's ``empty`` barrier counts both CTAs' consumers (remote arrivals);
* ``RES``: ``C = A · Wᵀ + R``, the residual held in registers from before the products
  (``1``) or brought by the loading warp's TMA into the output's staging tiles once the ring
  is full (``2``; the generated form's :func:`~tvm_stitch.codegen.gluon_gemm.tile_read`) or
  ring-depth k steps before the tile's last (``3``).

Found (H100, 2026-11-27, ``h100-multicast-2026-11-27.md``): no multicast variant is faster than
the control, which is at 0.95-1.01x cuBLAS on the product alone.
"""
import re

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .gluon_gemm import _tile_of  # the generated form's tile order (GROUP_M rows a group)


@gluon.jit
def _load(a_desc, w_desc, a_smem, w_smem, ready, empty, empty_a, r_desc, c_smem, r_ready,
          r_empty, M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
          NB: gl.constexpr, MC: gl.constexpr, SEP: gl.constexpr, RES: gl.constexpr):
    # the loading warp; A's pieces are a_desc's boxes (64 rows, or 32 for BAL's six pieces)
    ROWS: gl.constexpr = a_desc.block_shape[0]
    PIECES: gl.constexpr = 64 // ROWS
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN * MC)
    k_steps = gl.cdiv(K, BK)
    g = 0
    j = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, 8)
        for kk in range(k_steps):
            if RES >= 2:
                # the residual tiles into the output's staging tiles, once the ring is full
                # (RES 3: NB steps before the tile's last; each staging tile free once its
                # consumer's last store has read it)
                if kk == (gl.minimum(NB, k_steps) - 1 if RES == 2
                          else gl.maximum(k_steps - NB, 0)):
                    for ci in gl.static_range(3):
                        mbarrier.wait(r_empty.index(ci), (j & 1) ^ 1)
                        mbarrier.expect(r_ready.index(ci), r_desc.block_type.nbytes)
                        tma.async_load(r_desc, [pid_m * BM + ci * 64, pid_n * BN * MC],
                                       r_ready.index(ci), c_smem.index(ci))
            slot = g % NB
            ph = ((g // NB) & 1) ^ 1
            mbarrier.wait(empty.index(slot), ph)
            if SEP:
                mbarrier.wait(empty_a.index(slot), ph)
            mbarrier.expect(ready.index(slot),
                            3 * PIECES * a_desc.nbytes_per_cta + w_desc.nbytes_per_cta)
            for p in gl.static_range(3):
                for h in gl.static_range(PIECES):
                    tma.async_load(a_desc, [pid_m * BM + p * 64 + h * ROWS, kk * BK],
                                   ready.index(slot),
                                   a_smem.index(slot * 3 + p).slice(h * ROWS, ROWS),
                                   multicast=MC > 1)
            tma.async_load(w_desc, [pid_n * BN * MC, kk * BK], ready.index(slot),
                           w_smem.index(slot))
            g += 1
        j += 1


@gluon.jit
def _consume(a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty,
             M, N, K, CI: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
             NB: gl.constexpr, MC: gl.constexpr, SEP: gl.constexpr, RES: gl.constexpr):
    CGA: gl.constexpr = [[0, 1]] if MC > 1 else []
    acc_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, BN, 16], cga_layout=CGA)
    tiles_m = gl.cdiv(M, BM)
    tiles_n = gl.cdiv(N, BN * MC)
    k_steps = gl.cdiv(K, BK)
    j = 0
    for t in range(gl.program_id(0), tiles_m * tiles_n, gl.num_programs(0)):
        pid_m, pid_n = _tile_of(t, tiles_m, tiles_n, 8)
        g = j * k_steps
        if RES == 1:  # the residual in registers, loaded before the products (the codegen's)
            rm = pid_m * BM + CI * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, acc_l))
            rn = pid_n * BN * MC + gl.arange(0, BN * MC, layout=gl.SliceLayout(0, acc_l))
            r = gl.load(res + rm[:, None] * N + rn[None, :],
                        mask=(rm < M)[:, None] & (rn < N)[None, :], other=0.0)
        acc = gl.zeros([64, BN * MC], gl.float32, acc_l)
        for kk in range(k_steps):
            slot = (g + kk) % NB
            mbarrier.wait(ready.index(slot), ((g + kk) // NB) & 1)
            acc = warpgroup_mma(a_smem.index(slot * 3 + CI),
                                w_smem.index(slot).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(1, deps=(acc, ))
            if kk > 0:
                mbarrier.arrive(empty.index((g + kk - 1) % NB))
                if SEP:
                    mbarrier.arrive(empty_a.index((g + kk - 1) % NB))
        acc = warpgroup_mma_wait(0, deps=(acc, ))
        mbarrier.arrive(empty.index((g + k_steps - 1) % NB))
        if SEP:
            mbarrier.arrive(empty_a.index((g + k_steps - 1) % NB))
        if RES == 1:
            acc = acc + r.to(gl.float32)
        if RES >= 2:  # the residual the loading warp left in this consumer's staging tile
            mbarrier.wait(r_ready.index(CI), j & 1)
            acc = acc + c_smem.index(CI).load(acc_l).to(gl.float32)
        else:
            tma.store_wait(0)
        j += 1
        c_smem.index(CI).store(acc.to(gl.float16))
        fence_async_shared()
        tma.async_store(c_desc, [pid_m * BM + CI * 64, pid_n * BN * MC], c_smem.index(CI))
        if RES >= 2:
            tma.store_wait(0)
            mbarrier.arrive(r_empty.index(CI))
    tma.store_wait(0)


@gluon.jit
def _consume1(a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty,
              M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NB: gl.constexpr,
              MC: gl.constexpr, SEP: gl.constexpr, RES: gl.constexpr):
    _consume(a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty, M,
             N, K, 1, BM, BN, BK, NB, MC, SEP, RES)


@gluon.jit
def _consume2(a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty,
              M, N, K, BM: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, NB: gl.constexpr,
              MC: gl.constexpr, SEP: gl.constexpr, RES: gl.constexpr):
    _consume(a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty, M,
             N, K, 2, BM, BN, BK, NB, MC, SEP, RES)


@gluon.jit
def gemm_mc(a_desc, w_desc, c_desc, r_desc, res, M, N, K, BN: gl.constexpr, BK: gl.constexpr,
            NB: gl.constexpr, MC: gl.constexpr, BAL: gl.constexpr = 0, RES: gl.constexpr = 0):
    BM: gl.constexpr = 192
    a_smem = gl.allocate_shared_memory(gl.float16, [NB * 3, 64, BK], a_desc.layout)
    w_smem = gl.allocate_shared_memory(gl.float16, [NB, BN * MC, BK], w_desc.layout)
    c_smem = gl.allocate_shared_memory(gl.float16, [3, 64, BN * MC], c_desc.layout)
    ready = mbarrier.allocate_mbarrier(batch=NB)
    # a slot's consumers: its own CTA's three, and with BAL the other CTA's too (their remote
    # arrivals are patched into the PTX, :func:`balance`); multicast as Gluon issues it (the
    # lead CTA alone) waits for the other CTA's on a pair barrier of the lead's (SEP)
    empty = mbarrier.allocate_mbarrier(batch=NB)
    SEP: gl.constexpr = MC > 1 and not BAL
    empty_a = mbarrier.allocate_mbarrier(batch=NB, two_ctas=SEP)
    for i in gl.static_range(NB):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=6 if BAL else 3)
        mbarrier.init(empty_a.index(i), count=3)
    r_ready = mbarrier.allocate_mbarrier(batch=3)
    r_empty = mbarrier.allocate_mbarrier(batch=3)
    for i in gl.static_range(3):
        mbarrier.init(r_ready.index(i), count=1)
        mbarrier.init(r_empty.index(i), count=1)
    gl.warp_specialize([
        (_consume, (a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready, r_empty,
                    M, N, K, 0, BM, BN, BK, NB, MC, SEP, RES)),
        (_consume1, (a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready,
                     r_empty, M, N, K, BM, BN, BK, NB, MC, SEP, RES)),
        (_consume2, (a_smem, w_smem, ready, empty, empty_a, c_smem, c_desc, res, r_ready,
                     r_empty, M, N, K, BM, BN, BK, NB, MC, SEP, RES)),
        (_load, (a_desc, w_desc, a_smem, w_smem, ready, empty, empty_a, r_desc, c_smem,
                 r_ready, r_empty, M, N, K, BM, BN, BK, NB, MC, SEP, RES)),
    ], [4, 4, 1], [160, 160, 24])


def layouts(bn, bk, mc, a_rows=64):
    bcast = [[0, 0]] if mc > 1 else []
    split = [[1, 0]] if mc > 1 else []
    csplit = [[0, 1]] if mc > 1 else []
    L = gl.NVMMASharedLayout.get_default_for
    return {"a_desc": ((a_rows, bk), L([a_rows, bk], gl.float16, cga_layout=bcast)),
            "w_desc": ((bn * mc, bk), L([bn * mc, bk], gl.float16, cga_layout=split)),
            "c_desc": ((64, bn * mc), L([64, bn * mc], gl.float16, cga_layout=csplit)),
            "r_desc": ((64, bn * mc), L([64, bn * mc], gl.float16, cga_layout=csplit))}


def compile(bn=128, bk=64, nb=4, mc=2, ptx_version=87, bal=0, res=0):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    lay = layouts(bn, bk, mc, 32 if bal == 1 else 64)
    sig = {}
    for name in gemm_mc.arg_names:
        if name in lay:
            (r, c), layout = lay[name]
            sig[name] = f"tensordesc<fp16[{r},{c}],{layout!r}>"
        elif name in ("BN", "BK", "NB", "MC", "BAL", "RES"):
            sig[name] = "constexpr"
        elif name == "res":
            sig[name] = "*fp16"
        else:
            sig[name] = "i32"
    consts = dict(BN=bn, BK=bk, NB=nb, MC=mc, BAL=bal, RES=res)
    attrs = {(gemm_mc.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in ("res", "N", "K")}
    return triton.compile(GluonASTSource(gemm_mc, sig, consts, attrs),
                          target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "maxnreg": 128, "num_ctas": mc,
                                   "ptx_version": ptx_version})


_ARRIVE = re.compile(r"^(\s*)@(%p\d+) mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];$", re.M)
_MULTICAST = re.compile(r"^\s*@(%p\d+) cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global"
                        r"\.mbarrier::complete_tx::bytes\.multicast::cluster ", re.M)


def balance(ptx: str) -> str:
    """BAL's PTX (1: six 32-row pieces of A, three from each CTA; 2: three of 64 rows, two
    from the lead): (1) every consumer's arrival on a slot's ``empty`` barrier also arrives on
    the other CTA's (``mapa`` + ``mbarrier.arrive.shared::cluster``, as CUTLASS's
    ``ClusterBarrier::arrive(cta_id)``), so each CTA's loading
    warp knows when all six consumers released the slot; (2) the second half of A's
    multicast pieces is issued by the non-lead CTA (Gluon has the lead issue every piece of
    a broadcast tile), so each CTA pulls half of A from L2, as cuBLAS's ``1x2`` kernels do."""
    arrivals = _ARRIVE.findall(ptx)
    if len(arrivals) != 6:  # three consumers, in their loop and after it
        raise ValueError(f"expected 6 consumer arrivals, found {len(arrivals)}")

    def both(m):
        pad, pred, addr = m.groups()
        return (f"{m.group(0)}\n{pad}{{\n{pad}.reg .b32 %mc_rank, %mc_peer, %mc_addr;\n"
                f"{pad}mov.u32 %mc_rank, %cluster_ctarank;\n{pad}xor.b32 %mc_peer, %mc_rank, 1;\n"
                f"{pad}mapa.shared::cluster.u32 %mc_addr, {addr}, %mc_peer;\n"
                f"{pad}@{pred} mbarrier.arrive.shared::cluster.b64 _, "
                f"[%mc_addr];\n{pad}}}")

    ptx = _ARRIVE.sub(both, ptx)
    loads = list(_MULTICAST.finditer(ptx))
    for m in reversed(loads[(len(loads) + 1) // 2:]):
        pred = m.group(1)
        define = re.compile(rf"and\.pred \t{re.escape(pred)}, (%p\d+), (%p\d+);")
        found = list(define.finditer(ptx, 0, m.start()))
        if not found:
            raise ValueError(f"no definition of {pred}")
        d = found[-1]
        lead, elect = d.groups()
        ptx = (ptx[: d.start()] + f"{{ .reg .pred %mc_nl; not.pred %mc_nl, {lead}; "
               f"and.pred {pred}, %mc_nl, {elect}; }}" + ptx[d.end():])
    return ptx


def ptxas(ptx: str) -> bytes:
    """The cubin of ``ptx`` by Triton's own ptxas (sm_90a)."""
    import os
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    exe = get_ptxas(90).path
    with tempfile.TemporaryDirectory() as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        subprocess.run([exe, "-arch=sm_90a", "-o", out, src], check=True)
        return open(out, "rb").read()


#: (name, MC, BN, BK, NB, BAL, RES): the variants compiled
VARIANTS = [("mc1", 1, 128, 64, 4, 0, 0), ("mc2", 2, 128, 64, 4, 0, 0),
            ("mc2_bal", 2, 128, 64, 4, 1, 0), ("mc2_bal64", 2, 128, 64, 4, 2, 0),
            ("mc1_res", 1, 128, 64, 4, 0, 1), ("mc1_rtma", 1, 128, 64, 4, 0, 2),
            ("mc1_rlate", 1, 128, 64, 4, 0, 3)]


def build(out: str) -> None:
    """Every variant to ``out/<name>.{ptx,cubin,json}`` (the json: symbol, shared memory,
    warps, CTAs a cluster, the TMA boxes)."""
    import json
    import os

    os.makedirs(out, exist_ok=True)
    for name, mc, bn, bk, nb, bal, res in VARIANTS:
        k = compile(bn=bn, bk=bk, nb=nb, mc=mc, bal=bal, res=res)
        meta = k.metadata
        ptx, cubin = k.asm["ptx"], k.asm["cubin"]
        if bal:
            ptx = balance(ptx)
            cubin = ptxas(ptx)
        with open(os.path.join(out, f"{name}.ptx"), "w") as f:
            f.write(ptx)
        with open(os.path.join(out, f"{name}.cubin"), "wb") as f:
            f.write(cubin)
        info = {"symbol": meta.name, "shared": meta.shared, "num_warps": meta.num_warps,
                "num_ctas": meta.num_ctas, "boxes": [d["block_size"] for d in meta.tensordesc_meta],
                "swizzle": [d["swizzle"] for d in meta.tensordesc_meta],
                "MC": mc, "BN": bn, "BK": bk, "NB": nb, "BAL": bal, "RES": res, "BM": 192}
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(info, f)
        print(f"{name}: smem {meta.shared} B, CTAs {meta.num_ctas}, multicast loads "
              f"{ptx.count('multicast::cluster')}, remote arrivals "
              f"{ptx.count('mapa.shared::cluster')}, wgmma "
              f"{ptx.count('wgmma.mma_async')}")


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="build/multicast_gemm")
    build(p.parse_args(argv).out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
