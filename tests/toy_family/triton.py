"""The Triton printer: a loop over k of ``tl.dot``, the output written through its view."""

from __future__ import annotations

from tvm_stitch.codegen.elem_printer import write_output
from tvm_stitch.codegen.kernel_text import KernelSource, base, cdiv, function, pointer_args


def kernel(match, name: str) -> KernelSource:
    pointers, inputs, outputs = pointer_args(match)
    ext = match.frame.extents
    m, n, k = ext["m"], ext["n"], ext["k"]
    a, b = match.views["a"], match.views["b"]
    sa, sb = a.stride, b.stride
    lines = [
        "rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        f"A = {base(a, pointers, {})}",
        f"B = {base(b, pointers, {})}",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        f"for k0 in range(0, {k}, BLOCK_K):",
        "    rk = k0 + tl.arange(0, BLOCK_K)",
        f"    x = tl.load(A + rm[:, None] * {sa.get('m', 0)} + rk[None, :] * {sa.get('k', 0)}, "
        f"mask=(rm < {m})[:, None] & (rk < {k})[None, :], other=0.0)",
        f"    y = tl.load(B + rk[:, None] * {sb.get('k', 0)} + rn[None, :] * {sb.get('n', 0)}, "
        f"mask=(rk < {k})[:, None] & (rn < {n})[None, :], other=0.0)",
        "    acc += tl.dot(x, y, input_precision=DOT_PREC)",
    ]
    tiles = {"m": "rm[:, None]", "n": "rn[None, :]"}
    masks = {"m": f"(rm < {m})[:, None]", "n": f"(rn < {n})[None, :]"}
    lines += write_output(match, pointers, tiles, masks, "acc")
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "DOT_PREC"]
    text = function(match, name, inputs, outputs, constexprs, lines)
    return KernelSource(name, text, inputs, outputs, {}, "toy")


def grid(config, match, source) -> tuple:
    ext = match.frame.extents
    return (cdiv(ext["m"], config["BLOCK_M"]), cdiv(ext["n"], config["BLOCK_N"]))
