"""The fusion explorer against the exact plan and the greedy rule, on the built cases and on
random blocks (issue 50); with ``--pipeline``, the CUDA fusion reports of the zoo's models and
the Hugging Face families with ``explore="search"`` against ``"greedy"``. CPU only: plans are
scored by the delta-evaluator, reports count kernels and estimated bytes.

    python benchmarks/studies/explorer.py [--random N] [--ops K] [--pipeline]
"""

from __future__ import annotations

import argparse
import time

from tvm_stitch.explore import cases, fusion, ilp
from tvm_stitch.hardware import HardwareModel


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=int, default=200, help="random blocks")
    parser.add_argument("--ops", type=int, default=12, help="ops of a random block")
    parser.add_argument("--pipeline", action="store_true",
                        help="also the zoo's and the families' fusion reports, both ways")
    args = parser.parse_args(argv)
    hw = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
    print(f"{'case':26s} {'explorer':>9s} {'optimum':>9s} {'greedy':>9s} {'recomp.':>9s}  "
          "kernels e/o/g  explorer ms  optimum ms")
    for name, make in cases.CASES.items():
        graph = make()
        t0 = time.perf_counter()
        plan = fusion.explore(graph, hw)
        t1 = time.perf_counter()
        best = ilp.optimum(graph, hw)
        t2 = time.perf_counter()
        greedy = fusion.greedy(graph, hw)
        redone = fusion.recompute(graph, plan, hw).value  # the explorer's, then recomputation
        print(f"{name:26s} {plan.value:9.2f} {best.value:9.2f} {greedy.value:9.2f} "
              f"{redone:9.2f}  "
              f"{plan.kernels(graph)}/{best.kernels(graph)}/{greedy.kernels(graph)}"
              f"{(t1 - t0) * 1e3:16.1f} {(t2 - t1) * 1e3:11.1f}")
    ratios, greedy_ratios, recomputed = [], [], []
    for seed in range(args.random):
        graph = cases.random_graph(seed, args.ops)
        best = ilp.optimum(graph, hw)
        if best.value <= 0:
            continue
        plan = fusion.explore(graph, hw)
        ratios.append(plan.value / best.value)
        greedy_ratios.append(fusion.greedy(graph, hw).value / best.value)
        redone = fusion.recompute(graph, plan, hw)
        if redone.recomputed:
            recomputed.append(redone.value / fusion.recompute(graph, best, hw).value)
    exact = sum(r > 1 - 1e-9 for r in ratios)
    if ratios:
        print(f"\n{len(ratios)} random blocks of {args.ops} ops (scores in µs saved): the "
              f"explorer scores the optimum on {exact} ({exact / len(ratios):.1%}), within 5% "
              f"on {sum(r >= 0.95 for r in ratios)}, worst {min(ratios):.3f}; the greedy rule "
              f"on {sum(r > 1 - 1e-9 for r in greedy_ratios)}, worst {min(greedy_ratios):.3f}")
    if recomputed:
        print(f"recomputation adds to the explorer's plan on {len(recomputed)}; against the "
              f"optimum's plan recomputed: worst {min(recomputed):.3f}, best {max(recomputed):.3f}")
    return _pipeline() if args.pipeline else 0


def _pipeline() -> int:
    """Fusion reports (sm_90a, cost-model tiles, no Triton families) both ways; 1 where the
    explorer's plan has more kernels or more bytes than the greedy rule's anywhere."""
    import tvm
    from tvm_stitch.benchmarks.hf_families import FAMILIES, build

    from tvm_stitch.frontend import import_torch
    from tvm_stitch.report import fusion_report
    from tvm_stitch.workloads import WORKLOADS, get_workload

    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    models = [(name, lambda name=name: get_workload(name).instance(
        "float16", **({"layers": 1} if name.endswith(("-base", "-large")) else {})).mod)
        for name in WORKLOADS if name != "llama-8b"]

    def family(name):
        model, inputs = build(name, None)
        return import_torch(model, tuple(inputs), "float16").mod

    models += [(name, lambda name=name: family(name)) for name in FAMILIES]
    worse = []
    print(f"\n{'model':20s} {'greedy':>18s} {'explorer':>18s}")
    for name, make in models:
        mod = make()
        reports = [fusion_report(mod, cuda, tune="model", mcfuser=(), explore=e)
                   for e in ("greedy", "search")]
        (gk, gb), (sk, sb) = ((r.kernels, r.bytes) for r in reports)
        mark = "" if (sk, sb) == (gk, gb) else " fewer" if sk <= gk and sb <= gb else " MORE"
        worse += [name] if mark == " MORE" else []
        print(f"{name:20s} {gk:5d} k {gb / 1e6:8.3f} MB {sk:5d} k {sb / 1e6:8.3f} MB{mark}",
              flush=True)
    print("more kernels or bytes with the explorer:", worse or "none")
    return 1 if worse else 0


if __name__ == "__main__":
    raise SystemExit(main())
