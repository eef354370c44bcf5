"""Workloads shared by tests, benchmarks and notebooks.

>>> from tvm_stitch.workloads import get_workload
>>> inst = get_workload("layernorm").instance("float16", rows=1823, cols=781)
>>> inst.mod, inst.args, inst.reference()
"""

from __future__ import annotations

from .base import TOLERANCES, Instance, Workload
from .bert import BERT_CONFIGS, BertConfig, BertModel, bert_workload
from .hf_bert import hf_bert_workload, import_hf_bert
from .subgraphs import ATTENTION, GEMM_CHAINS, subgraph_workloads
from .zoo import MODELS, zoo_workloads

WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in [
        *(bert_workload(size) for size in BERT_CONFIGS),
        *(hf_bert_workload(size) for size in BERT_CONFIGS),
        *subgraph_workloads(),
        *zoo_workloads(),
    ]
}


def get_workload(name: str) -> Workload:
    """The workload called ``name``; ``KeyError`` lists the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None


__all__ = [
    "ATTENTION",
    "BERT_CONFIGS",
    "GEMM_CHAINS",
    "MODELS",
    "TOLERANCES",
    "WORKLOADS",
    "BertConfig",
    "BertModel",
    "Instance",
    "Workload",
    "get_workload",
    "import_hf_bert",
]
