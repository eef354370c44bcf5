"""StageInputs: kernels reading model inputs no longer cut TVM's CUDA graphs."""

from __future__ import annotations

import re

import pytest
import tvm
import tvm_stitch.passes
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T
from tvm_stitch.passes import StageInputs

import tvm_stitch
from tvm_stitch.workloads import get_workload

CUDA = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
GRAPHS = {"relax.backend.use_cuda_graph": True}


@I.ir_module
class Before:
    @T.prim_func(private=True, s_tir=True)
    def add(a: T.Buffer((4, 8), "float16"), m: T.Buffer((4, 8), "float16"),
            out: T.Buffer((4, 8), "float16")):
        for i, j in T.grid(4, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = a[vi, vj] + m[vi, vj]

    @R.function
    def main(x: R.Tensor((4, 8), "float16"), mask: R.Tensor((4, 8), "float16"),
             w: R.Tensor((4, 8), "float16")) -> R.Tensor((4, 8), "float16"):
        R.func_attr({"num_input": 2})
        cls = Before
        with R.dataflow():
            y = R.call_tir(cls.add, (w, mask), out_ty=R.Tensor((4, 8), "float16"))
            y1 = R.call_tir(cls.add, (y, w), out_ty=R.Tensor((4, 8), "float16"))
            y2 = R.call_tir(cls.add, (y1, mask), out_ty=R.Tensor((4, 8), "float16"))
            y3 = R.call_tir(cls.add, (y2, w), out_ty=R.Tensor((4, 8), "float16"))
            z = R.call_tir(cls.add, (y3, mask), out_ty=R.Tensor((4, 8), "float16"))
            R.output(z)
        return z


@I.ir_module
class Expected:
    @T.prim_func(private=True, s_tir=True)
    def add(a: T.Buffer((4, 8), "float16"), m: T.Buffer((4, 8), "float16"),
            out: T.Buffer((4, 8), "float16")):
        for i, j in T.grid(4, 8):
            with T.sblock("add"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = a[vi, vj] + m[vi, vj]

    @T.prim_func(s_tir=True)
    def stage_input_0(x: T.Buffer((4, 8), "float16"), staged: T.Buffer((4, 8), "float16")):
        T.func_attr({"global_symbol": "stage_input_0", "op_pattern": 0, "tirx.noalias": True})
        for i0, i1 in T.grid(4, 8):
            with T.sblock("staged"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                staged[v_i0, v_i1] = x[v_i0, v_i1]

    @R.function
    def main(x: R.Tensor((4, 8), "float16"), mask: R.Tensor((4, 8), "float16"),
             w: R.Tensor((4, 8), "float16")) -> R.Tensor((4, 8), "float16"):
        R.func_attr({"num_input": 2})
        cls = Expected
        with R.dataflow():
            mask_staged = R.call_tir(cls.stage_input_0, (mask,),
                                     out_ty=R.Tensor((4, 8), "float16"))
            y = R.call_tir(cls.add, (w, mask_staged), out_ty=R.Tensor((4, 8), "float16"))
            y1 = R.call_tir(cls.add, (y, w), out_ty=R.Tensor((4, 8), "float16"))
            y2 = R.call_tir(cls.add, (y1, mask_staged), out_ty=R.Tensor((4, 8), "float16"))
            y3 = R.call_tir(cls.add, (y2, w), out_ty=R.Tensor((4, 8), "float16"))
            z = R.call_tir(cls.add, (y3, mask_staged), out_ty=R.Tensor((4, 8), "float16"))
            R.output(mask_staged, z)
        return z


def test_an_input_read_by_kernels_is_copied_first():
    """The mask (an input read by three of five kernels, which would cut the CUDA graph into
    five launches) is copied once; the weight (after ``num_input``) and the unread input ``x``
    are left alone."""
    with tvm.transform.PassContext(config=GRAPHS):
        after = StageInputs()(Before)
    tvm.ir.assert_structural_equal(after, Expected)


def _kernels(inputs: dict, kernels: list, weight=None):
    """``main`` over the float16 ``inputs`` (name -> shape) and a weight ``w`` of shape
    ``weight``; one elementwise kernel per entry of ``kernels`` (the names it reads, and the
    previous kernel's output where it has the same shape)."""
    from tvm import relax, te

    params = {n: relax.Var(n, R.Tensor(shape, "float16")) for n, shape in inputs.items()}
    if weight:
        params["w"] = relax.Var("w", R.Tensor(weight, "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", list(params.values()), attrs={"num_input": len(inputs)}):
        with bb.dataflow():
            prev = None
            for names in kernels:
                args = [params[n] for n in names]
                shape = [int(d) for d in args[0].ty.shape]
                if prev is not None and [int(d) for d in prev.ty.shape] == shape:
                    args.insert(0, prev)
                prev = bb.emit_te(lambda *ts: te.compute(
                    ts[0].shape, lambda *i: sum(t(*i) for t in ts)), *args)
            out = bb.emit_output(prev)
        bb.emit_func_output(out)
    return bb.get()


def _staged(mod) -> list[str]:
    """Names of the inputs ``StageInputs`` copies in ``mod``'s main."""
    from tvm import relax

    with tvm.transform.PassContext(config=GRAPHS):
        after = StageInputs()(mod)
    calls = [b.value for b in after["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call)]
    return [c.args[1][0].name for c in calls
            if c.args[0].name_hint.startswith("stage_input")]


def test_large_inputs_read_by_one_kernel_are_not_copied():
    """An attention's query, key and value (64 MB each at 8×16×4096×64) read by its one
    kernel: copying them would cost a call 100-190 µs on the H200 and save no graph cut, so
    nothing changes; the same kernel over inputs of 64 KB is not copied either (one kernel
    is one launch either way)."""
    for shape in [(8, 16, 4096, 64), (2, 2, 128, 64)]:
        mod = _kernels({"q": shape, "k": shape, "v": shape}, [("q", "k", "v")])
        with tvm.transform.PassContext(config=GRAPHS):
            assert StageInputs()(mod).same_as(mod)


def test_a_mask_is_copied_and_large_hidden_states_are_not():
    """Hidden states read by three kernels and a mask read by two, the weight's kernels
    between them: the mask's copy (16 KB) costs less than the VM's launches it saves. At
    2048×4096 (16 MB) the hidden states' copy costs more than the three cuts they make, so
    they are read where they are; at 64×128 they are copied too."""
    kernels = [("h",), ("w",), ("h",), ("w",), ("h",), ("w",), ("m",), ("w",), ("m",), ("w",)]
    large = _kernels({"h": (2048, 4096), "m": (64, 128)}, kernels, weight=(2048, 4096))
    assert _staged(large) == ["m"]
    small = _kernels({"h": (64, 128), "m": (64, 128)}, kernels, weight=(64, 128))
    assert sorted(_staged(small)) == ["h", "m"]


def test_the_copies_are_chosen_by_their_cost_against_the_vm_launches_they_save():
    """``vm_launches``: each copy, each kernel reading an input not copied, each run of the
    others; ``inputs_to_stage`` takes the cheapest set, preferring fewer copies."""
    from tvm_stitch.cost.graphs import inputs_to_stage, vm_launches
    from tvm_stitch.hardware import HardwareModel

    m, h = "mask", "hidden"
    reads = [frozenset({h}), frozenset(), frozenset({m}), frozenset(), frozenset({m}),
             frozenset()]
    assert vm_launches(reads, frozenset()) == 6  # h | run | m | run | m | run
    assert vm_launches(reads, frozenset({m})) == 1 + 2  # the copy; h | run
    assert vm_launches(reads, frozenset({m, h})) == 2 + 1
    hw = HardwareModel.from_target(CUDA)
    assert inputs_to_stage(reads, {m: 16 << 10, h: 16 << 20}, hw) == {m}
    # read by the first kernel only, an input cuts nothing: not copied however small
    assert inputs_to_stage(reads, {m: 16 << 10, h: 16}, hw) == {m}
    assert inputs_to_stage(reads, {m: 64 << 20, h: 64 << 20}, hw) == set()
    assert inputs_to_stage([frozenset({m})], {m: 16}, hw) == set()


def test_nothing_changes_without_cuda_graphs():
    tvm.ir.assert_structural_equal(StageInputs()(Before), Before)


def _graph_regions(mod, func: str = "forward", **options) -> int:
    """CUDA graphs the stitch pipeline's executable replays in ``func`` (its last passes are
    TVM's)."""
    with tvm.transform.PassContext(config=GRAPHS):
        lowered = tvm_stitch.pipeline(CUDA, **options)(mod)
    return lowered[func].script().count("vm.builtin.cuda_graph.run_or_capture")


@pytest.mark.slow
def test_bert_runs_in_one_cuda_graph(tmp_path, monkeypatch):
    """HF BERT's attention kernels read the additive padding mask, an input of the imported
    model: without the copies the CUDA graph is cut at the second layer's attention (2 regions
    for 2 layers); with them, one graph.  The nn BERT's attention reads the mask its one small
    kernel computes from the input (materialized: every layer reads it), so it is one graph
    either way."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    hf = get_workload("hf-bert-tiny").instance("float16", batch=2, seq=67)
    nn_bert = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    assert _graph_regions(hf.mod, hf.func) == 1
    assert _graph_regions(nn_bert.mod, nn_bert.func) == 1
    monkeypatch.setattr(tvm_stitch.passes, "StageInputs", lambda *_: tvm.transform.module_pass(
        lambda mod, _ctx: mod, opt_level=0, name="Unstaged"))
    assert _graph_regions(hf.mod, hf.func) == 2
    assert _graph_regions(nn_bert.mod, nn_bert.func) == 1


def test_lifted_bert_runs_in_one_cuda_graph(tmp_path, monkeypatch):
    """With the weights' transform lifted out, ``forward`` still replays one graph: the input
    copies come after lifting, which would otherwise make them dataflow bindings that TVM's
    RewriteDataflowReshape turns back into views of the inputs (BERT-base: four graphs)."""
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(tmp_path / "db.json"))
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    inst = get_workload("bert-tiny").instance("float16", batch=2, seq=67)
    assert _graph_regions(inst.mod, lift_params=True) == 1


def _symbolic(bound: bool):
    @I.ir_module
    class Module:
        @T.prim_func(private=True, s_tir=True)
        def add(a_h: T.handle, m_h: T.handle, out_h: T.handle):
            n = T.int64()
            a = T.match_buffer(a_h, (n, 8), "float16")
            m = T.match_buffer(m_h, (n, 8), "float16")
            out = T.match_buffer(out_h, (n, 8), "float16")
            for i, j in T.grid(n, 8):
                with T.sblock("add"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    out[vi, vj] = a[vi, vj] + m[vi, vj]

        @R.function
        def main(x: R.Tensor(("n", 8), "float16"), mask: R.Tensor(("n", 8), "float16"),
                 w: R.Tensor(("n", 8), "float16")) -> R.Tensor(("n", 8), "float16"):
            n = T.int64()
            R.func_attr({"num_input": 2, "tir_var_upper_bound": {"n": 64}})
            cls = Module
            with R.dataflow():
                y = R.call_tir(cls.add, (w, mask), out_ty=R.Tensor((n, 8), "float16"))
                y1 = R.call_tir(cls.add, (y, w), out_ty=R.Tensor((n, 8), "float16"))
                y2 = R.call_tir(cls.add, (y1, mask), out_ty=R.Tensor((n, 8), "float16"))
                y3 = R.call_tir(cls.add, (y2, w), out_ty=R.Tensor((n, 8), "float16"))
                z = R.call_tir(cls.add, (y3, mask), out_ty=R.Tensor((n, 8), "float16"))
                R.output(z)
            return z

    if bound:
        return Module
    main = Module["main"]
    return tvm_stitch.passes.module.replace_functions(
        Module, {Module.get_global_var("main"): main.without_attr("tir_var_upper_bound")})


def test_an_input_of_bounded_symbolic_shape_is_copied_and_graphs_are_captured_per_shape():
    """A mask of shape ``(n, 8)``, ``n`` at most 64: it is copied first as a static one is (the
    copy's storage is planned at the bound), and the function names ``n`` as a dim its CUDA
    graphs are captured per value of; without a bound nothing changes."""
    with tvm.transform.PassContext(config=GRAPHS):
        after = StageInputs()(_symbolic(bound=True))
        unbounded = _symbolic(bound=False)
        assert StageInputs()(unbounded).same_as(unbounded)
    main = after["main"]
    assert list(main.attrs["relax.rewrite_cuda_graph.capture_symbolic_vars"]) == ["n"]
    copy = after["stage_input_0"]
    (x, staged) = copy.params
    assert [str(d) for d in x.shape] == ["n", "8"] and [str(d) for d in staged.shape] == ["n", "8"]
    calls = [b.value for b in main.body.blocks[0].bindings]
    assert calls[0].args[0].name_hint == "stage_input_0"
    assert calls[0].args[1][0].same_as(main.params[1])  # the mask, not x nor the weight
    staged_var = main.body.blocks[0].bindings[0].var
    second = [c.args[1][1] for c in calls[1:]]  # the mask's readers read the copy
    assert sum(a.same_as(staged_var) for a in second) == 3
    assert not any(a.same_as(main.params[1]) for a in second)


def test_a_dynamic_bert_replays_its_kernels_as_graphs_captured_per_shape():
    """Hugging Face BERT-tiny with dynamic batch and length, lowered for CUDA with graphs on:
    its generated kernels (GEMMs and attention) all run inside CUDA graphs, each captured with
    the symbolic dims as its key; only the first kernels (which read the inputs: the ids'
    lookup, the mask's expansion) and the kernels writing the outputs (or reading them: the
    pooler's GEMM) run outside. The inputs are not copied: read first, they cut no graph."""
    import torch
    import transformers
    from torch.export import Dim

    from tvm_stitch.frontend import default_options, import_torch

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=300, attn_implementation="eager")).eval()
    ids, mask = torch.randint(0, 300, (2, 9)), torch.ones(2, 9, dtype=torch.long)
    dims = {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=512)}
    imported = import_torch(model, (ids, mask), "float16",
                            dynamic_shapes={"input_ids": dims, "attention_mask": dims})
    with tvm.transform.PassContext(config=GRAPHS):
        lowered = tvm_stitch.pipeline(CUDA, tune="model", **default_options(CUDA))(imported.mod)
    captures = [gv for gv in lowered.functions if "cuda_graph_capture" in gv.name_hint]
    assert captures
    keys = [lowered[gv].params[-1] for gv in captures]  # the dims each graph depends on
    assert all(key.name == "shape_expr" for key in keys)
    dims = {str(d) for d in lowered["main"].attrs["tir_var_upper_bound"]}  # batch, length
    assert len(dims) == 2 and {str(d) for key in keys for d in key.ty.values} == dims
    generated = {gv.name_hint for gv, f in lowered.functions.items()
                 if f.attrs is not None and "tvm_stitch.kernel" in f.attrs}
    assert any("attention" in k for k in generated) and any("gemm" in k for k in generated)
    outside = lowered["main"].script()
    # outside a graph: kernels reading the model's outputs (the pooler's GEMM reads the last
    # hidden state), which live outside the graphs' memory
    returned = {v for line in outside.splitlines() if "_tuple: R.Tuple(" in line
                for v in re.findall(r"\b(alloc\d*)\b", line.split(" = ", 1)[1])}
    calls = [line.strip() for line in outside.splitlines()
             if any(line.strip().startswith(f"{k}(") for k in generated)]
    assert all(re.match(r"\w+\((alloc\d*),", c).group(1) in returned for c in calls), calls
    assert len(calls) <= 1
    assert outside.count("stage_input_") == 0


@pytest.mark.gpu
def test_a_dynamic_model_replays_a_graph_per_shape_and_keeps_each_calls_output():
    """On the GPU: HF BERT-tiny in float16 with dynamic batch and length through ``from_torch``
    (CUDA graphs on by default). Outputs kept from earlier calls, of another shape and of the
    same shape, are not overwritten by later calls, and each is PyTorch's."""
    import torch
    import transformers
    from torch.export import Dim

    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        vocab_size=300, attn_implementation="eager")).eval().cuda().half()

    def inputs(b, s):
        mask = torch.ones(b, s, dtype=torch.long, device="cuda")
        mask[0, s // 2:] = 0
        return torch.randint(0, 300, (b, s), device="cuda"), mask

    dims = {0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=128)}
    fn = tvm_stitch.from_torch(model, inputs(2, 9), dynamic_shapes={
        "input_ids": dims, "attention_mask": dims})
    calls = [inputs(2, 9), inputs(3, 17), inputs(2, 9), inputs(3, 17), inputs(1, 100)]
    kept = [fn(*args).last_hidden_state for args in calls]  # no copies: the outputs as given
    with torch.no_grad():
        for args, got in zip(calls, kept):
            want = model(*args).last_hidden_state
            torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
