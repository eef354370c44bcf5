"""The warp-specialized Gluon form of the generated attention (tvm_stitch.families.attention.gluon):
when it applies and why not, its sm_90a PTX on any machine, its numerics against the TE
reference on the GPU (Gluon has no interpreter), and the search measuring it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm

from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.codegen import embed
from tvm_stitch.codegen.kernel_text import gluon_version
from tvm_stitch.codegen.triton_gen import kernel_source
from tvm_stitch.families.attention.gluon import WS_TILES, ws_legality
from tvm_stitch.graph import build_graph
from tvm_stitch.pipeline import run_until
from tvm_stitch.workloads import get_workload

pytestmark = pytest.mark.skipif(gluon_version() is not None, reason=str(gluon_version()))

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})

#: attention as models bring it: sequence lengths no tile divides, a causal mask, heads side by
#: side in rows (BERT's [batch, seq, heads, dim] read in place: a head is a column offset of
#: the flat matrix), a padding mask read in place (Hugging Face BERT)
CASES = [
    ("torch-attention", "float16", dict(batch=2, heads=3, seq=200, dim=64, causal=1)),
    ("torch-attention", "float16", dict(batch=1, heads=2, seq=384, dim=128, causal=0)),
    ("bert-base", "float16", dict(batch=2, seq=200)),
    ("hf-bert-tiny", "float16", dict(batch=2, seq=72)),
    # sliding windows: Mistral's (causal) and one on both sides; no tile divides the lengths
    ("torch-attention", "float16", dict(batch=1, heads=2, seq=520, dim=64, causal=1,
                                        window=130)),
    ("torch-attention", "float16", dict(batch=1, heads=2, seq=400, dim=128, causal=0,
                                        window=200)),
    # LLaMA's grouped K/V heads (4 query heads a K/V head), causal, head dim 128
    ("torch-attention", "float16", dict(batch=1, heads=8, kv_heads=2, seq=300, dim=128,
                                        causal=1)),
]


def _attention(name, dtype, **params):
    inst = get_workload(name).instance(dtype, **params)
    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    match = recognize(graph, ("attention",)).matches[0]
    source = kernel_source(match)
    shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
              for t in [*source.inputs, *source.outputs]}
    return match, source, shapes, graph


def _ws(n, slots):
    return {"BLOCK_M": 128, "BLOCK_N": n, "num_warps": 4, "num_stages": slots, "WS": True,
            "NUM_SMS": 132}


@pytest.mark.parametrize("name,dtype,params", CASES[:3])
def test_warp_specialized_form_compiles_for_hopper(name, dtype, params):
    """Three warpgroups (two consumers, a loading warp's group), registers moved between them
    with setmaxnreg, TMA loads behind mbarriers, asynchronous wgmma; a symbol of its own."""
    match, source, shapes, _ = _attention(name, dtype, **params)
    assert ws_legality(match) is None and source.ws and "gl.warp_specialize" in source.ws
    triton_form = embed.generated_launch(
        source, match, {"BLOCK_M": 128, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2}, shapes)
    launch = embed.generated_launch(source, match, _ws(*WS_TILES[0]), shapes)
    ptx = launch.ptx
    assert ".reqntid 384" in ptx and ".maxnreg 168" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 240" in ptx.replace("\t", " ").replace("  ", " ")
    assert "cp.async.bulk.tensor" in ptx and "mbarrier.try_wait" in ptx
    assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1" in ptx
    assert launch.symbol.endswith("ws") and launch.symbol != triton_form.symbol
    # Q, K and V as TMA descriptors the host makes (no scratch memory for device-made ones),
    # passed by value (the module's function table marks them)
    assert len(launch.func.params) == len(source.inputs) + len(source.outputs)
    assert str(launch.func).count("tensormap_encode_tiled") == 3
    n_ptrs = len(source.inputs) + len(source.outputs)
    assert launch.arg_types[n_ptrs:n_ptrs + 5] == ["tensormap", "int32", "int32", "int64", "int64"]
    assert ".param .align 64 .b8" in ptx and "tensormap.replace" not in ptx


def test_causal_blocks_masks_and_heads_in_the_gluon_form():
    """A causal attention skips key blocks past the diagonal (longest rows first) and evaluates
    the mask only on blocks the diagonal crosses; ragged lengths mask keys past the end and
    store no row past it; BERT's heads are column offsets of one flat descriptor."""
    _, source, _, _ = _attention("torch-attention", "float16", batch=2, heads=3, seq=200,
                                 dim=64, causal=1)
    text = source.ws
    assert "TILES = gl.constexpr(12)" in text and "pid_m = 1 - i // 6" in text
    assert "gl.minimum(200, (pid_m + 1) * 128 + 0)" in text  # blocks past the diagonal skipped
    assert "if n0 + BLOCK_N - 1 > m0 + 0:" in text  # the mask only where the diagonal crosses
    assert "(rn < 200)[None, :]" in text and "(rm < 200)[:, None]" in text
    _, source, _, _ = _attention("bert-base", "float16", batch=2, seq=200)
    # Q of (batch, seq, 12 heads, 64): rows of 768 elements (the layout stride), head h at
    # column 64·h
    assert "q_col = (b * 153600 + h * 64) % 768" in source.ws


def _tile_function(text: str, programs: int):
    """The generated ``_tile`` as a Python function, ``gl`` a stand-in with ``programs``
    programs."""
    import re
    import types

    body = re.search(r"def _tile\(t, BLOCK_N: gl.constexpr\):\n((?:    .*\n)+)", text).group(1)
    gl = types.SimpleNamespace(num_programs=lambda axis: programs, cdiv=lambda a, b: -(-a // b),
                               maximum=max, minimum=min)
    consts = dict(re.findall(r"^(\w+) = gl.constexpr\((\d+)\)$", text, re.M))
    scope = {"gl": gl, **{k: int(v) for k, v in consts.items()}}
    exec("def _tile(t, BLOCK_N):\n" + body, scope)
    return scope["_tile"], int(consts["TILES"])


@pytest.mark.parametrize("programs", [132, 7, 24, 200])
def test_causal_tiles_are_balanced_over_persistent_programs(programs):
    """Each (batch, head, query block) of a causal grouped-head attention is walked once, by
    some program; blocks go longest first with a block's heads side by side, and the programs'
    sums of key blocks stay near their mean (head-major order left one 20 % over at 4 × 32
    heads × 2048 tokens on 132 SMs)."""
    _, source, _, _ = _attention("torch-attention", "float16", batch=4, heads=32, kv_heads=8,
                                 seq=2048, dim=128, causal=1)
    tile, tiles = _tile_function(source.ws, programs)
    seen, load = [], [0] * programs
    for p in range(programs):
        for t in range(p, tiles, programs):
            b, h, hk, pid_m, first, blocks = tile(t, 128)
            assert hk == h // 4 and first == 0 and blocks == pid_m + 1
            seen.append((b, h, pid_m))
            load[p] += blocks
    # (the frame may merge batch and heads into one axis of 128)
    assert len(seen) == len(set(seen)) == tiles == 4 * 32 * 16
    assert {m for *_, m in seen} == set(range(16))
    rounds = [[tile(t, 128)[3] for t in range(r, min(r + programs, tiles))]
              for r in range(0, tiles, programs)]
    assert rounds[0][0] == 15 and rounds[-1][-1] == 0  # the longest first
    assert all(min(a) >= max(b) for a, b in itertools.pairwise(rounds))
    assert [tile(t, 128)[1] for t in range(4)] == [0, 1, 2, 3]  # a group's heads together
    mean = sum(load) / programs
    assert max(load) <= 1.04 * mean, (max(load), mean)


def test_sliding_windows_in_the_gluon_form():
    """A sliding window: each tile's key loop starts at the block holding its first row's
    window (the loading warp and the consumers both), and the mask is evaluated only on the
    blocks either edge of the band crosses; the kernel compiles for sm_90a."""
    match, source, shapes, _ = _attention("torch-attention", "float16", batch=1, heads=2,
                                          seq=520, dim=64, causal=1, window=130)
    assert (match.window, match.causal) == (-129, 0) and ws_legality(match) is None
    text = source.ws
    assert "first = gl.maximum(pid_m * 128 - 129, 0) // BLOCK_N" in text
    assert "BLOCK_N) - first" in text  # past the diagonal, less the blocks before the window
    assert "[k_row + (first + j) * BLOCK_N, k_col]" in text
    assert "if n0 + BLOCK_N - 1 > m0 + 0 or n0 < m0 - 66:" in text
    ptx = embed.generated_launch(source, match, _ws(*WS_TILES[0]), shapes).ptx
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx


@pytest.mark.parametrize(
    "dtype,params,reason",
    [
        ("float32", dict(dim=64), "not one 16-bit float type"),
        ("float16", dict(dim=256), "head dimension above 128"),
        ("float16", dict(dim=60), "16 bytes"),  # 120-byte rows: TMA cannot read them
        ("float16", dict(dim=80), "not a power of two"),  # a box would read a neighbour's
    ],
)
def test_warp_specialized_form_says_why_not(dtype, params, reason):
    match, source, _, _ = _attention("torch-attention", dtype, batch=1, heads=2, seq=64,
                                     causal=0, **params)
    assert reason in ws_legality(match) and source.ws is None


def test_search_measures_the_warp_specialized_form():
    """The attention search seeds the Gluon form at each of its tilings (launch ``WS``)."""
    from tvm_stitch.families.attention.tune import ws_seeds

    seeds = ws_seeds()
    assert [(s["m"], s["n"], s["launch"]["num_stages"]) for s in seeds] == [
        (128, n, slots) for n, slots in WS_TILES]
    assert all(s["launch"]["WS"] for s in seeds)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype,params", CASES)
def test_warp_specialized_attention_numerics(name, dtype, params):
    """Every tiling of the Gluon form against the TE reference compiled for the CPU."""
    import torch

    from tvm_stitch.codegen.kernel_text import launch_constexprs, torch_descriptors
    from tvm_stitch.codegen.te_reference import reference_func
    from tvm_stitch.codegen.triton_gen import load

    match, source, shapes, graph = _attention(name, dtype, **params)
    rng = np.random.default_rng(0)
    inputs = []
    for t in source.inputs:
        value = graph.values.get(t)
        shape, dt = shapes[t]
        if isinstance(value, tvm.ir.expr.Constant):
            inputs.append(value.value.numpy())
        elif dt == "bool":
            inputs.append(rng.random(shape) > 0.3)
        elif "int" in dt:
            inputs.append(rng.integers(0, 2, shape).astype(dt))
        else:
            inputs.append((rng.standard_normal(shape) * 0.5).astype(dt))
    ex = tvm.compile(tvm.IRModule({"main": reference_func(match, source, shapes)}), "llvm")
    refs = [tvm.runtime.tensor(np.zeros(shapes[t][0], shapes[t][1])) for t in source.outputs]
    ex["main"](*[tvm.runtime.tensor(a) for a in inputs], *refs)
    args = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in inputs]
    for n, slots in WS_TILES:
        config = _ws(n, slots)
        fn = load(source, config)
        consts = launch_constexprs(source, match, config, fn.arg_names)
        outs = [torch.full(tuple(shapes[t][0]), float("nan"), dtype=getattr(torch, shapes[t][1]),
                           device="cuda") for t in source.outputs]
        descs = torch_descriptors(source, config, consts, args)
        fn[source.grid({**consts, "WS": True}, match)](*args, *outs, **descs, **consts,
                                                       **embed.launch_options(source, config))
        torch.cuda.synchronize()
        for ref, out in zip(refs, outs):
            r = ref.numpy().astype("float32")
            g = out.float().cpu().numpy()
            err = float(np.abs(g - r).max())
            assert np.isfinite(g).all() and err <= 2e-2 * max(1.0, float(np.abs(r).max())), (
                f"{match.describe()} BLOCK_N={n} NB={slots}: max error {err}")


def _stored_ws(tmp_path, monkeypatch, inst):
    """A tuning database holding the warp-specialized form for ``inst``'s attention."""
    import tvm_stitch
    from tvm_stitch.tune.database import TuningDatabase
    from tvm_stitch.tune.policy import tuning_key

    graph = build_graph(run_until(inst.mod, CUDA, "StitchFuseMBCI"), legalize=False)
    match = recognize(graph, ("attention",)).matches[0]
    db = TuningDatabase(tmp_path / "tuning.json")
    hw = tvm_stitch.HardwareModel.from_target(CUDA)
    db.put(tuning_key(db, match, kernel_source(match), hw), _ws(*WS_TILES[0]), time_us=1.0)
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "tuning.json"))


def test_a_stored_warp_specialized_choice_is_built_and_exported(tmp_path, monkeypatch):
    """The tuning database's choice of the Gluon form is what the pipeline embeds: its launch
    encodes Q's, K's and V's descriptors on the host, and the library exports (on a CPU
    machine: the PTX as a source the GPU host's compile hook hands back)."""
    import tvm_stitch

    inst = get_workload("torch-attention").instance("float16", batch=1, heads=2, seq=384,
                                                    dim=128, causal=1)
    _stored_ws(tmp_path, monkeypatch, inst)
    from tvm_stitch.report import fusion_report

    assert fusion_report(inst.mod, CUDA, "stitch").kernels == 1  # one launch, seen as such
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    ex.export_library(str(tmp_path / "mod.so"))
    blob = (tmp_path / "mod.so").read_bytes()
    # the Gluon kernel (registers moved between warpgroups, Q/K/V by value) and the host's
    # encoding of their descriptors
    assert b"setmaxnreg" in blob and b".param .align 64 .b8" in blob
    assert b"cuTensorMapEncodeTiled" in blob


@pytest.mark.gpu
def test_warp_specialized_attention_through_the_pipeline(tmp_path, monkeypatch):
    """The pipeline's executable with the Gluon form (descriptors made by TVM's host code)
    against PyTorch."""
    import torch

    import tvm_stitch

    inst = get_workload("torch-attention").instance("float16", batch=1, heads=2, seq=384,
                                                    dim=128, causal=1)
    _stored_ws(tmp_path, monkeypatch, inst)
    ex = tvm.compile(inst.mod, CUDA, relax_pipeline=tvm_stitch.pipeline(CUDA))
    vm = tvm.relax.VirtualMachine(ex, tvm.cuda())
    got = vm[inst.func](*[tvm.runtime.tensor(a, tvm.cuda()) for a in inst.args]).numpy()
    q, k, v = (torch.from_numpy(a).float() for a in inst.args)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    assert np.abs(got.astype("float32") - ref).max() < 2e-2


def test_float16_logits_keep_the_products_asynchronous(tmp_path):
    """BERT computes its logits in float16 and adds its padding mask: the mask is loaded before
    the products are issued, and ptxas keeps the wgmma asynchronous (no C7514 serialization,
    which rounding the accumulator straight to f16x2 caused)."""
    import os
    import subprocess

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton ships no ptxas here")
    match, source, shapes, _ = _attention("bert-base", "float16", batch=2, seq=128)
    text = source.ws
    load = text.index("gl.load(I3")
    assert text.index("def _logit_inputs") < load < text.index("def _softmax")
    assert "(s + 0.0).to(gl.float16)" in text
    launch = embed.generated_launch(source, match, _ws(*WS_TILES[0]), shapes)
    (tmp_path / "k.ptx").write_text(launch.ptx)
    out = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", str(tmp_path / "k.ptx"), "-o",
                          str(tmp_path / "k.o")], capture_output=True, text=True, check=True)
    assert "C7514" not in out.stderr and " 0 bytes spill stores" in out.stderr


def test_model_only_search_picks_the_warp_specialized_form():
    """Without a GPU or a stored choice the cost model prices the Gluon form beside the Triton
    form's launches; at head dim 128 it picks it (the H100's measured best there), with the
    tiling and program count the kernel needs."""
    import tvm_stitch
    from tvm_stitch.tune.kernels import tune_generated

    match, source, shapes, _ = _attention("torch-attention", "float16", batch=4, heads=16,
                                          seq=512, dim=128, causal=0)
    hw = tvm_stitch.HardwareModel.from_target(CUDA)
    tuned = tune_generated(match, source, shapes, hw=hw, on_device=False)
    assert tuned.config["WS"] and tuned.config["BLOCK_M"] == 128
    assert tuned.config["NUM_SMS"] == hw.num_sms and tuned.measurements == []
    launch = embed.generated_launch(source, match, tuned.config, shapes)
    assert launch.symbol.endswith("ws")
