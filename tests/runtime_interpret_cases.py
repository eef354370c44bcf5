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


def runtime_kernels(mod):
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
        found.append((runtime.runtime_kernel(pair, points, graph.values, ("m",)), graph))
    return found


def main(dtypes):
    torch.manual_seed(0)
    for dtype in dtypes:
        mod, w, bias = linear_module(dtype)
        ((kernel, graph),) = runtime_kernels(run_until(mod, CUDA, "StitchFuseMBCI"))
        fn = triton_gen.load(kernel.source)
        tdt = getattr(torch, dtype)
        consts = {**TILES, "DOT_PREC": "ieee", **runtime.FIXED_OPTIONS, "NUM_SMS": 3}
        consts = {k: v for k, v in consts.items() if k in fn.arg_names}
        for b, s in SIZES:
            inputs = {"x": torch.randn(b, s, 96).to(tdt), "r": torch.randn(b, s, 80).to(tdt)}
            want = torch.nn.functional.gelu(inputs["x"].float() @ torch.from_numpy(w).float()
                                            + torch.from_numpy(bias).float())
            want = want + inputs["r"].float()
            args = [inputs[t] if t in inputs else torch.from_numpy(graph.values[t].value.numpy())
                    for t in kernel.source.inputs]
            got = torch.zeros(b, s, 80, dtype=tdt)
            rows = value_at(kernel.extents["m"], {"b": b, "s": s})
            frame = copy.copy(kernel.match.frame)
            frame.extents = {**frame.extents, "m": rows}
            grid = kernel.source.grid(consts, dataclasses.replace(kernel.match, frame=frame))
            fn[grid](rows, *args, got, **consts)
            err = float((got.float() - want).abs().max())
            scale = max(1.0, float(want.abs().max()))
            print(json.dumps({"case": f"{dtype} {b}x{s}", "rows": rows, "max_err": err,
                              "ok": err <= TOL[dtype] * scale}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["float32", "float16"])
