"""BERT's GEMMs with their epilogues as the pipeline generates them, in the warp-specialized Gluon
form (:mod:`tvm_stitch.codegen.gluon_gemm`, every tiling the search seeds) and the Triton form's
persistent tiles, against cuBLAS in the same process (issue 11, item 1).

    python -m tvm_stitch.benchmarks.ws_gemm [--batch 8] [--seq 512] [--no-hoist] [--separate]
        [--ptxas] [--fold-norms] [--only TEXT] [--tiles C,N,K,SLOTS[,EW[,PTR]];...] [--no-triton]

Kernels are BERT-base's distinct GEMMs (Q/K/V over their joined weights, as ``lift_params``
builds them, with bias; FFN-in with bias + GELU; out-projection and FFN-out with bias +
residual) at ``batch × seq`` tokens, launched as the search launches them
(:func:`~tvm_stitch.tune.kernels.generated_runner`, random inputs). Baselines:
``torch.matmul`` (cuBLAS, no epilogue), ``F.linear`` with the bias, and ``F.linear`` followed by
a GELU or a residual add (two kernels, as PyTorch runs BERT's epilogues), on the same shapes.
``--no-hoist`` also times the Gluon form with the epilogue's reads after the product loop;
``--ptxas`` prints ptxas's registers and any wgmma serialization of each Gluon launch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import tvm

from tvm_stitch.errors import error_line

TRITON_FORMS = [
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
     "PERSISTENT": True, "TMA_STORE": True},
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
     "PERSISTENT": True},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 4,
     "PERSISTENT": True, "TMA_STORE": True},
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 3,
     "PERSISTENT": False},
]


def generated_gemms(workload: str, dtype: str = "float16", joined: bool = True,
                    fold_norms: bool = False, **params) -> list:
    """``(match, source, shapes, graph)`` of each distinct GEMM kernel the stitch pipeline
    generates for ``workload`` (instance ``params``); ``joined``: banded GEMMs (Q, K, V) read
    their weights joined, as the pipeline's ``lift_params`` makes them; ``fold_norms``:
    normalizations read only by GEMMs folded into them (through the weights, with
    ``joined``), as the pipeline's ``fold_norms`` folds them."""
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.analysis.weights import join_weights, weight_tensors
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until
    from tvm_stitch.workloads import get_workload

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    inst = get_workload(workload).instance(dtype, **params)
    mod = run_until(inst.mod, target, "StitchFuseMBCI")
    graph = build_graph(mod, legalize=False)
    weights = weight_tensors(graph, mod[inst.func]) if joined else None
    out, seen = [], set()
    found_all = recognize(graph, fold_norms=fold_norms, weights=weights if fold_norms else None)
    for found in (m for m in found_all.matches if m.family == "gemm"):
        match = found
        if joined and len(found.segments) > 1:  # scaled weights join as the pipeline's do
            scaled = {d.name for d in found.derived if d.kind == "scaled"}
            match, _ = join_weights(found, set(weights) | scaled)
        source = kernel_source(match)
        if source.name not in seen:
            seen.add(source.name)
            shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
                      for t in [*source.inputs, *source.outputs] if t in graph.tensors}
            # joined or derived weights (the bands' side by side, scaled, column sums) and
            # row moments: tensors the graph does not hold
            for view in match.views.values():
                shapes.setdefault(view.tensor, (view.shape, view.dtype))
            out.append((match, source, shapes, graph))
    return out


def device_hw():
    """The sm_90a hardware model with this GPU's SM count (the programs a persistent launch
    takes)."""
    import torch

    from tvm_stitch import HardwareModel

    hw = HardwareModel.from_target(tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return dataclasses.replace(hw, num_sms=sms)


def parse_tiles(text: str) -> tuple:
    """``"C,N,K,SLOTS[,EW[,PTR]];..."`` as tuples of :func:`~.gluon_gemm.ws_config`'s
    arguments."""
    return tuple(tuple(int(x) for x in part.split(",")) for part in text.split(";") if part)


def ptxas_report(ptx: str) -> str:
    """Registers, spills and any ``wgmma`` serialization ptxas reports for ``ptx`` (sm_90a;
    the ptxas Triton ships)."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        info = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"],
                              check=True, capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", info)
    spills = re.findall(r"(\d+) bytes spill stores", info)
    serial = re.findall(r"serialized due to (.*?) in the function", info)
    return (f"registers {','.join(regs)} spill stores {','.join(spills)}"
            + (f"; wgmma SERIALIZED: {serial[0]}" if serial else ""))


def run(batch: int, seq: int, hoist_variant: bool, joined: bool = True,
        ptxas: bool = False, fold_norms: bool = False, only: str | None = None,
        tiles: tuple | None = None, triton: bool = True) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from tvm_stitch.codegen.gluon_gemm import (
        WS_GEMM_TILES,
        applicable_tiles,
        gemm_ws_source,
        staging_legality,
        ws_config,
    )
    from tvm_stitch.tune.kernels import generated_runner
    from tvm_stitch.tune.measure import time_torch

    hw = device_hw()
    rows = []
    # one encoder layer: every layer's kernels are the same ones
    # with fold_norms two layers: the second layer's Q/K/V and out-projection read the
    # first's statistics
    for match, source, shapes, _ in generated_gemms("bert-base", batch=batch, seq=seq,
                                                    layers=2 if fold_norms else 1,
                                                    joined=joined, fold_norms=fold_norms):
        if only and only not in match.describe():
            continue
        ext = match.frame.extents
        m, k = ext["m"], ext["k"]
        n = sum(s.n for s in match.segments)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        wt = w.t().contiguous()
        res = torch.randn(m, n, device="cuda", dtype=torch.float16)
        base = {
            "matmul": time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda"),
            "linear": time_torch(lambda x, w=w, b=bias: F.linear(x, w, b), [a], "cuda"),
            # what eager PyTorch (and torch.compile, around cuBLAS) runs for BERT's epilogues
            "linear+gelu": time_torch(lambda x, w=w, b=bias: F.gelu(F.linear(x, w, b)), [a],
                                      "cuda"),
            "linear+res": time_torch(lambda x, w=w, b=bias, r=res: F.linear(x, w, b) + r, [a],
                                     "cuda"),
        }
        flops = 2 * m * n * k
        print(f"{match.describe()}: cuBLAS matmul {base['matmul']:.1f} us "
              f"({flops / base['matmul'] / 1e6:.0f} TFLOP/s), F.linear {base['linear']:.1f}, "
              f"+ GELU {base['linear+gelu']:.1f}, + residual {base['linear+res']:.1f} us",
              flush=True)
        forms = [(dict(c), "triton") for c in TRITON_FORMS] if triton else []
        if source.ws:
            staging = staging_legality(match) is None  # as the search seeds them
            for t in applicable_tiles(staging, tiles or WS_GEMM_TILES):
                try:
                    forms.append((ws_config(*t), "gluon"))
                except ValueError as e:
                    print(f"  gluon {t}: {e}")
        variants = [("", source)]
        if source.ws and hoist_variant:
            variants.append(("no-hoist", dataclasses.replace(
                source, ws=gemm_ws_source(match, source.name, hoist=False))))
        for tag, src in variants:
            runner = generated_runner(match, src, shapes, hw=hw)
            for config, kind in forms:
                if tag and kind != "gluon":
                    continue
                if config.get("PERSISTENT") and not src.persistent:
                    continue
                if config.get("TMA_STORE") and not src.tma_store:
                    continue
                try:
                    us = time_torch(runner(config), [], "cuda", budget_ms=30)
                except Exception as e:  # noqa: BLE001 - a form that fails is reported
                    print(f"  {kind} {config}: {type(e).__name__}: {error_line(e)[:120]}")
                    continue
                if ptxas and kind == "gluon":
                    from tvm_stitch.codegen.embed import generated_launch

                    launch = generated_launch(src, match, {**config, "NUM_SMS": hw.num_sms},
                                              shapes)
                    print(f"  ptxas {json.dumps(config)}: {ptxas_report(launch.ptx)}")
                row = dict(kernel=match.describe(), form=kind + (f" {tag}" if tag else ""),
                           config=config, us=us, **{f"{b}_us": v for b, v in base.items()})
                rows.append(row)
                print(f"  {row['form']:16s} {json.dumps(config)}: {us:6.1f} us "
                      f"({flops / us / 1e6:4.0f} TFLOP/s) matmul {base['matmul'] / us:.2f}x "
                      f"linear {base['linear'] / us:.2f}x", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--no-hoist", action="store_true")
    parser.add_argument("--separate", action="store_true",
                        help="Q, K and V over their own weights (not joined)")
    parser.add_argument("--ptxas", action="store_true",
                        help="ptxas's registers and wgmma serialization of each Gluon launch")
    parser.add_argument("--fold-norms", action="store_true",
                        help="the LayerNorms folded through the weights (row statistics read, "
                        "row moments written)")
    parser.add_argument("--only", metavar="TEXT",
                        help="only the GEMMs whose description holds TEXT (e.g. '3 bands')")
    parser.add_argument("--tiles", metavar="C,N,K,SLOTS[,EW[,PTR]];...",
                        help="the Gluon tilings to measure (default: the search's seeds)")
    parser.add_argument("--no-triton", action="store_true",
                        help="only the Gluon forms (one kernel name: e.g. for ncu)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    tiles = args.tiles and parse_tiles(args.tiles)
    rows = run(args.batch, args.seq, args.no_hoist, not args.separate, args.ptxas,
               args.fold_norms, args.only, tiles, not args.no_triton)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
