"""The tensor dependency graph of a Relax module (SOUFFLE §5, FusionStitching §4).

One node per TIR block (one tensor-expression computation) reached from the entry function's
``call_tir`` bindings, in program order.  Tensors are Relax values (``scope="global"``) or buffers
allocated inside a PrimFunc (``scope="local"``, named ``<call>.<buffer>``).  A module that still has
high-level Relax ops is legalized first.

A function with symbolic dims that have ranges is analysed at its representative point
(:mod:`.specialize`): its tensors' shapes are their sizes there, and a PrimFunc with symbolic
shapes gets its nodes from the PrimFunc specialized at the point (``Node.symbolic``; what those
nodes decide must be applied to the symbolic PrimFunc, never generated from their sizes).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict

import tvm
from tvm import relax, s_tir, sym, tirx

from .access import AccessMap, Dependence, analyze_access
from .classify import OpKind, classify, count_flops
from .specialize import call_point, call_types, dims_at, is_symbolic, representative, specialize
from .tir_walk import buffer_loads, iter_sblocks

logger = logging.getLogger(__name__)

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def dtype_bytes(dtype) -> int:
    """Bytes of one element of ``dtype`` (at least 1, for ``bool``)."""
    dt = tvm.runtime.DataType(str(dtype))
    return max(1, dt.bits * dt.lanes // 8)


@dataclasses.dataclass
class TensorInfo:
    """A tensor of the graph.

    Attributes
    ----------
    name : str
        Unique name.
    shape : tuple of int
    dtype : str
    scope : str
        ``"input"`` (function parameter), ``"const"``, ``"global"`` (a Relax value between kernels)
        or ``"local"`` (a buffer inside one PrimFunc).
    producer : str or None
        The node that writes it, if any.
    symbolic : bool
        Its shape has symbolic dims: ``shape`` is their size at the graph's point.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    scope: str
    producer: str | None = None
    symbolic: bool = False

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_bytes(self.dtype)


@dataclasses.dataclass
class Node:
    """One tensor-expression computation (a TIR block).

    Attributes
    ----------
    name : str
        ``<call>/<block>``, unique.
    call : str
        The Relax binding (one ``call_tir``, i.e. one kernel before fusion) the block belongs to.
    func : str
        The PrimFunc's name.
    kind : OpKind
    detail : str
        A finer label: ``gemm``, ``bmm``, ``conv``, ``reduce``, ``transpose``, ``reshape``,
        ``slice``, ``gather``, ``broadcast``, ``cast``, ``copy``, ``elementwise``, ...
    output : str
        The tensor written.
    inputs : list of AccessMap
        One map per distinct input access.
    spatial, reduction : tuple of (str, int)
        Block variables and their extents.
    flops : int
        Arithmetic operations over the whole iteration domain.
    bytes_read, bytes_written : int
        Footprints of the inputs and of the output, in bytes.
    block : tvm.s_tir.SBlock or None
        The TIR block itself (None for an opaque kernel), for analyses that read its expression.
    tensor_of : dict
        Graph tensor name of each buffer the block touches (its loads and its store).
    symbolic : bool
        The block is of a PrimFunc with symbolic shapes, analysed specialized at the graph's
        point: its extents and ``block`` are that specialization's.
    """

    name: str
    call: str
    func: str
    kind: OpKind
    detail: str
    output: str
    out_shape: tuple[int, ...]
    out_dtype: str
    inputs: list[AccessMap]
    spatial: tuple[tuple[str, int], ...]
    reduction: tuple[tuple[str, int], ...]
    flops: int
    bytes_read: int
    bytes_written: int
    elements_accessed: int
    block: object = dataclasses.field(default=None, repr=False, compare=False)
    tensor_of: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)
    symbolic: bool = False

    @property
    def compute_memory_ratio(self) -> float:
        """SOUFFLE's ratio: operations per element read or written."""
        return self.flops / max(1, self.elements_accessed)

    @property
    def memory_intensive(self) -> bool:
        return self.kind.memory_intensive

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "call": self.call,
            "kind": self.kind.value,
            "detail": self.detail,
            "output": self.output,
            "shape": list(self.out_shape),
            "dtype": self.out_dtype,
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "compute_memory_ratio": round(self.compute_memory_ratio, 3),
            "inputs": [
                {"tensor": m.tensor, "dependence": m.dependence.value, "map": m.describe()}
                for m in self.inputs
            ],
        }


@dataclasses.dataclass(frozen=True)
class Reuse:
    """A tensor read by more than one node (SOUFFLE §5.1).

    ``temporal`` when every pair of readers is ordered by a data dependence (cache the tensor
    between them), ``spatial`` when no pair is (a horizontal-fusion candidate), ``both`` when
    some pairs are and some are not (BERT's hidden state: read by Q, K, V and the residual add).
    """

    tensor: str
    readers: tuple[str, ...]
    kind: str


class TensorDependencyGraph:
    """Nodes, tensors and their producer/consumer relations.

    Build one with :func:`build_graph`.
    """

    def __init__(self):
        self.nodes: dict[str, Node] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self.skipped: list[tuple[str, str]] = []
        #: graph tensor name -> the Relax expression holding it (a Var, Constant or tuple item)
        self.values: dict = {}
        #: tensors something other than a call_tir reads: returned, block outputs, tuple reads
        self.pinned: set[str] = set()
        #: ``(binding, PrimFunc)`` of kernels called but not analysable (symbolic shapes)
        self.opaque_calls: list[tuple[str, str]] = []
        #: ``{dim name: size}``: where symbolic dims are read (:mod:`.specialize`); empty when
        #: the function is static
        self.point: dict[str, int] = {}
        self._consumers: dict[str, list[str]] = defaultdict(list)
        self._reach: dict[str, set[str]] = {}  # node -> the nodes it reaches (and itself)
        self._specialized: dict = {}  # (PrimFunc, point) -> (specialized, why not), building
        self._accesses: dict = {}  # (load or store, shape) -> AccessMap, building

    # -- construction ---------------------------------------------------------------------------
    def add_tensor(self, info: TensorInfo) -> None:
        self.tensors[info.name] = info

    def add_node(self, node: Node) -> None:
        self._reach.clear()
        self.nodes[node.name] = node
        for tensor in dict.fromkeys(m.tensor for m in node.inputs):
            self._consumers[tensor].append(node.name)
        self.tensors[node.output].producer = node.name

    # -- queries --------------------------------------------------------------------------------
    def consumers(self, tensor: str) -> list[Node]:
        """Nodes that read ``tensor``."""
        return [self.nodes[n] for n in self._consumers.get(tensor, [])]

    def producers_of(self, node: Node) -> list[Node]:
        """Nodes whose outputs ``node`` reads."""
        out = []
        for m in node.inputs:
            producer = self.tensors[m.tensor].producer
            if producer is not None and self.nodes[producer] not in out:
                out.append(self.nodes[producer])
        return out

    def successors(self, node: Node) -> list[Node]:
        """Nodes that read ``node``'s output."""
        return self.consumers(node.output)

    def reaches(self, src: str, dst: str) -> bool:
        """Whether a path of data dependences leads from node ``src`` to node ``dst`` (every
        node reaches itself). What a node reaches is found once and kept until a node is
        added: recognition asks for every pair of GEMMs it may group."""
        if src not in self._reach:
            seen, stack = set(), [src]
            while stack:
                cur = stack.pop()
                if cur in seen:
                    continue
                seen.add(cur)
                stack.extend(n.name for n in self.successors(self.nodes[cur]))
            self._reach[src] = seen
        return dst in self._reach[src]

    def shared_tensors(self) -> list[Reuse]:
        """Tensors read by more than one node, each tagged temporal, spatial or both."""
        out = []
        for tensor, readers in self._consumers.items():
            if len(readers) < 2:
                continue
            ordered = [
                self.reaches(a, b) or self.reaches(b, a)
                for i, a in enumerate(readers)
                for b in readers[i + 1 :]
            ]
            kind = (
                "both"
                if any(ordered) and not all(ordered)
                else ("temporal" if all(ordered) else "spatial")
            )
            out.append(Reuse(tensor, tuple(readers), kind))
        return out

    def kind_counts(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for node in self.nodes.values():
            counts[node.kind.value] += 1
        return dict(counts)

    def to_dict(self) -> dict:
        return {
            "nodes": [n.to_dict() for n in self.nodes.values()],
            "shared_tensors": [dataclasses.asdict(r) for r in self.shared_tensors()],
            "skipped": [{"binding": b, "reason": r} for b, r in self.skipped],
        }

    def __len__(self) -> int:
        return len(self.nodes)


def build_graph(
    mod: tvm.IRModule, func_name: str | None = None, legalize: bool = True, point=None
) -> TensorDependencyGraph:
    """Build the tensor dependency graph of one Relax function of ``mod``.

    Parameters
    ----------
    mod : tvm.IRModule
        A Relax module, legalized or not (``LegalizeOps`` runs first when high-level ops remain).
    func_name : str, optional
        The Relax function to analyse; by default the only public one, or ``main``.
    legalize : bool
        Run ``LegalizeOps`` first if high-level ops remain.  Off for modules where the remaining
        Relax ops are meant to stay (``R.reshape`` views after ``RewriteDataflowReshape``): those
        are recorded in ``skipped``.
    point : dict, optional
        Where symbolic dims are read (``{name: size}``); by default the function's
        representative point (:func:`~.specialize.representative`).

    Returns
    -------
    TensorDependencyGraph
    """
    if legalize and _needs_legalization(mod):
        mod = relax.transform.LegalizeOps()(mod)
    func = mod[_entry_name(mod, func_name)]
    graph = TensorDependencyGraph()
    graph.point = dict(point) if point is not None else representative(func)
    names = _Namer()
    for param in func.params:
        _add_relax_tensor(graph, names.name(param), param.ty, "input")
        graph.values[names.name(param)] = param
    for block in func.body.blocks:
        for binding in block.bindings:
            _visit_binding(graph, mod, names, binding)
            if not isinstance(binding.var, relax.DataflowVar):
                _pin(graph, names, binding.var)
            value = binding.value
            if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
                for var in relax.analysis.free_vars(value):
                    _pin(graph, names, var)
    for var in relax.analysis.free_vars(func.body.body):
        _pin(graph, names, var)
    return graph


def _pin(graph, names, var) -> None:
    name = names.name(var)
    for n in name if isinstance(name, list) else [name]:
        graph.pinned.add(n)


# -- Relax level -----------------------------------------------------------------------------------
class _Namer:
    """Unique graph names for Relax variables and constants."""

    def __init__(self):
        self._names: dict = {}
        self._used: set[str] = set()
        self.aliases: dict = {}

    def name(self, var) -> str:
        if var in self.aliases:
            return self.aliases[var]
        if var not in self._names:
            base = var.name if isinstance(var, relax.Var) else "const"
            name, i = base, 0
            while name in self._used:
                i += 1
                name = f"{base}_{i}"
            self._used.add(name)
            self._names[var] = name
        return self._names[var]


def _needs_legalization(mod) -> bool:
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op):
                    name = v.op.name
                    if name.startswith("relax.") and not name.startswith(
                        (
                            "relax.call_tir",
                            "relax.call_dps",
                            "relax.call_pure",
                            "relax.builtin",
                            "relax.vm.",
                            "relax.memory",
                            "relax.null_value",
                        )
                    ):
                        return True
    return False


def _entry_name(mod, func_name) -> str:
    if func_name is not None:
        return func_name
    public = [
        gv.name_hint
        for gv, f in mod.functions.items()
        if isinstance(f, relax.Function) and "global_symbol" in (f.attrs or {})
    ]
    # LiftTransformParams' <entry>_transform_params runs once, on the weights: not the entry
    public = [n for n in public if not (n.endswith("_transform_params")
                                        and n[: -len("_transform_params")] in public)]
    if "main" in public or len(public) != 1:
        if "main" not in public:
            raise ValueError(f"pass func_name: the module has Relax functions {public}")
        return "main"
    return public[0]


def _add_relax_tensor(graph, name, ty, scope) -> None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return
    dims = dims_at(ty.shape.values, graph.point)
    if dims is not None:
        symbolic = is_symbolic(ty.shape.values)
        graph.add_tensor(TensorInfo(name, dims, str(ty.dtype), scope, symbolic=symbolic))


def static_dims(dims) -> tuple[int, ...] | None:
    """``dims`` as Python ints, or None when one of them is symbolic."""
    out = []
    for d in dims:
        if not isinstance(d, (int, tirx.IntImm)):
            return None
        out.append(int(d))
    return tuple(out)


def _unanalysable(func) -> str | None:
    """Why the graph cannot have nodes for ``func`` (not a PrimFunc, symbolic shapes), or None.

    Such a call stays in the graph as an opaque binding (``skipped``): the passes that read the
    graph leave it to TVM.
    """
    if not isinstance(func, tirx.PrimFunc):
        return f"not a PrimFunc ({type(func).__name__})"
    if any(static_dims(p.shape) is None for p in func.params if hasattr(p, "shape")):
        return "symbolic or dynamic shapes"
    if any(not hasattr(p, "shape") for p in func.params):
        return "takes non-buffer parameters"
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    buffers = list(root.alloc_buffers) if root is not None else []
    for block, _ in iter_sblocks(func.body):
        buffers.extend(block.alloc_buffers)
        if any(static_dims([iv.dom.extent, iv.dom.min]) is None for iv in block.iter_vars):
            return "symbolic loop extents"
    if any(static_dims(b.shape) is None for b in buffers):
        return "symbolic buffer shapes"
    return None


def _visit_binding(graph, mod, names, binding) -> None:
    var, value = binding.var, binding.value
    if isinstance(value, relax.Var):
        names.aliases[var] = names.name(value)
        return
    if isinstance(value, relax.TupleGetItem) and isinstance(value.tuple_value, relax.Var):
        tup = names.aliases.get(value.tuple_value)
        if isinstance(tup, list):
            names.aliases[var] = tup[value.index]
        return
    if isinstance(value, relax.Tuple):
        names.aliases[var] = [names.name(f) for f in value.fields]
        return
    if isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
        _visit_call_tir(graph, mod, names, var, value)
        return
    reason = f"not a call_tir: {type(value).__name__}"
    if isinstance(value, relax.Call):
        reason = f"opaque call {getattr(value.op, 'name', value.op)}"
    _add_relax_tensor(graph, names.name(var), var.ty, "global")
    graph.values[names.name(var)] = var
    graph.skipped.append((var.name, reason))
    logger.debug("tensor graph: %s left out (%s)", var.name, reason)


def _visit_call_tir(graph, mod, names, var, call) -> None:
    gvar = call.args[0]
    func = mod[gvar]
    why = _unanalysable(func)
    symbolic = bool(why) and isinstance(func, tirx.PrimFunc) and bool(graph.point)
    if symbolic:  # specialized once per function and point (a model's layers share them)
        point = call_point(func, call, graph.point)
        key = (gvar.name_hint, tuple(sorted(point.items())) if point else None)
        if key not in graph._specialized:
            graph._specialized[key] = _at_point(func, point, why)
        func, why = graph._specialized[key]
    if not why:
        why = _disagrees(graph, func, call)
    if why:
        _add_relax_tensor(graph, names.name(var), var.ty, "global")
        graph.values[names.name(var)] = var
        graph.skipped.append((var.name, f"{gvar.name_hint}: {why}"))
        graph.opaque_calls.append((names.name(var), gvar.name_hint))
        logger.debug("tensor graph: %s left out (%s)", var.name, why)
        return
    arg_names = []
    for arg in _tensor_args(call):  # a specialized PrimFunc takes no shape scalars
        name = names.name(arg)
        if isinstance(arg, tvm.ir.expr.Constant):
            _add_relax_tensor(graph, name, arg.ty, "const")
            graph.values[name] = arg
        arg_names.append(name)
    out_sinfo = call.ty_args[0]
    call_name = names.name(var)
    if isinstance(out_sinfo, tvm.ir.TupleType):
        base = call_name
        out_names = [f"{base}.{i}" for i in range(len(out_sinfo.fields))]
        names.aliases[var] = out_names
        for i, (n, s) in enumerate(zip(out_names, out_sinfo.fields)):
            _add_relax_tensor(graph, n, s, "global")
            graph.values[n] = relax.TupleGetItem(var, i)
    else:
        out_names = [names.name(var)]
        _add_relax_tensor(graph, out_names[0], out_sinfo, "global")
        graph.values[out_names[0]] = var
    buffer_names = dict(zip(func.params, arg_names + out_names))
    _visit_prim_func(graph, func, buffer_names, call_name, gvar.name_hint, symbolic)


# -- TIR level -------------------------------------------------------------------------------------
def _at_point(func, point, why):
    """``(func specialized at point, None)``, or ``(func, why not)``."""
    special = specialize(func, point)
    if special is None:
        return func, f"{why} (not all of them have a range)"
    still = _unanalysable(special)
    return (func, f"{still} at the point {point}") if still else (special, None)


def _disagrees(graph, func, call) -> str | None:
    """Why the call's tensors do not have the shapes of ``func``'s buffers (at the graph's
    point: a shape variable named like the function's but standing for another dim), or None."""
    for param, ty in zip(func.params, call_types(call)):
        if not hasattr(param, "shape") or not isinstance(ty, relax.TensorType):
            continue
        if not isinstance(ty.shape, relax.ShapeExpr):
            return "a tensor of unknown shape"
        want = dims_at(ty.shape.values, graph.point)
        if want is None or want != tuple(int(d) for d in param.shape):
            return f"{param.name}'s shape {list(param.shape)} is not its argument's {want}"
    return None


def _tensor_args(call) -> list:
    """A ``call_tir``'s tensor arguments (TVM 0.27 passes shape scalars in the same tuple)."""
    return [a for a in call.args[1].fields if not isinstance(a.ty, tvm.ir.PrimType)]


def _visit_prim_func(graph, func, buffer_names, call, func_name, symbolic=False) -> None:
    root = func.body.block if isinstance(func.body, s_tir.SBlockRealize) else None
    local_buffers = list(root.alloc_buffers) if root is not None else []
    for block, _ in iter_sblocks(func.body):
        local_buffers.extend(block.alloc_buffers)
    for buf in local_buffers:
        # TVM may give several buffers of one PrimFunc the same name (GELU's "compute"s)
        name, i = f"{call}.{buf.name}", 0
        while name in graph.tensors:
            i += 1
            name = f"{call}.{buf.name}_{i}"
        buffer_names[buf] = name
        graph.add_tensor(TensorInfo(name, tuple(int(d) for d in buf.shape), str(buf.dtype),
                                    "local", symbolic=symbolic))
    added = False
    for block, _ in iter_sblocks(func.body):
        node = _block_node(block, buffer_names, call, func_name, graph)
        if node is not None:
            node.symbolic = symbolic
            graph.add_node(node)
            added = True
    if not added and root is not None and root.writes:
        graph.add_node(_external_node(root, buffer_names, call, func_name, graph))


def _external_node(root, buffer_names, call, func_name, graph) -> Node:
    """An opaque kernel (e.g. an embedded Triton launch) known only by the regions its root block
    declares: one node reading every ``T.reads`` region and writing the ``T.writes`` one."""

    def region_elements(region) -> int:
        n = 1
        for r in region.region:
            n *= int(r.extent)
        return n

    inputs = []
    for region in root.reads:
        tensor = buffer_names[region.source]
        shape = graph.tensors[tensor].shape
        inputs.append(
            AccessMap(
                tensor,
                Dependence.DATA_DEPENDENT,
                (),
                (),
                None,
                None,
                False,
                (),
                tuple(() for _ in shape),
                (),
                shape,
                region_elements(region),
            )
        )
    out = buffer_names[root.writes[0].source]
    info = graph.tensors[out]
    read = sum(m.footprint * dtype_bytes(graph.tensors[m.tensor].dtype) for m in inputs)
    written = region_elements(root.writes[0])
    return Node(
        name=f"{call}/{func_name}",
        call=call,
        func=func_name,
        kind=OpKind.OPAQUE,
        detail="external",
        output=out,
        out_shape=info.shape,
        out_dtype=info.dtype,
        inputs=inputs,
        spatial=(),
        reduction=(),
        flops=0,
        bytes_read=read,
        bytes_written=written * dtype_bytes(info.dtype),
        elements_accessed=sum(m.footprint for m in inputs) + written,
    )


def _block_node(block, buffer_names, call, func_name, graph) -> Node | None:
    store = block.body
    name = f"{call}/{block.name_hint}"
    if not isinstance(store, tirx.BufferStore):
        graph.skipped.append((name, "block body is not a single buffer store"))
        return None
    spatial = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    reduce = [iv for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    analyzer = sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)

    out = buffer_names.get(store.buffer)
    if out is None:
        graph.skipped.append((name, f"writes unknown buffer {store.buffer.name}"))
        return None
    inputs: list[AccessMap] = []
    seen = set()
    for load in buffer_loads(store.value):
        if load.source.same_as(store.buffer):
            continue  # the reduction accumulator
        tensor = buffer_names.get(load.source)
        if tensor is None:
            continue
        key = (tensor, tuple(str(i) for i in load.indices))
        if key in seen:
            continue
        seen.add(key)
        shape = graph.tensors[tensor].shape
        inputs.append(_access(graph, load, tensor, spatial, reduce, analyzer, shape))

    out_info = graph.tensors[out]
    write = _access(graph, store, out, spatial, reduce, analyzer, out_info.shape)
    iterations = 1
    for iv in block.iter_vars:
        iterations *= int(iv.dom.extent)
    per_iter, expensive = count_flops(store.value)
    flops = per_iter * iterations
    # Unique elements per tensor: the largest footprint among its accesses.
    footprints: dict[str, int] = {}
    for m in inputs:
        footprints[m.tensor] = max(footprints.get(m.tensor, 0), m.footprint)
    bytes_read = sum(n * dtype_bytes(graph.tensors[t].dtype) for t, n in footprints.items())
    elements = sum(footprints.values()) + write.footprint
    ratio = flops / max(1, elements)
    value = store.value
    kind, detail = classify(value, inputs, reduce, per_iter, expensive, ratio)
    return Node(
        name=name,
        call=call,
        func=func_name,
        kind=kind,
        detail=detail,
        output=out,
        out_shape=out_info.shape,
        out_dtype=out_info.dtype,
        inputs=inputs,
        spatial=tuple((iv.var.name, int(iv.dom.extent)) for iv in spatial),
        reduction=tuple((iv.var.name, int(iv.dom.extent)) for iv in reduce),
        flops=flops,
        bytes_read=bytes_read,
        bytes_written=write.footprint * dtype_bytes(out_info.dtype),
        elements_accessed=elements,
        block=block,
        tensor_of=buffer_names,
    )


def _access(graph, access, tensor, spatial, reduce, analyzer, shape) -> AccessMap:
    """:func:`analyze_access` of a load or store of a block, found once per build for the
    same statement (a PrimFunc every layer calls) and shape, named ``tensor`` each time."""
    key = (access, tuple(shape))
    found = graph._accesses.get(key)
    if found is None:
        found = analyze_access(tensor, list(access.indices), spatial, reduce, analyzer, shape)
        graph._accesses[key] = found
    return found if found.tensor == tensor else dataclasses.replace(found, tensor=tensor)


def prim_func_nodes(func: tvm.tirx.PrimFunc, name: str = "f", point=None) -> list[Node]:
    """The tensor-graph nodes (one per TIR block) of a single PrimFunc, parameters as globals.

    A PrimFunc with symbolic shapes is read specialized at ``point`` (``{dim name: size}``,
    :mod:`.specialize`; its nodes are ``symbolic``).  A PrimFunc the graph cannot analyse
    (symbolic shapes without a value at ``point``, non-buffer parameters) has none.
    """
    why = _unanalysable(func)
    symbolic = bool(why) and bool(point)
    if symbolic:
        func, why = _at_point(func, point, why)
    if why:
        return []
    graph = TensorDependencyGraph()
    buffer_names = {}
    for i, param in enumerate(func.params):
        pname = f"{name}.arg{i}"
        buffer_names[param] = pname
        graph.add_tensor(
            TensorInfo(pname, tuple(int(d) for d in param.shape), str(param.dtype), "global")
        )
    _visit_prim_func(graph, func, buffer_names, name, name, symbolic)
    return list(graph.nodes.values())


def static_shape(ty) -> tuple[int, ...] | None:
    """The static shape of a Relax tensor type, or None (not a tensor, or symbolic dims)."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return static_dims(ty.shape.values)
