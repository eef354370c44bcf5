"""What the runtime kernels of a function of symbolic shape are made of, before they are built.

A match of symbolic shape becomes a kernel whose sizes are arguments (:mod:`.runtime`): the
match is recognized again at two sentinel points to find what varies, and at each bucket point
below the representative one (:func:`.runtime.bucket_points`) for the tiles of smaller sizes.
:class:`RuntimePlanner` does that for one Relax function — each point's tensor graph built and
recognized once — and gives each match's :class:`RuntimePlan`: the runtime kernel, and the
tuner's calls for its tiles (``(args, kwargs)`` of
:meth:`~tvm_stitch.tune.policy.KernelTuner.config`), which the FuseMBCI pass hands to the
tuner, ahead or one by one.
"""

from __future__ import annotations

import dataclasses
import logging

from tvm import relax

from tvm_stitch.analysis.recognize import recognize
from tvm_stitch.families import runtime_extents
from tvm_stitch.graph import build_graph

from .kernel_text import UnsupportedKernelError
from .triton_gen import kernel_source

logger = logging.getLogger("tvm_stitch.mcfuser")


@dataclasses.dataclass(frozen=True)
class RuntimePlan:
    """A runtime kernel and the tuner's calls for its tiles.

    Attributes
    ----------
    kernel : RuntimeKernel
        :func:`.runtime.runtime_kernel`'s.
    shapes : dict
        The function's ``(shape, dtype)`` of each tensor the kernel reads and writes.
    values : list
        Their Relax values, inputs then outputs.
    request : tuple
        The tuner's call for the tiles at the function's representative point.
    buckets : list
        ``[(size, request), ...]`` at smaller sizes (:meth:`RuntimePlanner.plan`).
    """

    kernel: object
    shapes: dict
    values: list
    request: tuple
    buckets: list


class RuntimePlanner:
    """The runtime kernels of one Relax function of symbolic dims, planned.

    Parameters
    ----------
    mod : tvm.IRModule
        The module (after legalization, as FuseMBCI sees it).
    name : str
        The function.
    families : tuple of str
        The families recognized.
    fold_norms : bool
        Recognized with normalizations folded through the weights.
    weights : callable
        ``weights()``: the weight tensors bands may be joined over (None: not joined), asked
        when a point is first recognized.
    """

    def __init__(self, mod, name, families, fold_norms, weights):
        self.mod, self.name, self.families = mod, name, families
        self.fold_norms, self.weights = fold_norms, weights
        self.points = {}  # point -> (its tensor graph, the function's matches there)
        self.plans = {}  # id(match) -> (match, its plan)

    def plan(self, graph, match) -> RuntimePlan:
        """The plan of the kernel of ``match`` (of symbolic shape, recognized in ``graph``, the
        function's tensor graph), made once; raises :class:`UnsupportedKernelError` where the
        family's kernel cannot take its extents at run time."""
        known = self.plans.get(id(match))
        if known is None or known[0] is not match:
            known = self.plans[id(match)] = match, self._plan(graph, match)
        return known[1]

    def _plan(self, graph, match) -> RuntimePlan:
        from . import runtime

        axes = runtime_extents(match.family)
        if not axes or match.derived:
            raise UnsupportedKernelError("symbolic extents the family's kernel cannot take "
                                         "at run time")
        points = runtime.sentinel_points(graph.point)
        pair = [self.recognized_at(point, match) for point in points]
        kernel = runtime.runtime_kernel(pair, points, graph.values, axes, at_point=match,
                                        upper=graph.point)
        source = kernel.source
        tensors = [*source.inputs, *source.outputs]
        shapes, values = {}, []
        for t in tensors:
            value = graph.values.get(t)
            ty = getattr(value, "ty", None)
            if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
                raise UnsupportedKernelError(f"{t} is not a tensor of the function")
            shapes[t] = (tuple(ty.shape.values), str(ty.dtype))
            values.append(value)
        # the tiles: searched (or modelled) at the representative point, on the same kernel
        at_point = dataclasses.replace(match, runtime=kernel.match.runtime)
        point_shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype) for t in tensors}
        request = ((at_point, kernel_source(at_point), point_shapes, {}),
                   {"like": static_like(match)})
        return RuntimePlan(kernel, shapes, values, request, self._buckets(match, kernel))

    def recognized_at(self, point, match, graph=False):
        """``match`` recognized anew with the function's symbolic dims at ``point`` (and the
        tensor graph there, with ``graph``)."""
        key = tuple(sorted(point.items()))
        if key not in self.points:
            at = build_graph(self.mod, self.name, legalize=False, point=point)
            self.points[key] = at, recognize(
                at, self.families, fold_norms=self.fold_norms, weights=self.weights(),
                runtime=True).matches
        at, matches = self.points[key]
        for other in matches:
            if sorted(other.covered) == sorted(match.covered):
                return (other, at) if graph else other
        raise UnsupportedKernelError(f"not recognized alike with the dims at {point}")

    def _buckets(self, match, kernel) -> list:
        """``[(size, request), ...]``: the runtime kernel at each smaller size of the
        function's ranges (:func:`.runtime.bucket_points`) where the match is recognized alike:
        the size there (rows, or what the family's kernel is sized by) and the tuner's call for
        its tiles there, a short search kept in the tuning database under that point's
        extents."""
        from tvm_stitch.graph.specialize import value_at, var_ranges

        from . import runtime

        size = runtime.kernel_size(kernel.match.frame.extents, kernel.match.runtime)
        found = []
        for point in runtime.bucket_points(var_ranges(self.mod[self.name])):
            try:
                other, graph = self.recognized_at(point, match, graph=True)
                at = dataclasses.replace(other, runtime=kernel.match.runtime)
                source = kernel_source(at)
                shapes = {t: (graph.tensors[t].shape, graph.tensors[t].dtype)
                          for t in (*source.inputs, *source.outputs)}
            except Exception as err:  # noqa: BLE001 - any: the point gets no tiles of its own
                logger.info("%s: no tiles of its own at %s: %s: %s", match.describe(), point,
                            type(err).__name__, err)
                continue
            request = ((at, source, shapes, {}), {"like": static_like(other), "quick": True})
            found.append((value_at(size, point), request))
        return found


def static_like(match):
    """``(match, source)`` of the static kernel of ``match`` (recognized at a point): its
    tuning record's timings are the runtime kernel's at that point (the tuner's ``like``), or
    None where it prints no kernel."""
    try:
        return match, kernel_source(match)
    except Exception as err:  # noqa: BLE001 - any: no static kernel's timings to reuse
        logger.debug("%s: no static kernel at the point: %s", match.describe(), err)
        return None
