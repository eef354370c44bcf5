"""Fusion report: kernels, estimated global-memory bytes and fused groups of a pipeline.

The report runs a pipeline's passes up to and including fusion (and the reshape-to-view rewrite
of dataflow lowering, which removes copy kernels), then reads the entry function: every remaining
``call_tir`` is one kernel (dlight schedules each PrimFunc as one launch), its bytes are the global
tensors it reads (footprint) plus those it writes, and its group lists the op kinds of its blocks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict

import tvm
from tvm import relax

from .errors import error_line
from .graph import TensorDependencyGraph, build_graph
from .graph.tdg import dtype_bytes
from .pipeline import as_target, phases
from .stitch.columns import PARTIALS_ATTR

logger = logging.getLogger("tvm_stitch.report")


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


def fused_module(mod: tvm.IRModule, target, pipeline: str = "stitch", **options) -> tvm.IRModule:
    """``mod`` after a pipeline's dispatch and fusion phases and the reshape-to-view rewrite."""
    target = as_target(target)
    seq = []
    plan = {"plan_only": True} if pipeline == "stitch" else {}
    for name, passes in phases(target, pipeline, **plan, **options):
        if name in ("dispatch", "fusion"):
            seq.extend(passes)
    seq.append(relax.transform.RewriteDataflowReshape())
    with target:
        return tvm.transform.Sequential(seq)(mod)


def fusion_report(
    mod: tvm.IRModule, target="llvm", pipeline: str = "stitch", **options
) -> FusionReport:
    """The fusion report of one pipeline on a module.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module (not yet legalized).
    target : tvm.target.Target or str or dict
        ``llvm`` or a CUDA target.
    pipeline : {"stitch", "default"}
        tvm-stitch's pipeline or TVM's default for the target.
    **options
        Pipeline options (stitch only).

    Returns
    -------
    FusionReport
    """
    target = as_target(target)
    if pipeline == "stitch":
        options.setdefault("report", False)  # the report itself need not log
        options.setdefault("analyze", False)
    fused = fused_module(mod, target, pipeline, **options)
    graph = build_graph(fused, legalize=False)
    return FusionReport(pipeline, str(target.kind.name), annotate(groups_of(graph), fused))


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


def compare_pipelines(mod: tvm.IRModule, target="llvm") -> dict[str, FusionReport]:
    """Fusion reports of TVM's default pipeline and of the stitch pipeline, for the same module.

    Where TVM's own pipeline fails on the module (TVM 0.27 cannot legalize a ``full`` whose
    dtype came from PyTorch's ``triu`` mask, which the stitch pipeline canonicalizes first),
    the reason is logged and only the stitch pipeline's report is returned."""
    reports = {}
    try:
        reports["default"] = fusion_report(mod, target, "default")
    except Exception as err:  # noqa: BLE001 - TVM's pipeline, not ours: say so and go on
        logger.warning("TVM's default pipeline failed on this module: %s: %s",
                       type(err).__name__, error_line(err)[:200])
    reports["stitch"] = fusion_report(mod, target, "stitch")
    return reports


def nvcc_error(executable, arch: str = "sm_90a") -> str | None:
    """The first error ``nvcc`` reports on ``executable``'s CUDA C (TVM's kernels; Triton's are
    PTX already), or None where it compiles or no ``nvcc`` is on the path.  A TVM without a
    CUDA runtime only generates that source — the GPU host compiles it when the library is
    loaded — so this is how a CPU machine learns it would not."""
    from .codegen import check
    from .codegen.ptx import PREFIX

    # Triton's PTX travels as a prefixed "source"
    for source in _cuda_sources(executable):
        why = None if source.startswith(PREFIX) else check.nvcc_error(source, arch)
        if why:
            return why
    return None


def cuda_source(executable) -> str:
    """The generated CUDA C source of a compiled executable (empty when it has no CUDA module)."""
    return "\n".join(_cuda_sources(executable))


def _cuda_sources(executable) -> list[str]:
    """The source of each CUDA module of ``executable`` (its imports, walked depth first)."""
    stack, sources = [executable.mod], []
    while stack:
        module = stack.pop()
        if module.kind == "cuda":
            sources.append(module.inspect_source())
        stack.extend(module.imports)
    return sources
