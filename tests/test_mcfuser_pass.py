"""The MCFuser Relax pass: recognized kernels become one call each, with the right meaning.

On the CPU the Triton launches are replaced by their TE references
(:mod:`tvm_stitch.codegen.te_reference`), so the rewritten modules run on llvm and are compared
with PyTorch; on the GPU (``gpu`` marker) the real kernels run.
"""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.codegen import embed
from tvm_stitch.codegen.te_reference import reference_func
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.tune.policy import tuning_key
from tvm_stitch.workloads import get_workload
from tvm_stitch.workloads.subgraphs import relax_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


def legalized(mod):
    """``mod`` as FuseMBCI sees it in the stitch pipeline for the H100."""
    return run_until(mod, CUDA, "StitchFuseMBCI")


def reference_builder(calls):
    """Stands in for the Triton launches on a CPU: the kernels' meaning as TE."""

    def build(match, source, config, shapes):
        calls.append((match, source, config))
        return reference_func(match, source, shapes), []

    return build


def placeholder_builder(calls):
    """A PrimFunc of the launch's signature that computes nothing (structure tests)."""

    def build(match, source, config, shapes):
        calls.append((match, source, config))
        ins = [te.placeholder(shapes[t][0], shapes[t][1], f"I{i}")
               for i, t in enumerate(source.inputs)]
        outs = [_zeros(*shapes[t]) for t in source.outputs]
        return te.create_prim_func([*ins, *outs]), []

    return build


def _zeros(shape, dtype):
    return te.compute(shape, lambda *_: tvm.tirx.const(0, dtype))


@pytest.fixture
def database(tmp_path):
    return TuningDatabase(tmp_path / "tuning.json")


def run_llvm(mod, inst):
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm[inst.func](*[tvm.runtime.tensor(a) for a in inst.args]).numpy()


@pytest.mark.slow
@pytest.mark.parametrize("seq", [19, 67, 200])
def test_bert_layers_become_kernel_calls(database, seq):
    """Per layer: Q, K and V as one kernel, attention, output projection (+ residual), FFN in
    (+ GELU), FFN out (+ residual), the LayerNorms between them folded into the GEMMs reading
    them; layers share their PrimFuncs where they compute the same.  134 rows (seq 67) need
    warpgroup-sized row tiles with a ragged edge; so do 400 (seq 200), where 16 and 32 rows
    pad them little enough for the padding rule alone (every GEMM was left to TVM)."""
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=seq)
    calls = []
    with CUDA:
        out = FuseMBCI(database, reference_builder(calls), fold_norms=True)(legalized(inst.mod))
    kernels = sorted(m.describe() for m, _, _ in calls)
    assert [k.split()[0] for k in kernels] == ["attention"] + ["gemm"] * 7, kernels
    qkv = [m for m, _, _ in calls if len(m.segments) == 3]
    assert len(qkv) == 2 and all([s.n for s in m.segments] == [128, 128, 128] for m in qkv)
    # layer 1's Q/K/V and both FFN-in kernels normalize their A (layer 0's Q/K/V reads the
    # embeddings' LayerNorm: the position embeddings are read modulo the sequence, no view)
    assert sum(m.prologue is not None for m, _, _ in calls) == 2  # FFN in: one PrimFunc
    # the GEMMs writing a normalized row write its moments (Σx, Σx² in pieces) for the
    # readers: both out-projections and layer 0's FFN out (layer 1's writes the model's last
    # LayerNorm's input, which stays a kernel)
    writers = [m for m, _, _ in calls if any(o.chunk for o in m.all_outputs)]
    assert len(writers) == 3 and all(
        sum(bool(o.chunk) for o in m.all_outputs) == 2 for m in writers)
    text = out.script()
    assert text.count("R.call_tir(cls.stitch_gemm_") == 8
    assert text.count("R.call_tir(cls.stitch_attention_") == 2
    # LayerNorms left: the embeddings' and the model's output
    assert text.count("R.call_tir(cls.layer_norm") == 2
    # no matrix product, softmax, GELU, weight transpose or head split/merge is left to TVM
    for name in ("matmul", "softmax", "gelu", "transpose"):
        assert f"R.call_tir(cls.{name}" not in text, name
    np.testing.assert_allclose(run_llvm(out, inst), inst.reference()[0], *inst.tolerance)

    calls = []
    with CUDA:
        unfolded = FuseMBCI(database, reference_builder(calls))(legalized(inst.mod))
    assert unfolded.script().count("R.call_tir(cls.layer_norm") == 5
    assert all(m.prologue is None for m, _, _ in calls)


def test_attention_and_chain_subgraphs_numerics(database):
    """3-D attention (no mask, K != H) and a GEMM chain at irregular shapes."""
    att = get_workload("S1").instance("float32", heads=3, m=37, n=29, k=24, h=40)
    chain = get_workload("G1").instance("float32", batch=2, m=45, n=33, k=24, h=20)
    for inst, family in ((att, "attention"), (chain, "chain")):
        calls = []
        with CUDA:
            out = FuseMBCI(database, reference_builder(calls))(legalized(inst.mod))
        assert [m.family for m, _, _ in calls] == [family]
        assert tvm_stitch.fusion_report(out, "llvm", "default").kernels == 1
        np.testing.assert_allclose(run_llvm(out, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize("causal", [True, False])
def test_rows_with_no_key_are_zero_in_a_float16_import(database, causal):
    """``scaled_dot_product_attention`` with a boolean key mask, imported in float16 as
    ``from_torch`` does (exported in float32, converted): its ``-inf`` fill stays -inf, so the
    rows of a left-padded sequence that see no key are zeros, as PyTorch's safe softmax gives
    (saturated to -65504, they averaged V: Falcon's padding rows were 0.68 off on the GPU)."""
    import torch

    from tvm_stitch.frontend import import_torch
    from tvm_stitch.workloads.zoo import masked_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 21, 40) for _ in range(3))
    mask = torch.ones(2, 21, dtype=torch.bool)
    mask[0, -1] = False
    if causal:
        mask[1, :5] = False  # left padding: rows 0-4 of sequence 1 see no key
    else:
        mask[1] = False  # a sequence all padding: no row of it sees a key
    module = masked_attention(causal)
    with torch.no_grad():
        ref = module(q, k, v, mask).numpy()
    imported = import_torch(module, (q, k, v, mask), "float16")
    calls = []
    with CUDA:
        out = FuseMBCI(database, reference_builder(calls))(legalized(imported.mod))
    assert [m.family for m, _, _ in calls] == ["attention"]
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(x.numpy()) for x in (q, k, v, mask)])
    got = (got if hasattr(got, "numpy") else got[0]).numpy().astype("float32")
    assert not ref[1, :, :5].any()  # PyTorch's zeros, which the -65504 fill missed
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-2)


@pytest.mark.parametrize("causal", [0, 1])
def test_a_float16_export_of_masked_sdpa_is_one_float16_attention(database, causal):
    """A float16 model exported on the CPU: PyTorch's math attention with a boolean mask
    multiplies float32 copies of Q, K and V. The kernel reads the float16 tensors themselves
    and accumulates in float32 (the same products): one float16 attention, where Q and K's
    copies once made it a float32 attention beside three conversion kernels."""
    inst = get_workload("torch-attention").instance(
        "float16", batch=2, heads=3, seq=37, dim=40, causal=causal, mask=1)
    calls = []
    with CUDA:
        out = FuseMBCI(database, reference_builder(calls))(legalized(inst.mod))
    band = ", run-time mask, keys to query+0" if causal else ""  # causal & mask: a band
    assert [m.describe() for m, _, _ in calls] == [f"attention 2x3x37x37 d40 float16{band}"]
    assert tvm_stitch.fusion_report(out, "llvm", "default").kernels == 1
    np.testing.assert_allclose(run_llvm(out, inst), inst.reference()[0], *inst.tolerance)


@pytest.mark.parametrize(("dtypes", "kernel"), [
    (("float16", "float16", "float16"), "float16"),  # copies of one 16-bit type: read as it
    (("float16", "float32", "float32"), "float32"),  # mixed: the float32 attention as written
    (("float16", "bfloat16", "float16"), "float32"),
    (("float16", "float16", "float32"), "float32"),  # V no copy of a 16-bit tensor
])
def test_an_attention_over_float32_copies(database, dtypes, kernel):
    """Q·Kᵀ and P·V in float32 over float32 copies of Q, K, V: one attention either way, in
    the 16-bit type when all three are copies of one, else in float32 as written."""
    import ml_dtypes

    rng = np.random.default_rng(0)
    shapes = [("q", (3, 37, 24)), ("k", (3, 29, 24)), ("v", (3, 29, 24))]
    params = [(n, s, d) for (n, s), d in zip(shapes, dtypes)]

    def body(q, k, v):
        q, k, v = (relax.op.astype(x, "float32") for x in (q, k, v))
        s = relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 1]))
        s = relax.op.multiply(s, relax.const(0.2, "float32"))
        return [relax.op.matmul(relax.op.nn.softmax(s, axis=-1), v)]

    mod = relax_function(params, body)
    calls = []
    with CUDA:
        out = FuseMBCI(database, reference_builder(calls))(legalized(mod))
    assert [m.describe() for m, _, _ in calls] == [f"attention 1x3x37x29 d24 {kernel}"]
    # inputs exact in every dtype (bfloat16 keeps 8 bits): the float32 reference is exact
    args = [np.round(rng.standard_normal(s) * 8) / 8 for _, s in shapes]
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a.astype(ml_dtypes.bfloat16 if d == "bfloat16" else d))
          for a, d in zip(args, dtypes)])
    q, k, v = args
    logits = q @ k.transpose(0, 2, 1) * 0.2
    p = np.exp(logits - logits.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kept", [False, True, "input"])
def test_a_narrowing_cast_before_a_gemm_is_written_by_its_producer(database, kept):
    """A GEMM's ``A`` cast to bfloat16 from a float32 tensor another op computes (a bfloat16
    model's LayerNorm, run in float32 between casts): the product reads the narrow tensor,
    which the producer writes, not the wide one converted in its loop (twice the bytes; GPT-2
    base 1 × 256 in bfloat16 on the H100: 507.6 µs with, 441.2 without).  Where the float32
    tensor is needed anyway (``kept``: read again after the product), or is an input seen
    through data movement (``"input"``: no kernel computes it), the product reads it through
    the cast."""
    shapes = [("x", (67, 96), "float32"), ("w", (96, 96), "bfloat16")]

    def body(x, w):
        y = relax.op.multiply(x, relax.const(2.0, "float32"))  # a float32 row computation
        if kept == "input":
            y = relax.op.reshape(relax.op.permute_dims(relax.op.reshape(x, (67, 96, 1)),
                                                       [0, 2, 1]), (67, 96))
        a = relax.op.astype(y, "bfloat16")
        out = relax.op.astype(relax.op.matmul(a, relax.op.permute_dims(w), out_dtype="float32"),
                              "bfloat16")
        # kept: a second reader, the output adding y to the product
        return [relax.op.add(relax.op.astype(out, "float32"), y)] if kept is True else [out]

    graph = build_graph(legalized(relax_function(shapes, body)), legalize=False)
    (match,) = [m for m in recognize(graph).matches if m.family == "gemm"]
    read = graph.tensors[match.accesses["a"].tensor].dtype
    assert read == ("float32" if kept else "bfloat16")
    if kept == "input":
        assert match.accesses["a"].tensor == "x"


def _attention_module(axis=-1, twice=False):
    shapes = [("q", (3, 37, 24)), ("k", (3, 29, 24)), ("v", (3, 29, 24)), ("m", (1, 29))]

    def body(q, k, v, m):
        s = relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 1]))
        if twice:  # the logits read the product at two positions
            s = relax.op.add(s, relax.op.flip(s, axis=2))
        s = relax.op.add(relax.op.multiply(s, relax.const(0.2, "float32")), m)
        return [relax.op.matmul(relax.op.nn.softmax(s, axis=axis), v)]

    return relax_function([(n, s, "float32") for n, s in shapes], body)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"axis": 1}, "column-reduce"),  # a softmax over the query axis
        ({"twice": True}, "several positions"),
    ],
)
def test_unrecognized_attention_is_left_to_tvm(database, caplog, kwargs, reason):
    mod = legalized(_attention_module(**kwargs))
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.recognize"):
        out = FuseMBCI(database, reference_builder([]), mcfuser=("attention", "chain"))(mod)
    tvm.ir.assert_structural_equal(out, mod)
    assert reason in caplog.text


def _normalized_products(axis):
    shapes = [("x", (37, 50)), ("w", (50, 29)), ("w2", (50, 29)), ("b", (29,))]

    def body(x, w, w2, b):
        p = relax.op.nn.softmax(x, axis=axis)  # read by two GEMMs, nothing else
        y = relax.op.add(relax.op.matmul(p, w), b)
        return [y, relax.op.add(relax.op.matmul(p, w2), y)]

    return relax_function([(n, s, "float32") for n, s in shapes], body)


@pytest.mark.parametrize(("axis", "folded"), [(-1, True), (0, False)])
def test_row_statistics_fold_into_gemms(database, caplog, axis, folded):
    """A softmax over the rows (a max, then a sum of exponentials that depends on it) read only
    by GEMMs is computed in their prologue; over the columns (axis 0: the statistics would vary
    along ``k``) it is refused with the reason and stays a kernel.  numpy's numbers either
    way."""
    mod = legalized(_normalized_products(axis))
    calls = []
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.recognize"):
        out = FuseMBCI(database, reference_builder(calls), fold_norms=True)(mod)
    prologues = [m for m, _, _ in calls if m.prologue is not None]
    if folded:
        # one kernel: the second product reads the first's result, so it is computed with it
        assert "folded into" in caplog.text and len(prologues) == 1
        assert len(prologues[0].segments[0].products) == 2
        text = kernel_source(prologues[0]).text
        assert "stat0 = tl.maximum(" in text and "stat1 = stat1 + tl.sum(" in text
        # the sum of exponentials reads the maximum: the maximum is combined before its loop
        assert text.index("stat0 = tl.maximum(") < text.index("stat1 = tl.full(")
        assert "R.call_tir(cls.softmax" not in out.script()
    else:
        assert "reduces along the columns" in caplog.text and not prologues
        assert "R.call_tir(cls.softmax" in out.script()
    rng = np.random.default_rng(0)
    x, w, w2 = (rng.standard_normal(s).astype("float32") for s in ((37, 50), (50, 29), (50, 29)))
    b = rng.standard_normal(29).astype("float32")
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](
        *[tvm.runtime.tensor(a) for a in (x, w, w2, b)]).numpy()
    p = np.exp(x - x.max(axis=axis, keepdims=True))
    p /= p.sum(axis=axis, keepdims=True)
    np.testing.assert_allclose(got, p @ w2 + p @ w + b, rtol=1e-5, atol=1e-5)


def test_the_gemm_writing_a_normalized_row_writes_its_moments(database, caplog):
    """x = a·W1 + r is normalized (LayerNorm) and read by one GEMM: the kernel writing x also
    writes its moments and stays a kernel of its own (not grouped with a·W2, which shares its
    input); the reader combines the moments.  numpy's numbers."""
    shapes = [("a", (45, 40)), ("w1", (40, 48)), ("w2", (40, 48)), ("r", (45, 48)),
              ("g", (48,)), ("bt", (48,)), ("w3", (48, 24))]

    def body(a, w1, w2, r, g, bt, w3):
        x = relax.op.add(relax.op.matmul(a, w1), r)
        y = relax.op.matmul(relax.op.nn.layer_norm(x, g, bt, axes=[-1]), w3)
        return [relax.op.add(y, relax.op.sum(relax.op.matmul(a, w2), axis=[1], keepdims=True))]

    mod = legalized(relax_function([(n, sh, "float32") for n, sh in shapes], body))
    calls = []
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.recognize"):
        out = FuseMBCI(database, reference_builder(calls), fold_norms=True)(mod)
    assert "moments" in caplog.text
    writers = [m for m, _, _ in calls if any(o.chunk for o in m.all_outputs)]
    assert len(writers) == 1 and len(writers[0].segments) == 1
    assert "R.call_tir(cls.layer_norm" not in out.script()
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(sh).astype("float32") for _, sh in shapes]
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in args])
    a, w1, w2, r, g, bt, w3 = args
    x = a @ w1 + r
    norm = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + bt
    np.testing.assert_allclose(got.numpy(), norm @ w3 + (a @ w2).sum(1, keepdims=True),
                               rtol=1e-4, atol=1e-4)


def test_two_normalizations_of_one_row_share_its_moments(database, caplog):
    """One row normalized twice (a LayerNorm and an RMSNorm of x = a·W1 + r), each read by a
    GEMM: the writer of x writes each moment once (Σx, Σx²: the RMSNorm's Σx² is the
    LayerNorm's), the readers combine them.  numpy's numbers."""
    shapes = [("a", (45, 40)), ("w1", (40, 48)), ("r", (45, 48)), ("w2", (48, 24)),
              ("w3", (48, 24))]

    def body(a, w1, r, w2, w3):
        x = relax.op.add(relax.op.matmul(a, w1), r)
        ones, zeros = relax.const(np.ones(48, "float32")), relax.const(np.zeros(48, "float32"))
        ln = relax.op.nn.layer_norm(x, ones, zeros, axes=[-1])
        rms = relax.op.multiply(x, relax.op.rsqrt(relax.op.add(
            relax.op.mean(relax.op.multiply(x, x), axis=[-1], keepdims=True),
            relax.const(1e-6, "float32"))))
        return [relax.op.add(relax.op.matmul(ln, w2), relax.op.matmul(rms, w3))]

    mod = legalized(relax_function([(n, sh, "float32") for n, sh in shapes], body))
    calls = []
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.recognize"):
        out = FuseMBCI(database, reference_builder(calls), fold_norms=True)(mod)
    writers = [m for m, _, _ in calls if any(o.chunk for o in m.all_outputs)]
    assert caplog.text.count("moments") == 2 and len(writers) == 1
    assert sum(bool(o.chunk) for o in writers[0].all_outputs) == 2
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(sh).astype("float32") for _, sh in shapes]
    ex = tvm.compile(out, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(x) for x in args])
    a, w1, r, w2, w3 = args
    x = a @ w1 + r
    ln = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    rms = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(got.numpy(), ln @ w2 + rms @ w3, rtol=1e-4, atol=1e-4)


def test_no_triton_means_no_rewrite(caplog, monkeypatch):
    import tvm_stitch.passes.mcfuser as pass_module

    monkeypatch.setattr(pass_module, "can_compile", lambda: (False, "triton is not installed"))
    mod = legalized(get_workload("bert-tiny").instance("float32", batch=1, seq=8).mod)
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI()(mod)
    tvm.ir.assert_structural_equal(out, mod)
    assert "Triton kernels not used: triton is not installed" in caplog.text


def test_a_cpu_machine_compiles_for_the_gpu(tmp_path, caplog, monkeypatch):
    """Without a GPU the stitch pipeline still embeds its Triton kernels: compiled to sm_90 PTX,
    tiles from the cost model, kept in the exported library as sources the GPU host's compile
    hook (installed by ``import tvm_stitch``) hands back as PTX."""
    import tvm_ffi

    from tvm_stitch.codegen import ptx

    if embed.can_measure()[0]:
        pytest.skip("this machine has a GPU: kernels are loaded, not saved for another")
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))
    with caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    assert "tiles not measured" in caplog.text and "(model)" in caplog.text
    kernels = [
        m for host in ex.mod.imports for m in host.imports
        if m.kind == "cuda" and m.inspect_source().startswith(ptx.PREFIX)
    ]
    assert len(kernels) >= 4  # attention, Q/K/V, out-projection, FFN1, FFN2 (variants shared)
    text = kernels[0].inspect_source()[len(ptx.PREFIX):]
    assert ".version 8.7" in text and ".target sm_90a" in text
    ex.export_library(str(tmp_path / "mod.so"))
    blob = (tmp_path / "mod.so").read_bytes()
    assert blob.count(ptx.PREFIX.encode()) == len(kernels)
    # what the GPU host's loader does with such a source, and with any other
    hook = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    assert bytes(hook(ptx.as_source(text))) == text.encode()
    assert TuningDatabase(tmp_path / "tuning.json").records == {}  # model choices: not stored


def test_unknown_family_is_an_error():
    with pytest.raises(ValueError, match="unknown kernel families"):
        FuseMBCI(mcfuser=("conv",))
    with pytest.raises(ValueError, match="mcfuser takes"):
        tvm_stitch.pipeline(CUDA, mcfuser=("linear",))


def test_tuning_database_is_used_first(database):
    """A stored config is used as is; model-only choices (no GPU) are not stored."""
    hw = tvm_stitch.HardwareModel.from_target(CUDA)
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=19)
    graph = build_graph(legalized(inst.mod), legalize=False)
    # Q, K and V together: the kernel's own key (its name digests its text)
    (qkv, *_) = [m for m in recognize(graph, ("gemm",)).matches if len(m.segments) == 3]
    key = tuning_key(database, qkv, kernel_source(qkv), hw)
    assert key.startswith("stitch_gemm_") and "|float32|sm_90" in key
    stored = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    database.put(key, stored)
    calls = []
    with CUDA:
        FuseMBCI(database, placeholder_builder(calls), mcfuser=("gemm",))(legalized(inst.mod))
    configs = {len(m.segments): config for m, _, config in calls}
    assert configs[3] == stored
    assert configs[1] != stored  # chosen by the analytical model
    assert list(TuningDatabase(database.path).records) == [key]


def test_corrupt_tuning_database_is_ignored(tmp_path, caplog):
    path = tmp_path / "tuning.json"
    path.write_text("{not json")
    with caplog.at_level("WARNING", logger="tvm_stitch.tune"):
        db = TuningDatabase(path)
    assert db.records == {} and "ignored" in caplog.text
    db.put("k", {"BLOCK_M": 64})
    assert TuningDatabase(path).get("k")["config"] == {"BLOCK_M": 64}
    path.write_text('{"version": 99, "records": {}}')
    assert TuningDatabase(path).records == {}


# -- Before/Expected: what the rewrite does to a function --------------------------------------
def _expected(mod, body):
    """``mod``'s kernel PrimFunc with ``main`` built by ``body(bb, kernel_gv, params)``."""
    (name,) = [gv.name_hint for gv in mod.functions if gv.name_hint.startswith("stitch_")]
    bb = relax.BlockBuilder()
    gv = bb.add_func(mod[name], name)
    params = [relax.Var(p.name, p.ty) for p in mod["main"].params]
    with bb.function("main", params):
        out = body(bb, gv, params)
        bb.emit_func_output(out)
    return bb.get()


def test_horizontal_transformation(database):
    """Three projections of one input (SOUFFLE's horizontal TE transformation): one kernel with
    a band of columns each, its three results read from a tuple."""
    shapes = [("x", (2, 19, 64))] + [
        (f"{p}{r}", (64, 64) if p == "w" else (64,)) for r in "qkv" for p in "wb"
    ]

    def body(x, *wb):
        outs = []
        for w, b in zip(wb[::2], wb[1::2]):
            outs.append(relax.op.add(relax.op.matmul(x, relax.op.permute_dims(w)), b))
        return [relax.Tuple(outs)]

    before = legalized(relax_function([(n, s, "float32") for n, s in shapes], body))
    with CUDA:
        after = FuseMBCI(database, placeholder_builder([]))(before)

    def expected(bb, kernel, params):
        types = [relax.TensorType((2, 19, 64), "float32")] * 3
        with bb.dataflow():
            call = bb.emit(relax.call_tir(kernel, params, types))
            outs = [bb.emit(relax.TupleGetItem(call, i)) for i in range(3)]
            result = bb.emit_output(relax.Tuple(outs))
        return result

    tvm.ir.assert_structural_equal(after, _expected(after, expected))


def test_vertical_transformation(database):
    """Head split, transposes, scale, softmax and head merge around two products (SOUFFLE's
    vertical TE transformation): the layout ops become index expressions of one kernel that
    reads Q, K, V and writes the merged heads in place."""
    b, s, heads, d = 2, 19, 3, 16

    def body(q, k, v):
        def split(t):
            return relax.op.permute_dims(relax.op.reshape(t, (b, s, heads, d)), [0, 2, 1, 3])

        scores = relax.op.matmul(split(q), relax.op.permute_dims(split(k), [0, 1, 3, 2]))
        probs = relax.op.nn.softmax(relax.op.multiply(scores, relax.const(0.25, "float32")))
        ctx = relax.op.permute_dims(relax.op.matmul(probs, split(v)), [0, 2, 1, 3])
        return [relax.op.reshape(ctx, (b, s, heads * d))]

    params = [(n, (b, s, heads * d), "float32") for n in "qkv"]
    before = legalized(relax_function(params, body))
    calls = []
    with CUDA:
        after = FuseMBCI(database, placeholder_builder(calls))(before)

    def expected(bb, kernel, params):
        with bb.dataflow():
            out = bb.emit_output(
                relax.call_tir(kernel, params, relax.TensorType((b, s, heads * d), "float32"))
            )
        return out

    tvm.ir.assert_structural_equal(after, _expected(after, expected))
    (match, _, _) = calls[0]
    views = match.views
    # Q, K, V: (batch, seq, heads·dim) read as (b, h, m|n, k) without a copy
    assert views["q"].stride == {"b": s * heads * d, "h": d, "m": heads * d, "n": 0, "d": 0,
                                 "k": 1}
    assert views["k"].stride["n"] == heads * d and views["k"].stride["m"] == 0
    assert views["out0"].stride == {"b": s * heads * d, "h": d, "m": heads * d, "n": 0, "d": 1,
                                    "k": 0}


# -- on the GPU: the generated kernels inside TVM executables ----------------------------------
def _gpu_run(inst, tune="measure"):
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune=tune))
    vm = relax.VirtualMachine(ex, tvm.cuda(0))
    dev = tvm.cuda(0)
    return vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()


@pytest.mark.gpu
@pytest.mark.parametrize("seq", [67, 200])
def test_bert_kernels_on_the_gpu(tmp_path, monkeypatch, seq):
    """Searched and run at 134 and 400 rows: ragged edges for the 64- and 128-row tiles."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=seq)
    fused = tvm_stitch.report.fused_module(inst.mod, CUDA, "stitch")
    names = [gv.name_hint for gv in fused.functions if gv.name_hint.startswith("stitch_")]
    assert sorted(n.split("_")[1] for n in names) == ["attention"] + ["gemm"] * 4
    assert TuningDatabase(tmp_path / "db.json").records  # the searches ran and were kept
    out = _gpu_run(inst)
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_attention_and_chain_on_the_gpu(tmp_path, monkeypatch, dtype):
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    for inst in (
        get_workload("S6").instance(dtype, heads=3, m=100, n=77, k=80, h=48),
        get_workload("G4").instance(dtype, batch=2, m=96, n=130, k=64, h=80),
    ):
        fused = tvm_stitch.report.fused_module(inst.mod, CUDA, "stitch", tune="model")
        assert any(gv.name_hint.startswith("stitch_") for gv in fused.functions)
        out = _gpu_run(inst, tune="model")  # numerics; the search is the BERT test's
        np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


@pytest.mark.gpu
def test_a_library_built_as_without_a_gpu_runs_on_the_gpu(tmp_path, monkeypatch):
    """The cross-compile path on one machine: with ``TVM_COMPILE_FORCE_FALLBACK`` (TVM's switch)
    TVM's kernels and the Triton kernels are built as on a machine without a CUDA runtime (CUDA
    source, Triton PTX kept as source), exported, loaded back and run against PyTorch."""
    from tvm_stitch.codegen import ptx
    from tvm_stitch.report import cuda_source

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_COMPILE_FORCE_FALLBACK", "1")
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    # tiles from the cost model, as a machine without a GPU takes them
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA, tune="model"))
    assert cuda_source(ex).count(ptx.PREFIX) >= 4  # attention and the GEMMs, as sources
    ex.export_library(str(tmp_path / "mod.so"))
    monkeypatch.delenv("TVM_COMPILE_FORCE_FALLBACK")
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(tmp_path / "mod.so")), dev)
    out = vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()
    np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)


def _linear_residual(rows=67, k=1000, cols=96, seed=0):
    """``x @ wᵀ + bias + residual`` in float16 at irregular sizes, with its numpy reference."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, k)) * 0.5).astype("float16")
    w = (rng.standard_normal((cols, k)) * k**-0.5).astype("float16")
    bias = (rng.standard_normal(cols) * 0.1).astype("float16")
    res = rng.standard_normal((rows, cols)).astype("float16")

    def body(x_, w_, b_, r_):
        prod = relax.op.matmul(x_, relax.op.permute_dims(w_), out_dtype="float32")
        return [relax.op.add(relax.op.add(relax.op.astype(prod, "float16"), b_), r_)]

    mod = relax_function([("x", x.shape, "float16"), ("w", w.shape, "float16"),
                          ("bias", bias.shape, "float16"), ("res", res.shape, "float16")], body)
    expected = (x.astype("float32") @ w.astype("float32").T).astype("float16").astype(
        "float32") + bias + res
    return mod, [x, w, bias, res], expected


#: a split-K launch the search could pick: 3 programs per tile over k = 1000 (16 steps of 64:
#: slices of 6, 6 and 4 steps), tiles of 64 x 32 over 67 x 96
SPLIT_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 3, "num_warps": 4,
                "num_stages": 3, "PERSISTENT": False}


def _split_database(database, mod):
    hw = tvm_stitch.HardwareModel.from_target(CUDA)
    graph = build_graph(legalized(mod), legalize=False)
    (match,) = recognize(graph, ("gemm",)).matches
    source = kernel_source(match)
    assert source.split_k
    database.put(tuning_key(database, match, source, hw), SPLIT_CONFIG)
    return database


def test_split_k_launch_gets_zeroed_counters_and_a_workspace(database):
    """A split-K launch (the tuning database's choice) is one call whose extra input is a zero
    constant (one counter per output tile, which the kernel leaves zero) and whose extra
    output is the float32 workspace of 3 partial tiles per output tile."""
    if not embed.can_compile()[0]:
        pytest.skip(embed.can_compile()[1])
    mod, _, _ = _linear_residual()
    _split_database(database, mod)
    with CUDA:
        out = FuseMBCI(database)(legalized(mod))
    (gv,) = [gv for gv in out.functions if gv.name_hint.startswith("stitch_gemm_")]
    assert gv.name_hint.endswith("k3")
    prim = out[gv]
    assert int(prim.attrs[embed.ZEROED_INPUTS]) == 1
    tiles = 2 * 3  # 64-row tiles over 67 rows, 32-column tiles over 96 columns
    params = {p.name: (tuple(int(d) for d in p.shape), p.dtype) for p in prim.params}
    assert params["CNT"] == ((tiles,), "int32")
    assert params["WS"] == ((tiles * 3 * 64 * 32,), "float32")
    (call,) = [b.value for b in out["main"].body.blocks[0].bindings
               if isinstance(b.value, relax.Call) and b.value.args[0].same_as(gv)]
    counters = call.args[1].fields[-1]
    assert isinstance(counters, tvm.ir.expr.Constant)
    assert not counters.value.numpy().any() and counters.value.numpy().shape == (tiles,)


@pytest.mark.gpu
def test_split_k_gemm_on_the_gpu(tmp_path, monkeypatch):
    """The split-K launch against numpy, called three times: its counters stay usable (a
    counter left non-zero would make the next call's tiles skip their epilogue)."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    mod, args, expected = _linear_residual()
    _split_database(TuningDatabase(tmp_path / "db.json"), mod)
    ex = tvm.compile(mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    inputs = [tvm.runtime.tensor(a, device=dev) for a in args]
    for _ in range(3):
        out = vm["main"](*inputs).numpy().astype("float32")
        np.testing.assert_allclose(out, expected, rtol=2e-2, atol=2e-2)


def test_kernel_generation_shows_its_progress(database, monkeypatch):
    """Generating, tuning and compiling the kernels (the longest phase of a compile) goes
    through a progress bar over the function's recognized kernels (tqdm's: drawn on a
    terminal or in a notebook)."""
    import tqdm.auto

    bars = []

    class Recorder(tqdm.auto.tqdm):  # the searches' bars (no iterable) as they are
        def __init__(self, iterable=None, **kwargs):
            super().__init__(iterable, **{**kwargs, "disable": True})
            if iterable is not None:
                bars.append((kwargs.get("desc"), len(iterable), kwargs.get("disable")))

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=16)
    calls = []
    with CUDA:
        FuseMBCI(database, placeholder_builder(calls))(legalized(inst.mod))
    ((desc, total, disable),) = bars
    assert desc == "Triton kernels of forward" and total >= len(calls) > 0 and disable is None
