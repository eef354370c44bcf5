"""The ``chain`` family's Triton kernel (:func:`chain_source`): ``E = (A·B)·D``, the product
rounded to D's dtype, and the output epilogue."""

from __future__ import annotations

from tvm_stitch.codegen.elem_printer import write_output
from tvm_stitch.codegen.kernel_text import KernelSource, base, cdiv, function, pointer_args


def chain_source(match, name: str) -> KernelSource:
    """``E = (A·B)·D`` with the product rounded to D's dtype, and the output epilogue."""
    pointers, inputs, outputs = pointer_args(match)
    ext = match.frame.extents
    views = match.views
    m, n, k, d = ext["m"], ext["n"], ext["k"], ext["d"]
    heads = ext.get("h", 1)
    a, b, dv = views["a"], views["b"], views["d"]
    scal = {"b": "bb", "h": "hh"}
    sa, sb, sd = a.stride, b.stride, dv.stride
    lines = [
        "pid_m = tl.program_id(0)",
        "pid_h = tl.program_id(1)",
        "pid = tl.program_id(2)",
        f"bb = pid // {heads}",
        f"hh = pid % {heads}",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)",
        f"A = {base(a, pointers, scal)}",
        f"B = {base(b, pointers, scal)}",
        f"D = {base(dv, pointers, scal)}",
        "acc = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)",
        f"for n0 in range(0, {n}, BLOCK_N):",
        "    rn = n0 + tl.arange(0, BLOCK_N)",
        "    c = _tile_product(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), A, B, rm, rn, "
        f"{m}, {n}, {k}, {sa.get('m', 0)}, {sa.get('k', 0)}, {sb.get('k', 0)}, "
        f"{sb.get('n', 0)}, BLOCK_K, DOT_PREC)",
        f"    dd = tl.load(D + rn[:, None] * {sd.get('n', 0)} + rh[None, :] * {sd.get('d', 0)}, "
        f"mask=(rn < {n})[:, None] & (rh < {d})[None, :], other=0.0)",
        "    acc += tl.dot(c.to(dd.dtype), dd, input_precision=DOT_PREC)",
    ]
    tiles = {"b": "bb", "h": "hh", "m": "rm[:, None]", "d": "rh[None, :]"}
    masks = {"m": f"(rm < {m})[:, None]", "d": f"(rh < {d})[None, :]"}
    lines += write_output(match, pointers, tiles, masks, "acc")
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "BLOCK_H", "DOT_PREC"]
    text = function(match, name, inputs, outputs, constexprs, lines)
    return KernelSource(name, text, inputs, outputs, {}, "chain")


kernel = chain_source  # the family's printer (see :mod:`tvm_stitch.families`)


def grid(config: dict, match, source) -> tuple:
    """Programs along x, y, z: query-row tiles, output-column tiles, batch instances."""
    ext = match.frame.extents
    return (
        cdiv(ext["m"], config["BLOCK_M"]),
        cdiv(ext["d"], config["BLOCK_H"]),
        ext.get("b", 1) * ext.get("h", 1),
    )
