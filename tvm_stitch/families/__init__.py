"""The kernel families MCFuser's pass generates, one folder each, and their registry.

A family's name is its one name everywhere: the value of the ``mcfuser`` pipeline option, the
``family`` of its matches, the prefix of its generated kernels (``stitch_<name>_<digest>``, the
tuning database's keys) and the first word of its log lines.

The contract
------------
A family is a folder of modules, one per layer it takes part in; the shared code finds them by
:meth:`Family.module` and calls only the names below (``tvm_stitch/families/gemm`` is the
fullest example, ``tests/toy_family`` the smallest).

``recognize.py`` (analysis)
    ``PRODUCTS``: the contractions a kernel holds (1, or 2 for two products, the second
    reading the first).  A function named after the family builds a
    :class:`~tvm_stitch.analysis.match.Match` (whose ``family`` is the name) or raises
    :class:`~tvm_stitch.analysis.match.NotRecognizedError`: for one product
    ``(graph, contraction, written, read)``, finalizing the match itself
    (:func:`~tvm_stitch.analysis.match.finalize`); for two ``(graph, frame, composer, c1, c2,
    inner, vmap, region, stop)`` over a frame of axes ``m``, ``n``, ``d`` (and batch axes),
    after ``claim(region, n_var, graph)`` returned the ``inner`` element (None: not this
    family's; two-product families are asked in the registry's order), the driver then calling
    its ``finalize(graph, match)``.  ``describe(match)`` says what a kernel computes, starting
    with the family's name.  Optional: ``zero_empty_rows(region, n_var, graph)`` (two products:
    whether rows with no visible key are zeros), ``regroup(graph, contractions, matches,
    written, read, rejected, weights, fold_norms)`` (one product: after every one-product match
    is found; it gets every family's matches and returns them all, its own regrouped) and
    ``COLLAPSE`` (the frame's axes merged where the accesses allow; default ``("b",)``).
``cost.py`` (cost)
    ``program(workload, tiles, launch, hw)``: one program's work, a
    :class:`~tvm_stitch.cost.model.Program` the shared model prices; optional
    ``infeasible(workload, tiles, launch)``: why no model may price it.
``triton.py`` (code generation)
    ``kernel(match, name)``: the :class:`~tvm_stitch.codegen.kernel_text.KernelSource` of its
    Triton form (its ``family`` is set to the family's name); ``grid(config, match, source)``:
    programs along x, y (, z).  Optional: ``buffers(source, match, consts)`` (buffers a launch
    needs besides the kernel's tensors: a split-K workspace) and ``tma_layout(match)`` (how TMA
    reads its bands' B operands: joining them in one weight tensor), and ``RUNTIME_EXTENTS``
    (the frame's axes whose extent may be a kernel argument, for functions of symbolic shape:
    :mod:`tvm_stitch.codegen.runtime`; a kernel printed for a match whose ``runtime`` names
    them has no form sized by them).
``gluon.py`` (code generation, optional)
    A warp-specialized form: ``ws_legality(match)``, ``ws_descriptors(match)``,
    ``ws_source(match, name)`` and ``ws_launch_options(config)``.
``template.py`` (code generation, optional)
    A hand-written Triton template of the family's computation (``TEMPLATE``, jitted by
    :func:`tvm_stitch.codegen.triton_kernels.kernel`), its legality, parameters and launcher:
    the family's template search (in its ``tune.py``) runs it.
``reference.py`` (code generation)
    ``reference(match, tensors, shapes)``: ``{output tensor: te.Tensor}``, what the kernel
    computes as TE (:func:`~tvm_stitch.codegen.te_reference.reference_func` builds on it).
``tune.py`` (tuning)
    ``space(match)``: the tile search's :class:`~tvm_stitch.tune.kernels.Space` (chain,
    legality, template parameters, accumulators); ``options(match, source, on_device)``: the
    launch options and seeds of a generated kernel's search; ``default_launch(config)``: the
    launch of a candidate before the search refines it; ``LAUNCHES`` and ``SEEDS``: the
    defaults of :func:`~tvm_stitch.tune.kernels.search` (the family's template search).
    Optional: ``SPLITS`` (splits of k, where its kernels split k), ``WHOLE_TILES`` (loops a
    record may leave out: their tile is the whole extent) and ``ws_launch_legality(match,
    config)``.

This module is data only (the package's lowest layer).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util


@dataclasses.dataclass(frozen=True)
class Family:
    """A kernel family.

    Attributes
    ----------
    name : str
        Its one name (see the module's docstring).
    computes : str
        What its kernels compute, in a line.
    package : str
        The package of its folder (default: ``tvm_stitch.families.<name>``).
    """

    name: str
    computes: str
    package: str = ""

    @property
    def folder(self) -> str:
        return self.package or f"{__name__}.{self.name}"

    def module(self, part: str):
        """The family's module ``part`` (see the module's docstring)."""
        return importlib.import_module(f"{self.folder}.{part}")

    def has(self, part: str) -> bool:
        """Whether the family's folder holds the optional module ``part``."""
        return importlib.util.find_spec(f"{self.folder}.{part}") is not None


#: every family, by name: adding one is a folder and a line here.  Two-product families are
#: asked in this order (attention claims softmax between its products; chain the rest).
REGISTRY: dict[str, Family] = {
    f.name: f
    for f in (
        Family("attention", "softmax(g(Q·Kᵀ))·V: scales, masks, K/V shared by query heads"),
        Family("chain", "two products, the second reading the first through casts"),
        Family("gemm", "a product and its epilogue; products sharing A side by side"),
    )
}

#: the built-in families' names, in the registry's order (the ``mcfuser`` option's default)
FAMILIES = tuple(REGISTRY)


def family(name: str) -> Family:
    """The registered family ``name``; ValueError naming the known ones for any other."""
    if name not in REGISTRY:
        raise ValueError(f"unknown kernel family {name!r}; known: {tuple(REGISTRY)}")
    return REGISTRY[name]


def part(name: str, part: str):
    """Module ``part`` of family ``name`` (:meth:`Family.module`)."""
    return family(name).module(part)


def runtime_extents(name: str) -> tuple:
    """The axes of family ``name`` whose sizes its kernels may take at run time (its
    ``triton.RUNTIME_EXTENTS``; none by default)."""
    return getattr(part(name, "triton"), "RUNTIME_EXTENTS", ())


def check(names) -> tuple:
    """``names`` as a tuple of registered families; ValueError naming the unknown ones."""
    if isinstance(names, str):
        raise ValueError(f"kernel families are a tuple of {tuple(REGISTRY)}; got {names!r}")
    unknown = sorted(set(names) - set(REGISTRY))
    if unknown:
        raise ValueError(f"unknown kernel families {unknown}; known: {tuple(REGISTRY)}")
    return tuple(names)
