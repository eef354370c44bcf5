"""Masks that skip work (issue 49, item 2): an attention whose folded mask is a band of
diagonals — causal, a sliding window, both — is recognized from the mask's values, compares
indices instead of reading the mask, and skips the key blocks outside each query block's band;
``mask_blocks=False`` reads every block (the dense-mask kernel)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm import relax
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.analysis.elem import Iter, Op, leaves, walk
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.families.attention.recognize import visible_logits
from tvm_stitch.frontend import import_torch
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload
from tvm_stitch.workloads.zoo import hidden_keys

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def _attention(mod):
    graph = build_graph(run_until(mod, CUDA, "StitchFuseMBCI"), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "attention"]
    return match


def _mask_reads(match):
    return [role for role in match.views if isinstance(role, tuple)]


@pytest.mark.parametrize(("causal", "window", "seq", "band"), [
    (1, 16, 70, (-15, 0)),  # Mistral's: the query and the 15 keys before it
    (0, 16, 70, (-8, 8)),  # ModernBERT's: 8 keys on either side
    (0, 5, 33, (-2, 2)),
    (1, 100, 70, (None, 0)),  # a window longer than the sequence: causal only
    (1, 0, 40, (None, 0)),
    (0, 0, 40, (None, None)),
])
def test_a_sliding_window_is_recognized_from_its_values(causal, window, seq, band):
    """The mask, built from ``arange`` comparisons inside ``forward`` and folded to a constant,
    is found to be the band ``window <= key - query <= causal``; the kernel compares indices
    instead of reading it, and inside the band the logits need no mask."""
    inst = get_workload("torch-attention").instance(
        "float16", batch=1, heads=2, seq=seq, dim=32, causal=causal, window=window)
    match = _attention(inst.mod)
    assert (match.window, match.causal) == band
    assert not _mask_reads(match)
    lo, hi = band
    offset = np.arange(seq)[None, :] - np.arange(seq)[:, None]
    seen = np.ones((seq, seq), bool)
    if lo is not None:
        seen &= offset >= lo
    if hi is not None:
        seen &= offset <= hi
    np.testing.assert_array_equal(seen, ~hidden_keys(seq, bool(causal), window).numpy())
    visible = visible_logits(match)
    if band == (None, None):
        assert visible is None
    else:
        assert any(isinstance(e, Iter) for e in walk(match.score))
        assert not any(isinstance(e, Iter) or (isinstance(e, Op) and e.op == "select")
                       for e in walk(visible))
        assert [x.key() for x in leaves(visible)] == [x.key() for x in leaves(match.score)]


class _Masked(torch.nn.Module):
    """``softmax(q·kᵀ/√d + mask)·v`` with ``mask`` a constant hiding ``hidden``."""

    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden

    def forward(self, q, k, v):
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        inf = torch.full(scores.shape[-2:], float("-inf"), dtype=q.dtype)
        return torch.softmax(scores + torch.where(self.hidden, inf, 0 * inf.nan_to_num()),
                             -1) @ v


@pytest.mark.parametrize("mask", ["documents", "diagonal hidden"])
def test_a_mask_that_is_no_band_or_hides_a_whole_row_skips_nothing(mask):
    """Block-diagonal documents are no band; a causal mask that hides the diagonal too leaves
    the first query no key (PyTorch's softmax of that row is NaN, not a skipped block): both
    keep the mask on every key block."""
    seq = 48
    i = torch.arange(seq)
    if mask == "documents":
        hidden = (i[:, None] // 20) != (i[None, :] // 20)
    else:
        hidden = i[None, :] >= i[:, None]
    q, k, v = (torch.randn(1, 2, seq, 32) for _ in range(3))
    imported = import_torch(_Masked(hidden), (q, k, v), "float16")
    match = _attention(imported.mod)
    assert match.window is None and match.causal is None
    assert visible_logits(match) is None


def _placeholder_builder(calls):
    from tvm import te

    def build(match, source, config, shapes):
        calls.append((match, source))
        ins = [te.placeholder(shapes[t][0], shapes[t][1], f"I{i}")
               for i, t in enumerate(source.inputs)]
        outs = [te.compute(shapes[t][0], lambda *_, t=t: tvm.tirx.const(0, shapes[t][1]))
                for t in source.outputs]
        return te.create_prim_func([*ins, *outs]), []

    return build


@pytest.mark.parametrize("mask_blocks", [True, False])
def test_mask_blocks_false_gives_the_dense_mask_kernel(tmp_path, mask_blocks):
    """FuseMBCI's kernel of a sliding window starts each query block's key loop at its window
    and splits it around the blocks seen whole; with ``mask_blocks=False`` one loop over every
    key block, the mask (index comparisons) on each."""
    inst = get_workload("torch-attention").instance(
        "float16", batch=1, heads=2, seq=130, dim=32, causal=1, window=40)
    calls = []
    with CUDA:
        FuseMBCI(TuningDatabase(tmp_path / "t.json"), _placeholder_builder(calls),
                 tune="model", mask_blocks=mask_blocks)(run_until(inst.mod, CUDA,
                                                                  "StitchFuseMBCI"))
    ((match, source),) = calls
    loops = source.text.count("for n0 in range(")
    if mask_blocks:
        assert (match.window, match.causal) == (-39, 0)
        assert "start = tl.maximum(pid_m * BLOCK_M - 39, 0)" in source.text and loops == 3
    else:
        assert (match.window, match.causal) == (None, None)
        assert "start" not in source.text and loops == 2  # whole blocks, then the last one


def test_the_window_kernels_skip_blocks_and_match_torch_under_the_interpreter():
    """The generated kernels of sliding windows (causal and on both sides, tiles square and
    not, sequences no tile divides) under Triton's interpreter: PyTorch's numbers; and with the
    first key block's K and V NaN, the query blocks whose window starts past it still give
    them (they never read it). A padding mask read at run time (sequences whole, a third
    shown, none): the key blocks past a sequence's last shown key are not read either, and a
    sequence showing none is computed over every key, as written."""
    pytest.importorskip("triton")
    script = Path(__file__).with_name("window_interpret_cases.py")
    cases = ["1,20,70,16,16", "0,20,70,32,16", "1,9,64,16,32", "0,40,64,16,16", "1,0,40,16,16"]
    padded = ["padded:40,16,16", "padded:64,32,16"]
    res = subprocess.run([sys.executable, str(script), *cases, *padded], capture_output=True,
                         text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, check=False,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    # with and without TMA loads, NaN keys or not; padded: NaN keys or not
    assert len(records) == 4 * len(cases) + 2 * len(padded)
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]
    skipped = [r for r in records if r["case"].endswith("NaN keys") and r.get("window")]
    assert len(skipped) == 8 and all(r["rows"] > 0 for r in skipped)
    assert sum("padded" in r["case"] and r["case"].endswith("NaN keys") for r in records) == 2


def test_a_window_built_for_llvm_matches_pytorch(tmp_path):
    """The stitch pipeline's module with the window's kernel as its TE reference (the
    recognized logits: index comparisons), run on llvm, gives PyTorch's numbers."""
    from tvm_stitch.codegen.te_reference import reference_func

    def build(match, source, config, shapes):
        return reference_func(match, source, shapes), []

    inst = get_workload("torch-attention").instance(
        "float32", batch=1, heads=2, seq=45, dim=24, causal=0, window=12)
    with CUDA:
        out = FuseMBCI(TuningDatabase(tmp_path / "t.json"), build, tune="model")(
            run_until(inst.mod, CUDA, "StitchFuseMBCI"))
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())[inst.func](
        *[tvm.runtime.tensor(a) for a in inst.args]).numpy()
    np.testing.assert_allclose(got, inst.reference()[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("family", "bands"), [
    ("mistral-window", [(-15, 0), (-15, 0)]),  # sliding_window=16
    ("modernbert", [(None, None), (-8, 8)]),  # a global layer, then a local one of 16 keys
])
def test_hugging_face_windows_are_found_however_the_model_spells_them(family, bands):
    """Mistral's sliding window (transformers' masking utilities) and ModernBERT's local
    layers (its own mask, one per sequence of the batch) are found from the folded values;
    no layer reads a mask, ModernBERT's global one neither (its mask hides nothing)."""
    from tvm_stitch.benchmarks.hf_families import build

    module, inputs = build(family, None)
    imported = import_torch(module, tuple(inputs), "float16")
    graph = build_graph(run_until(imported.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    matches = [m for m in recognize(graph).matches if m.family == "attention"]
    assert [(m.window, m.causal) for m in matches] == bands
    assert not any(_mask_reads(m) for m in matches)


def test_grouped_heads_written_as_llama_repeats_them_read_k_and_v_once_a_group():
    """``torch-attention`` with ``kv_heads`` (K and V repeated by ``expand`` and ``reshape``,
    LLaMA's ``repeat_kv``) is one attention over the K/V heads as given, four query heads
    each, with a sliding window too; llvm gives PyTorch's numbers."""
    for window in (0, 24):
        inst = get_workload("torch-attention").instance(
            "float16", batch=1, heads=8, kv_heads=2, seq=70, dim=32, causal=1, window=window)
        match = _attention(inst.mod)
        assert match.group == 4 and match.causal == 0
        assert match.window == (-23 if window else None)
        assert match.views["k"].shape[1] == 2  # read from the two K heads given
    ex = tvm.compile(inst.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())[inst.func](
        *[tvm.runtime.tensor(a) for a in inst.args]).numpy()
    np.testing.assert_allclose(got.astype("float32"), inst.reference()[0], rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(("name", "params", "lengths"), [
    ("hf-bert-tiny", {"batch": 2, "seq": 19, "layers": 1}, True),  # padding, every row alike
    ("torch-attention", {"batch": 2, "heads": 2, "seq": 40, "dim": 32, "causal": 0, "mask": 1},
     True),
    ("torch-attention", {"batch": 2, "heads": 2, "seq": 40, "dim": 32, "causal": 1, "mask": 1},
     False),  # padding and a causal mask: rows differ
    ("torch-attention", {"batch": 2, "heads": 2, "seq": 40, "dim": 32, "causal": 1}, False),
])
def test_a_padding_mask_read_at_run_time_bounds_the_key_loop(name, params, lengths):
    """Where the mask depends on the sequence and the key only, the kernel first finds the last
    key its sequence shows and runs its key loop up to that key's block; a mask that varies
    along the queries (causal and padded) or a constant band does not."""
    from tvm_stitch.codegen import triton_gen
    from tvm_stitch.families.attention.recognize import key_masked

    inst = get_workload(name).instance("float16", **params)
    match = _attention(inst.mod)
    assert key_masked(match) == lengths
    text = triton_gen.kernel_source(match).text
    assert ("hi = tl.where(shown == 0," in text) == lengths


@pytest.mark.parametrize(("name", "params", "band"), [
    ("torch-attention", {"causal": 1, "mask": 1}, (None, 0)),  # PyTorch's boolean mask
    ("torch-attention", {"causal": 1, "mask": 2}, (None, 0)),  # finfo.min filled
    ("torch-attention", {"causal": 0, "mask": 1}, None),  # padding only: no band
    ("llama", {}, (None, 0)),  # Hugging Face's mask, materialized by another kernel
    ("gpt2", {}, (None, 0)),
    ("mistral-window", {}, (-15, 0)),
    ("roberta", {}, None),  # an encoder's padding
])
def test_a_band_under_a_mask_read_at_run_time_is_found(name, params, band):
    """A causal mask (or sliding window) combined with a padding mask given at run time —
    PyTorch's boolean or filled masks, Hugging Face's ``attention_mask`` turned into a 4-D
    mask by another kernel — hides every key outside the band whatever the padding is: found
    by evaluating the logits for each way the run-time mask can decide its comparisons."""
    from tvm_stitch.benchmarks.hf_families import build

    from tvm_stitch.codegen import triton_gen

    if name == "torch-attention":
        mod = get_workload(name).instance("float16", batch=2, heads=2, seq=40, dim=32,
                                          **params).mod
    else:
        module, inputs = build(name, None, mask=True)
        mod = import_torch(module, tuple(inputs), "float16").mod
    graph = build_graph(run_until(mod, CUDA, "StitchFuseMBCI"), legalize=False)
    matches = [m for m in recognize(graph).matches if m.family == "attention"]
    assert matches and all(m.runtime_band == band for m in matches)
    assert all((m.causal, m.window) == (None, None) for m in matches)  # the mask is still read
    text = triton_gen.kernel_source(matches[0]).text
    assert ("if tl.min(" in text) == (band is not None)


def test_a_mask_read_at_run_time_that_varies_along_the_queries_gives_no_band():
    """A 4-D boolean mask given as an input may hide anything: no band, every block read."""
    import torch.nn.functional as F

    class Given(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q = torch.randn(2, 2, 24, 16)
    mask = torch.ones(2, 1, 24, 24, dtype=torch.bool).tril()
    mod = import_torch(Given(), (q, q, q, mask), "float16").mod
    assert _attention(mod).runtime_band is None


def test_a_band_under_a_run_time_mask_skips_blocks_under_the_interpreter():
    """Causal (and sliding-window) and padding masks in one, under Triton's interpreter:
    sequences whole, right padded, left padded and all padding give PyTorch's numbers (a
    block with a row that sees no key is computed over every key, as the dense kernel is);
    with K and V NaN past the first query block's diagonal, its rows in the first two
    sequences stay finite (skipped), and with the first key block NaN, so do the rows whose
    window starts past it. At the edges: logits scaled before a float16 fill (the test of a
    row that saw no key is in scores), and bands before or after whole query blocks (no read
    outside K and V)."""
    pytest.importorskip("triton")
    script = Path(__file__).with_name("window_interpret_cases.py")
    cases = ["runtime:40,16,16,1", "runtime:70,32,16,2", "runtime:64,16,32,2",
             "runtime:70,16,16,2,20", "runtime:64,32,16,1,9"]
    edges = ["edges:scaled,40,16,16", "edges:before,100,16,16", "edges:after,128,16,16"]
    res = subprocess.run([sys.executable, str(script), *cases, *edges], capture_output=True,
                         text=True, env={**os.environ, "TRITON_INTERPRET": "1"}, check=False,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    # the windows: their first keys NaN too; at the edges (a scaled fill, bands before and
    # after the rows), one run each
    assert len(records) == 2 * len(cases) + 2 + len(edges)
    assert all(r["ok"] for r in records), [r for r in records if not r["ok"]]


def test_the_values_a_run_time_input_is_tried_at_decide_each_comparison_as_any_value_can():
    """Cuts at -inf and 0: ``(v > -inf) & (v < 0)`` is true for a finite negative ``v``,
    which must be among the values tried; an input used in arithmetic gives none."""
    from tvm_stitch.analysis.elem import Const, Leaf
    from tvm_stitch.families.attention.recognize import _representatives

    v = Leaf("mask", (), "float32")
    both = Op("and", (Op("gt", (v, Const(float("-inf"), "float32")), "bool"),
                      Op("lt", (v, Const(0.0, "float32")), "bool")), "bool")
    values = np.array(_representatives(v, both))
    seen = {(bool(x > -np.inf), bool(x < 0)) for x in values}
    assert seen == {(False, True), (True, True), (True, False)}
    assert _representatives(v, Op("add", (v, Const(1.0, "float32")), "float32")) is None
    assert _representatives(v, v) is None


def test_index_variables_are_found_inside_selects():
    """``vars_in`` reads a select's condition and branches: an index that depends on the head
    only through a select still counts as depending on it."""
    from tvm.ir.prim import expr as P

    from tvm_stitch.graph.access import vars_in

    h, m, n = (tvm.tirx.Var(x, "int64") for x in "hmn")
    assert {v.name for v in vars_in(P.Select(h < 1, m - n, n - m))} == {"h", "m", "n"}


@pytest.mark.parametrize(("name", "window", "evaluations"), [
    ("llama", None, 1),  # two layers reading one mask: evaluated once
    ("gemma2", 8, 2),  # a sliding window of 8 then global attention: two structures
])
def test_a_run_time_band_is_evaluated_once_per_structure(name, window, evaluations,
                                                         monkeypatch):
    """Layers whose logits have the same structure (a decoder's, reading one mask) share one
    evaluation of the band; layers of another structure (Gemma-2's sliding-window layers
    beside its global ones) get their own, the same band as each would alone."""
    from tvm_stitch.benchmarks import hf_families

    from tvm_stitch.families.attention import recognize as attention

    if window:
        cfg_cls, model_cls, config, kind = hf_families.FAMILIES[name]
        monkeypatch.setitem(hf_families.FAMILIES, name,
                            (cfg_cls, model_cls, {**config, "sliding_window": window}, kind))
    module, inputs = hf_families.build(name, None, mask=True)
    mod = import_torch(module, tuple(inputs), "float16").mod
    pre = run_until(mod, CUDA, "StitchFuseMBCI")
    evaluated = attention._evaluated_band
    calls = []
    monkeypatch.setattr(attention, "_evaluated_band",
                        lambda *a: calls.append(a) or evaluated(*a))
    shared = [m.runtime_band for m in recognize(build_graph(pre, legalize=False)).matches
              if m.family == "attention"]
    assert len(calls) == evaluations and len(shared) == 2
    alone = []
    for graph_match in range(2):  # each layer's band with nothing remembered
        attention._RUNTIME_BANDS.clear()
        graph = build_graph(pre, legalize=False)
        found = [m for m in recognize(graph).matches if m.family == "attention"]
        attention._RUNTIME_BANDS.clear()
        alone.append(attention.runtime_band(graph, found[graph_match]))
    assert shared == alone and shared[0] is not None
    assert len(set(shared)) == evaluations  # Gemma-2's two bands differ
