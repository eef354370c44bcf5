"""BERT's GEMMs with their epilogues as the pipeline generates them, in the warp-specialized Gluon
form (:mod:`tvm_stitch.families.gemm.gluon`, every tiling the search seeds) and the Triton form's
persistent tiles, against cuBLAS in the same process (issue 11, item 1).

    python benchmarks/studies/ws_gemm.py [--batch 8] [--seq 512] [--no-hoist] [--separate]
        [--ptxas] [--fold-norms] [--only TEXT] [--tiles C,N,K,SLOTS[,EW[,PTR]];...]
        [--no-triton] [--model llama-8b] [--triton-forms JSON] [--sustained SECONDS]

Kernels are BERT-base's distinct GEMMs (Q/K/V over their joined weights, as ``lift_params``
builds them, with bias; FFN-in with bias + GELU; out-projection and FFN-out with bias +
residual) at ``batch × seq`` tokens, launched as the search launches them
(:func:`~tvm_stitch.tune.kernels.generated_runner`, random inputs). Baselines:
``torch.matmul`` (cuBLAS, no epilogue), ``F.linear`` with the bias, and ``F.linear`` followed by
a GELU or a residual add (two kernels, as PyTorch runs BERT's epilogues), on the same shapes.
``--no-hoist`` also times the Gluon form with the epilogue's reads after the product loop;
``--ptxas`` prints ptxas's registers and any wgmma serialization of each Gluon launch;
``--triton-forms`` replaces the Triton form's launches timed (a JSON list of configs, e.g.
split-K ones for GEMMs of few rows).
A GEMM's forms and baselines are all prepared first, then timed in turns (:data:`ROUNDS`
rounds): the clock drifts down under a sustained load, and a form timed late would lose by its
place alone (``docs/results/h200-clock-drift-wide-tiles-2026-11-30.md``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import tvm
from tvm_stitch.benchmarks.harness import generated_gemms, ptxas_report

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


def device_hw():
    """The sm_90a hardware model with this GPU's SM count (the programs a persistent launch
    takes)."""
    import torch

    from tvm_stitch import HardwareModel

    hw = HardwareModel.from_target(tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return dataclasses.replace(hw, num_sms=sms)


#: rounds in which the forms and baselines of one GEMM are timed in turns (30 ms each)
ROUNDS = 5


def parse_tiles(text: str) -> tuple:
    """``"C,N,K,SLOTS[,EW[,PTR]];..."`` as tuples of
    :func:`~tvm_stitch.families.gemm.gluon_launch.ws_config`'s arguments."""
    return tuple(tuple(int(x) for x in part.split(",")) for part in text.split(";") if part)


def run(batch: int, seq: int, hoist_variant: bool, joined: bool = True,
        ptxas: bool = False, fold_norms: bool = False, only: str | None = None,
        tiles: tuple | None = None, triton: bool = True, model: str = "bert-base",
        triton_forms: list | None = None, sustain: float = 0.0) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from tvm_stitch.benchmarks.harness import in_turns

    from tvm_stitch.families.gemm.gluon import gemm_ws_source, staging_legality
    from tvm_stitch.families.gemm.gluon_launch import WS_GEMM_TILES, applicable_tiles, ws_config
    from tvm_stitch.tune.kernels import generated_runner
    from tvm_stitch.tune.measure import torch_timer

    hw = device_hw()
    rows = []
    # one encoder layer: every layer's kernels are the same ones
    # with fold_norms two layers: the second layer's Q/K/V and out-projection read the
    # first's statistics
    for match, source, shapes, _ in generated_gemms(model, batch=batch, seq=seq,
                                                    layers=2 if fold_norms else 1,
                                                    joined=joined, fold_norms=fold_norms):
        if only and only not in match.describe():
            continue
        ext = match.frame.extents
        m, k = ext["m"], ext["k"]
        # every product's columns (a gate and an up interleaved: twice the output's)
        n = sum(s.n * len(s.products) for s in match.segments)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=torch.float16)
        wt = w.t().contiguous()
        res = torch.randn(m, n, device="cuda", dtype=torch.float16)
        baselines = {
            "matmul": lambda x, wt=wt: torch.matmul(x, wt),
            "linear": lambda x, w=w, b=bias: F.linear(x, w, b),
            # what eager PyTorch (and torch.compile, around cuBLAS) runs for BERT's epilogues
            "linear+gelu": lambda x, w=w, b=bias: F.gelu(F.linear(x, w, b)),
            "linear+res": lambda x, w=w, b=bias, r=res: F.linear(x, w, b) + r,
        }
        timers = {name: torch_timer(fn, [a], "cuda") for name, fn in baselines.items()}
        flops = 2 * m * n * k
        forms = [(dict(c), "triton") for c in triton_forms or TRITON_FORMS] if triton else []
        if source.ws:
            staging = staging_legality(match) is None  # as the search seeds them
            for t in applicable_tiles(staging, tiles or WS_GEMM_TILES):
                try:
                    config = ws_config(*t)
                    if match.paired:  # BLOCK_N is the output's; the product's is twice it
                        config["BLOCK_N"] //= 2
                    forms.append((config, "gluon"))
                except ValueError as e:
                    print(f"  gluon {t}: {e}")
        variants = [("", source)]
        if source.ws and hoist_variant:
            variants.append(("no-hoist", dataclasses.replace(
                source, ws=gemm_ws_source(match, source.name, hoist=False))))
        measured = []  # (form label, config), their timers in ``timers`` by index
        for tag, src in variants:
            runner = generated_runner(match, src, shapes, hw=hw)
            for config, kind in forms:
                if tag and kind != "gluon":
                    continue
                if config.get("PERSISTENT") and not src.persistent:
                    continue
                if config.get("TMA_STORE") and not src.tma_store:
                    continue
                if config.get("SPLIT_K", 1) > 1 and not src.split_k:
                    continue
                try:
                    timer = torch_timer(runner(config), [], "cuda")
                except Exception as e:  # noqa: BLE001 - a form that fails is reported
                    print(f"  {kind} {config}: {type(e).__name__}: {error_line(e)[:120]}")
                    continue
                if ptxas and kind == "gluon":
                    from tvm_stitch.codegen.embed import generated_launch

                    launch = generated_launch(src, match, {**config, "NUM_SMS": hw.num_sms},
                                              shapes)
                    print(f"  ptxas {json.dumps(config)}: {ptxas_report(launch.ptx)}")
                timers[len(measured)] = timer
                measured.append((kind + (f" {tag}" if tag else ""), config))
        # every form and baseline timed in turns: the clock drifts down under a sustained
        # load (a form timed late would lose by its place alone)
        times = dict(zip(timers, in_turns(list(timers.values()), ROUNDS,
                                          budget_ms=30.0 * ROUNDS)))
        base = {name: times[name] for name in baselines}
        print(f"{match.describe()}: cuBLAS matmul {base['matmul']:.1f} us "
              f"({flops / base['matmul'] / 1e6:.0f} TFLOP/s), F.linear {base['linear']:.1f}, "
              f"+ GELU {base['linear+gelu']:.1f}, + residual {base['linear+res']:.1f} us",
              flush=True)
        if sustain:
            _sustained(timers, measured, sustain, flops)
        for i, (form, config) in enumerate(measured):
            us = times[i]
            if isinstance(us, Exception):
                print(f"  {form} {config}: {type(us).__name__}: {error_line(us)[:120]}")
                continue
            row = dict(kernel=match.describe(), form=form, config=config, us=us,
                       **{f"{b}_us": v for b, v in base.items()})
            rows.append(row)
            print(f"  {form:16s} {json.dumps(config)}: {us:6.1f} us "
                  f"({flops / us / 1e6:4.0f} TFLOP/s) matmul {base['matmul'] / us:.2f}x "
                  f"linear {base['linear'] / us:.2f}x", flush=True)
    return rows


def _sustained(timers: dict, measured: list, seconds: float, flops: int) -> None:
    """cuBLAS's matmul and each form run alone for ``seconds`` after a second idle: µs per call
    once the clock has settled, with the SM clock, the power-capped share and the power NVML
    read meanwhile (:func:`~tvm_stitch.benchmarks.harness.sustained`)."""
    import time

    from tvm_stitch.benchmarks.harness import PowerMeter, Sampler, sustained

    meter = PowerMeter.open()
    if meter is None:
        print("  --sustained: NVML cannot be read here")
        return
    sampler = Sampler(meter)
    sampler.start()
    names = {"matmul": "cuBLAS matmul", **{i: f"{f} {json.dumps(c)}" for i, (f, c)
                                            in enumerate(measured)}}
    for key, name in names.items():
        time.sleep(1.0)
        r = sustained(timers[key], seconds, sampler)
        print(f"  sustained {name}: first {r['first_us']:.1f} us, settled {r['us']:.1f} us "
              f"({flops / r['us'] / 1e6:.0f} TFLOP/s), {r.get('mhz') or 0:.0f} MHz, "
              f"capped {r.get('capped') or 0:.2f}, {r.get('watts') or 0:.0f} W, "
              f"{r.get('mj') or 0:.3f} mJ/call", flush=True)
    sampler.stop()


def _forms(text: str) -> list:
    """``--triton-forms``: a JSON list, or the path of a file holding one."""
    if text.lstrip().startswith("["):
        return json.loads(text)
    with open(text) as f:
        return json.load(f)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-base",
                        help="the zoo model whose GEMMs are timed (e.g. llama-8b)")
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
    parser.add_argument("--triton-forms", metavar="JSON",
                        help="the Triton form's configs to time (a JSON list or a file of one; "
                        "default: TRITON_FORMS)")
    parser.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                        help="also run cuBLAS and each form alone for SECONDS: settled time, "
                        "SM clock and power (NVML)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    tiles = args.tiles and parse_tiles(args.tiles)
    rows = run(args.batch, args.seq, args.no_hoist, not args.separate, args.ptxas,
               args.fold_norms, args.only, tiles, not args.no_triton, args.model,
               args.triton_forms and _forms(args.triton_forms), args.sustained)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
