"""MCFuser's search space for chains of compute-intensive ops (paper §III).

A chain is described by its cross-tile loops (``m, n, k, h`` for ``E = (A·B)·D``), its
computation blocks (which loops each one uses, which are its reductions) and its tensors (which
loops index them).  A *tiling expression* orders the loops: **deep** tilings nest every loop (all
permutations), **flat** tilings nest the loops shared by every block and run the others in
sequence inside them (``mn(k,h)``).  A *candidate* is an expression plus a tile size per loop.

Statements (load ``L``, compute ``C``, store ``S``) are placed by the DAG analysis of §III-B: a
statement sits in the innermost enclosing loop that actually indexes its tensor; a loop whose
extent is 1 (tile = dimension) is dead and never holds a statement, so loads hoist out of it.
:func:`placements` gives, for each statement, its trip count and its tile footprint — what the
analytical model (``tvm_stitch.cost.mcfuser``) and the code generator consume.

Pruning (§III-C): rule 1 deduplicates expressions whose per-block sub-expression is the same,
rule 2 drops expressions that keep partial tiles of an intermediate tensor across a reduction,
rule 3 drops tile sizes that need padding, rule 4 drops candidates whose shared memory estimate
exceeds 1.2 × the per-block limit.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator

TILE_QUANTUM = 16  # tensor cores need 16x16x16 tiles: tile sizes are multiples of 16
SMEM_SLACK = 1.2  # rule 4 keeps candidates up to 1.2x the limit: the estimate errs


@dataclasses.dataclass(frozen=True)
class Block:
    """One computation block: ``out[spatial] = Σ_reduce f(inputs)``."""

    out: str
    inputs: tuple[str, ...]
    spatial: tuple[str, ...]
    reduce: tuple[str, ...]

    @property
    def loops(self) -> tuple[str, ...]:
        return self.spatial + self.reduce


@dataclasses.dataclass(frozen=True)
class ChainSpec:
    """A chain of matrix products: loops, blocks in order, and how tensors are indexed.

    Attributes
    ----------
    extents : dict of str to int
        Dimension of each cross-tile loop.
    blocks : tuple of Block
        In execution order; the last block's output is the chain's output.
    index : dict of str to tuple of str
        The loops indexing each tensor, in its dimension order.
    batch : int
        Independent instances (batch × heads), bound to a grid axis of their own.
    dtype_bytes : int
        Bytes per element of inputs and output.
    """

    extents: dict[str, int]
    blocks: tuple[Block, ...]
    index: dict[str, tuple[str, ...]]
    batch: int = 1
    dtype_bytes: int = 2

    @property
    def output(self) -> str:
        return self.blocks[-1].out

    @property
    def intermediates(self) -> tuple[str, ...]:
        return tuple(b.out for b in self.blocks[:-1])

    @property
    def loops(self) -> tuple[str, ...]:
        return tuple(self.extents)

    @property
    def shared_loops(self) -> tuple[str, ...]:
        """Loops every block uses (flat tilings nest these)."""
        return tuple(x for x in self.loops if all(x in b.loops for b in self.blocks))

    @staticmethod
    def gemm(m: int, n: int, k: int, dtype_bytes: int = 2) -> ChainSpec:
        """A single product ``C = A·B`` (A is (M, K), B (K, N)): a chain of length one."""
        return ChainSpec(
            extents={"m": m, "n": n, "k": k},
            blocks=(Block("C", ("A", "B"), ("m", "n"), ("k",)),),
            index={"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n")},
            dtype_bytes=dtype_bytes,
        )

    @staticmethod
    def gemm_chain(batch: int, m: int, n: int, k: int, h: int, dtype_bytes: int = 2) -> ChainSpec:
        """``C = A·B; E = C·D`` with A (M, K), B (K, N), D (N, H): MCFuser's Table II."""
        return ChainSpec(
            extents={"m": m, "n": n, "k": k, "h": h},
            blocks=(
                Block("C", ("A", "B"), ("m", "n"), ("k",)),
                Block("E", ("C", "D"), ("m", "h"), ("n",)),
            ),
            index={
                "A": ("m", "k"),
                "B": ("k", "n"),
                "C": ("m", "n"),
                "D": ("n", "h"),
                "E": ("m", "h"),
            },
            batch=batch,
            dtype_bytes=dtype_bytes,
        )


@dataclasses.dataclass(frozen=True)
class TilingExpr:
    """A loop structure: ``outer`` loops nested in order, then ``branches`` run in sequence.

    Deep tilings have no branches (``mhnk``); flat ones do (``mn(k,h)``).
    """

    outer: tuple[str, ...]
    branches: tuple[tuple[str, ...], ...] = ()

    def __str__(self) -> str:
        inner = ",".join("".join(b) for b in self.branches)
        return "".join(self.outer) + (f"({inner})" if self.branches else "")

    @property
    def is_flat(self) -> bool:
        return bool(self.branches)

    def path(self, loop: str) -> tuple[str, ...]:
        """The loops enclosing ``loop``, outermost first, ``loop`` included."""
        if loop in self.outer:
            return self.outer[: self.outer.index(loop) + 1]
        for branch in self.branches:
            if loop in branch:
                return self.outer + branch[: branch.index(loop) + 1]
        raise KeyError(loop)

    def block_path(self, block: Block) -> tuple[str, ...]:
        """Loops enclosing a block's computation: the path of its innermost loop."""
        paths = [self.path(x) for x in block.loops]
        return max(paths, key=len)


def tiling_expressions(spec: ChainSpec) -> list[TilingExpr]:
    """All deep tilings (loop permutations) and flat tilings of ``spec`` (paper §III-A)."""
    deep = [TilingExpr(p) for p in itertools.permutations(spec.loops)]
    shared = spec.shared_loops
    private = [tuple(x for x in b.loops if x not in shared) for b in spec.blocks]
    flat = []
    if all(len(p) == 1 for p in private) and len(private) > 1:
        flat = [TilingExpr(p, tuple(private)) for p in itertools.permutations(shared)]
    return deep + flat


# -- statement placement (§III-B) ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Statement:
    """A placed load, compute or store statement.

    Attributes
    ----------
    kind : {"load", "compute", "store"}
    tensor : str
        Tensor loaded or stored, or the output of the computed block.
    scope : tuple of str
        Enclosing loops (outermost first) that are live (extent > 1).
    trips : int
        How many times it runs per grid instance: product of its enclosing loops' trip counts.
    tile : dict of str to int
        Elements covered along each loop the tensor is indexed by (a full dimension when the
        statement sits outside that loop).
    """

    kind: str
    tensor: str
    scope: tuple[str, ...]
    trips: int
    tile: dict[str, int]

    @property
    def elements(self) -> int:
        return math.prod(self.tile.values()) if self.tile else 1


def trip_counts(spec: ChainSpec, tiles: dict[str, int]) -> dict[str, int]:
    """Iterations of each cross-tile loop: ``ceil(dimension / tile)``."""
    return {x: math.ceil(spec.extents[x] / tiles[x]) for x in spec.loops}


def placements(spec: ChainSpec, expr: TilingExpr, tiles: dict[str, int]) -> list[Statement]:
    """Place every statement of ``spec`` under ``expr`` with ``tiles`` (paper §III-B).

    A statement about tensor ``X`` of block ``b`` sits in the innermost loop of ``b``'s path that
    indexes ``X`` and has more than one trip; a store must also sit outside the block's reduction
    loops (the result is complete only after them).  Loops on the path below that position are
    not enclosing it: the statement covers their whole range (its tile spans the dimension).
    """
    trips = trip_counts(spec, tiles)
    out = []
    for block in spec.blocks:
        path = expr.block_path(block)
        for tensor in block.inputs:
            if tensor not in spec.intermediates:
                out.append(_place(spec, "load", tensor, path, trips, tiles))
        compute_scope = [x for x in path if trips[x] > 1 and x in block.loops]
        out.append(_statement(spec, "compute", block.out, path, compute_scope, trips, tiles))
        if block.out == spec.output:
            reduce_pos = [path.index(r) for r in block.reduce if r in path and trips[r] > 1]
            limit = min(reduce_pos) if reduce_pos else len(path)
            out.append(_place(spec, "store", block.out, path[:limit], trips, tiles))
    return out


def _place(spec, kind, tensor, path, trips, tiles) -> Statement:
    live = [x for x in path if trips[x] > 1 and x in spec.index[tensor]]
    return _statement(spec, kind, tensor, path, live, trips, tiles)


def _statement(spec, kind, tensor, path, live, trips, tiles) -> Statement:
    depth = path.index(live[-1]) + 1 if live else 0
    scope = tuple(x for x in path[:depth] if trips[x] > 1)
    if kind == "compute":
        block = next(b for b in spec.blocks if b.out == tensor)
        tile = {x: tiles[x] for x in block.loops}
    else:
        tile = {x: (tiles[x] if x in path[:depth] else spec.extents[x]) for x in spec.index[tensor]}
    return Statement(kind, tensor, scope, math.prod(trips[x] for x in scope), tile)


def grid_loops(spec: ChainSpec, expr: TilingExpr) -> tuple[str, ...]:
    """Loops bound to ``blockIdx`` (rule 1 binds spatial loops first).

    A loop spatial in every block (``m``) is always bound: no block ever reduces over it, so
    binding it never repeats work, wherever the expression nests it.  A loop spatial only in the
    output block (``h``) is bound when it encloses the output's reduction loops (then each block
    runs the reductions for its own tile anyway); inside a reduction it stays a loop.
    """
    last = spec.blocks[-1]
    bound = []
    for x in last.spatial:
        everywhere = all(x in b.spatial for b in spec.blocks)
        if everywhere or all(r not in expr.path(x) for r in last.reduce):
            bound.append(x)
    return tuple(bound)


def sub_expression(spec: ChainSpec, expr: TilingExpr) -> str:
    """What one thread block runs: ``expr`` without its ``blockIdx`` loops (rule 1's key)."""
    bound = set(grid_loops(spec, expr))
    outer = tuple(x for x in expr.outer if x not in bound)
    branches = tuple(tuple(x for x in b if x not in bound) for b in expr.branches)
    return str(TilingExpr(outer, tuple(b for b in branches if b)))


# -- pruning (§III-C) -------------------------------------------------------------------------
def rule1_dedup(spec: ChainSpec, exprs: list[TilingExpr]) -> list[TilingExpr]:
    """Keep one expression per per-block sub-expression."""
    seen: dict[str, TilingExpr] = {}
    for e in exprs:
        seen.setdefault(sub_expression(spec, e), e)
    return list(seen.values())


def rule2_intermediate(spec: ChainSpec, exprs: list[TilingExpr]) -> list[TilingExpr]:
    """Drop expressions where a block producing an intermediate has a reduction loop enclosing
    one of its spatial loops: partial tiles of the intermediate would pile up in shared memory."""

    def ok(e: TilingExpr) -> bool:
        for block in spec.blocks[:-1]:
            for r in block.reduce:
                if any(r in e.path(s)[:-1] for s in block.spatial):
                    return False
        return True

    return [e for e in exprs if ok(e)]


def tile_options(extent: int) -> list[int]:
    """Multiples of 16 up to the dimension (rounded up to a multiple of 16)."""
    top = math.ceil(extent / TILE_QUANTUM) * TILE_QUANTUM
    return list(range(TILE_QUANTUM, top + 1, TILE_QUANTUM))


def rule3_padding(extent: int, tile: int) -> bool:
    """Keep a tile size unless it pads too much: none for power-of-two dimensions, < 5% else."""
    padded = math.ceil(extent / tile) * tile
    if extent & (extent - 1) == 0:
        return padded == extent
    return (padded - extent) / extent < 0.05


def _rule3(extent: int, tiles: list[int]) -> list[int]:
    """Rule 3 over one loop's tile sizes, keeping every power of two among them.

    Powers of two are the only tiles Triton's code generator has (masks handle the ragged
    edge), and the padding rule alone leaves a ragged extent only its smallest ones: 400 rows
    kept 16 and 32, which no warpgroup's ``wgmma`` takes, and 16-row attention tiles. So they
    all stay (up to the extent rounded up to 16: :func:`tile_options`), and the cost model,
    which counts the padded tiles' work, and the measurement weigh their padding.  When every
    size pads too much (an extent such as 19, 40 or 134), the sizes with the least padding
    are kept too (48 covers a head dimension of 40 in one tile)."""
    kept = [t for t in tiles if rule3_padding(extent, t)]
    if not kept and tiles:
        pad = {t: math.ceil(extent / t) * t - extent for t in tiles}
        kept = [t for t in tiles if pad[t] == min(pad.values())]
    return [t for t in tiles if t in kept or t & (t - 1) == 0]


def smem_estimate(spec: ChainSpec, expr: TilingExpr, tiles: dict[str, int]) -> int:
    """Equation (1): shared memory of a candidate, in bytes.

    Every loaded tile is staged in shared memory (a hoisted load keeps its whole footprint), and
    so is every intermediate tile (the consumer reads it from there); accumulators of the output
    live in registers.
    """
    key = (tuple(spec.extents.items()), spec.blocks, tuple(spec.index.items()),
           spec.dtype_bytes, expr, tuple(tiles.items()))
    if key not in _SMEM:
        if len(_SMEM) > 1 << 18:  # a bound on the memory: a compile's spaces fit many times
            _SMEM.clear()
        _SMEM[key] = _smem_estimate(spec, expr, tiles)
    return _SMEM[key]


#: :func:`smem_estimate` by spec, expression and tiles: every search over a kernel (each
#: bucket point, each record checked) prices the same candidates again
_SMEM: dict = {}


def _smem_estimate(spec: ChainSpec, expr: TilingExpr, tiles: dict[str, int]) -> int:
    total = 0
    for st in placements(spec, expr, tiles):
        if st.kind == "load":
            total += st.elements * spec.dtype_bytes
    for block in spec.blocks[:-1]:
        total += math.prod(tiles[x] for x in block.spatial) * spec.dtype_bytes
    return total


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A tiling expression and a tile size per loop."""

    expr: TilingExpr
    tiles: tuple[tuple[str, int], ...]

    @property
    def tile_dict(self) -> dict[str, int]:
        return dict(self.tiles)

    def __str__(self) -> str:
        return f"{self.expr}[" + ",".join(f"{k}={v}" for k, v in self.tiles) + "]"


@dataclasses.dataclass
class SearchSpace:
    """The pruned search space and how many candidates each rule left (the paper's Fig. 7)."""

    spec: ChainSpec
    exprs: list[TilingExpr]
    tiles: dict[str, list[int]]
    counts: dict[str, int]
    smem_limit: int
    legal: Callable[[Candidate], str | None] | None = None
    #: the admitted candidates, in order, once enumerated (a search, its seeds and the counts
    #: read them several times)
    _admitted: list | None = dataclasses.field(default=None, repr=False, compare=False)

    def fits(self, cand: Candidate) -> bool:
        """Rule 4: the candidate's shared memory fits."""
        return smem_estimate(self.spec, cand.expr, cand.tile_dict) <= SMEM_SLACK * self.smem_limit

    def admits(self, cand: Candidate) -> bool:
        """Rule 4, and the code generator's legality check when one is given."""
        return self.fits(cand) and (self.legal is None or self.legal(cand) is None)

    def find(self, tiles: dict[str, int]) -> Candidate | None:
        """An admitted candidate with tile sizes ``tiles`` (one per loop, of the sizes rule 3
        left), under the first expression that admits it; None where there is none."""
        if set(tiles) != set(self.tiles) or any(tiles[x] not in self.tiles[x] for x in tiles):
            return None
        for expr in self.exprs:
            cand = Candidate(expr, tuple((x, tiles[x]) for x in self.tiles))
            if self.admits(cand):
                return cand
        return None

    def candidates(self) -> Iterator[Candidate]:
        """Admitted candidates, in a fixed order (enumerated once)."""
        if self._admitted is None:
            self._admitted = [c for c in self.unpruned() if self.admits(c)]
        return iter(self._admitted)

    def unpruned(self) -> Iterator[Candidate]:
        """Every candidate rules 1-3 leave, in a fixed order."""
        names = list(self.tiles)
        for expr in self.exprs:
            for values in itertools.product(*(self.tiles[x] for x in names)):
                yield Candidate(expr, tuple(zip(names, values)))


def build_search_space(
    spec: ChainSpec, smem_limit: int, legal: Callable[[Candidate], str | None] | None = None,
    count: bool = True,
) -> SearchSpace:
    """Enumerate expressions and tile sizes, apply rules 1–4, count what each rule leaves.

    Parameters
    ----------
    spec : ChainSpec
    smem_limit : int
        Shared memory a block may use (``HardwareModel.smem_per_block``).
    legal : callable, optional
        The code generator's legality check (returns why a candidate cannot be generated, or
        None); applied after rule 4 and counted as ``legal``.
    count : bool
        Count the candidates rule 4 and ``legal`` admit (every candidate is checked); False
        leaves ``rule4`` and ``legal`` out of ``counts`` (a space only asked to
        :meth:`~SearchSpace.find` one candidate).
    """
    exprs = tiling_expressions(spec)
    options = {x: tile_options(spec.extents[x]) for x in spec.loops}
    n_tiles = math.prod(len(v) for v in options.values())
    counts = {"expressions": len(exprs), "all": len(exprs) * n_tiles}
    exprs = rule1_dedup(spec, exprs)
    counts["rule1_expressions"] = len(exprs)
    exprs = rule2_intermediate(spec, exprs)
    counts["rule2_expressions"] = len(exprs)
    counts["rule2"] = len(exprs) * n_tiles
    options = {x: _rule3(spec.extents[x], v) for x, v in options.items()}
    counts["rule3"] = len(exprs) * math.prod(len(v) for v in options.values())
    space = SearchSpace(spec, exprs, options, counts, smem_limit, legal)
    if count:  # one enumeration: the counts and the admitted candidates
        fitting = [c for c in space.unpruned() if space.fits(c)]
        counts["rule4"] = len(fitting)
        space._admitted = [c for c in fitting if legal is None or legal(c) is None]
        if legal is not None:
            counts["legal"] = len(space._admitted)
    return space
