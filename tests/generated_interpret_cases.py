"""Generated Triton kernels under Triton's interpreter against their TE references.

Run with TRITON_INTERPRET=1 (``tests/test_recognize.py`` runs it in a subprocess and reads the JSON
lines it prints).  For each model given on the command line (``name:dtype[:k=v,...]``), every
distinct kernel recognized for a CUDA target is generated, run by the interpreter on random
inputs with small tiles, and compared with :func:`tvm_stitch.codegen.te_reference.reference_func`
compiled for llvm on the same inputs.
"""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402

from tvm_stitch.analysis.recognize import recognize  # noqa: E402
from tvm_stitch.analysis.weights import (  # noqa: E402
    interleave,
    join_weights,
    pair_weights,
    weight_tensors,
)
from tvm_stitch.codegen import kernel_text, triton_gen  # noqa: E402
from tvm_stitch.codegen.te_reference import reference_func  # noqa: E402
from tvm_stitch.families.gemm import recognize as recognize_module  # noqa: E402
from tvm_stitch.families.gemm.template import GEMM_MAX_TILE  # noqa: E402
from tvm_stitch.families.gemm.triton import LATE_STATISTICS  # noqa: E402
from tvm_stitch.graph import build_graph  # noqa: E402
from tvm_stitch.pipeline import run_until  # noqa: E402
from tvm_stitch.workloads import get_workload  # noqa: E402

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
MOMENT_PROGRAMS = recognize_module.MOMENT_PROGRAMS
TILES = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "BLOCK_H": 16, "GROUP_M": 2}
TOL = {"float32": 2e-4, "float16": 2e-2}


def legalized(mod):
    """``mod`` as FuseMBCI sees it in the stitch pipeline for the H100."""
    return run_until(mod, CUDA, "StitchFuseMBCI")


def random_input(shape, dtype, rng):
    if dtype == "bool":  # a mask; its first slice hides everything (rows with no visible key)
        mask = rng.random(shape) > 0.3
        if len(shape) > 1:
            mask[0] = False
        return mask
    if "int" in dtype:
        return rng.integers(0, 2, shape).astype(dtype)
    return (rng.standard_normal(shape) * 0.5).astype(dtype)


def moments_input(shape, rng):
    """Pieces of row moments that some row could have: positive, and small enough against
    the row's length that mean² stays below the mean of squares (a variance, not NaN)."""
    return (np.abs(rng.standard_normal(shape)) * 0.5 + 0.5).astype("float32")


def run_case(label, match, graph, rng, joined=None):
    """Print one JSON line per output of each run of ``match``'s kernel (and, with
    ``joined`` — ``(match', JoinedWeights)`` — of the kernel reading the bands' weights
    concatenated, against the same reference)."""
    source = triton_gen.kernel_source(match)
    tensors = [*source.inputs, *source.outputs]
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for t in tensors}
    # constants (folded masks) keep their values: the kernels may be specialised on them
    inputs = [
        graph.values[t].value.numpy()
        if isinstance(graph.values.get(t), tvm.ir.expr.Constant)
        else moments_input(shapes[t][0], rng).astype(shapes[t][1])
        # a row's moments (sums of x, x², ...) from another kernel, or a weight's scaled
        # copy or column sums (a normalization folded through the weights)
        if t not in graph.values
        else random_input(shapes[t][0], shapes[t][1], rng)
        for t in source.inputs
    ]
    # the TE reference, compiled for the CPU
    ref_func = reference_func(match, source, shapes)
    ex = tvm.compile(tvm.IRModule({"main": ref_func}), target="llvm")
    outs = [tvm.runtime.tensor(np.zeros(shapes[t][0], shapes[t][1])) for t in source.outputs]
    ex["main"](*[tvm.runtime.tensor(a) for a in inputs], *outs)
    refs = [o.numpy().astype("float32") for o in outs]
    kernels = [("", match, source, inputs)]
    if joined is not None:  # the same products, their weights read from one tensor
        jmatch, jw = joined
        by_name = dict(zip(source.inputs, inputs))
        parts = [by_name[t] for t in jw.parts]
        by_name[jw.name] = (interleave(parts, jw.axis) if jw.interleaved
                            else np.concatenate(parts, axis=jw.axis))
        jsource = triton_gen.kernel_source(jmatch)
        assert jsource.persistent or jw.interleaved, "joined weights that TMA cannot read"
        kernels.append((" joined weights", jmatch, jsource, [by_name[t] for t in jsource.inputs]))
    for suffix, kmatch, ksource, kinputs in kernels:
        _run_kernel(f"{label} {match.describe()}{suffix}", kmatch, ksource, kinputs, shapes, refs)


def _run_kernel(label, match, source, inputs, shapes, refs):
    # the generated kernel, interpreted
    fn = triton_gen.load(source)
    args = [torch.from_numpy(np.ascontiguousarray(a)) for a in inputs]
    # both formulations of a GEMM that TMA can read: one program per tile, and persistent
    # programs (fewer than the tiles, so each walks several) loading through TMA; an attention
    # that TMA can read, with and without tensor-descriptor loads
    pieces = {o.tensor for o in match.all_outputs if o.chunk}
    chunk = max((o.chunk for o in match.all_outputs), default=0)
    tiles = {**TILES, "BLOCK_N": max(TILES["BLOCK_N"], chunk)}  # a moment's pieces are whole
    runs = [("", {}, tiles)]
    if source.persistent:
        runs.append((" persistent", {"PERSISTENT": True}, tiles))
    if source.tma_store:  # the outputs' tiles stored by TMA (clipped at the tensors' ends)
        runs.append((" persistent tma-store", {"PERSISTENT": True, "TMA_STORE": True}, tiles))
    if source.persistent and len(match.segments) > 1:  # tiles straddling a band's last column
        bn = 32
        while all(s.n % bn == 0 for s in match.segments):
            bn *= 2
        wide = {**TILES, "BLOCK_N": bn}
        runs.append((f" persistent BLOCK_N={wide['BLOCK_N']}", {"PERSISTENT": True}, wide))
    if source.tma:
        runs.append((" tma", {"TMA": True}, tiles))
    if pieces:  # a row's moments from tiles wider than one piece
        wide = {**TILES, "BLOCK_N": min(4 * chunk, GEMM_MAX_TILE)}
        runs.append((f" BLOCK_N={wide['BLOCK_N']}", {}, wide))
    if match.statistics and match.prologue is None:  # tiles over LATE_STATISTICS elements
        # combine the row statistics before the product loop, smaller ones after it
        big = {**TILES, "BLOCK_M": 64, "BLOCK_N": 2 * LATE_STATISTICS // 64}
        runs.append((f" BLOCK_M=64 BLOCK_N={big['BLOCK_N']}", {}, big))
    if source.split_k:  # k split in 2, and in 3 (slices of unequal steps, maybe an empty one)
        runs += [(f" split-k {s}", {"SPLIT_K": s}, tiles) for s in (2, 3)]
    for kind, options, run_tiles in runs:
        consts = {**run_tiles, **source.constexprs, "DOT_PREC": "ieee"}
        consts.update({"PERSISTENT": False, "TMA": False, "NUM_SMS": 3, "SPLIT_K": 1,
                       "TMA_STORE": False, **options})
        buffers = {
            name: torch.zeros(size, dtype=getattr(torch, dtype))
            for name, (size, dtype) in kernel_text.launch_buffers(source, match, consts).items()
        }
        consts.update({"WS": None, "CNT": None, **buffers})
        consts = {k: v for k, v in consts.items() if k in fn.arg_names}
        got = [torch.zeros(shapes[t][0], dtype=getattr(torch, shapes[t][1]))
               for t in source.outputs]
        # a GEMM's A and B (and outputs)
        descs = kernel_text.torch_descriptors(source, options, consts, args, got)
        fn[source.grid(consts, match)](*args, *got, **descs, **consts)
        if "CNT" in buffers and buffers["CNT"].any():  # counters must be left zero
            got = [torch.full_like(g, float("nan")) for g in got]
        for t, ref, out in zip(source.outputs, refs, got):
            g, r = out.float().numpy(), ref
            if t in pieces:  # a row's moment in pieces: how it is split depends on the tiles
                g, r = g.sum(axis=-1), r.sum(axis=-1)
            err = float(np.abs(g - r).max())
            scale = max(1.0, float(np.abs(r).max()))
            ok = bool(err <= TOL[match.dtype] * scale and np.isfinite(g).all())
            print(json.dumps(
                {"case": f"{label}{kind} {t}", "max_err": err, "ok": ok}
            ))


def main(specs):
    rng = np.random.default_rng(0)
    for spec in specs:
        name, dtype, *rest = spec.split(":")
        params = dict(kv.split("=") for kv in rest[0].split(",")) if rest else {}
        fold = params.pop("fold", "0") == "1"  # the kernels with normalizations folded in too
        # programs=N: moments in the wider pieces of producers of N tiles
        # (recognize.moment_chunk), and only the kernels writing or reading them
        programs = params.pop("programs", None)
        only = params.pop("only", None)  # only=TEXT: the kernels whose description has TEXT
        recognize_module.MOMENT_PROGRAMS = int(programs) if programs else MOMENT_PROGRAMS
        inst = get_workload(name).instance(dtype, **{k: int(v) for k, v in params.items()})
        mod = legalized(inst.mod)
        graph = build_graph(mod, legalize=False)
        weights = weight_tensors(graph, mod[inst.func])
        seen = set()
        matches = recognize(graph).matches
        if fold:  # in A's prologue, and through the weights (scaled weights, column sums)
            matches += recognize(graph, fold_norms=True).matches
            matches += recognize(graph, fold_norms=True, weights=weights).matches
        for match in matches:
            if programs and not (match.statistics or any(o.chunk for o in match.all_outputs)):
                continue
            if only and only not in match.describe():
                continue
            key = triton_gen.kernel_source(match).name
            if key not in seen:
                seen.add(key)
                scaled = {d.name for d in match.derived if d.kind == "scaled"}
                joiner = pair_weights if len(match.segments) == 1 else join_weights
                found = joiner(match, weights | scaled)
                run_case(f"{name} {dtype}", match, graph, rng,
                         found if found[0] is not None else None)


if __name__ == "__main__":
    main(sys.argv[1:])
