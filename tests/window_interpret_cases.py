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




def padded(seq: int, bm: int, bn: int) -> None:
    """Hugging Face BERT-tiny's attention (a padding mask read at run time) with sequences of
    different lengths, one all padding: PyTorch-like numbers (its TE reference), and with K and
    V NaN past each sequence's last shown key's block, the same (those blocks are skipped)."""
    from tvm_stitch.codegen.te_reference import reference_func

    inst = get_workload("hf-bert-tiny").instance("float32", batch=3, seq=seq, layers=1)
    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    source = triton_gen.kernel_source(match)
    fn = triton_gen.load(source)
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
              for t in [*source.inputs, *source.outputs]}
    rng = np.random.default_rng(0)
    lengths = [seq, seq // 3, 0]  # whole, a third, none shown
    inputs = {}
    operands = {match.views[r].tensor for r in ("q", "k", "v")}
    for t in source.inputs:
        shape, dtype = shapes[t]
        if t not in operands:  # the padding mask
            mask = np.zeros(shape, dtype)
            for b, length in enumerate(lengths):
                mask[b, :length] = 1
            inputs[t] = mask
        else:
            inputs[t] = (rng.standard_normal(shape) * 0.5).astype(dtype)
    ref_func = reference_func(match, source, shapes)
    ex = tvm.compile(tvm.IRModule({"main": ref_func}), target="llvm")
    out = tvm.runtime.tensor(np.zeros(*shapes[source.outputs[0]]))
    ex["main"](*[tvm.runtime.tensor(inputs[t]) for t in source.inputs], out)
    want = torch.from_numpy(out.numpy())
    ext = match.frame.extents
    first = -(-lengths[1] // bn) * bn  # the second sequence's blocks past its last shown key
    for label in ("", " NaN keys"):
        args = {t: torch.from_numpy(a.copy()) for t, a in inputs.items()}
        for role, inner in (("k", "k"), ("v", "d")) if label else ():
            view = match.views[role]
            flat = args[view.tensor].view(-1)
            st = view.stride
            h, n_, e = np.meshgrid(np.arange(ext.get("h", 1)), np.arange(first, seq),
                                   np.arange(ext[inner]), indexing="ij")
            at = (view.offset + st.get("b", 0) + h * st.get("h", 0) + n_ * st.get("n", 0)
                  + e * st.get(inner, 0))
            flat[torch.from_numpy(at.reshape(-1))] = float("nan")
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, **source.constexprs, "DOT_PREC": "ieee",
                  "TMA": False}
        consts = {k: c for k, c in consts.items() if k in fn.arg_names}
        got = torch.zeros(want.shape, dtype=torch.float32)
        fn[source.grid(consts, match)](*[args[t] for t in source.inputs], got, **consts)
        # the output's rows by sequence: (sequences, queries, ...)
        rows = got.reshape(len(lengths), seq, -1)[1] if label else got
        ref = want.reshape(len(lengths), seq, -1)[1] if label else want
        err = float((rows - ref).abs().max())
        print(json.dumps({"case": f"{match.describe()} padded {bm}x{bn}{label}",
                          "max_err": err, "ok": bool(err <= 1e-4
                                                     and torch.isfinite(rows).all())}),
              flush=True)


def runtime(seq: int, bm: int, bn: int, fill: int, window: int = 0) -> None:
    """A causal mask (with a sliding ``window`` too) and a padding mask read at run time in
    one (``torch-attention`` with ``mask=fill``: 1, PyTorch's boolean mask; 2, a ``finfo.min``
    fill): sequences whole, right padded, left padded (its first rows see no key) and all
    padding give PyTorch's numbers; with K and V NaN past the first query block's diagonal
    block, that block's rows of the first two sequences still do (they skip it), and with the
    first key block NaN, so do the first sequence's rows whose window starts past it, where
    the others are computed over every key as written."""
    inst = get_workload("torch-attention").instance(
        "float32", batch=4, heads=2, seq=seq, dim=32, causal=1, mask=fill, window=window)
    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    lo = 1 - window if window else None
    assert match.runtime_band == (lo, 0), match.runtime_band
    source = triton_gen.kernel_source(match)
    fn = triton_gen.load(source)
    keys = np.ones((4, seq), bool)
    keys[1, seq - seq // 3:] = False  # right padding
    keys[2, :seq // 3] = False  # left padding: its first rows see no key
    keys[3] = False
    q, k, v = (torch.from_numpy(np.ascontiguousarray(a)) for a in inst.args[:3])
    mask = torch.from_numpy(keys)
    with torch.no_grad():
        want = inst.torch_fns["eager"]("cpu", torch.float32)(q, k, v, mask)
    operands = {match.views[r].tensor: r for r in ("q", "k", "v")}
    poison = -(-bm // bn) * bn  # the first query block's loop ends at this key
    late = [r for r in range(seq) if lo is not None and (r // bm * bm + lo) // bn >= 1]
    checks = [("", slice(None), None), (" NaN keys", (slice(0, 2), slice(None), slice(0, bm)),
                                        slice(poison, None))]
    if late:
        checks.append((" NaN first keys", (0, slice(None), late), slice(0, bn)))
    for label, rows, poisoned in checks:
        tensors = {"q": q, "k": k.clone(), "v": v.clone()}
        if poisoned is not None:
            for t in ("k", "v"):
                tensors[t][..., poisoned, :] = float("nan")
        args = [tensors[operands[t]] if t in operands else mask.to(
            getattr(torch, str(graph.tensors[t].dtype))) for t in source.inputs]
        consts = {"BLOCK_M": bm, "BLOCK_N": bn, **source.constexprs, "DOT_PREC": "ieee",
                  "TMA": False}
        consts = {n: c for n, c in consts.items() if n in fn.arg_names}
        got = torch.zeros(want.shape, dtype=torch.float32)
        fn[source.grid(consts, match)](*args, got, **consts)
        err = float((got[rows] - want[rows]).abs().max())
        print(json.dumps({"case": f"{match.describe()} fill {fill} {bm}x{bn}{label}",
                          "max_err": err, "ok": bool(err <= 1e-4
                                                     and torch.isfinite(got[rows]).all())}),
              flush=True)


def edges(kind: str, seq: int, bm: int, bn: int) -> None:
    """Bands under a run-time mask at their limits (found in review): ``scaled``, logits
    scaled by 4 before a -65504 fill with left padding (the kernel's logits are not the
    scores: its test of a row that saw no key is in scores); ``before``, ``tril(-64)``, and
    ``after``, ``triu(40)``, bands that leave whole query blocks with no key (the loops stay
    inside the keys: K and V lie between NaN, which any read outside would bring in)."""
    import torch.nn.functional as F

    from tvm_stitch.frontend import import_torch

    class Edge(torch.nn.Module):
        def forward(self, q, k, v, mask):
            n = q.shape[-2]
            ones = torch.ones(n, n, dtype=torch.bool)
            if kind == "scaled":
                scores = (q @ k.transpose(-1, -2)) * 4.0
                scores = torch.where(mask[:, None, None, :] & ones.tril(), scores, -65504.0)
                return torch.softmax(scores, dim=-1) @ v
            band = ones.tril(-64) if kind == "before" else ones.triu(40)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :]
                                                  & band)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, seq, 16) for _ in range(3))
    keys = torch.ones(2, seq, dtype=torch.bool)
    keys[1, :seq // 2] = False  # left padding
    graph = build_graph(run_until(import_torch(Edge(), (q, k, v, keys), "float32").mod, CUDA,
                                  "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    source = triton_gen.kernel_source(match)
    fn = triton_gen.load(source)

    def between_nan(x):
        room = torch.full((x.numel() + 8192,), float("nan"))
        room[4096:4096 + x.numel()] = x.reshape(-1)
        return room[4096:4096 + x.numel()].view(x.shape)

    tensors = {"q": q, "k": between_nan(k), "v": between_nan(v)}
    operands = {match.views[r].tensor: r for r in ("q", "k", "v")}
    args = [tensors[operands[t]] if t in operands else keys.to(
        getattr(torch, str(graph.tensors[t].dtype))) for t in source.inputs]
    consts = {"BLOCK_M": bm, "BLOCK_N": bn, **source.constexprs, "DOT_PREC": "ieee",
              "TMA": False}
    consts = {n: c for n, c in consts.items() if n in fn.arg_names}
    got = torch.zeros(2, 2, seq, 16)
    fn[source.grid(consts, match)](*args, got, **consts)
    with torch.no_grad():
        want = Edge()(q, k, v, keys)
    err = float((got - want).abs().max())
    print(json.dumps({"case": f"{match.describe()} {kind} {bm}x{bn}", "band":
                      match.runtime_band, "max_err": err,
                      "ok": bool(err <= 1e-4 and torch.isfinite(got).all())}), flush=True)


if __name__ == "__main__":
    for spec in sys.argv[1:]:
        if spec.startswith("padded:"):
            padded(*map(int, spec[len("padded:"):].split(",")))
        elif spec.startswith("edges:"):
            kind, *sizes = spec[len("edges:"):].split(",")
            edges(kind, *map(int, sizes))
        elif spec.startswith("runtime:"):
            runtime(*map(int, spec[len("runtime:"):].split(",")))
        else:
            case(*map(int, spec.split(",")))
