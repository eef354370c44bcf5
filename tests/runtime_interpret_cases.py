"""Generated kernels with runtime extents under Triton's interpreter, against torch.

Run with TRITON_INTERPRET=1 (``tests/test_dynamic.py`` runs it in a subprocess and reads the
JSON lines it prints).  A Linear with bias, GELU and a residual over ``(batch, seq, 96)`` with
both dims symbolic is recognized as the stitch pipeline recognizes it for the H100; its kernel
is printed once, the rows ``batch * seq`` an argument (:mod:`tvm_stitch.codegen.runtime`), and
run at several sizes, none a multiple of the tiles.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from tvm import relax, tirx  # noqa: E402

from tvm_stitch.analysis.recognize import recognize  # noqa: E402
from tvm_stitch.codegen import runtime, triton_gen  # noqa: E402
from tvm_stitch.codegen.kernel_text import launch_buffers, launch_constexprs  # noqa: E402
from tvm_stitch.graph import build_graph  # noqa: E402
from tvm_stitch.graph.specialize import value_at  # noqa: E402
from tvm_stitch.pipeline import run_until  # noqa: E402

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
TILES = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2}
TOL = {"float32": 2e-4, "float16": 2e-2}
SIZES = ((1, 1), (2, 7), (3, 37))


def linear_module(dtype: str, k: int = 96, n: int = 80):
    """``gelu(x @ w + bias) + r`` over symbolic ``(b, s)``, and its weights."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.1).astype(dtype)
    bias = (rng.standard_normal(n) * 0.1).astype(dtype)
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    x = relax.Var("x", relax.TensorType([b, s, k], dtype))
    r = relax.Var("r", relax.TensorType([b, s, n], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, r], {"tir_var_lower_bound": {"b": 1, "s": 1},
                                      "tir_var_upper_bound": {"b": 8, "s": 128}}):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, relax.const(w)), relax.const(bias)))
            out = bb.emit_output(relax.op.add(relax.op.nn.gelu(y), r))
        bb.emit_func_output(out)
    return bb.get(), w, bias


def attention_module(dtype: str, heads: int = 2, d: int = 32):
    """``softmax(q kᵀ / √d + mask) v`` over symbolic ``(b, s)``, the mask a padding mask."""
    b, s = tirx.Var("b", "int64"), tirx.Var("s", "int64")
    q, k, v = (relax.Var(n, relax.TensorType([b, heads, s, d], dtype)) for n in "qkv")
    mask = relax.Var("mask", relax.TensorType([b, 1, 1, s], dtype))
    bb = relax.BlockBuilder()
    with bb.function("main", [q, k, v, mask], {"tir_var_lower_bound": {"b": 1, "s": 1},
                                               "tir_var_upper_bound": {"b": 8, "s": 128}}):
        with bb.dataflow():
            scores = relax.op.matmul(q, relax.op.permute_dims(k, [0, 1, 3, 2]))
            scores = relax.op.add(relax.op.multiply(scores, relax.const(d ** -0.5, dtype)), mask)
            out = bb.emit_output(relax.op.matmul(relax.op.nn.softmax(scores, axis=-1), v))
        bb.emit_func_output(out)
    return bb.get()


def _at(kernel, sizes):
    """``kernel``'s runtime arguments and grid at ``sizes`` of its dims."""
    frame = copy.copy(kernel.match.frame)
    frame.extents = {a: value_at(e, sizes) for a, e in frame.extents.items()}
    values = [value_at(e, sizes) for e in kernel.source.arguments.values()]
    return values, dataclasses.replace(kernel.match, frame=frame)


def attention_cases(dtypes, heads=2, d=32):
    for dtype in dtypes:
        mod = run_until(attention_module(dtype, heads, d), CUDA, "StitchFuseMBCI")
        kernels = [k for k, _ in runtime_kernels(mod, ("b", "m", "n"))]
        (kernel,) = [k for k in kernels if k.match.family == "attention"]
        fn = triton_gen.load(kernel.source)
        tdt = getattr(torch, dtype)
        consts = {**TILES, "BLOCK_K": 32, "BLOCK_H": 32, "DOT_PREC": "ieee", "TMA": False}
        consts = {k: v for k, v in {**consts, **kernel.source.constexprs}.items()
                  if k in fn.arg_names}
        for b, s in SIZES:
            q, k, v = (torch.randn(b, heads, s, d).to(tdt) for _ in range(3))
            mask = torch.zeros(b, 1, 1, s)
            if s > 2:
                mask[-1, ..., s - s // 3:] = -10000.0  # the last sequence padded
            mask = mask.to(tdt)
            inputs = {"q": q, "k": k, "v": v, "mask": mask}
            scores = q.float() @ k.float().transpose(-1, -2) * d ** -0.5 + mask.float()
            want = torch.softmax(scores, -1) @ v.float()
            got = torch.zeros(b, heads, s, d, dtype=tdt)
            values, sized = _at(kernel, {"b": b, "s": s})
            grid = kernel.source.grid(consts, sized)
            fn[grid](*values, *[inputs[t] for t in kernel.source.inputs], got, **consts)
            err = float((got.float() - want).abs().max())
            print(json.dumps({"case": f"attention {dtype} {b}x{s}", "rows": b * s,
                              "max_err": err, "ok": err <= TOL[dtype] * 4}))


def runtime_kernels(mod, axes=("m",)):
    """``(kernel, graph)`` of every runtime kernel recognized in ``mod`` (legalized for the
    H100)."""
    graph = build_graph(mod, legalize=False)
    points = runtime.sentinel_points(graph.point)
    found = []
    for match in recognize(graph, runtime=True).matches:
        pair = []
        for point in points:
            at = recognize(build_graph(mod, legalize=False, point=point), runtime=True)
            pair += [m for m in at.matches if sorted(m.covered) == sorted(match.covered)]
        found.append((runtime.runtime_kernel(pair, points, graph.values, axes), graph))
    return found


def main(dtypes):
    torch.manual_seed(0)
    for dtype in dtypes:
        mod, w, bias = linear_module(dtype)
        ((kernel, graph),) = runtime_kernels(run_until(mod, CUDA, "StitchFuseMBCI"))
        fn = triton_gen.load(kernel.source)
        tdt = getattr(torch, dtype)
        # unsplit, and k split in 2 (a variant of bounded rows: its workspace sized at the
        # largest rows here, 111, as generated_launch sizes it at the variant's bound)
        for split in (1, 2):
            config = {**TILES, **runtime.FIXED_OPTIONS, "NUM_SMS": 3, "SPLIT_K": split}
            consts = launch_constexprs(kernel.source, kernel.match, config, fn.arg_names)
            buffers = {
                name: torch.zeros(size, dtype=getattr(torch, t)) for name, (size, t) in
                launch_buffers(kernel.source, runtime.at_bound(kernel.match, 111), consts).items()
            }
            assert bool(buffers) == (split > 1)
            for b, s in SIZES:
                inputs = {"x": torch.randn(b, s, 96).to(tdt),
                          "r": torch.randn(b, s, 80).to(tdt)}
                want = torch.nn.functional.gelu(
                    inputs["x"].float() @ torch.from_numpy(w).float()
                    + torch.from_numpy(bias).float())
                want = want + inputs["r"].float()
                args = [inputs[t] if t in inputs
                        else torch.from_numpy(graph.values[t].value.numpy())
                        for t in kernel.source.inputs]
                got = torch.zeros(b, s, 80, dtype=tdt)
                rows = value_at(kernel.extents["m"], {"b": b, "s": s})
                values, sized = _at(kernel, {"b": b, "s": s})
                fn[kernel.source.grid(consts, sized)](*values, *args, got,
                                                      **{**consts, **buffers})
                err = float((got.float() - want).abs().max())
                scale = max(1.0, float(want.abs().max()))
                left = int(buffers["CNT"].abs().sum()) if buffers else 0  # counters left zero
                print(json.dumps({"case": f"{dtype} {b}x{s} split {split}", "rows": rows,
                                  "max_err": err,
                                  "ok": err <= TOL[dtype] * scale and left == 0}))


if __name__ == "__main__":
    dtypes = sys.argv[1:] or ["float32", "float16"]
    main(dtypes)
    attention_cases(dtypes)
