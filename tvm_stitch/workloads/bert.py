"""BERT encoder written with ``tvm.relax.frontend.nn``.

Parameter names mirror Hugging Face's ``BertModel`` state dict
(``embeddings.word_embeddings.weight``, ``encoder.layer.0.attention.self.query.weight``, ...) so the
same random weights can be loaded into both and compared.  Attention is written out op by op
(matmul, scale, additive mask, softmax, matmul) so the fusion passes see the graph a framework
would hand them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from tvm_stitch.analysis.indexing import HALF


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Shape hyper-parameters of a BERT encoder (same names as Hugging Face's ``BertConfig``)."""

    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    vocab_size: int = 30522
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


#: The three sizes the project benchmarks. ``tiny`` is google/bert_uncased_L-2_H-128_A-2.
BERT_CONFIGS = {
    "tiny": BertConfig(128, 2, 2, 512),
    "base": BertConfig(768, 12, 12, 3072),
    "large": BertConfig(1024, 24, 16, 4096),
}

#: Additive mask value for padded positions (as in the original BERT code).
MASK_VALUE = -10000.0


def _accumulator(dtype: str) -> str | None:
    """Matrix products of 16-bit models accumulate in float32, as cuBLAS does for PyTorch."""
    return "float32" if dtype in HALF else None


def _matmul(a: nn.Tensor, b: nn.Tensor, dtype: str) -> nn.Tensor:
    acc = _accumulator(dtype)
    out = op.matmul(a, b, out_dtype=acc)
    return op.astype(out, dtype) if acc else out


class _Linear(nn.Module):
    """``y = x·Wᵀ + b`` with float32 accumulation for float16 (weights and bias stay ``dtype``)."""

    def __init__(self, n_in: int, n_out: int, dtype: str):
        self.dtype = dtype
        self.weight = nn.Parameter((n_out, n_in), dtype)
        self.bias = nn.Parameter((n_out,), dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return _matmul(x, op.permute_dims(self.weight), self.dtype) + self.bias


class _Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.position_embeddings = nn.Embedding(
            cfg.max_position_embeddings, cfg.hidden_size, dtype=dtype
        )
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size, dtype=dtype)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, dtype=dtype)

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        _, seq = input_ids.shape
        positions = op.arange(0, seq, dtype="int32")
        token_types = op.zeros((seq,), dtype="int32")
        x = self.word_embeddings(input_ids)
        pos = self.position_embeddings(positions) + self.token_type_embeddings(token_types)
        return self.LayerNorm(x + op.reshape(pos, (1, seq, -1)))


class _SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.cfg = cfg
        self.dtype = dtype
        self.query = _Linear(cfg.hidden_size, cfg.hidden_size, dtype)
        self.key = _Linear(cfg.hidden_size, cfg.hidden_size, dtype)
        self.value = _Linear(cfg.hidden_size, cfg.hidden_size, dtype)

    def forward(self, x: nn.Tensor, mask: nn.Tensor) -> nn.Tensor:
        cfg = self.cfg
        batch, seq, _ = x.shape
        heads, dim = cfg.num_attention_heads, cfg.head_dim

        def split_heads(t: nn.Tensor) -> nn.Tensor:
            return op.permute_dims(op.reshape(t, (batch, seq, heads, dim)), [0, 2, 1, 3])

        q, k, v = split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x))
        scores = _matmul(q, op.permute_dims(k, [0, 1, 3, 2]), self.dtype)
        scores = scores * (1.0 / math.sqrt(dim)) + mask
        probs = op.softmax(scores, axis=-1)
        ctx = op.permute_dims(_matmul(probs, v, self.dtype), [0, 2, 1, 3])
        return op.reshape(ctx, (batch, seq, cfg.hidden_size))


class _Dense(nn.Module):
    """Linear, then residual add and LayerNorm (HF's ``BertSelfOutput`` / ``BertOutput``)."""

    def __init__(self, n_in: int, n_out: int, eps: float, dtype: str):
        self.dense = _Linear(n_in, n_out, dtype)
        self.LayerNorm = nn.LayerNorm(n_out, eps=eps, dtype=dtype)

    def forward(self, x: nn.Tensor, residual: nn.Tensor) -> nn.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class _Attention(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.self = _SelfAttention(cfg, dtype)
        self.output = _Dense(cfg.hidden_size, cfg.hidden_size, cfg.layer_norm_eps, dtype)

    def forward(self, x: nn.Tensor, mask: nn.Tensor) -> nn.Tensor:
        return self.output(self.self(x, mask), x)


class _Intermediate(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.dense = _Linear(cfg.hidden_size, cfg.intermediate_size, dtype)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return op.gelu(self.dense(x))


class _Layer(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.attention = _Attention(cfg, dtype)
        self.intermediate = _Intermediate(cfg, dtype)
        self.output = _Dense(cfg.intermediate_size, cfg.hidden_size, cfg.layer_norm_eps, dtype)

    def forward(self, x: nn.Tensor, mask: nn.Tensor) -> nn.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class _Encoder(nn.Module):
    def __init__(self, cfg: BertConfig, dtype: str):
        self.layer = nn.ModuleList([_Layer(cfg, dtype) for _ in range(cfg.num_hidden_layers)])

    def forward(self, x: nn.Tensor, mask: nn.Tensor) -> nn.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertModel(nn.Module):
    """BERT encoder: ``forward(input_ids, attention_mask) -> last_hidden_state``.

    ``attention_mask`` is HF's 0/1 mask of shape ``(batch, seq)`` (int32); it becomes the additive
    mask ``(1 - m) * -10000`` broadcast over heads and query positions.  The pooler is left out:
    the benchmarks and HF comparisons use ``last_hidden_state``.  In float16, matrix products
    accumulate in float32 and are cast back (LayerNorm's statistics are float32 in TVM's
    legalization already), which is what PyTorch computes too.
    """

    def __init__(self, cfg: BertConfig, dtype: str = "float32"):
        self.cfg = cfg
        self.dtype = dtype
        self.embeddings = _Embeddings(cfg, dtype)
        self.encoder = _Encoder(cfg, dtype)

    def forward(self, input_ids: nn.Tensor, attention_mask: nn.Tensor) -> nn.Tensor:
        batch, seq = input_ids.shape
        mask = (1.0 - op.astype(attention_mask, self.dtype)) * MASK_VALUE
        mask = op.reshape(mask, (batch, 1, 1, seq))
        return self.encoder(self.embeddings(input_ids), mask)


# -- workloads -------------------------------------------------------------------------------------
def init_weight(name: str, shape, dtype: str, rng) -> np.ndarray:
    """Random BERT weights by parameter name: LayerNorm scales near 1, biases and tables small."""
    shape = tuple(int(d) for d in shape)
    if name.endswith("LayerNorm.weight"):
        w = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name.endswith("bias"):
        w = 0.02 * rng.standard_normal(shape)
    else:
        w = 0.05 * rng.standard_normal(shape)
    return w.astype(dtype)


def bert_inputs(cfg: BertConfig, batch: int, seq: int, rng, index_dtype: str = "int32"):
    """Token ids and a 0/1 attention mask whose last sequence has its final quarter padded."""
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(index_dtype)
    mask = np.ones((batch, seq), index_dtype)
    if batch > 1:
        mask[-1, seq - seq // 4 :] = 0
    return ids, mask


def make_hf_bert(cfg: BertConfig, attn_implementation: str = "eager"):
    """A randomly initialised ``transformers.BertModel`` (no pooler) with ``cfg``'s shapes."""
    import transformers

    hf_cfg = transformers.BertConfig(
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        vocab_size=cfg.vocab_size,
        max_position_embeddings=cfg.max_position_embeddings,
        type_vocab_size=cfg.type_vocab_size,
        layer_norm_eps=cfg.layer_norm_eps,
        attn_implementation=attn_implementation,
    )
    return transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()


def load_weights(model, state: dict) -> None:
    """Load numpy weights named like HF's state dict; every parameter must be given."""
    import torch

    tensors = {k: torch.from_numpy(np.asarray(v, dtype="float32")) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    params = {n for n, _ in model.named_parameters()}
    if unexpected or params & set(missing):
        raise RuntimeError(
            f"weights do not match HF BertModel: missing {sorted(params & set(missing))}, "
            f"unexpected {unexpected}"
        )


def hf_model_factory(cfg: BertConfig, state: dict, attn_implementation: str):
    """``make(device, dtype) -> fn(ids, mask, *ignored)``: HF's ``BertModel`` with ``state``."""

    def make(device, dtype):
        model = make_hf_bert(cfg, attn_implementation)
        load_weights(model, state)
        model = model.to(device=device, dtype=dtype)

        def fn(ids, mask, *_weights):
            # the additive mask of BertModel.forward above; HF uses a 4-D mask as given
            additive = (1.0 - mask[:, None, None, :].to(dtype)) * MASK_VALUE
            return model(input_ids=ids.long(), attention_mask=additive).last_hidden_state

        return fn

    return make


def hf_torch_fns(cfg: BertConfig, state: dict) -> dict:
    """HF ``BertModel`` baselines with ``state``: eager attention and SDPA attention."""
    return {impl: hf_model_factory(cfg, state, impl) for impl in ("eager", "sdpa")}


def bert_workload(size: str):
    """The ``bert-<size>`` workload: :class:`BertModel` exported from ``relax.frontend.nn``."""
    from .base import Instance, Workload, layers_suffix

    def build(dtype, rng, batch, seq, layers=0):
        from tvm.relax.frontend.nn import spec

        cfg = with_layers(BERT_CONFIGS[size], layers)
        model = BertModel(cfg, dtype)
        mod, params = model.export_tvm(
            spec={
                "forward": {
                    "input_ids": spec.Tensor((batch, seq), "int32"),
                    "attention_mask": spec.Tensor((batch, seq), "int32"),
                }
            }
        )
        ids, mask = bert_inputs(cfg, batch, seq, rng)
        weights = {name: init_weight(name, p.shape, dtype, rng) for name, p in params}
        return Instance(
            f"bert-{size}{layers_suffix(layers)} {batch}x{seq} {dtype}",
            mod,
            "forward",
            [ids, mask, *weights.values()],
            hf_torch_fns(cfg, weights),
            bert_flops(cfg, batch, seq),
            0,
            dtype,
        )

    cfg = BERT_CONFIGS[size]
    return Workload(
        f"bert-{size}",
        "bert",
        f"BERT-{size} encoder ({cfg.num_hidden_layers} layers, "
        f"hidden {cfg.hidden_size}) from relax.frontend.nn; layers=N keeps N layers",
        {"batch": 1, "seq": 128, "layers": 0},
        build,
    )


def with_layers(cfg: BertConfig, layers: int) -> BertConfig:
    """``cfg`` with its first ``layers`` layers (``0``: all of them)."""
    return dataclasses.replace(cfg, num_hidden_layers=layers) if layers else cfg



def bert_flops(cfg: BertConfig, batch: int, seq: int) -> int:
    """Matrix-product FLOPs of one forward pass (what TFLOP/s figures are computed from)."""
    tokens, h, inter = batch * seq, cfg.hidden_size, cfg.intermediate_size
    per_layer = 2 * tokens * h * (4 * h + 2 * inter) + 4 * batch * seq * seq * h
    return per_layer * cfg.num_hidden_layers
