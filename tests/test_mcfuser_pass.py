"""The MCFuser Relax pass: attention, GEMM chains and Linear layers become one kernel call each."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import relax, te, topi
from tvm_stitch.passes import FuseMBCI

import tvm_stitch
from tvm_stitch.codegen import embed
from tvm_stitch.tune.database import TuningDatabase
from tvm_stitch.workloads import get_workload
from tvm_stitch.workloads.subgraphs import relax_function

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})


# -- TE stand-ins for the Triton PrimFuncs: same buffers, same views, same math
def _reader(view, tensor):
    """Element ``idx`` of ``view`` (logical indices) read from ``tensor`` (its parameter)."""
    base = embed.contiguous(view.param.shape)

    def read(*idx):
        flat = sum((i * s for i, s in zip(idx, view.strides) if s), tvm.tirx.const(0, "int64"))
        return tensor[tuple((flat // b) % d for b, d in zip(base, view.param.shape))]

    return read


def _te_attention(q, k, v, out, mask, scale, config):
    placeholders = {}
    for vw in (q, k, v, mask):
        if vw is not None and vw.param not in placeholders:
            placeholders[vw.param] = te.placeholder(vw.param.shape, vw.param.dtype, vw.param.name)
    rq, rk, rv = (_reader(x, placeholders[x.param]) for x in (q, k, v))
    rm = _reader(mask, placeholders[mask.param]) if mask is not None else None
    *lead, m, dk = q.shape
    n, dh = k.shape[-2], v.shape[-1]
    f32 = "float32"
    kr = te.reduce_axis((0, dk), "kr")
    s = te.compute(
        (*lead, m, n),
        lambda *i: te.sum(
            rq(*i[:-1], kr).astype(f32) * rk(*i[:-2], i[-1], kr).astype(f32), axis=kr
        ),
    )

    def logit(*i):
        x = s(*i) * tvm.tirx.const(scale, f32)
        return x + rm(*i).astype(f32) if rm else x

    nr = te.reduce_axis((0, n), "nr")
    mx = te.compute((*lead, m), lambda *i: te.max(logit(*i, nr), axis=nr))
    nr2 = te.reduce_axis((0, n), "nr2")
    den = te.compute((*lead, m), lambda *i: te.sum(te.exp(logit(*i, nr2) - mx(*i)), axis=nr2))
    nr3 = te.reduce_axis((0, n), "nr3")
    o = te.compute(
        (*lead, m, dh),
        lambda *i: te.sum(
            te.exp(logit(*i[:-1], nr3) - mx(*i[:-1])) * rv(*i[:-2], nr3, i[-1]).astype(f32),
            axis=nr3,
        ),
    )
    # the output parameter holds ``o`` through its view (strides of a permuted contiguous layout)
    order = sorted(range(len(out.shape)), key=lambda d: -out.strides[d])

    def write(*idx):
        base = embed.contiguous(out.param.shape)
        flat = sum((i * b for i, b in zip(idx, base)), tvm.tirx.const(0, "int64"))
        logical = [None] * len(out.shape)
        for d in order:
            logical[d] = (flat // out.strides[d]) % out.shape[d]
        return (o(*logical) / den(*logical[:-1])).astype(out.param.dtype)

    y = te.compute(out.param.shape, write, name="out")
    return te.create_prim_func([*placeholders.values(), y])


def _te_linear(m, n, k, dtype, has_res, gelu, config):
    x = te.placeholder((m, k), dtype, "x")
    w = te.placeholder((n, k), dtype, "w")
    b = te.placeholder((n,), dtype, "b")
    y = topi.nn.dense(x, w, b, out_dtype="float32")
    if gelu:
        y = topi.multiply(topi.multiply(y, 0.5), topi.add(topi.erf(y * 0.7071067811865476), 1))
    ins = [x, w, b]
    if has_res:
        r = te.placeholder((m, n), dtype, "r")
        ins.append(r)
        y = topi.add(y, topi.cast(r, "float32"))
    return te.create_prim_func([*ins, topi.cast(y, dtype)])


def _te_chain(batch, m, n, k, h, dtype, config):
    a = te.placeholder((batch, m, k), dtype, "a")
    b = te.placeholder((batch, k, n), dtype, "b")
    d = te.placeholder((batch, n, h), dtype, "d")
    c = topi.nn.batch_matmul(a, b, out_dtype="float32", transpose_b=False)
    c = topi.cast(c, dtype)
    e = topi.nn.batch_matmul(c, d, out_dtype="float32", transpose_b=False)
    return te.create_prim_func([a, b, d, topi.cast(e, dtype)])


def _te_builder(calls):
    """Stands in for :func:`passes.mcfuser.embed_builder` on a CPU."""
    make = {"linear": _te_linear, "attention": _te_attention, "chain": _te_chain}

    def build(family, **kwargs):
        calls.append((family, kwargs))
        return make[family](**kwargs), []

    return build


def _planned(calls):
    """The real builder minus the CUDA module: Triton compiles to sm_90 PTX without a GPU."""
    make = {"linear": embed.linear_launch, "attention": embed.attention_launch}

    def build(family, **kwargs):
        launch = make[family](**kwargs)
        calls.append((family, launch))
        return launch.func, []

    return build


@pytest.fixture
def database(tmp_path):
    return TuningDatabase(tmp_path / "tuning.json")


def _run_llvm(mod, inst):
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    vm = relax.VirtualMachine(ex, tvm.cpu())
    return vm[inst.func](*[tvm.runtime.tensor(a) for a in inst.args]).numpy()


def test_bert_layers_become_kernel_calls(database):
    """Per layer: Q, K, V, output projection, FFN in (+GELU), FFN out (+residual), attention."""
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=19)
    calls = []
    with CUDA:
        out = FuseMBCI(database, _te_builder(calls))(inst.mod)
    families = sorted(f for f, _ in calls)
    # one PrimFunc per distinct kernel: the two layers share them
    assert families == ["attention"] + ["linear"] * 4
    text = out["forward"].script()
    assert text.count("R.call_tir(stitch_linear_") == 12
    assert text.count("R.call_tir(stitch_attention_") == 2
    # softmax, GELU, the head split/merge and the weight transposes are all inside kernels
    for op in ("R.nn.softmax", "R.nn.gelu", "R.permute_dims", "R.matmul"):
        assert op not in text, op
    before = tvm_stitch.fusion_report(inst.mod, "llvm", "default")
    after = tvm_stitch.fusion_report(out, "llvm", "default")
    # TVM's default: 20 kernels per layer; now 9 (6 GEMMs, attention, 2 LayerNorms) and no
    # copy kernels between them (reshape pairs between Linear layers are collapsed to views)
    per_layer = [g.func for g in after.groups if g.func.startswith(("stitch_", "layer_norm"))]
    assert len(per_layer) == 2 * 9 + 1  # + the embeddings' LayerNorm
    assert not [g.func for g in after.groups if "reshape" in g.func and "add" not in g.func]
    assert after.kernels <= before.kernels - 2 * (20 - 9)
    np.testing.assert_allclose(_run_llvm(out, inst), inst.reference()[0], *inst.tolerance)


def test_attention_reads_heads_in_place(database):
    """The kernel reads Q, K, V from the Linear outputs and writes the merged heads directly."""
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=19)
    calls = []
    with CUDA:
        out = FuseMBCI(database, _planned(calls), families=("attention",))(inst.mod)
    ((family, launch),) = calls
    assert family == "attention" and ".entry stitch_attn_" in launch.ptx  # sm_90 PTX, renamed
    func = launch.func
    shapes = [tuple(int(d) for d in p.shape) for p in func.params]
    # q, k, v: (batch, seq, hidden) projections; the (batch, 1, 1, seq) mask as (batch, seq)
    assert shapes == [(2, 19, 128)] * 3 + [(2, 19), (2, 19, 128)]
    packed = func.body.block.body.value  # T.call_packed(symbol, pointers..., ints..., launch)
    ints = [int(a) for a in packed.args[6:31] if isinstance(a, tvm.tirx.IntImm)]
    # M, N, DK, DH, HEADS, then strides (batch, head, row) per tensor: unit strides are constants
    assert ints[:5] == [19, 19, 64, 64, 2]
    assert ints[5:17] == [19 * 128, 64, 128] * 4  # q, k, v and out in (batch, seq, heads, dim)
    assert ints[17:20] == [19, 0, 0]  # the mask broadcasts over heads and query rows
    text = out["forward"].script()
    assert "R.permute_dims(reshape" not in text and "R.nn.softmax" not in text
    # the fusion report counts the embedded kernel, with the bytes its declared regions move
    report = tvm_stitch.fusion_report(out, "llvm", "default")
    (group,) = [g for g in report.groups if g.func.startswith("stitch_attention")][:1]
    assert group.kinds == ["opaque"]
    assert group.bytes_read == (3 * 2 * 19 * 128 + 2 * 19) * 2
    assert group.bytes_written == 2 * 19 * 128 * 2
    before = tvm_stitch.fusion_report(inst.mod, "llvm", "default")
    assert report.kernels < before.kernels


def test_attention_and_chain_subgraphs_numerics(database):
    """3-D attention without a mask (K != H) and a GEMM chain, at irregular shapes."""
    calls = []
    att = get_workload("S1").instance("float32", heads=3, m=37, n=29, k=24, h=40)
    chain = get_workload("G1").instance("float32", batch=2, m=45, n=33, k=24, h=20)
    for inst, family in ((att, "attention"), (chain, "chain")):
        with CUDA:
            out = FuseMBCI(database, _te_builder(calls))(inst.mod)
        assert f"stitch_{family}_" in out.script()
        assert tvm_stitch.fusion_report(out, "llvm", "default").kernels == 1
        np.testing.assert_allclose(_run_llvm(out, inst), inst.reference()[0], *inst.tolerance)
    att_kwargs = calls[0][1]
    assert att_kwargs["mask"] is None and math.isclose(att_kwargs["scale"], 24**-0.5, rel_tol=1e-6)


def _attention_module(axis=-1, mask_shape=(1, 29)):
    shapes = [("q", (3, 37, 24)), ("k", (3, 29, 24)), ("v", (3, 29, 24)), ("m", mask_shape)]

    def body(q, k, v, m):
        s = relax.op.matmul(q, relax.op.permute_dims(k, [0, 2, 1]))
        s = relax.op.add(relax.op.multiply(s, relax.const(0.2, "float32")), m)
        return [relax.op.matmul(relax.op.nn.softmax(s, axis=axis), v)]

    return relax_function([(n, s, "float32") for n, s in shapes], body)


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"axis": 1}, "softmax over axis 1"),
        ({"mask_shape": (2, 3, 37, 29)}, "does not broadcast"),
    ],
)
def test_illegal_attention_is_left_alone(database, caplog, kwargs, reason):
    mod = _attention_module(**kwargs)
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI(database, _te_builder([]), families=("attention",))(mod)
    tvm.ir.assert_structural_equal(out, mod)
    assert reason in caplog.text


def test_no_gpu_means_no_rewrite(caplog):
    if embed.can_embed()[0]:
        pytest.skip("this machine can embed Triton kernels")
    inst = get_workload("bert-tiny").instance("float32", batch=1, seq=8)
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI()(inst.mod)
    tvm.ir.assert_structural_equal(out, inst.mod)
    assert "Triton kernels not used" in caplog.text


def test_illegal_linear_is_left_alone(database, caplog):
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((4, 8), "float32"))
    w = relax.Var("w", R.Tensor((6, 8), "float32"))
    b = relax.Var("b", R.Tensor((4, 6), "float32"))  # a 2-D "bias" is not a Linear layer's
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.add(relax.op.matmul(x, relax.op.permute_dims(w)), b))
        bb.emit_func_output(out)
    mod = bb.get()
    with CUDA, caplog.at_level("INFO", logger="tvm_stitch.mcfuser"):
        out = FuseMBCI(database, _te_builder([]))(mod)
    tvm.ir.assert_structural_equal(out, mod)
    assert "left to TVM: not a Linear layer" in caplog.text


def test_unknown_family_is_an_error():
    with pytest.raises(ValueError, match="unknown MBCI families"):
        FuseMBCI(families=("conv",))
    with pytest.raises(ValueError, match="mcfuser takes"):
        tvm_stitch.pipeline(CUDA, mcfuser="linear")


def test_tuning_database_is_used_first(database):
    """A stored config is used as is; model-only choices (no GPU) are not stored."""
    hw = tvm_stitch.HardwareModel.from_target(CUDA)
    key = database.key("gemm", (38, 128, 128), "float32", hw.arch)
    stored = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 3}
    database.put(key, stored)
    inst = get_workload("bert-tiny").instance("float32", batch=2, seq=19)
    calls = []
    with CUDA:
        FuseMBCI(database, _te_builder(calls), families=("linear",))(inst.mod)
    configs = {(kw["m"], kw["n"], kw["k"]): kw["config"] for f, kw in calls}
    assert configs[(38, 128, 128)] == stored
    assert configs[(38, 512, 128)] != stored  # chosen by the analytical model
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


# -- on the GPU: the embedded kernels inside TVM executables
def _gpu_run(inst):
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    vm = relax.VirtualMachine(ex, tvm.cuda(0))
    dev = tvm.cuda(0)
    return vm[inst.func](*[tvm.runtime.tensor(a, device=dev) for a in inst.args]).numpy()


@pytest.mark.gpu
def test_bert_kernels_on_the_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    fused = tvm_stitch.report.fused_module(inst.mod, CUDA, "stitch")
    names = [gv.name_hint for gv in fused.functions if gv.name_hint.startswith("stitch_")]
    assert sorted(n.split("_")[1] for n in names) == ["attention"] + ["linear"] * 4
    assert "external_mods" in fused.attrs
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
        fused = tvm_stitch.report.fused_module(inst.mod, CUDA, "stitch")
        assert any(gv.name_hint.startswith("stitch_") for gv in fused.functions)
        out = _gpu_run(inst)
        np.testing.assert_allclose(out.astype("float32"), inst.reference()[0], *inst.tolerance)
