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


def test_from_torch_checks_its_inputs(bert):
    ids = torch.randint(0, 500, (1, 8))
    fn = tvm_stitch.from_torch(bert, (ids, torch.ones_like(ids)), target="llvm")
    with pytest.raises(ValueError, match="compiled for"):
        fn(torch.randint(0, 500, (1, 9)), torch.ones(1, 9, dtype=torch.int64))
    with pytest.raises(TypeError, match="expected 2 inputs"):
        fn(ids)
    with pytest.raises(TypeError, match="dtype"):
        fn(ids.float(), torch.ones_like(ids))


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
