"""The model zoo: Hugging Face models as users bring them, built from configs with random weights.

Each model is exported with ``torch.export`` and imported with ``from_exported_program`` through
:func:`tvm_stitch.frontend.import_torch` (float16 as ``model.half()`` computes it), exactly as
``tvm_stitch.from_torch`` does for a user.  Nothing is downloaded: ``transformers`` builds the
models from the configs below, initialised by its own ``_init_weights`` from a seeded generator,
with every one-dimensional parameter (biases, norm scales) then perturbed so that a lost bias or
scale shows in the numerics.

``-tiny`` sizes are for CI (two layers, irregular widths: head dims 32 and 80, grouped K/V heads,
17 image tokens); ``-base`` sizes are the benchmarks' (GPT-2 small, ViT-B/16, and a LLaMA-style
model with TinyLlama's layer shapes and 4 layers).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from tvm_stitch.analysis.indexing import HALF

from .base import Instance, Workload, layers_suffix


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """A ``transformers`` model family of the zoo.

    Attributes
    ----------
    name : str
        Workload prefix (``gpt2`` gives ``gpt2-tiny``, ``gpt2-base``).
    model_class : str
        ``transformers`` class built from the config.
    configs : dict
        Size -> config keyword arguments.
    inputs : callable
        ``inputs(config, batch, seq, rng) -> list of numpy arrays`` in ``forward``'s order.
    defaults : dict
        Default shape parameters.
    flops : callable
        ``flops(config, batch, seq) -> int``: matrix-product FLOPs of one forward pass.
    """

    name: str
    model_class: str
    config_class: str
    configs: dict
    inputs: Callable
    defaults: dict
    flops: Callable
    kwargs: dict = dataclasses.field(default_factory=dict)


def _token_ids(cfg, batch, seq, rng):
    return [rng.integers(0, cfg.vocab_size, (batch, seq)).astype("int64")]


def _pixels(cfg, batch, _seq, rng):
    size = cfg.image_size
    return [rng.standard_normal((batch, cfg.num_channels, size, size)).astype("float32")]


def _decoder_flops(batch, seq, hidden, inter, heads, kv_heads, gated, layers):
    tokens, dim = batch * seq, hidden // heads
    proj = 2 * tokens * hidden * (hidden + 2 * kv_heads * dim + hidden)
    mlp = 2 * tokens * hidden * inter * (3 if gated else 2)
    attn = 4 * batch * heads * seq * seq * dim
    return layers * (proj + mlp + attn)


MODELS = {
    m.name: m
    for m in [
        ZooModel(
            name="gpt2",
            model_class="GPT2Model",
            config_class="GPT2Config",
            configs={
                "tiny": dict(n_embd=128, n_layer=2, n_head=4, n_inner=512, vocab_size=1000),
                "base": dict(n_embd=768, n_layer=12, n_head=12, n_inner=3072, vocab_size=50257),
            },
            inputs=_token_ids,
            defaults={"batch": 1, "seq": 256},
            flops=lambda c, b, s: _decoder_flops(
                b, s, c.n_embd, c.n_inner, c.n_head, c.n_head, False, c.n_layer
            ),
            kwargs={"use_cache": False},
        ),
        ZooModel(
            name="llama",
            model_class="LlamaModel",
            config_class="LlamaConfig",
            configs={
                "tiny": dict(
                    hidden_size=160,
                    intermediate_size=320,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    num_key_value_heads=1,
                    vocab_size=1000,
                ),
                "base": dict(
                    hidden_size=2048,
                    intermediate_size=5632,
                    num_hidden_layers=4,
                    num_attention_heads=32,
                    num_key_value_heads=4,
                    vocab_size=32000,
                ),
                # two LLaMA-3-8B layers (its vocabulary left at 32000: the embedding lookup
                # is one gather whatever its rows)
                "8b": dict(
                    hidden_size=4096,
                    intermediate_size=14336,
                    num_hidden_layers=2,
                    num_attention_heads=32,
                    num_key_value_heads=8,
                    vocab_size=32000,
                    rope_theta=500000.0,
                ),
            },
            inputs=_token_ids,
            defaults={"batch": 1, "seq": 256},
            flops=lambda c, b, s: _decoder_flops(
                b,
                s,
                c.hidden_size,
                c.intermediate_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                True,
                c.num_hidden_layers,
            ),
            kwargs={"use_cache": False},
        ),
        ZooModel(
            name="vit",
            model_class="ViTModel",
            config_class="ViTConfig",
            configs={
                "tiny": dict(
                    hidden_size=96,
                    num_hidden_layers=2,
                    num_attention_heads=3,
                    intermediate_size=192,
                    image_size=32,
                    patch_size=8,
                ),
                "base": dict(
                    hidden_size=768,
                    num_hidden_layers=12,
                    num_attention_heads=12,
                    intermediate_size=3072,
                    image_size=224,
                    patch_size=16,
                ),
            },
            inputs=_pixels,
            defaults={"batch": 1},
            flops=lambda c, b, _s: _decoder_flops(
                b,
                (c.image_size // c.patch_size) ** 2 + 1,
                c.hidden_size,
                c.intermediate_size,
                c.num_attention_heads,
                c.num_attention_heads,
                False,
                c.num_hidden_layers,
            ),
        ),
    ]
}


def _config_kwargs(model: ZooModel, size: str, layers: int = 0) -> dict:
    """``model``'s config at ``size``; ``layers`` > 0 keeps only that many layers."""
    kwargs = dict(model.configs[size])
    if layers:
        key = "n_layer" if "n_layer" in kwargs else "num_hidden_layers"
        kwargs[key] = layers
    return kwargs


def make_model(
    model: ZooModel, size: str, attn_implementation: str = "eager", seed: int = 0, layers: int = 0
):
    """The ``transformers`` model of ``model`` at ``size`` (seeded init, 1-D parameters
    perturbed); ``layers`` > 0 keeps only the first that many layers' worth of config."""
    import torch
    import transformers

    cfg = getattr(transformers, model.config_class)(
        **_config_kwargs(model, size, layers), attn_implementation=attn_implementation
    )
    torch.manual_seed(seed)
    cls = getattr(transformers, model.model_class)
    net = cls(cfg, add_pooling_layer=False) if model.name == "vit" else cls(cfg)
    perturb_vectors(net, torch.Generator().manual_seed(seed + 1))
    return net.eval()


def perturb_vectors(net, generator=None) -> None:
    """Add 0.02·N(0, 1) noise to every one-dimensional parameter of ``net`` (biases, norm
    scales), so that a lost bias or scale shows in the numerics (``generator``: torch's global
    one when None)."""
    import torch

    with torch.no_grad():
        for p in net.parameters():
            if p.dim() == 1:
                p.add_(0.02 * torch.randn(p.shape, generator=generator))


def as_loaded(net, device, dtype):
    """``net`` on ``device`` in ``dtype`` as ``from_pretrained(..., dtype=dtype)`` loads it:
    parameters and persistent buffers cast, non-persistent floating buffers (state computed at
    construction, such as LLaMA's rotary ``inv_freq``, which transformers computes in float32)
    left in the dtype they were computed in. ``net.to(dtype)`` casts those too: LLaMA-3's
    rotary angles at position 2047 were then off by up to 0.34 rad in float16, and PyTorch's
    float16 rows off the float32 reference by 0.66."""
    kept = [(module, name, buf) for module in net.modules()
            for name in module._non_persistent_buffers_set
            if (buf := module._buffers.get(name)) is not None and buf.is_floating_point()]
    net = net.to(device=device, dtype=dtype)
    for module, name, buf in kept:
        module._buffers[name] = buf.to(device=device)
    return net


def last_hidden(inner, kwargs: dict, names: tuple = ()):
    """A torch module ``forward(*inputs) -> inner(*inputs, **kwargs).last_hidden_state``; with
    ``names``, the inputs are passed by those keywords (GPT-2's second positional parameter is
    its KV cache, not the attention mask)."""
    import torch

    class LastHidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner

        def forward(self, *inputs):
            if names:
                return self.inner(**dict(zip(names, inputs)), **kwargs).last_hidden_state
            return self.inner(*inputs, **kwargs).last_hidden_state

    return LastHidden()


def _torch_fns(model: ZooModel, size: str, seed: int, n_inputs: int, layers: int = 0) -> dict:
    """``eager`` and ``sdpa`` attention baselines: ``make(device, dtype) -> fn(*inputs, ...)``;
    the functions take the instance's arguments and ignore the weights after the inputs."""

    def factory(impl):
        def make(device, dtype):
            net = last_hidden(make_model(model, size, impl, seed, layers), model.kwargs)
            net = as_loaded(net, device, dtype)

            def fn(*args):
                inputs = [a.to(dtype) if a.is_floating_point() else a for a in args[:n_inputs]]
                return net(*inputs)

            return fn

        return make

    return {impl: factory(impl) for impl in ("eager", "sdpa")}


def zoo_workload(model: ZooModel, size: str) -> Workload:
    """The ``<model>-<size>`` workload."""
    import functools

    @functools.cache
    def _config(layers):
        import transformers

        return getattr(transformers, model.config_class)(**_config_kwargs(model, size, layers))

    def build(dtype, rng, batch, seq=None, layers=0, sdpa=0):
        import torch

        from tvm_stitch.frontend import import_torch

        seed = int(rng.integers(0, 2**31))
        cfg = _config(layers)
        inputs = model.inputs(cfg, batch, seq, rng)
        impl = "sdpa" if sdpa else "eager"
        net = last_hidden(make_model(model, size, impl, seed, layers), model.kwargs)
        imported = import_torch(net, tuple(torch.from_numpy(a) for a in inputs), dtype)
        name = f"{model.name}-{size}{layers_suffix(layers)} {batch}x{seq or ''} {dtype}"
        name += " sdpa" if sdpa else ""
        return Instance(
            name.replace("x ", " "),
            imported.mod,
            "main",
            [*inputs, *imported.weights],
            _torch_fns(model, size, seed, len(inputs), layers),
            model.flops(cfg, batch, seq),
            0,
            dtype,
        )

    cfg_text = ", ".join(f"{k}={v}" for k, v in model.configs[size].items())
    return Workload(
        f"{model.name}-{size}",
        "zoo",
        f"transformers {model.model_class} ({cfg_text}; layers=N keeps N layers; sdpa=1: "
        "built with transformers' default attention, scaled_dot_product_attention)",
        {**model.defaults, "layers": 0, "sdpa": 0},
        build,
    )


def hidden_keys(n: int, causal: bool, window: int, device=None):
    """The keys a query does not see, ``[n, n]`` booleans: past the diagonal (``causal``); with
    a ``window`` of ``w`` keys, the keys ``w`` or more before the query (causal: Mistral's
    sliding window) or more than ``w // 2`` away on either side (ModernBERT's local
    attention)."""
    import torch

    i = torch.arange(n, device=device)
    offset = i[None, :] - i[:, None]  # key - query
    hidden = offset > 0 if causal else torch.zeros(n, n, dtype=torch.bool, device=device)
    if window:
        hidden = hidden | (offset <= -window if causal else offset.abs() > window // 2)
    return hidden


def plain_attention(causal: bool, window: int = 0, group: int = 1):
    """Attention as people write it in PyTorch: ``softmax(q @ kᵀ / √d [+ causal mask]) @ v``,
    with the causal mask (``-inf`` above the diagonal) built by ``triu`` inside ``forward``;
    with a ``window``, the mask of :func:`hidden_keys` built from ``arange`` there; with a
    ``group`` of query heads a K/V head, K and V repeated as LLaMA's ``repeat_kv`` does
    (``expand`` and ``reshape``). (``masked_fill`` is the other common spelling; TVM 0.27's
    importer mistypes it after a float16 division by a Python float.)"""
    import torch

    def repeat_kv(x):
        b, h, s, d = x.shape
        return x[:, :, None].expand(b, h, group, s, d).reshape(b, h * group, s, d)

    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            if group > 1:
                k, v = repeat_kv(k), repeat_kv(v)
            d = q.shape[-1]
            scores = q @ k.transpose(-1, -2) / d**0.5
            n = scores.shape[-1]
            if window:
                inf = torch.full((n, n), float("-inf"), dtype=q.dtype, device=q.device)
                zero = torch.zeros((n, n), dtype=q.dtype, device=q.device)
                scores = scores + torch.where(hidden_keys(n, causal, window, q.device), inf, zero)
            elif causal:
                inf = torch.full((n, n), float("-inf"), dtype=q.dtype, device=q.device)
                scores = scores + torch.triu(inf, 1)
            return torch.softmax(scores, dim=-1) @ v

    return Attention()


def flex_baseline(seq: int, causal: bool, window: int):
    """PyTorch's FlexAttention (compiled) with the block mask of :func:`hidden_keys`:
    ``fn(q, k, v)``, the baseline of a masked attention's skipped blocks."""
    import torch
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def mask_mod(b, h, q, k):
        seen = k <= q if causal else q >= 0
        if window:
            seen = seen & ((q - k < window) if causal else ((q - k).abs() <= window // 2))
        return seen

    block_mask = create_block_mask(mask_mod, None, None, seq, seq, device="cuda")
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def masked_attention(causal: bool, window: int = 0):
    """``scaled_dot_product_attention`` with a boolean key mask ``[batch, keys]`` (and a causal
    one, or a window of :func:`hidden_keys`): a sequence with no key visible gives zeros, as
    PyTorch's safe softmax does."""
    import torch
    import torch.nn.functional as F

    class MaskedAttention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            visible = mask[:, None, None, :]
            n = q.shape[-2]
            if window:
                visible = visible & ~hidden_keys(n, causal, window, q.device)
            elif causal:
                visible = visible & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            return F.scaled_dot_product_attention(q, k, v, attn_mask=visible)

    return MaskedAttention()


def filled_attention(causal: bool, window: int = 0):
    """Attention as Hugging Face's eager implementations write it: a boolean key mask
    ``[batch, keys]`` (and a causal one, or a window of :func:`hidden_keys`) fills the hidden
    logits with ``finfo(dtype).min`` before the softmax; a row with no key visible averages V
    (a softmax of equal logits)."""
    import torch

    class FilledAttention(torch.nn.Module):
        def forward(self, q, k, v, mask):
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
            visible = mask[:, None, None, :]
            n = q.shape[-2]
            if window:
                visible = visible & ~hidden_keys(n, causal, window, q.device)
            elif causal:
                visible = visible & torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            scores = torch.where(visible, scores, torch.finfo(scores.dtype).min)
            return torch.softmax(scores, dim=-1) @ v

    return FilledAttention()


def key_mask(batch: int, seq: int) -> np.ndarray:
    """A key mask: the first sequence's last quarter padded, the last sequence all padding."""
    mask = np.ones((batch, seq), bool)
    mask[0, seq - seq // 4:] = False
    if batch > 1:
        mask[-1] = False
    return mask


def plain_attention_workload() -> Workload:
    """``torch-attention``: :func:`plain_attention` imported like a user's model (``mask=1``:
    :func:`masked_attention`; ``mask=2``: :func:`filled_attention`)."""

    def build(dtype, rng, batch, heads, seq, dim, causal, mask=0, window=0, kv_heads=0):
        import torch
        import torch.nn.functional as F

        from tvm_stitch.frontend import import_torch

        kv_heads = kv_heads or heads
        if heads % kv_heads or (kv_heads != heads and mask):
            raise ValueError(f"torch-attention's kv_heads divides heads ({heads}) and goes "
                             f"with mask=0 only, got {kv_heads}")
        shape = (batch, heads, seq, dim)
        kv_shape = (batch, kv_heads, seq, dim)
        qkv = [rng.standard_normal(s).astype("float32") for s in (shape, kv_shape, kv_shape)]
        makers = {0: plain_attention, 1: masked_attention, 2: filled_attention}
        if mask not in makers:
            raise ValueError(f"torch-attention's mask takes 0, 1 or 2, got {mask}")
        if window < 0:
            raise ValueError(f"torch-attention's window is a key count, got {window}")
        group = heads // kv_heads
        module = (plain_attention(bool(causal), window, group) if (window or group > 1)
                  and not mask else makers[mask](bool(causal), window))
        inputs = qkv + ([key_mask(batch, seq)] if mask else [])
        # exported in the compute dtype, as written; a finfo.min fill (mask=2) as from_torch
        # compiles Hugging Face's models: exported in float32 and converted (the fill saturates)
        convert = mask == 2
        imported = import_torch(
            module,
            tuple(torch.from_numpy(a) for a in inputs),
            dtype,
            convert=convert,
        )

        def eager(device, tdtype):
            return module.to(device)

        def sdpa(device, tdtype):
            if mask:
                return module.to(device)
            gqa = {"enable_gqa": True} if group > 1 else {}  # K/V heads shared, as given
            if window:
                seen = ~hidden_keys(seq, bool(causal), window, device)
                return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=seen,
                                                                      **gqa)
            return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal),
                                                                  **gqa)

        baselines = {"eager": eager, "sdpa": sdpa}
        if window and not mask:  # (FlexAttention's block mask knows no padding)
            baselines["flex"] = lambda device, tdtype: flex_baseline(seq, bool(causal), window)
        # the products' work over the keys each query sees
        seen = int((~hidden_keys(seq, bool(causal), window)).sum()) if window else (
            seq * seq // (2 if causal else 1))
        flops = 4 * batch * heads * seen * dim
        io = 2 * batch * (heads + kv_heads) * seq * dim * (2 if dtype in HALF else 4)
        return Instance(
            f"torch-attention {batch}x{heads}{f'/{kv_heads}' if group > 1 else ''}x{seq}x{dim}"
            f"{' causal' if causal else ''}"
            f"{f' window {window}' if window else ''}{('', ' masked', ' filled')[mask]} {dtype}",
            imported.mod,
            "main",
            [a if convert else a.astype(dtype) for a in qkv] + inputs[3:],
            baselines,
            flops,
            io,
            dtype,
        )

    return Workload(
        "torch-attention",
        "zoo",
        "attention written in plain PyTorch (optionally causal), imported like a user's model; "
        "mask=1: scaled_dot_product_attention with a boolean key mask (one sequence all padding); "
        "mask=2: the same mask filling logits with finfo.min, as Hugging Face's eager attention; "
        "window=W: a sliding window of W keys (causal: Mistral's; else W // 2 on each side), "
        "with FlexAttention's block mask as a baseline; kv_heads=H: grouped K/V heads (LLaMA's "
        "repeat_kv)",
        {"batch": 4, "heads": 16, "seq": 512, "dim": 64, "causal": 0, "mask": 0, "window": 0,
         "kv_heads": 0},
        build,
    )


def zoo_workloads() -> list[Workload]:
    """Every model of the zoo at every size, and plain PyTorch attention."""
    return [zoo_workload(m, size) for m in MODELS.values() for size in m.configs] + [
        plain_attention_workload()
    ]
