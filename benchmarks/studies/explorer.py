"""The fusion explorer against the exact plan and the greedy rule, on the built cases and on
random blocks (issue 50). CPU only: plans are scored by the delta-evaluator.

    python benchmarks/studies/explorer.py [--random N] [--ops K]
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
    args = parser.parse_args(argv)
    hw = HardwareModel.from_target({"kind": "cuda", "arch": "sm_90a"})
    print(f"{'case':26s} {'explorer':>9s} {'optimum':>9s} {'greedy':>9s}  kernels e/o/g  "
          "explorer ms  optimum ms")
    for name, make in cases.CASES.items():
        graph = make()
        t0 = time.perf_counter()
        plan = fusion.explore(graph, hw)
        t1 = time.perf_counter()
        best = ilp.optimum(graph, hw)
        t2 = time.perf_counter()
        greedy = fusion.greedy(graph, hw)
        print(f"{name:26s} {plan.value:9.2f} {best.value:9.2f} {greedy.value:9.2f}  "
              f"{plan.kernels(graph)}/{best.kernels(graph)}/{greedy.kernels(graph)}"
              f"{(t1 - t0) * 1e3:16.1f} {(t2 - t1) * 1e3:11.1f}")
    ratios, greedy_ratios = [], []
    for seed in range(args.random):
        graph = cases.random_graph(seed, args.ops)
        best = ilp.optimum(graph, hw).value
        if best <= 0:
            continue
        ratios.append(fusion.explore(graph, hw).value / best)
        greedy_ratios.append(fusion.greedy(graph, hw).value / best)
    exact = sum(r > 1 - 1e-9 for r in ratios)
    print(f"\n{len(ratios)} random blocks of {args.ops} ops (scores in µs saved): the explorer "
          f"scores the optimum on {exact} ({exact / len(ratios):.1%}), within 5% on "
          f"{sum(r >= 0.95 for r in ratios)}, worst {min(ratios):.3f}; the greedy rule on "
          f"{sum(r > 1 - 1e-9 for r in greedy_ratios)}, worst {min(greedy_ratios):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
