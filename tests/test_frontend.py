"""``tvm_stitch.from_torch``: one line from a PyTorch module to a compiled, callable model."""

from __future__ import annotations

import pytest
import torch

import tvm_stitch
from tvm_stitch.workloads.zoo import MODELS, make_model


@pytest.fixture(scope="module")
def bert():
    import transformers

    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=96, vocab_size=500)
    torch.manual_seed(0)
    return transformers.BertModel(cfg, add_pooling_layer=False).eval()


@pytest.mark.slow
def test_from_torch_returns_the_models_output(bert):
    ids = torch.randint(0, 500, (2, 13))
    mask = torch.ones(2, 13, dtype=torch.int64)
    mask[1, 9:] = 0
    fn = tvm_stitch.from_torch(bert, (ids, mask), target="llvm")
    out = fn(ids, mask)
    assert type(out).__name__ == type(bert(ids, mask)).__name__  # the model's output class
    with torch.no_grad():
        ref = bert(ids, mask).last_hidden_state
    torch.testing.assert_close(out.last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    # other inputs of the compiled shapes run without recompiling
    ids2 = torch.randint(0, 500, (2, 13))
    with torch.no_grad():
        ref2 = bert(ids2, mask).last_hidden_state
    torch.testing.assert_close(fn(ids2, mask).last_hidden_state, ref2, rtol=1e-4, atol=1e-4)
    # positional inputs are named as the model's forward names them, and taken by those names
    assert [name for name, _, _ in fn.inputs] == ["input_ids", "attention_mask"]
    torch.testing.assert_close(fn(input_ids=ids2, attention_mask=mask).last_hidden_state, ref2,
                               rtol=1e-4, atol=1e-4)


def test_from_torch_checks_its_inputs(bert):
    ids = torch.randint(0, 500, (1, 8))
    fn = tvm_stitch.from_torch(bert, (ids, torch.ones_like(ids)), target="llvm")
    with pytest.raises(ValueError, match="compiled for"):
        fn(torch.randint(0, 500, (1, 9)), torch.ones(1, 9, dtype=torch.int64))
    with pytest.raises(TypeError, match="expected 2 inputs"):
        fn(ids)
    with pytest.raises(TypeError, match="dtype"):
        fn(ids.float(), torch.ones_like(ids))


def test_inputs_that_are_unaligned_views_are_taken():
    """A boolean key mask sliced out of a larger tensor starts 13 bytes in: TVM's DLPack import
    refuses data not 64-byte aligned, so the call copies it."""
    from tvm_stitch.workloads.zoo import masked_attention

    q, k, v = (torch.randn(2, 2, 13, 16) for _ in range(3))
    keys = torch.ones(3, 13, dtype=torch.bool)
    keys[2, 9:] = False
    mask = keys[1:]  # contiguous, 13 bytes past an aligned start
    assert mask.is_contiguous() and mask.data_ptr() % 64
    model = masked_attention(causal=False)
    fn = tvm_stitch.from_torch(model, (q, k, v, mask), target="llvm")
    torch.testing.assert_close(fn(q, k, v, mask), model(q, k, v, mask), rtol=1e-5, atol=1e-5)


def test_an_import_failure_says_what_failed(monkeypatch):
    """TVM's importer failing with a bare ``assert`` (no message) is still the clear
    ``RuntimeError`` naming it — not an ``IndexError`` from reading the message's last line."""
    import tvm.relax.frontend.torch as importer

    def fail(*_args, **_kwargs):
        raise AssertionError

    monkeypatch.setattr(importer, "from_exported_program", fail)
    with pytest.raises(RuntimeError, match=r"could not import the exported model "
                       r"\(AssertionError: no message\)"):
        tvm_stitch.from_torch(torch.nn.Linear(4, 3), (torch.randn(2, 4),), target="llvm")


@pytest.mark.slow
def test_inputs_by_name(bert):
    """A model compiled from keyword inputs, as a tokenizer returns them, is called the same
    way; a name that is not an input, or a missing one, is an error that lists the inputs."""
    ids = torch.randint(0, 500, (2, 9))
    mask = torch.ones(2, 9, dtype=torch.int64)
    mask[0, 6:] = 0
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    fn = tvm_stitch.from_torch(bert, (), target="llvm", example_kwargs=tokens)
    with torch.no_grad():
        ref = bert(**tokens).last_hidden_state
    torch.testing.assert_close(fn(**tokens).last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    out = fn(ids, token_type_ids=tokens["token_type_ids"], attention_mask=mask)
    torch.testing.assert_close(out.last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match=r"not compiled.*compiled for"):
        fn(**tokens, position_ids=ids)
    with pytest.raises(TypeError, match="missing"):
        fn(input_ids=ids, attention_mask=mask)


@pytest.mark.slow
def test_the_module_is_given_back_as_it_was():
    """Compiling does not change the user's model: a float16 model in training mode stays so
    (it is exported in float32 and eval mode) with the same tensor objects (weights, buffers,
    gradients), also when the import fails; a float32 one exported in float16 keeps its float32
    values bit for bit."""
    import transformers

    from tvm_stitch.frontend import import_torch

    cfg = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
        vocab_size=100,
    )
    torch.manual_seed(0)
    net = transformers.BertModel(cfg, add_pooling_layer=False).half().train()
    weight = net.embeddings.word_embeddings.weight
    weight.grad = torch.ones_like(weight)
    buffers = dict(net.named_buffers())
    before = {k: v.clone() for k, v in net.state_dict().items()}
    ids = torch.randint(0, 100, (1, 7))
    tvm_stitch.from_torch(net, (ids,), target="llvm")
    assert net.training and net.encoder.layer[0].training
    assert net.embeddings.word_embeddings.weight is weight and weight.dtype == torch.float16
    assert weight.grad.dtype == torch.float16
    assert all(b is buffers[k] for k, b in net.named_buffers())
    state = net.state_dict()
    assert all(state[k].dtype == v.dtype and torch.equal(state[k], v) for k, v in before.items())
    with pytest.raises(RuntimeError):  # the export fails: a float where token ids go
        import_torch(net, (ids.half(),), "float32")
    assert net.training and weight.dtype == torch.float16
    # exported in float16 directly, a float32 model keeps its values: rounding them to
    # float16 and back would change most of them
    net = torch.nn.Sequential(torch.nn.LayerNorm(24), torch.nn.GELU())
    with torch.no_grad():
        net[0].weight.normal_()
    before = net[0].weight.detach().clone()
    assert not torch.equal(before.half().float(), before)
    import_torch(net, (torch.randn(3, 24),), "float16", convert=False)
    assert torch.equal(net[0].weight, before) and net[0].weight.dtype == torch.float32


@pytest.mark.slow
def test_from_torch_decoder_with_a_causal_mask():
    """LLaMA (grouped K/V heads, rotary embeddings, a causal mask built from indices): its mask
    is folded at compile time and the model runs on llvm, which TVM's default pipeline cannot."""
    model = MODELS["llama"]
    net = make_model(model, "tiny")
    ids = torch.randint(0, 1000, (1, 11))
    fn = tvm_stitch.from_torch(net, (ids,), target="llvm", example_kwargs={"use_cache": False})
    with torch.no_grad():
        ref = net(ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(fn(ids).last_hidden_state, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_mixture_of_experts_is_exported_with_static_experts(caplog):
    """Mixtral as ``transformers`` builds it computes its experts with ``grouped_mm``, a custom
    operator TVM cannot import.  ``from_torch`` exports it with transformers' ``batched_mm``
    (every expert on every token, the unrouted ones weighted zero): the compiled model matches
    PyTorch, and the model's own implementation is given back."""
    import transformers

    cfg = transformers.MixtralConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                                     intermediate_size=96, num_hidden_layers=2, vocab_size=500,
                                     num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    net = transformers.MixtralModel(cfg).eval()
    assert net.config._experts_implementation == "grouped_mm"
    ids = torch.randint(0, 500, (2, 13))
    with caplog.at_level("INFO", logger="tvm_stitch.frontend"):
        fn = tvm_stitch.from_torch(net, (ids,), target="llvm",
                                   example_kwargs={"use_cache": False})
    assert "experts exported as transformers' 'batched_mm'" in caplog.text
    assert net.config._experts_implementation == "grouped_mm"
    with torch.no_grad():
        ref = net(ids, use_cache=False).last_hidden_state
    torch.testing.assert_close(fn(ids).last_hidden_state, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_decoder_as_transformers_builds_it():
    """GPT-2 with transformers' defaults — ``scaled_dot_product_attention`` and ``use_cache``
    on — in one line: no KV cache is exported (a cache object is no tensor ``torch.export``
    returns), and the heads' ``view`` after PyTorch's decomposition of the attention, which
    lays its output out otherwise than the export saw, still imports."""
    import transformers

    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=2, vocab_size=500,
                                  bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    net = transformers.GPT2Model(cfg).eval()
    assert net.config._attn_implementation == "sdpa" and net.config.use_cache
    ids = torch.randint(0, 500, (2, 11))
    fn = tvm_stitch.from_torch(net, (ids,), target="llvm")
    with torch.no_grad():
        ref = net(ids).last_hidden_state
    torch.testing.assert_close(fn(ids).last_hidden_state, ref, rtol=1e-4, atol=1e-4)


def test_half_precision_export_returns_its_dtypes():
    """A module exported in float16 (``convert=False``) returns float16, as PyTorch does (TVM's
    importer leaves its products' float32 accumulators up to the output): the cast joins the
    last kernel, which stores half the bytes."""
    import numpy as np
    import tvm
    from tvm import relax

    from tvm_stitch.frontend import import_torch
    from tvm_stitch.workloads.zoo import plain_attention

    q, k, v = (torch.randn(1, 2, 40, 32) for _ in range(3))
    imported = import_torch(plain_attention(True), (q, k, v), "float16", convert=False)
    ret = imported.mod["main"].ret_ty
    assert str(ret.dtype) == "float16"
    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    assert tvm_stitch.fusion_report(imported.mod, cuda).kernels == 1
    ex = tvm.compile(imported.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    args = [tvm.runtime.tensor(t.half().numpy()) for t in (q, k, v)]
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy()
    with torch.no_grad():
        ref = plain_attention(True)(q, k, v).numpy()
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype("float32"), ref, rtol=2e-2, atol=2e-2)


def test_bfloat16_is_the_default_for_a_bfloat16_model_on_cuda(bert):
    """A bfloat16 model compiles in bfloat16 on CUDA (float16 cannot hold its range), any other
    in float16; on the CPU in float32; the model itself is not changed."""
    from tvm_stitch.frontend import default_dtype

    assert default_dtype(bert, cuda=True) == "float16"
    assert default_dtype(bert, cuda=False) == "float32"
    bf = bert.to(torch.bfloat16)
    try:
        assert default_dtype(bf, cuda=True) == "bfloat16"
        assert default_dtype(bf, cuda=False) == "float32"
        bf.encoder.layer[0].output.float()  # modules kept in float32 (transformers does so)
        assert default_dtype(bf, cuda=True) == "bfloat16"
    finally:
        bert.float()
    # no parameters: the inputs say
    relu = torch.nn.ReLU()
    assert default_dtype(relu, True, (torch.ones(2, dtype=torch.bfloat16),)) == "bfloat16"
    assert default_dtype(relu, True, (torch.ones(2, dtype=torch.int64),)) == "float16"


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "llama"])
def test_a_model_compiled_in_bfloat16(family, bert):
    """``dtype="bfloat16"`` on llvm: bfloat16 weights and activations, float32 accumulation, a
    LayerNorm (BERT) run in float32 between casts, rotary tables and a causal mask (LLaMA);
    within bfloat16's tolerance of PyTorch float32 and no further off than PyTorch's own
    bfloat16 model."""
    import copy

    from tvm_stitch.workloads.base import TOLERANCES

    if family == "bert":
        net = bert
        ids = torch.randint(0, 500, (2, 13))
        mask = torch.ones(2, 13, dtype=torch.int64)
        mask[1, 9:] = 0
        inputs, kwargs = (ids, mask), {}
    else:
        net = make_model(MODELS["llama"], "tiny")
        inputs, kwargs = (torch.randint(0, 1000, (1, 11)),), {"use_cache": False}
    fn = tvm_stitch.from_torch(net, inputs, target="llvm", dtype="bfloat16",
                               example_kwargs=kwargs)
    assert {str(w.dtype) for w in fn.imported.weights} == {"bfloat16"}
    out = fn(*inputs).last_hidden_state.float()
    with torch.no_grad():
        ref = net(*inputs, **kwargs).last_hidden_state
        theirs = copy.deepcopy(net).to(torch.bfloat16)(*inputs, **kwargs).last_hidden_state
    rtol, atol = TOLERANCES["bfloat16"]
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    ours, torchs = (out - ref).abs().max().item(), (theirs.float() - ref).abs().max().item()
    assert ours <= 2 * torchs + 1e-3, (ours, torchs)


@pytest.mark.gpu
def test_from_torch_on_the_gpu(bert):
    """One line on CUDA: computed in float16 by default, inputs and outputs torch tensors on
    the GPU (outputs in the module's dtype), the padding mask honoured; the kernels' tiles from
    the cost model (no search)."""
    ids = torch.randint(0, 500, (3, 45))
    mask = torch.ones(3, 45, dtype=torch.int64)
    mask[1, 30:] = 0
    mask[2, :7] = 0
    fn = tvm_stitch.from_torch(bert, (ids, mask), target="cuda", tune="model")
    out = fn(ids.cuda(), mask.cuda()).last_hidden_state
    with torch.no_grad():
        ref = bert(ids, mask).last_hidden_state
    assert out.device.type == "cuda" and out.dtype == ref.dtype
    torch.testing.assert_close(out.float().cpu(), ref, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="is on cpu"):
        fn(ids, mask)


@pytest.mark.gpu
def test_a_bfloat16_model_on_the_gpu(bert):
    """A bfloat16 model on CUDA is compiled in bfloat16 by default and matches PyTorch float32
    within bfloat16's tolerance, padding included."""
    import copy

    from tvm_stitch.workloads.base import TOLERANCES

    ids = torch.randint(0, 500, (3, 45))
    mask = torch.ones(3, 45, dtype=torch.int64)
    mask[1, 30:] = 0
    with torch.no_grad():
        ref = bert(ids, mask).last_hidden_state
    bf = copy.deepcopy(bert).to(torch.bfloat16)
    fn = tvm_stitch.from_torch(bf, (ids, mask), target="cuda", tune="model")
    assert fn.imported.dtype == "bfloat16"
    out = fn(ids.cuda(), mask.cuda()).last_hidden_state
    rtol, atol = TOLERANCES["bfloat16"]
    torch.testing.assert_close(out.float().cpu(), ref, rtol=rtol, atol=atol)


def _state(net) -> dict:
    """Every parameter, gradient and buffer of ``net``: the object, its data's address, dtype
    and device, and each module's training flag."""
    state = {f"{k} flag": m.training for k, m in net.named_modules()}
    for k, t in [*net.named_parameters(), *net.named_buffers()]:
        state[k] = (t, t.data_ptr(), t.dtype, t.device)
        if t.grad is not None:
            state[f"{k} grad"] = (t.grad, t.grad.data_ptr(), t.grad.dtype, t.grad.device)
    return state


def _assert_same_state(net, before: dict) -> None:
    after = _state(net)
    assert after.keys() == before.keys()
    for k, was in before.items():
        now = after[k]
        if isinstance(was, tuple):
            assert now[0] is was[0] and now[1:] == was[1:], k
        else:
            assert now == was, k


@pytest.mark.parametrize("kernel", ["efficient", "flash", "cudnn"])
def test_fused_attention_kernels_are_decomposed(kernel):
    """What ``scaled_dot_product_attention`` becomes where it is exported on CUDA — PyTorch's
    fused kernels, which TVM's importer lacks ("Unsupported function types") — is imported as
    the CPU's export is (products and a softmax, the same Relax module): a forward calling the
    kernel itself (exported on the CPU through its meta function) compiles and matches."""
    import tvm

    from tvm_stitch.frontend import import_torch

    aten, sdpa = torch.ops.aten, torch.nn.functional.scaled_dot_product_attention

    class Fused(torch.nn.Module):
        def forward(self, q, k, v, bias):
            if kernel == "efficient":
                return aten._scaled_dot_product_efficient_attention(q, k, v, bias, False)[0]
            if kernel == "cudnn":
                return aten._scaled_dot_product_cudnn_attention(
                    q, k, v, bias, False, 0.0, False, scale=0.3)[0]
            return aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]

    class Composite(torch.nn.Module):
        def forward(self, q, k, v, bias):
            if kernel == "efficient":
                return sdpa(q, k, v, attn_mask=bias)
            if kernel == "cudnn":
                return sdpa(q, k, v, attn_mask=bias, scale=0.3)
            return sdpa(q, k, v, is_causal=True) + 0 * bias.sum()

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 12, 16) for _ in range(3))
    bias = torch.randn(2, 1, 12, 12)
    if kernel != "flash":  # the flash kernel's export takes no mask: ours adds a product
        tvm.ir.assert_structural_equal(import_torch(Fused(), (q, k, v, bias)).mod,
                                       import_torch(Composite(), (q, k, v, bias)).mod)
    fn = tvm_stitch.from_torch(Fused(), (q, k, v, bias), target="llvm")
    torch.testing.assert_close(fn(q, k, v, bias), Composite()(q, k, v, bias),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("dtype", "attn", "compute"), [
    ("float16", "sdpa", None), ("bfloat16", "eager", "bfloat16"), ("float16", "eager", "float16"),
])
@pytest.mark.slow
def test_a_16_bit_model_on_the_cpu(dtype, attn, compute):
    """A float16 or bfloat16 model on the CPU, with SDPA or eager attention, example inputs
    in its dtype (token ids and an ``inputs_embeds`` keyword): compiled on llvm (float32 by
    default) it gives what its float32 version gives, and it is given back as it was —
    training flags, tensor objects, data, dtypes."""
    import copy

    import transformers

    from tvm_stitch.workloads.base import TOLERANCES

    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=40, vocab_size=100,
                                  attn_implementation=attn)
    torch.manual_seed(0)
    net = transformers.BertModel(cfg, add_pooling_layer=False).to(getattr(torch, dtype))
    ids = torch.randint(0, 100, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    embeds = torch.randn(2, 9, 32).to(net.dtype)
    with torch.no_grad():
        ref = copy.deepcopy(net).float().eval()
        want = ref(ids, mask).last_hidden_state
        want_embeds = ref(inputs_embeds=embeds.float(), attention_mask=mask).last_hidden_state
    net.train()
    before = _state(net)
    rtol, atol = TOLERANCES[compute or "float32"]
    fn = tvm_stitch.from_torch(net, (ids, mask), target="llvm", dtype=compute)
    torch.testing.assert_close(fn(ids, mask).last_hidden_state.float(), want,
                               rtol=rtol, atol=atol)
    _assert_same_state(net, before)
    tokens = {"inputs_embeds": embeds, "attention_mask": mask}
    fn = tvm_stitch.from_torch(net, (), target="llvm", dtype=compute, example_kwargs=tokens)
    torch.testing.assert_close(fn(**tokens).last_hidden_state.float(), want_embeds,
                               rtol=rtol, atol=atol)
    _assert_same_state(net, before)


def test_floating_keyword_inputs_are_exported_in_float32():
    """A floating keyword input of a float16 model is exported as a positional one is: in
    float32 with the model, and the compiled model takes it in float16."""
    net = torch.nn.Linear(8, 4).half()
    x = torch.randn(3, 8).half()
    fn = tvm_stitch.from_torch(net, (), target="llvm", example_kwargs={"input": x})
    want = torch.nn.functional.linear(x.float(), net.weight.float(), net.bias.float())
    torch.testing.assert_close(fn(input=x), want, rtol=1e-4, atol=1e-4)
    assert net.weight.dtype == torch.float16


@pytest.mark.slow
def test_token_ids_outside_the_vocabulary_are_an_index_error(bert):
    """An id outside an embedding table — too large or negative — raises ``IndexError`` as
    PyTorch does, naming the input (TVM's ``take`` would clamp it); ids within the tables give
    the model's output.  ``check_indices=False`` (or the attribute) turns the check off."""
    ids = torch.randint(0, 500, (2, 9))
    mask = torch.ones_like(ids)
    types = torch.zeros_like(ids)
    tokens = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    fn = tvm_stitch.from_torch(bert, (), target="llvm", example_kwargs=tokens)
    assert fn.check_indices and fn.imported.index_bounds == {0: 500, 2: 2}
    with torch.no_grad():
        ref = bert(**tokens).last_hidden_state
    torch.testing.assert_close(fn(**tokens).last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    edge = ids.clone()
    edge[0, 0], edge[1, 8] = 0, 499
    with torch.no_grad():
        ref = bert(edge, mask, types).last_hidden_state
    torch.testing.assert_close(fn(edge, mask, types).last_hidden_state, ref, rtol=1e-4, atol=1e-4)
    for bad in (500, -1):
        wrong = ids.clone()
        wrong[1, 3] = bad
        with pytest.raises(IndexError, match="index out of range in self"), torch.no_grad():
            bert(wrong, mask, types)
        with pytest.raises(IndexError, match=rf"index out of range in self: input 0 \(input_ids\) "
                           rf"holds {bad}, outside the 500 rows"):
            fn(wrong, mask, types)
    with pytest.raises(IndexError, match=r"input 2 \(token_type_ids\) holds 2, outside the 2 rows"):
        fn(input_ids=ids, attention_mask=mask, token_type_ids=types + 2)
    fn.check_indices = False
    fn(wrong, mask, types)  # clamped, not checked
    fn = tvm_stitch.from_torch(bert, (ids, mask), target="llvm", check_indices=False)
    assert not fn.check_indices
    fn(wrong, mask)


def test_the_inputs_checked_are_those_an_embedding_reads():
    """An input reaches its table through casts and reshapes and is checked against the
    smallest table it indexes; an index that is no embedding's (``table[idx]``, which PyTorch
    takes negative) is not checked."""

    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.big, self.small = torch.nn.Embedding(10, 4), torch.nn.Embedding(6, 4)
            self.scale = torch.nn.Parameter(torch.randn(5, 4))

        def forward(self, ids, idx):
            flat = ids.long().reshape(-1)
            return self.big(flat) + self.small(flat.view(1, -1).squeeze(0)) * self.scale[idx]

    torch.manual_seed(0)
    net = Lookup().eval()
    ids = torch.randint(0, 6, (2, 3), dtype=torch.int32)
    idx = torch.tensor([4, 0, 2, 4, 3, 1])
    fn = tvm_stitch.from_torch(net, (ids, idx), target="llvm")
    assert fn.imported.index_bounds == {0: 6}
    with torch.no_grad():
        torch.testing.assert_close(fn(ids, idx), net(ids, idx), rtol=1e-5, atol=1e-5)
    fn(ids, idx - 5)  # not checked
    wrong = ids.clone()
    wrong[0, 1] = 7  # inside the big table, outside the small one
    with pytest.raises(IndexError, match=r"input 0 \(ids\) holds 7, outside the 6 rows"):
        fn(wrong, idx)


@pytest.mark.gpu
@pytest.mark.parametrize(("family", "attn", "dtype"), [
    ("bert", "sdpa", "float16"), ("bert", "eager", "bfloat16"), ("llama", "sdpa", "float16"),
    ("llama", "sdpa", "bfloat16"),
])
def test_a_model_held_on_the_gpu(family, attn, dtype):
    """The README's one line for a model on the GPU (``model.half().cuda()``, CUDA inputs,
    transformers' SDPA — which exports as fused kernels on CUDA — or eager attention): it
    matches the model's own output, costs no second copy of the weights on the GPU (PyTorch's
    allocator's peak), and the model is given back as it was: on the GPU, in its dtype, the
    same tensors at the same addresses, its training flags."""
    import copy

    import transformers

    from tvm_stitch.workloads.base import TOLERANCES

    torch.manual_seed(0)
    if family == "bert":
        cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=96, vocab_size=500,
                                      attn_implementation=attn)
        net = transformers.BertModel(cfg, add_pooling_layer=False)
        ids = torch.randint(0, 500, (2, 45), device="cuda")
        mask = torch.ones_like(ids)
        mask[1, 30:] = 0
        inputs, kwargs = (ids, mask), {}
    else:
        net = make_model(MODELS["llama"], "tiny", attn_implementation=attn)
        inputs, kwargs = (torch.randint(0, 1000, (2, 37), device="cuda"),), {"use_cache": False}
    net = net.to(getattr(torch, dtype)).cuda().eval()
    with torch.no_grad():
        theirs = net(*inputs, **kwargs).last_hidden_state.float()
        ref = copy.deepcopy(net).float()(*inputs, **kwargs).last_hidden_state
    net.train()
    before = _state(net)
    weight_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn = tvm_stitch.from_torch(net, inputs, target="cuda", dtype=dtype,
                               example_kwargs=kwargs, tune="model")
    assert torch.cuda.max_memory_allocated() - base < weight_bytes / 2
    _assert_same_state(net, before)
    assert all(p.is_cuda and p.dtype == getattr(torch, dtype) for p in net.parameters())
    out = fn(*inputs).last_hidden_state
    assert out.is_cuda
    rtol, atol = TOLERANCES[dtype]
    torch.testing.assert_close(out.float(), theirs, rtol=rtol, atol=atol)
    torch.testing.assert_close(out.float(), ref, rtol=rtol, atol=atol)
    # no index check by default on CUDA (it waits for the GPU); asked for, as on the CPU
    assert not fn.check_indices
    wrong = inputs[0].clone()
    wrong[1, 5] = net.config.vocab_size
    fn.check_indices = True
    with pytest.raises(IndexError, match=r"input 0 \(\w+\) holds"):
        fn(wrong, *inputs[1:])


@pytest.mark.gpu
def test_device_constants_of_a_model_on_the_gpu():
    """A model on the GPU whose forward makes a tensor on its input's device, with a
    ``position_ids`` buffer and a tensor it holds as a plain attribute (on the GPU, which
    ``Module.to`` does not move): compiled (``check_indices=True``) it matches, and the
    attribute is the same tensor on the GPU afterwards."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = torch.nn.Embedding(50, 32), torch.nn.Embedding(16, 32)
            self.register_buffer("position_ids", torch.arange(16).unsqueeze(0), persistent=False)
            self.lin = torch.nn.Linear(32, 32)
            self.scale = torch.linspace(0.5, 1.5, 32)

        def forward(self, ids):
            n = ids.shape[1]
            steps = torch.arange(n, device=ids.device, dtype=self.lin.weight.dtype)
            h = self.emb(ids) + self.pos(self.position_ids[:, :n]) * self.scale
            return self.lin(h) + steps[:, None]

    torch.manual_seed(0)
    net = Net().half().cuda().eval()
    net.scale = scale = net.scale.half().cuda()
    ids = torch.randint(0, 50, (2, 12), device="cuda")
    with torch.no_grad():
        ref = net(ids).float()
    fn = tvm_stitch.from_torch(net, (ids,), target="cuda", dtype="float16", tune="model",
                               check_indices=True)
    assert net.scale is scale and scale.is_cuda and net.position_ids.is_cuda
    torch.testing.assert_close(fn(ids).float(), ref, rtol=2e-2, atol=2e-2)
    with pytest.raises(IndexError, match=r"input 0 \(ids\) holds 50"):
        fn(torch.full_like(ids, 50))


@pytest.mark.gpu
def test_sdpa_exported_on_cuda_is_imported():
    """The second line of defence where it is needed: ``scaled_dot_product_attention``
    exported on CUDA (float16, a boolean mask) holds no fused kernel after
    :func:`tvm_stitch.frontend.decompositions` and imports into Relax."""
    from tvm.relax.frontend.torch import from_exported_program

    from tvm_stitch.frontend import decompositions

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    q, k, v = (torch.randn(2, 4, 64, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    mask = torch.rand(2, 1, 64, 64, device="cuda") > 0.2
    exported = torch.export.export(Attention(), (q, k, v, mask)).run_decompositions(
        decompositions())
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "_scaled_dot_product" in t], targets
    from_exported_program(exported, keep_params_as_input=True, run_ep_decomposition=False)


def test_a_model_compiled_again_is_loaded_from_the_executables_kept(tmp_path, monkeypatch,
                                                                     caplog):
    """``from_torch`` keeps the executable it built; the same model compiled again (another
    process, another day) is loaded, not rebuilt, and computes the same. A change of what the
    build depends on (an option, the module, the tuning database) builds anew, and a
    corrupt entry is removed and built again."""
    import logging

    import numpy as np
    import tvm

    from tvm_stitch import executables

    monkeypatch.setenv("TVM_STITCH_EXECUTABLES", "1")
    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    database = tmp_path / "tuning.json"
    monkeypatch.setenv("TVM_STITCH_TUNING_DB", str(database))
    builds = []
    real = tvm.compile
    monkeypatch.setattr(tvm, "compile", lambda *a, **k: builds.append(1) or real(*a, **k))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                torch.nn.LayerNorm(40)).eval()
    x = torch.randn(3, 24)
    want = model(x).detach().numpy()

    first = tvm_stitch.from_torch(model, (x,), target="llvm")
    assert len(builds) == 1 and len(list(executables.folder().glob("*.so"))) == 1
    assert len(list(executables.folder().glob("*.json"))) == 1
    with caplog.at_level(logging.INFO, logger="tvm_stitch.frontend"):
        again = tvm_stitch.from_torch(model, (x,), target="llvm")
    assert len(builds) == 1 and "kept from an earlier run" in caplog.text
    for fn in (first, again):
        np.testing.assert_allclose(fn(x).numpy(), want, rtol=1e-4, atol=1e-4)
    # other weights are the executable's parameters: still loaded, and computing with them
    other = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(),
                                torch.nn.LayerNorm(40)).eval()
    np.testing.assert_allclose(tvm_stitch.from_torch(other, (x,), target="llvm")(x).numpy(),
                               other(x).detach().numpy(), rtol=1e-4, atol=1e-4)
    assert len(builds) == 1
    # what the build depends on: another shape, another option, another tuning database
    tvm_stitch.from_torch(model, (torch.randn(5, 24),), target="llvm")
    tvm_stitch.from_torch(model, (x,), target="llvm", fold_norms=True)
    assert len(builds) == 3
    database.write_text('{"version": 1, "records": {}}')
    tvm_stitch.from_torch(model, (x,), target="llvm")
    assert len(builds) == 4
    # a corrupt entry: removed (with a warning) and built again
    for entry in executables.folder().glob("*.json"):
        entry.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="tvm_stitch.executables"):
        fn = tvm_stitch.from_torch(model, (x,), target="llvm")
    assert len(builds) == 5 and "could not be loaded" in caplog.text
    np.testing.assert_allclose(fn(x).numpy(), want, rtol=1e-4, atol=1e-4)


def test_the_least_recently_used_executables_go_beyond_the_limit(tmp_path, monkeypatch):
    """A service compiling many shapes keeps at most ``$TVM_STITCH_EXECUTABLES_MAX``
    executables; the least recently used (stored or loaded) are removed first."""
    import os

    from tvm_stitch import executables

    monkeypatch.setenv("TVM_STITCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TVM_STITCH_EXECUTABLES_MAX", "2")

    class Built:  # what export_library writes is the library
        def export_library(self, path):
            with open(path, "wb") as f:
                f.write(b"library")

    database = tmp_path / "tuning.json"
    for i, name in enumerate(["a" * 32, "b" * 32]):
        assert executables.store(name, Built(), database)
        os.utime(executables.folder() / f"{name}.json", (1000 + i, 1000 + i))
    assert executables.store("c" * 32, Built(), database)
    kept = sorted(p.name[0] for p in executables.folder().iterdir())
    assert kept == ["b", "b", "c", "c"]  # "a", the oldest, went with its library
    monkeypatch.setenv("TVM_STITCH_EXECUTABLES_MAX", "none")
    assert executables.store("d" * 32, Built(), database)  # a bad limit: the default
    assert len(list(executables.folder().glob("*.json"))) == 3


def test_a_model_as_from_pretrained_loads_it_in_float16():
    """A decoder as ``from_pretrained(..., dtype=float16)`` gives it to its user: float16
    weights beside the rotary frequencies transformers keeps float32 (a non-persistent
    buffer, not cast). ``from_torch`` takes it as held, in float16, and matches the float32
    model within float16's tolerance, as PyTorch's own float16 run does."""
    import numpy as np
    import transformers

    from tvm_stitch.workloads.base import TOLERANCES
    from tvm_stitch.workloads.zoo import as_loaded

    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1,
                                   vocab_size=50, rope_theta=500000.0)
    torch.manual_seed(0)
    net = transformers.LlamaModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 37))
    with torch.no_grad():
        want = net(ids, use_cache=False).last_hidden_state.numpy()
    held = as_loaded(net, "cpu", torch.float16)
    assert held.rotary_emb.inv_freq.dtype == torch.float32
    assert held.layers[0].self_attn.q_proj.weight.dtype == torch.float16
    compiled = tvm_stitch.from_torch(held, (ids,), target="llvm", dtype="float16")
    got = compiled(ids)
    got = getattr(got, "last_hidden_state", got)
    rtol, atol = TOLERANCES["float16"]
    np.testing.assert_allclose(got.float().numpy(), want, rtol=rtol, atol=atol)
