"""Triton templates: numerics under the interpreter, ahead-of-time PTX for sm_90, legality."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import triton
import triton.language as tl

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.explore.tiling import Candidate, ChainSpec, TilingExpr
from tvm_stitch.families.chain import template as chain_template


@pytest.fixture(scope="module")
def interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    script = Path(__file__).with_name("triton_interpret_cases.py")
    out = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.slow
def test_erf_to_absolute_accuracy_under_interpreter(interpreted):
    """``_erf_abs`` (GELU's erf): within 1.2e-7 of float64 erf, NaN kept, the sign of zero."""
    (case,) = [r for r in interpreted if r["case"] == "erf absolute"]
    assert case["ok"], case


@pytest.mark.parametrize("family", ["chain", "attention", "gemm"])
def test_numerics_under_interpreter(interpreted, family):
    cases = [r for r in interpreted if r["case"].startswith(family)]
    assert len(cases) >= 6  # fp32 and fp16, irregular shapes
    bad = [r for r in cases if not r["ok"]]
    assert not bad, bad


def _sig(pointers, ints):
    return {**dict.fromkeys(pointers, "*fp16"), **dict.fromkeys(ints, "i32")}


def test_ahead_of_time_ptx_for_sm90():
    chain = tk.compile_ptx(
        "chain",
        _sig(
            ["A", "B", "D", "E"],
            [
                "M",
                "N",
                "K",
                "H",
                "s_ab",
                "s_am",
                "s_ak",
                "s_bb",
                "s_bk",
                "s_bn",
                "s_db",
                "s_dn",
                "s_dh",
                "s_eb",
                "s_em",
                "s_eh",
            ],
        ),
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "BLOCK_H": 64, "HOIST_A": True},
    )
    assert ".target sm_90" in chain and "wgmma.mma_async" in chain  # Hopper tensor cores
    attention = tk.compile_ptx(
        "attention",
        {
            **_sig(
                ["Q", "Kt", "V", "O", "Mask"],
                [
                    "M",
                    "N",
                    "DK",
                    "DH",
                    "HEADS",
                    "s_qb",
                    "s_qg",
                    "s_qm",
                    "s_qk",
                    "s_kb",
                    "s_kg",
                    "s_kn",
                    "s_kk",
                    "s_vb",
                    "s_vg",
                    "s_vn",
                    "s_vh",
                    "s_ob",
                    "s_og",
                    "s_om",
                    "s_oh",
                    "s_xb",
                    "s_xg",
                    "s_xm",
                    "s_xn",
                ],
            ),
            "scale": "fp32",
        },
        {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "BLOCK_H": 64, "HAS_MASK": True},
    )
    assert "ex2.approx" in attention  # the softmax's exp, fused between the two products
    gemm = tk.compile_ptx(
        "gemm",
        _sig(
            ["A", "B", "C", "Bias", "Res"],
            ["M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn", "s_cm", "s_cn", "s_rm", "s_rn"],
        ),
        {
            "BLOCK_M": 128,
            "BLOCK_N": 128,
            "BLOCK_K": 64,
            "HAS_BIAS": True,
            "GELU": 1,
            "HAS_RES": False,
            "GROUP_M": 8,
        },
    )
    assert "wgmma.mma_async" in gemm


def test_generated_launch_carries_pointers_only():
    """A generated kernel (BERT-base's FFN in + GELU) compiles for sm_90 with wgmma; its
    PrimFunc passes buffer pointers only (every size and stride is compiled in), then Triton's
    null scratch pointers and the launch."""
    import tvm
    from tvm import relax

    import tvm_stitch
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen import embed
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.workloads import get_workload

    inst = get_workload("bert-base").instance("float16", batch=1, seq=128)
    with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
        mod = relax.transform.LegalizeOps()(tvm_stitch.passes.AccumulateFloat32()(inst.mod))
    graph = build_graph(mod, legalize=False)
    (ffn,) = [m for m in recognize(graph, ("gemm",)).matches[:6]
              if m.frame.extents["k"] == 768 and m.segments[0].n == 3072]
    source = kernel_source(ffn)
    # GELU, recognized from the blocks TVM legalized; its erf to the accuracy 0.5 + 0.5·erf needs
    assert "_erf_abs(" in source.text and "tl.math.erf" not in source.text
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 8, "num_stages": 4}
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
              for t in [*source.inputs, *source.outputs]}
    launch = embed.generated_launch(source, ffn, cfg, shapes)
    assert "wgmma.mma_async" in launch.ptx and f".entry {launch.symbol}" in launch.ptx
    call = _packed_call(launch.func)
    assert [str(a) for a in call.args[1:5]] == ["I0.data", "I1.data", "I2.data", "O0.data"]
    # then A's, B's and the output's TMA descriptors, encoded by the host code before the
    # launch (the persistent formulation reads through the first two and, with TMA_STORE,
    # writes through the third; this one does neither), each with its shape and row stride:
    # A (128 x 768, rows 768 apart), B the weight (3072 x 768), the output (128 x 3072)
    desc = ["tensormap", "int32", "int32", "int64", "int64"]
    assert launch.arg_types == ["handle"] * 4 + desc * 3 + ["int64"] * 2
    assert str(launch.func).count("tensormap_encode_tiled") == 3
    assert [int(a) for a in call.args[6:10]] == [128, 768, 768, 1]
    assert [int(a) for a in call.args[11:15]] == [3072, 768, 768, 1]
    assert [int(a) for a in call.args[16:20]] == [128, 3072, 3072, 1]
    ints = [int(a) for a in call.args[20:]]
    # scratch pointers, threads, one program per 128x128 tile (then the batch axis), smem
    assert ints[:5] == [0, 0, 256, 24, 1] and ints[5] > 0

    # the persistent formulation: one program per SM, operands through TMA (tensor-map
    # copies in the PTX) whose descriptors the host made: no descriptor is written on the device
    assert source.persistent
    launch = embed.generated_launch(source, ffn, {**cfg, "PERSISTENT": True, "NUM_SMS": 132},
                                    shapes)
    assert "cp.async.bulk.tensor" in launch.ptx and "wgmma.mma_async" in launch.ptx
    assert "tensormap.replace" not in launch.ptx
    assert launch.symbol.endswith("p")  # its own PTX symbol
    assert "cp.async.bulk.tensor.2d.global.shared" not in launch.ptx  # stores by pointers
    stored = embed.generated_launch(
        source, ffn, {**cfg, "PERSISTENT": True, "NUM_SMS": 132, "TMA_STORE": True}, shapes)
    assert "cp.async.bulk.tensor.2d.global.shared" in stored.ptx
    assert stored.symbol.endswith("pd")
    assert len(list(launch.func.params)) == 4  # no scratch memory
    call = _packed_call(launch.func)
    assert [int(a) for a in call.args[20:25]] == [0, 0, 256, 24, 1]


def _probe_launch(symbol, **options):
    """The GEMM template's launch on a 70×48×64 product, as kernel ``symbol``."""
    from tvm_stitch.codegen import embed

    return embed.plan_launch(
        "gemm",
        [embed.Param(n, s, "float16") for n, s in (("A", (70, 64)), ("W", (48, 64)),
                                                    ("C", (70, 48)))],
        {"A": "A", "B": "W", "C": "C", "Bias": "A", "Res": "A", "M": 70, "N": 48, "K": 64,
         "s_am": 64, "s_ak": 1, "s_bk": 1, "s_bn": 64, "s_cm": 48, "s_cn": 1, "s_rm": 48,
         "s_rn": 1},
        {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "HAS_BIAS": False, "GELU": 0,
         "HAS_RES": False, "GROUP_M": 8, "PERSISTENT": False, "NUM_SMS": 1},
        (4,), {"num_warps": 4, "num_stages": 2}, symbol, **options)


def test_generated_kernels_wait_for_the_kernel_before_them(tmp_path):
    """Launched with programmatic dependent launch, a generated kernel's first instructions
    wait for the grid before it (nothing is loaded or stored earlier), then release the next
    launch; the tag sits before the shared-memory one (TVM wants that last) and ptxas takes
    the PTX."""
    import re

    from tvm_stitch.codegen import embed

    source = _probe_launch("pdl_probe", launch_dependents="start")
    body = source.ptx[source.ptx.index(".entry pdl_probe"):]
    body = body[body.index("{") + 1:]
    instructions = [ln.strip() for ln in body.splitlines()
                    if ln.strip() and not ln.strip().startswith((".reg", ".shared", "//", "$"))]
    assert instructions[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    assert not any(re.match(r"(ld|st|cp|atom|red)\.", i) for i in instructions[:2])
    assert embed.PDL_TAG in source.tags
    if "tirx.use_dyn_shared_memory" in source.tags:
        assert source.tags[-1] == "tirx.use_dyn_shared_memory"
    _assert_assembles(source.ptx, tmp_path)


def _assert_assembles(ptx: str, tmp_path) -> None:
    """ptxas (Triton's, else one on the path; none: nothing checked) takes ``ptx`` for sm_90a."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        ptxas = shutil.which("ptxas")
    if ptxas:
        (tmp_path / "k.ptx").write_text(ptx)
        out = subprocess.run([ptxas, "--gpu-name=sm_90a", str(tmp_path / "k.ptx"), "-o",
                              str(tmp_path / "k.cubin")], capture_output=True, text=True,
                             check=False)
        assert out.returncode == 0, out.stderr


def test_dependent_launch_can_be_turned_off(tmp_path, monkeypatch):
    """``dependent_launch=False``: the generated kernels neither wait for the grid before them
    nor carry the launch tag (profiles then time each kernel alone); by default they do, and
    release the next launch at their exit (``launch_dependents="start"``: at their start)."""
    import tvm

    import tvm_stitch
    from tvm_stitch.codegen import embed
    from tvm_stitch.workloads import get_workload

    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    inst = get_workload("bert-tiny").instance("float16", layers=1)
    waits, releases = {}, {}
    for dependent, release in ((True, "start"), (False, "start"), (True, "exit")):
        with cuda:
            mod = tvm_stitch.pipeline(cuda, tune="model", dependent_launch=dependent,
                                      launch_dependents=release)(inst.mod)
        ptx = [m.inspect_source() for m in mod.attrs["external_mods"]]
        waits[dependent, release] = (sum("griddepcontrol.wait" in p for p in ptx), len(ptx))
        releases[dependent, release] = sum("griddepcontrol.launch_dependents" in p for p in ptx)
    kernels = waits[True, "start"][1]
    assert waits[True, "start"] == waits[True, "exit"] == (kernels, kernels) and kernels > 0
    assert waits[False, "start"] == (0, kernels)
    assert releases == {(True, "start"): kernels, (False, "start"): 0, (True, "exit"): 0}
    with pytest.raises(ValueError, match="launch_dependents"):
        tvm_stitch.passes.FuseMBCI(launch_dependents="late")
    # the launch tag goes with the wait (a kernel launched with it but not waiting would race)
    probe = _probe_launch("independent_probe", dependent=False)
    assert embed.PDL_TAG not in probe.tags and "griddepcontrol" not in probe.ptx


def test_next_launch_released_at_exit():
    """``launch_dependents="exit"``: the kernel still waits for the grid before it, first, but
    gives no early trigger (the next launch begins once its blocks have exited). The default,
    ``"auto"``, releases it at the start of a grid that leaves SMs free (4 blocks on 132
    SMs), at the exit of one that does not (4 blocks on 4), and at exit where the SMs are
    not known; an unknown placement is an error, in the pipeline's options too."""
    from tvm_stitch.codegen import embed
    from tvm_stitch.config import PipelineOptions

    assert PipelineOptions().launch_dependents == "auto"
    for symbol, options in (("exit_probe", {"launch_dependents": "exit", "num_sms": 132}),
                            ("full_probe", {"num_sms": 4}), ("unknown_probe", {})):
        probe = _probe_launch(symbol, **options)
        assert embed.PDL_TAG in probe.tags
        body = probe.ptx[probe.ptx.index(f".entry {symbol}"):]
        assert body.count("griddepcontrol.wait;") == 1
        assert "griddepcontrol.launch_dependents" not in probe.ptx, symbol
    early = _probe_launch("early_probe", num_sms=132).ptx
    assert early.count("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;") == 1
    with pytest.raises(ValueError, match="launch_dependents"):
        embed.dependent_launch(probe.ptx, "end")
    with pytest.raises(ValueError, match="'start' or 'exit'"):
        embed.dependent_launch(probe.ptx, "auto")  # a grid decides 'auto'
    with pytest.raises(ValueError, match="launch_dependents"):
        PipelineOptions(launch_dependents="late")


def test_weights_are_pulled_into_l2_before_the_wait(tmp_path):
    """``prefetch``: the kernel takes one more pointer per prefetched input (after Triton's
    own parameters), the launch passes that input's data there, and before the wait each
    block's first thread pulls its share of the input's 16-byte pieces into L2 (W: 48 x 64
    float16, 384 pieces); ptxas takes the PTX. Without ``prefetch`` nothing changes."""
    probe = _probe_launch("prefetch_probe", prefetch=("W",))
    plain = _probe_launch("plain_probe")
    assert probe.arg_types == [*plain.arg_types, "handle"]
    head = probe.ptx[probe.ptx.index(".entry prefetch_probe"):]
    params = head[:head.index(")")]
    assert params.rstrip().endswith(".param .u64 prefetch_probe_prefetch_0")
    body = head[head.index("{"):]
    pull = body.index("cp.async.bulk.prefetch.L2.global")
    assert pull < body.index("griddepcontrol.wait;")
    assert "setp.ge.u32 %pfp1, %pfr10, 384;" in body  # no share starts past the input
    assert "prefetch" not in plain.ptx
    call = _packed_call(probe.func.body)
    args = [str(a) for a in call.args]
    nulls = len(args) - 1 - args[::-1].index("T.int64(0)")  # Triton's scratch pointers, then
    assert args[nulls + 1] == "W.data"  # the prefetched input, then the launch's extents
    assert args[1:nulls + 1] == [str(a) for a in _packed_call(plain.func.body).args][1:nulls + 1]
    _assert_assembles(probe.ptx, tmp_path)


def _packed_call(node):
    """The launch's ``call_packed`` in a PrimFunc of :func:`embed.generated_launch`."""
    import tvm

    if isinstance(node, tvm.ir.Call) and node.op.name == "tirx.tvm_call_packed":
        return node
    for attr in ("body", "block", "seq", "value"):
        child = getattr(node, attr, None)
        for c in child if isinstance(child, (list, tvm.ir.Array)) else [child]:
            found = _packed_call(c) if c is not None else None
            if found is not None:
                return found
    return None


def test_generated_attention_loads_through_tma_where_it_can():
    """An attention whose Q, K and V rows are 16-byte aligned has a TMA formulation (constexpr
    ``TMA``, tensor-map copies in its sm_90 PTX, three descriptors of scratch per program); a head
    dimension of 60 float16 elements (120-byte rows) has not, and says why."""
    import tvm
    from tvm import relax

    import tvm_stitch
    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen import embed
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.families.attention.triton import attention_tma
    from tvm_stitch.graph import build_graph
    from tvm_stitch.workloads import get_workload

    def attention(name, **params):
        inst = get_workload(name).instance("float16", **params)
        with tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}):
            mod = relax.transform.LegalizeOps()(tvm_stitch.passes.AccumulateFloat32()(inst.mod))
        graph = build_graph(mod, legalize=False)
        match = recognize(graph, ("attention",)).matches[0]
        source = kernel_source(match)
        shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
                  for t in [*source.inputs, *source.outputs]}
        return match, source, shapes

    match, source, shapes = attention("bert-base", batch=1, seq=128)
    assert attention_tma(match) is None and source.tma and "TMA: tl.constexpr" in source.text
    cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    plain = embed.generated_launch(source, match, cfg, shapes)
    assert "cp.async.bulk.tensor" not in plain.ptx and len(plain.func.params) == 5
    launch = embed.generated_launch(source, match, {**cfg, "TMA": True}, shapes)
    assert "cp.async.bulk.tensor" in launch.ptx and "wgmma.mma_async" in launch.ptx
    assert launch.symbol.endswith("t") and launch.symbol != plain.symbol
    # 2 query tiles x 12 heads, 3 descriptors of 128 bytes each
    assert int(launch.func.params[-1].shape[0]) == 24 * 3 * 128

    match, source, _ = attention("torch-attention", batch=1, heads=2, seq=64, dim=60, causal=0)
    assert "16 bytes" in attention_tma(match)
    assert not source.tma and "TMA" not in source.text


def test_attention_rounds_its_float16_logits_in_pairs():
    """BERT's logits are the product rounded to float16 (``(q·kᵀ).half()``), every key block:
    the generated attention rounds them two values an instruction (``cvt.rn.f16x2.f32``), no
    float32 value is rounded alone in its sm_90a PTX; a GEMM's text does not import the
    helper (its name, and so its tuning records, unchanged)."""
    import re

    import tvm

    from tvm_stitch.analysis.recognize import recognize
    from tvm_stitch.codegen import embed
    from tvm_stitch.codegen.triton_gen import kernel_source
    from tvm_stitch.graph import build_graph
    from tvm_stitch.pipeline import run_until
    from tvm_stitch.workloads import get_workload

    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    inst = get_workload("bert-base").instance("float16", batch=1, seq=136)
    graph = build_graph(run_until(inst.mod, cuda, "StitchFuseMBCI"), legalize=False)
    found = recognize(graph, ("attention", "gemm")).matches
    match = next(m for m in found if m.family == "attention")
    source = kernel_source(match)
    assert re.search(r"= _cvt_f16x2\(s\)", source.text), source.text
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
              for t in [*source.inputs, *source.outputs]}
    ptx = embed.generated_launch(source, match, {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4,
                                                 "num_stages": 3}, shapes).ptx
    assert "cvt.rn.f16x2.f32" in ptx
    # no value rounded alone on a line rounding logits (the partial last key block's
    # probabilities may be: Triton knows which of its columns are past the keys)
    lines, alone, at = source.text.splitlines(), [], None
    for line in ptx.splitlines():
        loc = re.match(r"\s*\.loc\s+1\s+(\d+)", line)
        at = int(loc.group(1)) if loc else at
        if re.search(r"cvt\.rn\.f16\.f32", line):
            alone.append(lines[at - 1])
    assert not [x for x in alone if "_cvt_f16x2" in x], alone
    gemm = next(m for m in found if m.family == "gemm")
    assert "_cvt_" not in kernel_source(gemm).text


def test_only_whole_tiles_round_in_pairs():
    """Paired rounding takes two neighbouring values a thread: a value reading the product (a
    whole tile) is rounded so; a key vector (a float32 mask) keeps ``.to()``; without
    ``paired`` nothing changes."""
    from tvm_stitch.analysis.elem import Const, Leaf, Op
    from tvm_stitch.analysis.indexing import Strided
    from tvm_stitch.codegen.elem_printer import ElemPrinter

    s = Leaf("s", ("m", "n"), "float32")
    mask = Leaf("mask", ("n",), "float32")
    view = Strided("mask", (64,), "float32", 0, (("n", 1),))
    logits = Op("cast", (Op("mul", (s, Const(0.125, "float32")), "float32"),), "float16")
    key = Op("cast", (mask,), "float16")

    def printed(paired):
        p = ElemPrinter({"m": "rm[:, None]", "n": "rn[None, :]"}, {}, {"mask": "M"},
                        {mask.key(): view}, {"s": ("s", "float32")}, paired=paired)
        p.expr(Op("add", (logits, key), "float16"))
        return "\n".join(p.lines)

    text = printed(True)
    assert text.count("_cvt_f16x2(") == 1 and ".to(tl.float16)" in text, text
    assert "_cvt_" not in printed(False)


def test_a_cast_constant_is_folded():
    """A mask folded to one value (DeBERTa-v2's relative-position attention at 37 tokens: a
    comparison every element of which is False), cast, is the cast value: Triton has no
    ``False.to(tl.int64)`` (the attention compiled nowhere and was left to TVM)."""
    from tvm_stitch.analysis.elem import Const, Leaf, Op
    from tvm_stitch.analysis.indexing import Strided
    from tvm_stitch.codegen.elem_printer import ElemPrinter

    x = Leaf("x", ("n",), "float16")
    view = Strided("x", (64,), "float16", 0, (("n", 1),))
    p = ElemPrinter({"n": "rn"}, {}, {"x": "X"}, {x.key(): view}, {})
    shift = Op("cast", (Const(False, "bool"),), "int64")
    one = Op("cast", (Const(True, "bool"),), "float16")
    text = p.expr(Op("add", (Op("mul", (x, one), "float16"),
                             Op("cast", (shift,), "float16")), "float16"))
    printed = "\n".join([*p.lines, text])
    assert ".to(" not in printed and "False" not in printed, printed
    assert " = 1.0\n" in printed and " = 0.0\n" in printed, printed
    # as the kernel would cast: wrapped, rounded
    import numpy as np

    p = ElemPrinter({}, {}, {}, {}, {})
    casts = [Op("cast", (Const(300, "int32"),), "int8"),
             Op("cast", (Const(0.1, "float32"),), "float16")]  # alive while printed
    for cast in casts:
        p.expr(cast)
    assert [line.split(" = ")[1] for line in p.lines] == [
        "44", repr(float(np.float16(np.float32(0.1))))]


def test_template_legality():
    spec = ChainSpec.gemm_chain(1, 512, 512, 256, 256)
    tiles = {"m": 64, "n": 64, "k": 64, "h": 64}
    flat = TilingExpr(("m", "n"), (("k",), ("h",)))
    reason = chain_template.chain_legality(spec, Candidate(flat, tuple(tiles.items())))
    assert reason and "accumulators" in reason  # 4 h tiles inside the n loop
    ok = Candidate(flat, tuple({**tiles, "h": 256}.items()))  # one h tile: a FlashAttention shape
    assert chain_template.chain_legality(spec, ok) is None
    assert chain_template.chain_config(spec, ok)["BLOCK_H"] == 256
    deep = Candidate(TilingExpr(tuple("mhnk")), tuple(tiles.items()))
    assert chain_template.chain_legality(spec, deep) is None
    assert not chain_template.chain_config(spec, deep)["HOIST_A"]
    kn = Candidate(TilingExpr(tuple("mhkn")), tuple(tiles.items()))
    assert "encloses n" in chain_template.chain_legality(spec, kn)
    odd = Candidate(TilingExpr(tuple("mhnk")), tuple({**tiles, "n": 48}.items()))
    assert "powers of two" in chain_template.chain_legality(spec, odd)  # Triton's tl.arange


def test_erf_printed_to_the_accuracy_its_sum_needs():
    """An erf added to a constant at least half its scale (GELU's ``1 + erf`` and TVM's
    ``0.5 + 0.5·erf``, through casts) is printed as ``_erf_abs``; a bare or finely offset erf
    keeps libdevice's, and the two forms of one erf are two values."""
    from tvm_stitch.analysis.elem import Const, Leaf, Op, offset_erf
    from tvm_stitch.analysis.indexing import Strided
    from tvm_stitch.codegen.elem_printer import ElemPrinter

    x = Leaf("x", ("i",), "float16")
    u = Op("mul", (x, Const(0.7071067811865476, "float16")), "float16")
    erf32 = Op("erf", (Op("cast", (u,), "float32"),), "float32")
    half = Op("cast", (erf32,), "float16")
    tvm_gelu = Op("mul", (x, Op("add", (Const(0.5, "float16"),
                                         Op("mul", (half, Const(0.5, "float16")), "float16")),
                                "float16")), "float16")
    hf_sum = Op("sub", (Const(1.0, "float32"), erf32), "float32")
    fine = Op("add", (Const(0.1, "float32"), Op("mul", (erf32, Const(3.0, "float32")),
                                                "float32")), "float32")
    assert offset_erf(tvm_gelu.args[1]) is erf32 and offset_erf(hf_sum) is erf32
    assert offset_erf(fine) is None and offset_erf(erf32) is None
    erf64 = Op("erf", (Leaf("y", ("i",), "float64"),), "float64")
    assert offset_erf(Op("add", (Const(1.0, "float64"), erf64), "float64")) is None

    view = Strided("x", (8,), "float16", 0, (("i", 1),))
    p = ElemPrinter({"i": "ri"}, {}, {"x": "X"}, {x.key(): view}, {})
    p.expr(tvm_gelu)
    p.expr(fine)
    text = "\n".join(p.lines)
    assert text.count("_erf_abs(") == 1 and text.count("tl.math.erf(") == 1, text


@triton.jit
def _erf_kernel(x_ptr, y_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    tl.store(y_ptr + i, tk._erf_abs(tl.load(x_ptr + i)))


@pytest.mark.gpu
def test_erf_to_absolute_accuracy_on_the_gpu():
    """On the GPU ``ex2.approx`` (two units at 1) adds to the fit's 1.1e-7: within 2.5e-7."""
    import torch

    x = torch.linspace(-6, 6, 1 << 16, device="cuda")
    y = torch.empty_like(x)
    _erf_kernel[(1,)](x, y, n=1 << 16)
    assert (y.double() - torch.erf(x.double())).abs().max().item() <= 2.5e-7


@triton.jit
def _pairs_kernel(x_ptr, y_ptr, z_ptr, n: tl.constexpr):
    i = tl.arange(0, n)
    x = tl.load(x_ptr + i)
    tl.store(y_ptr + i, tk._cvt_f16x2(x))
    tl.store(z_ptr + i, tk._cvt_bf16x2(x))


@pytest.mark.gpu
def test_paired_roundings_are_the_casts_on_the_gpu():
    """``cvt.rn.f16x2.f32`` and ``cvt.rn.bf16x2.f32`` two values at a time round each value as
    PyTorch's casts do, bit for bit: halfway cases, subnormals, overflow, infinities, NaN."""
    import torch

    g = torch.Generator().manual_seed(0)
    special = torch.tensor([0.0, -0.0, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 65504.0, 65520.0,
                            1e6, -1e6, 2.0**-25, 3 * 2.0**-26, 1e-8, float("inf"),
                            float("-inf"), float("nan"), 1.0 + 2.0**-8, -(1.0 + 3 * 2.0**-8)])
    x = torch.cat([special, torch.randn(4096 - 16, generator=g) * 100,
                   torch.randn(4096, generator=g) * 1e-5]).cuda()
    y = torch.empty(x.shape, dtype=torch.float16, device="cuda")
    z = torch.empty(x.shape, dtype=torch.bfloat16, device="cuda")
    _pairs_kernel[(1,)](x, y, z, n=x.numel())
    keep = ~torch.isnan(x)  # NaN stays NaN (its payload aside)
    for rounded, cast in ((y, x.half()), (z, x.bfloat16())):
        assert torch.isnan(rounded).equal(~keep)
        assert torch.equal(rounded[keep].view(torch.int16), cast[keep].view(torch.int16))


def test_tma_stores_are_searched_beside_pointer_stores():
    """A GEMM that can store by TMA has each persistent launch (and seed) searched both ways;
    one-program-per-tile and split launches keep pointer stores; without the form, none."""
    from tvm_stitch.families.gemm.tune import template_options

    plain, plain_seeds = template_options(True, True)
    launches, seeds = template_options(True, True, tma_store=True)
    stored = [o for o in launches if o.get("TMA_STORE")]
    assert stored and all(o["PERSISTENT"] and o.get("SPLIT_K", 1) == 1 for o in stored)
    assert [{k: v for k, v in o.items() if k != "TMA_STORE"} for o in stored] == [
        o for o in plain if o["PERSISTENT"]]
    assert len(seeds) == len(plain_seeds) + sum(s["launch"]["PERSISTENT"] for s in plain_seeds)
    assert not any(o.get("TMA_STORE") for o in plain + template_options(False, True, True)[0])


def test_softmax_scale_comes_out_of_the_row_maxima():
    """The logits' positive scale (with log2 e) comes out of the online softmax's maxima, one
    for the masked and the visible logits of a causal attention: ``exp2(y·c − max·c)`` is one
    FMA a logit.  A model's float16 logits keep their roundings (only the final widening is
    scaled).  Logits without one common factor, or not bounded (a -1e9 mask: a row of keys all
    masked would take max · c's rounding error as its exponent; a float32 or bfloat16 value
    that log2 e would scale past float32's range), stay as written and the softmax computes
    ``exp2((y − max) · log2 e)``."""
    from tvm_stitch.analysis.elem import Const, Iter, Leaf, Op
    from tvm_stitch.families.attention.triton import LOG2E, softmax_exp2
    from tvm_stitch.families.attention.triton import scaled_logits as _scaled_logits

    s = Leaf("s", (), "float32")

    def keys(es):
        return [e.key() for e in es]

    def scaled_logits(*scores):
        return _scaled_logits(*scores, product="s")

    (y,), c, fused = scaled_logits(Op("mul", (s, Const(0.125, "float32")), "float32"))
    assert keys([y]) == keys([s]) and c == 0.125 * LOG2E and fused
    # BERT: (s as float16) · 0.125 + mask, in float16, then widened
    half = Op("add", (Op("mul", (Op("cast", (s,), "float16"), Const(0.125, "float16")),
                             "float16"), Leaf("mask", (), "float16")), "float16")
    (y,), c, fused = scaled_logits(half)
    assert keys([y]) == keys([Op("cast", (half,), "float32")]) and c == LOG2E and fused
    # the same in bfloat16: its values reach 3.4e38, which log2 e would scale to -inf
    bf = Op("add", (Op("mul", (Op("cast", (s,), "bfloat16"), Const(0.125, "bfloat16")),
                           "bfloat16"), Leaf("mask", (), "bfloat16")), "bfloat16")
    (y,), c, fused = scaled_logits(bf)
    assert keys([y]) == keys([bf]) and c == LOG2E and not fused
    # causal: the masked logits and the visible ones share the factor; -inf stays -inf
    cond = Iter("n > m", "bool")
    scaled = Op("mul", (s, Const(0.125, "float32")), "float32")
    masked = Op("select", (cond, Const(float("-inf"), "float32"), scaled), "float32")
    (ym, yv), c, fused = scaled_logits(masked, scaled)
    assert c == 0.125 * LOG2E and fused and keys([yv]) == keys([s])
    assert keys([ym]) == keys([Op("select", (cond, Const(float("-inf"), "float32"), s),
                                  "float32")])
    # a bias scaled otherwise: no common factor, the logits as written
    bias = Op("mul", (Leaf("bias", (), "float32"), Const(2.0, "float32")), "float32")
    logits = Op("add", (scaled, bias), "float32")
    (y,), c, fused = scaled_logits(logits)
    assert keys([y]) == keys([logits]) and c == LOG2E and not fused
    # a huge finite mask (a row of keys all masked: max · c rounded far from every y · c) or a
    # float32 read scaled alike (unbounded) keeps the logits as written; -10000 is fine
    for big, want in ((-1e9, False), (-1e4, True)):
        mask = Op("select", (cond, Const(big * 0.125, "float32"), Const(0.0, "float32")),
                  "float32")
        assert scaled_logits(Op("add", (scaled, mask), "float32"))[2] == want, big
    bias = Op("mul", (Leaf("bias", (), "float32"), Const(0.125, "float32")), "float32")
    assert not scaled_logits(Op("add", (scaled, bias), "float32"))[2]
    assert softmax_exp2(0.5, fused=True) == ("z * 0.5 - {m} * 0.5", "(m_i - m_safe) * 0.5")
    assert softmax_exp2(0.5, fused=False) == ("(z - {m}) * 0.5", "(m_i - m_safe) * 0.5")
