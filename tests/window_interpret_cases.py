"""Attention with a sliding window under Triton's interpreter: numerics against torch, and the
key blocks outside the window never read.

Run with TRITON_INTERPRET=1 (``tests/test_attention_windows.py`` runs it in a subprocess and
reads the JSON lines it prints). Each case is ``causal,window,seq,BLOCK_M,BLOCK_N``: the
``torch-attention`` workload in float32 with that mask, its generated kernel run by the
interpreter with those tiles (and with TMA loads where the kernel has them) on random Q, K, V,
then again with K and V of the first ``BLOCK_N`` keys NaN: the rows whose query blocks skip
that key block must come out finite and equal, which they cannot if the block is read (its
probabilities are 0, and 0 · NaN is NaN).
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
from tvm_stitch.codegen import kernel_text, triton_gen  # noqa: E402
from tvm_stitch.graph import build_graph  # noqa: E402
from tvm_stitch.pipeline import run_until  # noqa: E402
from tvm_stitch.workloads import get_workload  # noqa: E402
from tvm_stitch.workloads.zoo import hidden_keys  # noqa: E402

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def case(causal: int, window: int, seq: int, bm: int, bn: int) -> None:
    inst = get_workload("torch-attention").instance(
        "float32", batch=1, heads=2, seq=seq, dim=32, causal=causal, window=window)
    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    source = triton_gen.kernel_source(match)
    fn = triton_gen.load(source)
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a)) for a in inst.args[:3])
    hidden = hidden_keys(seq, bool(causal), window)
    scores = (q @ k.transpose(-1, -2) / 32**0.5).masked_fill(hidden, float("-inf"))
    want = torch.softmax(scores, -1) @ v
    lo = match.window
    # query blocks whose first row's window starts past the first key block skip it
    skipping = [r for r in range(seq) if lo is not None and (r // bm * bm + lo) // bn >= 1]
    poisoned = [t.clone() for t in (k, v)]
    for t in poisoned:
        t[..., :bn, :] = float("nan")
    for tma in ([False, True] if source.tma else [False]):
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, **source.constexprs, "DOT_PREC": "ieee"}
        if source.tma:
            consts["TMA"] = tma
        consts = {n: c for n, c in consts.items() if n in fn.arg_names}
        for label, (kk, vv) in (("", (k, v)), (" NaN keys", poisoned)):
            got = torch.zeros(want.shape, dtype=torch.float32)
            args = {"q": q, "k": kk, "v": vv}
            ordered = [args[role] for role in _roles(match, source)]
            descs = kernel_text.torch_descriptors(source, {"TMA": tma}, consts, ordered, [got])
            fn[source.grid(consts, match)](*ordered, got, **descs, **consts)
            rows = slice(None) if not label else skipping
            err = float((got[..., rows, :] - want[..., rows, :]).abs().max()) if (
                label == "" or skipping) else 0.0
            ok = bool(err <= 1e-4 and torch.isfinite(got[..., rows, :]).all())
            print(json.dumps({
                "case": f"{match.describe()} {bm}x{bn}{' tma' if tma else ''}{label}",
                "window": match.window, "causal": match.causal, "rows": len(skipping)
                if label else seq, "max_err": err, "ok": ok}), flush=True)


def _roles(match, source):
    """``q``/``k``/``v`` in the order of the kernel's inputs."""
    by_tensor = {match.views[r].tensor: r for r in ("q", "k", "v")}
    return [by_tensor[t] for t in source.inputs]


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        case(*map(int, spec.split(",")))
