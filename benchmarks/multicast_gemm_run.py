"""Launch :mod:`multicast_gemm`'s kernels on the GPU host through the CUDA driver (no Triton,
no TVM): each variant on BERT-base's four GEMM shapes at 4096 tokens, checked against
``torch.matmul`` and timed beside it from CUDA-graph replays, same process.

    python benchmarks/multicast_gemm_run.py DIR [--m 4096] [--cases out,ffn2] [--rounds 5]
        [--jit] [--once]

``DIR`` holds what ``python -m tvm_stitch.benchmarks.multicast_gemm --out DIR`` compiled
(``build/``, ignored by git: name it in the device call's ``carry``). The cubin is loaded (the
PTX when the driver refuses it); a kernel whose PTX asks for clusters
(``.reqnctapercluster``) is launched in clusters by a plain ``cuLaunchKernel``. Timings from one
process drift by several percent from run to run, so every kernel is timed ``--rounds`` times
in turn and the median is shown.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
from cutlass_gemm_study import time_torch  # runs as a script on the GPU host

CASES = {"qkv": (2304, 768), "out": (768, 768), "ffn1": (3072, 768), "ffn2": (768, 3072)}
_F16 = 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
_L2_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
_MAX_DYN_SMEM = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class _Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def __call__(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            msg = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{name}: {rc} {msg.value}")


def tensor_map(cu, t, box, swizzle):
    """A TMA descriptor of the 2-D fp16 tensor ``t`` with ``box`` (rows, columns): its buffer
    and the 64-byte aligned address of the descriptor in it."""
    buf = ctypes.create_string_buffer(128 + 64)
    addr = (ctypes.addressof(buf) + 63) & ~63
    dims = (ctypes.c_uint64 * 2)(t.shape[1], t.shape[0])
    strides = (ctypes.c_uint64 * 1)(t.stride(0) * 2)
    boxd = (ctypes.c_uint32 * 2)(box[1], box[0])
    ones = (ctypes.c_uint32 * 2)(1, 1)
    cu("cuTensorMapEncodeTiled", ctypes.c_void_p(addr), _F16, 2, ctypes.c_void_p(t.data_ptr()),
       dims, strides, boxd, ones, 0, swizzle, _L2_128B, 0)
    return buf, addr


class Kernel:
    """One compiled variant, loaded."""

    def __init__(self, cu, path):
        self.cu = cu
        base = path[: -len(".json")]
        self.info = json.load(open(path))
        self.name = os.path.basename(base)
        self.module = ctypes.c_void_p()
        try:
            data = open(base + ".cubin", "rb").read()
            cu("cuModuleLoadData", ctypes.byref(self.module), data)
            self.loaded = "cubin"
        except RuntimeError:
            data = open(base + ".ptx", "rb").read() + b"\0"
            cu("cuModuleLoadData", ctypes.byref(self.module), data)
            self.loaded = "ptx"
        self.func = ctypes.c_void_p()
        cu("cuModuleGetFunction", ctypes.byref(self.func), self.module,
           self.info["symbol"].encode())
        cu("cuFuncSetAttribute", self.func, _MAX_DYN_SMEM, self.info["shared"])

    def args(self, a, w, c, r):
        """The kernel's parameters for ``c = a @ w.T (+ r)`` (kept alive by the caller)."""
        vals, addrs = [], []
        for t, box, sw in zip((a, w, c, r), self.info["boxes"], self.info["swizzle"]):
            buf, addr = tensor_map(self.cu, t, box, sw)
            vals.append(buf)
            addrs.append(addr)
            for v in (ctypes.c_int32(t.shape[0]), ctypes.c_int32(t.shape[1]),
                      ctypes.c_int64(t.stride(0)), ctypes.c_int64(1)):
                vals.append(v)
                addrs.append(ctypes.addressof(v))
        m, k = a.shape
        n = w.shape[0]
        for v in (ctypes.c_uint64(r.data_ptr()), ctypes.c_int32(m), ctypes.c_int32(n),
                  ctypes.c_int32(k), ctypes.c_uint64(0), ctypes.c_uint64(0)):
            vals.append(v)
            addrs.append(ctypes.addressof(v))
        return vals, (ctypes.c_void_p * len(addrs))(*addrs)

    def max_clusters(self, blocks):
        """The driver's count of clusters resident at once (``cuOccupancyMaxActiveClusters``)
        for a launch of ``blocks`` CTAs; 0 where it cannot say."""

        class Config(ctypes.Structure):
            _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
                        ("attrs", ctypes.c_void_p), ("nattrs", ctypes.c_uint)]

        cfg = Config((blocks, 1, 1), (32 * self.info["num_warps"], 1, 1), self.info["shared"],
                     None, None, 0)
        count = ctypes.c_int()
        try:
            self.cu("cuOccupancyMaxActiveClusters", ctypes.byref(count), self.func,
                    ctypes.byref(cfg))
        except RuntimeError:
            return 0
        return count.value

    def grid(self, m, n, sms):
        mc = self.info["MC"]
        tiles = -(-m // self.info["BM"]) * -(-n // (self.info["BN"] * mc))
        return min(sms // mc, tiles) * mc

    def launch(self, keep, m, n, sms):
        import torch

        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        self.cu("cuLaunchKernel", self.func, self.grid(m, n, sms), 1, 1,
                32 * self.info["num_warps"], 1, 1, self.info["shared"], stream, keep[1], None)


def _jit_form(a, w, sms):
    """The product by :mod:`gluon_gemm`'s ``coop3`` form, compiled by this host's Triton."""
    import torch
    from gluon_gemm import launch

    c = torch.empty(a.shape[0], w.shape[0], device="cuda", dtype=torch.float16)
    return lambda: launch(a, w, c, None, None, "coop3", 192, 128, 64, 4, True, 0, sms)


def main(argv=None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir")
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--rounds", type=int, default=3,
                   help="every kernel timed this many times in turn; the median is shown")
    p.add_argument("--jit", action="store_true",
                   help="also the same form (coop3 192 x 128 x 64, 4 slots) compiled here by "
                        "this host's Triton (benchmarks/gluon_gemm.py), as column 'jit'")
    p.add_argument("--once", action="store_true",
                   help="launch each kernel once, untimed (for Nsight Compute)")
    args = p.parse_args(argv)
    cu = _Driver()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kernels = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.json"))):
        try:
            kernels.append(Kernel(cu, path))
        except RuntimeError as e:
            print(f"{path}: not loaded: {e}")
    print(torch.cuda.get_device_name(), f"{sms} SMs;",
          ", ".join(f"{k.name} ({k.loaded}, {k.info['shared']} B, "
                    f"{k.max_clusters(sms // k.info['MC'] * k.info['MC'])} clusters at once)"
                    for k in kernels))
    torch.manual_seed(0)
    names = " ".join(f"{k.name:>16}" for k in kernels) + (f" {'jit':>16}" if args.jit else "")
    print(f"{'case':6} {'M x N x K':>18} {'cuBLAS':>8} {names}")
    for case in args.cases.split(","):
        n, k = CASES[case]
        a = torch.randn(args.m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k**0.5
        r = torch.randn(args.m, n, device="cuda", dtype=torch.float16)
        ref = a.float() @ w.float().T
        cells, timed = {}, []
        for kern in kernels:
            c = torch.zeros(args.m, n, device="cuda", dtype=torch.float16)
            keep = kern.args(a, w, c, r)
            try:
                kern.launch(keep, args.m, n, sms)
                torch.cuda.synchronize()
            except RuntimeError as e:
                cells[kern.name] = "fail " + str(e)[:10]
                continue
            err = (c.float() - ref - (r.float() if kern.info.get("RES") else 0)).abs().max().item()
            if not err < 5e-2:
                cells[kern.name] = f"wrong {err:.1e}"
                continue
            cells[kern.name] = f"error {err:.1e}"
            timed.append((kern, keep, c))
        if args.once:
            torch.matmul(a, w.T)
            base = float("nan")
        else:  # rounds of every kernel in turn; each one's median over the rounds
            rounds = {"cuBLAS": []}
            jit = _jit_form(a, w, sms) if args.jit else None
            for _ in range(args.rounds):
                rounds["cuBLAS"].append(time_torch(torch.matmul, (a, w.T)))
                if jit is not None:
                    rounds.setdefault("jit", []).append(time_torch(jit, ()))
                for kern, keep, _c in timed:
                    rounds.setdefault(kern.name, []).append(
                        time_torch(kern.launch, (keep, args.m, n, sms)))
            base = statistics.median(rounds.pop("cuBLAS"))
            for name, times in rounds.items():
                us = statistics.median(times)
                cells[name] = f"{us:7.1f} ({base / us:.2f}x)"
        names = [k.name for k in kernels] + (["jit"] if args.jit else [])
        row = " ".join(f"{cells.get(name, ''):>16}" for name in names)
        print(f"{case:6} {f'{args.m}x{n}x{k}':>18} {base:8.1f} {row}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
