"""The kernels of a fused module, read from its tensor graph: what each launch computes and the
global memory it moves (:class:`FusionReport`)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import tvm

from .tdg import TensorDependencyGraph, dtype_bytes

#: a PrimFunc attribute: how many partial-result buffers a two-phase column pattern lifted to
#: its parameters (the kernel then launches twice)
PARTIALS_ATTR = "tvm_stitch.partials"


@dataclasses.dataclass
class KernelGroup:
    """One kernel: the blocks a PrimFunc call computes.

    Attributes
    ----------
    name : str
        The Relax binding of the call.
    func : str
        The PrimFunc.
    kinds : list of str
        Op kinds of its blocks, in program order (``row-reduce``, ``light-elementwise``, ...).
    bytes_read, bytes_written : int
        Global-memory footprints.
    """

    name: str
    func: str
    kinds: list[str]
    bytes_read: int
    bytes_written: int
    kernel: str = ""  # what a generated kernel computes (family, shape, outputs)
    launches: int = 1  # a column pattern in two phases: 2

    @property
    def bytes(self) -> int:
        """Global-memory footprints, read and written (a two-phase pattern's partial sums
        included: written by one phase, read by the other)."""
        return self.bytes_read + self.bytes_written


@dataclasses.dataclass
class FusionReport:
    """What a pipeline makes of a module.

    Attributes
    ----------
    pipeline : str
    target : str
    groups : list of KernelGroup
    """

    pipeline: str
    target: str
    groups: list[KernelGroup]

    @property
    def kernels(self) -> int:
        """Kernel launches per call of the entry function."""
        return sum(g.launches for g in self.groups)

    @property
    def bytes(self) -> int:
        """Estimated global-memory traffic: bytes read plus written by every kernel."""
        return sum(g.bytes for g in self.groups)

    def kind_histogram(self) -> dict[str, int]:
        """How many kernels have each signature (the op kinds they fuse)."""
        hist: dict[str, int] = OrderedDict()
        for g in self.groups:
            key = "+".join(dict.fromkeys(g.kinds)) or "empty"
            hist[key] = hist.get(key, 0) + 1
        return hist

    def to_dict(self) -> dict:
        return {
            "pipeline": self.pipeline,
            "target": self.target,
            "kernels": self.kernels,
            "bytes": self.bytes,
            "groups": [{**dataclasses.asdict(g), "bytes": g.bytes} for g in self.groups],
        }

    def format(self, max_groups: int = 12) -> str:
        """A short readable summary: kernels by signature; generated kernels by what they do."""
        lines = [
            f"{self.pipeline} pipeline on {self.target}: {self.kernels} kernels, "
            f"{self.bytes / 1e6:.3f} MB global memory traffic (estimated)"
        ]
        for sig, n in list(self.kind_histogram().items())[:max_groups]:
            lines.append(f"  {n:4d} x {sig}")
        generated: dict[str, int] = OrderedDict()
        for g in self.groups:
            if g.kernel:
                generated[g.kernel] = generated.get(g.kernel, 0) + 1
        if generated:
            lines.append("  generated in Triton:")
            lines += [f"  {n:4d} x {what}" for what, n in generated.items()]
        return "\n".join(lines)


def groups_of(graph: TensorDependencyGraph) -> list[KernelGroup]:
    """Kernel groups of a graph whose ``call`` attribute names one kernel per call."""
    by_call: dict[str, list] = OrderedDict()
    for node in graph.nodes.values():
        by_call.setdefault(node.call, []).append(node)
    groups = []
    for call, nodes in by_call.items():
        read: dict[str, int] = {}
        written: set[str] = set()
        for node in nodes:
            for m in node.inputs:
                info = graph.tensors[m.tensor]
                if info.scope != "local":
                    read[m.tensor] = max(read.get(m.tensor, 0), m.footprint)
            if graph.tensors[node.output].scope != "local":
                written.add(node.output)
        groups.append(
            KernelGroup(
                name=call,
                func=nodes[0].func,
                kinds=[n.kind.value for n in nodes],
                bytes_read=sum(n * dtype_bytes(graph.tensors[t].dtype) for t, n in read.items()),
                bytes_written=sum(graph.tensors[t].nbytes for t in written),
            )
        )
    # kernels the graph cannot look into (symbolic shapes) still launch: bytes unknown
    groups += [KernelGroup(call, func, ["unanalysed"], 0, 0) for call, func in graph.opaque_calls]
    return groups


def annotate(groups: list[KernelGroup], mod: tvm.IRModule) -> list[KernelGroup]:
    """``groups`` with what ``mod``'s functions say of them: the generated kernel each stands
    for, the launches of a column pattern in two phases."""
    funcs = {gv.name_hint: func for gv, func in mod.functions.items()}
    for group in groups:
        attrs = getattr(funcs.get(group.func), "attrs", None) or {}
        group.kernel = str(attrs.get("tvm_stitch.kernel", ""))
        if attrs.get(PARTIALS_ATTR):
            group.launches = 2
    return groups
