"""Models as users bring them: the zoo through recognition, the stitch pipeline and PyTorch.

Every zoo model (tiny sizes) is imported from ``transformers`` exactly as ``from_torch`` does.
On the CPU: the stitch pipeline builds it for llvm and matches PyTorch; every recognized kernel,
substituted by its TE reference, still matches PyTorch; the fusion report for a CUDA target lists
one kernel per attention and per Linear layer with its epilogue; the generated Triton kernels
match their references under Triton's interpreter.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.analysis.elem import Iter, Op, leaves, walk
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.codegen.te_reference import reference_func
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.families.attention.recognize import visible_logits
from tvm_stitch.graph import build_graph
from tvm_stitch.library import prepare_args
from tvm_stitch.pipeline import num_input, run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})

#: model -> (shape parameters, layers, kernels per layer by family and products/segments)
ZOO = {
    "hf-bert-tiny": ({"batch": 2, "seq": 19}, 2),
    "gpt2-tiny": ({"seq": 33}, 2),
    "llama-tiny": ({"seq": 33}, 2),
    "vit-tiny": ({}, 2),
}
#: kernels of one layer: (family, segments, products per segment)
PER_LAYER = {
    # attention, Q/K/V in one kernel, output projection + residual, FFN in + GELU, FFN out
    "hf-bert-tiny": [("attention", 1, 1), ("gemm", 3, 1), ("gemm", 1, 1), ("gemm", 1, 1),
                     ("gemm", 1, 1)],
    # GPT-2's c_attn is one Linear already
    "gpt2-tiny": [("attention", 1, 1), ("gemm", 1, 1), ("gemm", 1, 1), ("gemm", 1, 1),
                  ("gemm", 1, 1)],
    # grouped K/V heads; gate and up projections computed together, SiLU(gate)·up their epilogue
    "llama-tiny": [("attention", 1, 1), ("gemm", 3, 1), ("gemm", 1, 1), ("gemm", 1, 2),
                   ("gemm", 1, 1)],
    "vit-tiny": [("attention", 1, 1), ("gemm", 3, 1), ("gemm", 1, 1), ("gemm", 1, 1),
                 ("gemm", 1, 1)],
}


@functools.cache
def instance(name, dtype):
    params, _ = ZOO[name]
    return get_workload(name).instance(dtype, **params)


def legalized(mod):
    """``mod`` as FuseMBCI sees it in the stitch pipeline for the H100."""
    return run_until(mod, CUDA, "StitchFuseMBCI")


def run_llvm(mod, inst):
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    out = vm[inst.func](*[tvm.runtime.tensor(a) for a in inst.args])
    return out.numpy().astype("float32")


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_builds_on_llvm_and_matches_pytorch(name):
    """The stitch pipeline for llvm (TVM's default pipeline fails on GPT-2 and LLaMA there)."""
    inst = instance(name, "float32")
    np.testing.assert_allclose(run_llvm(inst.mod, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_recognition_per_layer(name):
    inst = instance(name, "float16")
    graph = build_graph(legalized(inst.mod), legalize=False)
    found = recognize(graph)
    _, layers = ZOO[name]
    kernels = Counter(
        (m.family, len(m.segments) or 1, max((len(s.products) for s in m.segments), default=1))
        for m in found.matches
    )
    assert kernels == Counter({k: v * layers for k, v in Counter(PER_LAYER[name]).items()})
    # the layers share their kernels (names, PrimFuncs, tuning records), whatever the graph
    # calls their tensors; the first layer's residual may come from the embeddings in another
    # shape (LLaMA)
    names = {kernel_source(m).name for m in found.matches}
    assert len(names) <= len(PER_LAYER[name]) + 1, sorted(names)


@pytest.mark.parametrize(("name", "dtype"), [(n, "float32") for n in ZOO] + [
    ("llama-tiny", "float16"), ("hf-bert-tiny", "float16"), ("gpt2-tiny", "float16")])
@pytest.mark.parametrize("fold", ["", "folded", "through"])
def test_zoo_kernels_mean_what_the_model_means(tmp_path, caplog, name, dtype, fold):
    """Every recognized kernel replaced by its TE reference: still PyTorch's numbers — also
    with every normalization read only by GEMMs folded into them (``fold_norms``), and folded
    through their weights where they read it as ``A`` (with ``join_weights``: the scaled
    weights and column sums computed by the module before the kernels)."""
    inst = instance(name, dtype)
    calls = []

    def build(match, source, config, shapes):
        calls.append("through" if match.derived else
                     match.family if match.prologue is None else "normalized")
        return reference_func(match, source, shapes), []

    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        mod = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build, fold_norms=bool(fold),
                       lift_params=fold == "through")(legalized(inst.mod))
    assert "attention" in calls and "gemm" in calls
    # every zoo model has a norm before a GEMM
    assert ("normalized" in calls) == (fold == "folded")
    assert ("through" in calls) == (fold == "through")
    assert "left to TVM" not in caplog.text  # every kernel was built and put in place
    assert mod.script().count("R.call_tir(cls.stitch_") >= len(calls)
    np.testing.assert_allclose(run_llvm(mod, inst), inst.reference()[0], *inst.tolerance)


#: families outside the zoo (tiny configs): other spellings of attention (DistilBERT's, OPT's
#: biased projections), grouped K/V heads with RMSNorm (Qwen2), Gemma's 1+γ RMSNorm and
#: tanh-GELU gate
MORE = {
    "distilbert": ("DistilBertModel", "DistilBertConfig",
                   dict(dim=96, n_layers=2, n_heads=3, hidden_dim=192, vocab_size=500)),
    "opt": ("OPTModel", "OPTConfig",
            dict(hidden_size=96, ffn_dim=192, num_hidden_layers=2, num_attention_heads=3,
                 vocab_size=500, word_embed_proj_dim=96)),
    "qwen2": ("Qwen2Model", "Qwen2Config",
              dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=500)),
    "gemma": ("GemmaModel", "GemmaConfig",
              dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=2, num_key_value_heads=1, head_dim=64, vocab_size=500)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MORE))
def test_more_models_mean_what_they_mean(tmp_path, name):
    """Models no zoo test was written for, float16, norms folded through the weights: their
    attention and GEMMs recognized, every kernel replaced by its TE reference, PyTorch's
    numbers."""
    from tvm_stitch.workloads.zoo import ZooModel, _token_ids, zoo_workload

    cls, cfg_cls, cfg = MORE[name]
    model = ZooModel(name=name, model_class=cls, config_class=cfg_cls, configs={"tiny": cfg},
                     inputs=_token_ids, defaults={"batch": 1, "seq": 16}, flops=lambda *_: 0,
                     kwargs={} if "Bert" in cls else {"use_cache": False})
    inst = zoo_workload(model, "tiny").instance("float16", batch=2, seq=13)
    calls = []

    def build(match, source, config, shapes):
        calls.append("through" if match.derived else match.family)
        return reference_func(match, source, shapes), []

    with CUDA:
        mod = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build, fold_norms=True,
                       lift_params=True)(legalized(inst.mod))
    assert {"attention", "gemm", "through"} <= set(calls)
    np.testing.assert_allclose(run_llvm(mod, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(ZOO))
def test_pytorchs_attention_kernel_is_recognized_like_eager_attention(tmp_path, name):
    """The zoo (and HF BERT) built with transformers' default attention, SDPA,
    which PyTorch decomposes to Q and K each scaled by √scale and a safe softmax (a second
    reduction over the logits zeroes rows with no visible key): as many kernels as the eager
    spelling, one attention kernel a layer, and those kernels replaced by their TE references
    give PyTorch's numbers."""
    params, layers = ZOO[name]
    sdpa = get_workload(name).instance("float16", sdpa=1, **params)
    eager = instance(name, "float16")
    assert "sdpa" in sdpa.name
    assert (tvm_stitch.fusion_report(sdpa.mod, CUDA).kernels
            == tvm_stitch.fusion_report(eager.mod, CUDA).kernels)
    calls = []

    def build(match, source, config, shapes):
        calls.append((match.family, match.zero_empty_rows))
        return reference_func(match, source, shapes), []

    with CUDA:
        mod = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build)(legalized(sdpa.mod))
    assert ("attention", True) in calls
    assert mod.script().count("R.call_tir(cls.stitch_attention") == layers
    np.testing.assert_allclose(run_llvm(mod, sdpa), sdpa.reference()[0], *sdpa.tolerance)


@pytest.mark.parametrize("causal", [0, 1])
def test_a_sequence_with_no_visible_key_gives_zeros(tmp_path, causal):
    """``scaled_dot_product_attention`` with a boolean key mask (joined with a causal one by
    ``&``), one sequence all padding: its rows have no finite logit, and PyTorch's safe softmax
    gives them zeros where a plain softmax gives NaN.  The recognized kernel (its TE reference)
    gives PyTorch's numbers, zeros included."""
    inst = get_workload("torch-attention").instance(
        "float32", batch=3, heads=2, seq=21, dim=40, causal=causal, mask=1)
    matches = []

    def build(match, source, config, shapes):
        matches.append(match)
        return reference_func(match, source, shapes), []

    with CUDA:
        mod = FuseMBCI(TuningDatabase(tmp_path / "db.json"), build)(legalized(inst.mod))
    assert [(m.family, m.zero_empty_rows) for m in matches] == [("attention", True)]
    ref = inst.reference()[0]
    assert not ref[-1].any() and np.isfinite(ref).all()  # the padded sequence: zeros
    np.testing.assert_allclose(run_llvm(mod, inst), ref, *inst.tolerance)


@pytest.mark.parametrize("name", list(ZOO))
def test_cuda_fusion_report_on_a_cpu(name, tmp_path, monkeypatch):
    """The kernels the GPU host will build, listed on this machine: per layer one attention
    kernel and one kernel per Linear layer with its epilogue, no product left to TVM."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    inst = instance(name, "float16")
    report = tvm_stitch.fusion_report(inst.mod, CUDA)
    _, layers = ZOO[name]
    opaque = [g for g in report.groups if g.kinds == ["opaque"]]
    assert len(opaque) == len(PER_LAYER[name]) * layers
    # no matrix product left to TVM (stitched patterns are memory-intensive; ViT's patch
    # embedding is a convolution)
    left = [g.func for g in report.groups if "compute-intensive" in g.kinds]
    assert not [f for f in left if not f.startswith("stitched_") and "conv" not in f], left
    default = tvm_stitch.fusion_report(inst.mod, CUDA, "default")
    assert report.kernels < default.kernels * 0.6


#: kernels fold_norms saves on the two-layer models: every norm but the model's last (its output)
#: — two per layer — except BERT's embeddings LayerNorm (its position embeddings are read
#: modulo the sequence: no strided view over the flattened rows); in GPT-2 the embeddings' sum,
#: which shared the first LayerNorm's kernel, is left on its own, and reads the position
#: embeddings' rows as a slice (a gather of rows 0..n-1, canonicalized): that gather's kernel
#: goes too
SAVED = {"hf-bert-tiny": 3, "gpt2-tiny": 4, "llama-tiny": 4, "vit-tiny": 4}


@pytest.mark.parametrize("name", list(ZOO))
def test_folded_norms_leave_the_kernel_list(name, tmp_path, monkeypatch):
    """With ``fold_norms`` every LayerNorm / RMSNorm read only by GEMMs is computed inside them:
    two kernels fewer per layer, the same generated kernels otherwise (CUDA report, CPU)."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    inst = instance(name, "float16")
    _, layers = ZOO[name]
    plain = tvm_stitch.fusion_report(inst.mod, CUDA)
    folded = tvm_stitch.fusion_report(inst.mod, CUDA, fold_norms=True)
    opaque = [len([g for g in r.groups if g.kinds == ["opaque"]]) for r in (plain, folded)]
    assert opaque[0] == opaque[1] == len(PER_LAYER[name]) * layers
    assert plain.kernels - folded.kernels == SAVED[name]


@pytest.mark.slow
def test_generated_kernels_under_the_interpreter(tmp_path):
    """The Triton text of every distinct kernel against its TE reference (irregular shapes)."""
    script = Path(__file__).with_name("generated_interpret_cases.py")
    env = {**os.environ, "TRITON_INTERPRET": "1", "TVM_STITCH_CACHE": str(tmp_path)}
    # the last two: sequences a multiple of 128 and power-of-two heads, and GEMMs of 256 rows and
    # 512 columns, printed without bounds checks along those axes
    # (fold=1: also the GEMMs with the LayerNorm / RMSNorm before them folded in; programs=1:
    # only those writing or reading moments, in pieces of whole 128-column rows; sdpa=1:
    # transformers' default attention; mask=1: a boolean key mask, whose first sequence the
    # cases' inputs hide entirely; in float16, Q, K and V read through their float32 copies;
    # mask=2: that mask filling the logits with finfo(float32).min, which log2 e would scale
    # to -inf: a NaN in rows with no key visible before the softmax took differences first)
    specs = ["bert-tiny:float32:batch=2,seq=19,fold=1", "llama-tiny:float16:seq=33,fold=1",
             "bert-tiny:float16:batch=2,seq=19,fold=1,programs=1",
             "gpt2-tiny:float16:seq=33,sdpa=1",
             "torch-attention:float32:batch=2,heads=2,seq=33,dim=48,causal=1,mask=1",
             "torch-attention:float16:batch=2,heads=2,seq=40,dim=24,causal=0,mask=1",
             "torch-attention:float16:batch=1,heads=2,seq=128,dim=32,causal=1",
             "torch-attention:float32:batch=2,heads=2,seq=33,dim=48,causal=1,mask=2",
             "bert-tiny:float16:batch=2,seq=128"]
    res = subprocess.run([sys.executable, str(script), *specs], capture_output=True, text=True,
                         env=env, check=False, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    assert len(records) >= 15
    bad = [r for r in records if not r["ok"]]
    assert not bad, bad


# -- on the GPU: the generated kernels inside TVM executables ----------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize(("name", "params"), [
    ("hf-bert-tiny", {"batch": 2, "seq": 67}),
    ("gpt2-tiny", {"seq": 45}),
    ("gpt2-tiny", {"seq": 45, "sdpa": 1}),
    ("llama-tiny", {"seq": 45}),
    ("vit-tiny", {}),
    ("torch-attention", {"batch": 2, "heads": 3, "seq": 77, "dim": 80, "causal": 1}),
    ("torch-attention", {"batch": 3, "heads": 2, "seq": 50, "dim": 64, "causal": 1, "mask": 1}),
])
def test_zoo_on_the_gpu(tmp_path, monkeypatch, name, params):
    """Every model through the stitch pipeline on CUDA (tiles from the analytical model):
    PyTorch's numbers, with the recognized kernels embedded."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload(name).instance("float16", **params)
    pipe = tvm_stitch.pipeline(CUDA, tune="model")
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=pipe)
    assert any("stitch_attention_" in m.inspect_source() for m in _cuda_modules(ex))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "params"), [
    ("hf-bert-tiny", {"batch": 2, "seq": 67}),
    ("llama-tiny", {"seq": 45}),  # bands of unequal widths (grouped K/V heads)
])
def test_joined_weights_on_the_gpu(tmp_path, monkeypatch, name, params):
    """``lift_params``: Q/K/V's weights concatenated once by ``<func>_transform_params``, the
    banded GEMM reading them through one TMA descriptor (persistent): PyTorch's numbers."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload(name).instance("float16", **params)
    pipe = tvm_stitch.pipeline(CUDA, tune="model", lift_params=True)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=pipe)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    assert vm.module.implements_function(f"{inst.func}_transform_params")
    args = [tvm.runtime.tensor(a, device=dev) for a in inst.args]
    args = prepare_args(vm, inst.func, args, num_input(inst.mod, inst.func))
    assert len(args) < len(inst.args)  # three weights became one
    out = vm[inst.func](*args).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "params"), [
    ("hf-bert-tiny", {"batch": 2, "seq": 67}),  # 134 rows: the last row tile clipped
    ("llama-tiny", {"seq": 45}),
])
def test_tma_stores_on_the_gpu(tmp_path, monkeypatch, name, params):
    """GEMMs storing their tiles by TMA (``TMA_STORE``, descriptors over the outputs made by
    the executable's host code): every GEMM that can is built so, and the model gives
    PyTorch's numbers."""
    from tvm_stitch.families.gemm import tune as kernels

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    options = kernels.template_options

    def stores_only(persistent, split=False, tma_store=False):
        launches, seeds = options(persistent, split, tma_store)
        if tma_store:  # the model then has only TMA-storing launches to choose from
            launches = [o for o in launches if o.get("TMA_STORE")]
            seeds = [s for s in seeds if s["launch"].get("TMA_STORE")]
        return launches, seeds

    monkeypatch.setattr(kernels, "template_options", stores_only)
    inst = get_workload(name).instance("float16", **params)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    ptx = "".join(m.inspect_source() for m in _cuda_modules(ex))
    assert "cp.async.bulk.tensor.2d.global.shared" in ptx
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "params"), [
    ("hf-bert-tiny", {"batch": 2, "seq": 67}),
    ("llama-tiny", {"seq": 45}),
])
@pytest.mark.parametrize("lift", [False, True], ids=["prologue", "through-weights"])
def test_folded_norms_on_the_gpu(tmp_path, monkeypatch, name, params, lift):
    """LayerNorm (post-norm BERT: A prologues and residual epilogues) and RMSNorm (LLaMA: the
    Q/K/V and gate × up prologues) computed inside the GEMMs: PyTorch's numbers on the GPU —
    also folded through the weights (``lift_params``: scaled weights and column sums made
    once, the GEMMs reading the normalization's input as it is)."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload(name).instance("float16", **params)
    pipe = tvm_stitch.pipeline(CUDA, tune="model", fold_norms=True, lift_params=lift)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=pipe)
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    args = [tvm.runtime.tensor(a, device=dev) for a in inst.args]
    args = prepare_args(vm, inst.func, args, num_input(inst.mod, inst.func))
    out = vm[inst.func](*args).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


def _cuda_modules(executable):
    stack, found = [executable.mod], []
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            found.append(module)
        stack.extend(module.imports)
    return found


@pytest.mark.parametrize(("name", "params", "causal"), [
    ("gpt2-tiny", {"seq": 33}, 0),
    ("llama-tiny", {"seq": 33}, 0),
    ("torch-attention", {"batch": 1, "heads": 2, "seq": 40, "dim": 32, "causal": 1}, 0),
    ("torch-attention", {"batch": 1, "heads": 2, "seq": 40, "dim": 32, "causal": 0}, None),
    ("hf-bert-tiny", {"batch": 2, "seq": 19}, None),  # a padding mask: an input, not a constant
])
def test_causal_masks_become_index_comparisons(name, params, causal):
    """A causal mask folded to a constant (however the model built it) is recognized from its
    values: the kernel compares indices instead of reading it, and skips blocks past the
    diagonal; a mask that depends on the input stays a tensor the kernel reads."""
    inst = get_workload(name).instance("float16", **params)
    attention = [m for m in recognize(build_graph(legalized(inst.mod), legalize=False)).matches
                 if m.family == "attention"]
    assert attention and all(m.causal == causal for m in attention)
    for m in attention:
        reads = [role for role in m.views if isinstance(role, tuple)]
        assert bool(reads) == (name == "hf-bert-tiny")
        # left of the diagonal the logits need no mask: the comparison folds away
        visible = visible_logits(m)
        if causal is None:
            assert visible is None
        else:
            assert any(isinstance(e, Iter) for e in walk(m.score))
            assert not any(isinstance(e, Iter) or (isinstance(e, Op) and e.op == "select")
                           for e in walk(visible))
            assert [x.key() for x in leaves(visible)] == [x.key() for x in leaves(m.score)]


@pytest.mark.parametrize(("layers", "reads"), [(2, "float16"), (1, "int32")])
def test_a_mask_every_layer_reads_is_read_not_recomputed(layers, reads):
    """The nn BERT's additive padding mask, ``(1 - mask) · -10000`` reshaped to [batch, 1, 1,
    seq], is read by every layer's attention (through the reshape, which kernels see
    through): each kernel reads it as computed, in float16, rather than recomputing it from the
    int32 input — a conversion for every logit (BERT-base 8×512: 26.4 µs an attention kernel,
    24.3 without it; H100).  With one layer its only reader recomputes it (one kernel less)."""
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=19, layers=layers)
    graph = build_graph(legalized(inst.mod), legalize=False)
    attention = [m for m in recognize(graph).matches if m.family == "attention"]
    assert len(attention) == layers
    for m in attention:
        masks = [view for role, view in m.views.items() if isinstance(role, tuple)]
        assert [graph.tensors[v.tensor].dtype for v in masks] == [reads]
        casts = [e for e in walk(m.score) if isinstance(e, Op) and e.op == "cast"
                 and e.args[0].dtype == "int32"]
        assert bool(casts) == (reads == "int32")


def test_pytorchs_float16_baseline_keeps_computed_state_in_float32():
    """The bench's PyTorch baseline in float16 is the model as ``from_pretrained(dtype=...)``
    loads it: weights in float16, the rotary frequencies transformers computes at construction
    left float32. Cast with ``net.to(float16)``, the frequencies round in float16 and the
    angles at position 2047 drift (LLaMA-tiny's cosines there by 0.43; LLaMA-3's angles by up
    to 0.34 rad): the bench then marked every PyTorch row of the two LLaMA-3-8B layers wrong
    (0.66 off at 1x2048)."""
    import torch

    from tvm_stitch.workloads.zoo import MODELS, as_loaded, make_model

    net = make_model(MODELS["llama"], "tiny")
    freqs = net.rotary_emb.inv_freq.clone()
    half = as_loaded(net, "cpu", torch.float16)
    assert half.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(half.rotary_emb.inv_freq, freqs)
    assert half.layers[0].mlp.gate_proj.weight.dtype == torch.float16
    # the rotation of position 2047 as the model computes it, against float64 angles
    pos = torch.tensor([[2047]])
    cos, _ = half.rotary_emb(torch.zeros(1, 1, 1, dtype=torch.float16), pos)
    want = torch.cos(2047 * freqs.double())
    assert (cos[0, 0, : len(freqs)].double() - want).abs().max() < 2e-3
