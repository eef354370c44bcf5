"""Hugging Face ``BertModel`` imported from PyTorch.

TVM 0.27's ``from_exported_program`` cannot import BERT exported in float16 (mixed dtypes in the
linear layers), so the model is exported in float32 and, for float16, converted afterwards with
``relax.transform.ToMixedPrecision``: float16 operands, float32 accumulation, float16 weights.
"""

from __future__ import annotations

from .base import Instance, Workload
from .bert import (
    BERT_CONFIGS,
    bert_flops,
    bert_inputs,
    hf_torch_fns,
    init_weight,
    load_weights,
    make_hf_bert,
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
    from tvm import relax
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    class _LastHidden(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, attention_mask):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    example = (
        torch.zeros((batch, seq), dtype=torch.int64),
        torch.ones((batch, seq), dtype=torch.int64),
    )
    with torch.no_grad():
        exported = torch.export.export(_LastHidden(model.float().eval()), example)
    mod = from_exported_program(exported, keep_params_as_input=True, unwrap_unit_return_tuple=True)
    mod, params = detach_params(mod)
    weights = [p.numpy() for p in params["main"]]
    if dtype == "float16":
        # float16 operands with float32 accumulation (out_dtype is the accumulator's dtype: with
        # "float16" the result drifts ~0.1 from PyTorch's on BERT-base); weights become float16
        # parameters instead of float32 ones cast on every call
        names = [v.name for v in mod["main"].params[2:]]
        mod = relax.transform.ToMixedPrecision("float32", fp16_input_names=names)(mod)
        weights = [w.astype("float16") for w in weights]
    elif dtype != "float32":
        raise ValueError(f"dtype must be float32 or float16, got {dtype!r}")
    return mod, weights


def hf_bert_workload(size: str) -> Workload:
    """The ``hf-bert-<size>`` workload: HF ``BertModel`` (eager attention) with random weights."""
    cfg = BERT_CONFIGS[size]

    def build(dtype, rng, batch, seq):
        model = make_hf_bert(cfg, "eager")
        state = {
            name: init_weight(name, p.shape, "float32", rng) for name, p in model.named_parameters()
        }
        load_weights(model, state)
        mod, weights = import_hf_bert(model, batch, seq, dtype)
        ids, mask = bert_inputs(cfg, batch, seq, rng, "int64")
        return Instance(
            f"hf-bert-{size} {batch}x{seq} {dtype}",
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
        f"Hugging Face BertModel ({size}) imported with torch.export + from_exported_program",
        {"batch": 1, "seq": 128},
        build,
    )
