"""Where issue 50's item 3 would act on real models (CPU only): the explorer's plans of the
Hugging Face families' CUDA builds, searched for

* **recomputable producers**: a cheap op (light elementwise or broadcast) whose inputs all
  come from outside the block, read by a stitched pattern and by something else. Recomputing
  it in every reader drops its write; and where its inputs are smaller than its output (a
  broadcast), each reader reads less;
* **packing of different row counts**: two stitched patterns of the plan with no path between
  them and different row counts, which the greedy rule's packing (equal rows) leaves as two
  kernels (the explorer's packs them where :func:`~tvm_stitch.explore.fusion.packing_gain`
  says so, since 2026-11-30).

Recomputation itself is :func:`tvm_stitch.explore.fusion.recompute` (since 2026-11-30): this
study lists the candidates before it, whether or not it recomputes them.

    python benchmarks/studies/item3_instances.py [--only qwen3 gemma2 ...]

It wraps :func:`tvm_stitch.explore.fusion.explore` for the run and prints one line per
instance and a count per family.
"""

from __future__ import annotations

import argparse
from collections import Counter

from tvm_stitch.explore import fusion
from tvm_stitch.graph.classify import OpKind

CHEAP = (OpKind.LIGHT_ELEMWISE, OpKind.BROADCAST)


def instances(graph, plan) -> list[str]:
    """The item-3 instances of one block's plan, as lines."""
    owner = {i: n for n, p in enumerate(plan.patterns) for i in p.members}
    found = []
    for i, v in enumerate(graph.vertices):
        readers = graph.consumers[i]
        if v.kind not in CHEAP or v.inputs or len(readers) < 2:
            continue
        if any(owner.get(c) is not None for c in readers):
            found.append(f"recompute {v.name} ({v.kind.value}, {v.out_bytes} B from "
                         f"{sum(s for _, s in v.reads)} B): read by "
                         f"{[graph.vertices[c].name for c in readers]}")
    for a, p in enumerate(plan.patterns):
        for q in plan.patterns[a + 1:]:
            bits_p = sum(1 << i for i in p.members)
            bits_q = sum(1 << i for i in q.members)
            joined = any(graph.reach[i] & bits_q for i in p.members) or any(
                graph.reach[i] & bits_p for i in q.members)
            if not joined and p.rows != q.rows:
                names = [graph.vertices[min(x.members)].name for x in (p, q)]
                found.append(f"pack {names[0]} ({p.rows} rows) with {names[1]} ({q.rows} rows)")
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="these families (default: all)")
    args = parser.parse_args(argv)
    from tvm_stitch.benchmarks import hf_families

    counts: Counter = Counter()
    current = {"family": None}
    search = fusion.explore

    def explore(graph, hw, *rest, **kw):
        plan = search(graph, hw, *rest, **kw)
        for line in instances(graph, plan):
            print(f"  {current['family']}: {line}", flush=True)
            counts[current["family"], line.split()[0]] += 1
        return plan

    fusion.explore = explore
    names = args.only or list(hf_families.FAMILIES)
    try:
        for name in names:
            current["family"] = name
            hf_families.main(["--only", name])
    finally:
        fusion.explore = search
    for kind in ("recompute", "pack"):
        total = sum(n for (_, k), n in counts.items() if k == kind)
        where = sorted({f for (f, k) in counts if k == kind})
        print(f"{kind}: {total} instances in {len(where)} of {len(names)} families "
              f"{where if where else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
