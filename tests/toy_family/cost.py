"""Cost terms: one output tile a program, a loop over k."""

from __future__ import annotations

from tvm_stitch.cost.model import BASE_REGISTERS, Program, cdiv


def program(w, tiles, launch, hw) -> Program:
    ext, b = w.extents, w.dtype_bytes
    bm, bn, bk = tiles["m"], tiles["n"], tiles["k"]
    warps = int(launch.get("num_warps", 4))
    return Program(
        warps=warps, bm=bm, bn=bn,
        programs=cdiv(ext["m"], bm) * cdiv(ext["n"], bn),
        iters=cdiv(ext["k"], bk),
        flops=2 * bm * bn * bk,
        loaded=(bm * bk + bk * bn) * b,
        sfu=0.0,
        registers=bm * bn / (32 * warps) + BASE_REGISTERS,
        smem_fixed=0,
        unique=(ext["m"] * ext["k"] + ext["k"] * ext["n"] + ext["m"] * ext["n"]) * b,
        stored=bm * bn * b,
        busy_with_load=True,
    )
