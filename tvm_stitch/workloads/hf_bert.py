"""Hugging Face ``BertModel`` imported from PyTorch.

Imported as :func:`tvm_stitch.from_torch` imports (:func:`tvm_stitch.frontend.import_torch`):
exported in float32 and, for float16, converted afterwards (``ToMixedPrecision``,
``HalfActivations``).
"""

from __future__ import annotations

from .base import Instance, Workload, layers_suffix
from .bert import (
    BERT_CONFIGS,
    bert_flops,
    bert_inputs,
    hf_torch_fns,
    init_weight,
    load_weights,
    make_hf_bert,
    with_layers,
)


def import_hf_bert(model, batch: int, seq: int, dtype: str = "float32"):
    """Export a ``transformers.BertModel`` with ``torch.export`` and import it into Relax.

    Parameters
    ----------
    model : transformers.BertModel
        In float32 and eval mode.
    batch, seq : int
        Static input shape.
    dtype : {"float32", "float16"}
        Compute dtype of the imported module.

    Returns
    -------
    mod : tvm.IRModule
        ``main(input_ids, attention_mask, *weights) -> last_hidden_state``.
    weights : list of numpy.ndarray
        The weights in ``main``'s parameter order (float16 for a float16 module).
    """
    import torch

    from tvm_stitch.frontend import import_torch

    from .zoo import last_hidden

    example = (
        torch.zeros((batch, seq), dtype=torch.int64),
        torch.ones((batch, seq), dtype=torch.int64),
    )

    net = last_hidden(model, {}, ("input_ids", "attention_mask"))
    imported = import_torch(net, example, dtype)
    return imported.mod, imported.weights


def hf_bert_workload(size: str) -> Workload:
    """The ``hf-bert-<size>`` workload: HF ``BertModel`` (eager attention; ``sdpa=1``:
    ``transformers``' default, ``scaled_dot_product_attention``) with random weights."""
    def build(dtype, rng, batch, seq, layers=0, sdpa=0):
        cfg = with_layers(BERT_CONFIGS[size], layers)
        model = make_hf_bert(cfg, "sdpa" if sdpa else "eager")
        state = {
            name: init_weight(name, p.shape, "float32", rng) for name, p in model.named_parameters()
        }
        load_weights(model, state)
        mod, weights = import_hf_bert(model, batch, seq, dtype)
        ids, mask = bert_inputs(cfg, batch, seq, rng, "int64")
        return Instance(
            f"hf-bert-{size}{layers_suffix(layers)} {batch}x{seq} {dtype}{' sdpa' if sdpa else ''}",
            mod,
            "main",
            [ids, mask, *weights],
            hf_torch_fns(cfg, state),
            bert_flops(cfg, batch, seq),
            0,
            dtype,
        )

    return Workload(
        f"hf-bert-{size}",
        "bert",
        f"Hugging Face BertModel ({size}) imported with torch.export + from_exported_program; "
        "layers=N keeps N layers; sdpa=1: transformers' default attention",
        {"batch": 1, "seq": 128, "layers": 0, "sdpa": 0},
        build,
    )
