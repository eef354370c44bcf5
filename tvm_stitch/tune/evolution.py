"""MCFuser's evolutionary search (paper §IV-B, Algorithm 1).

Each round estimates the whole population with the analytical model, measures only the top
``n`` (on the GPU; without a measuring function the model's estimate stands in), stops when the
best measured time changes by less than ``eps`` (relative), and builds the next population by
drawing candidates with weight ``1 / estimate`` and mutating the tile size of one loop each.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from tvm_stitch.explore.tiling import Candidate, SearchSpace


@dataclasses.dataclass(frozen=True)
class SearchConfig:
    """Knobs of Algorithm 1.

    Attributes
    ----------
    population : int
        ``N``: candidates estimated per round.
    top_n : int
        ``n``: candidates measured per round (8 in the paper).
    eps : float
        Relative change of the best time under which the search stops.
    max_rounds : int
        A bound for searches that keep improving a little.
    seed : int
    """

    population: int = 128
    top_n: int = 8
    eps: float = 0.01
    max_rounds: int = 30
    seed: int = 0


@dataclasses.dataclass
class SearchResult:
    """The best candidate, its time, and every (estimate, measurement) pair taken."""

    best: Candidate
    best_time: float
    rounds: int
    pairs: list[tuple[float, float]]
    measured: bool
    times: dict = dataclasses.field(default_factory=dict)  # candidate -> measured (or estimated)

    @property
    def correlation(self) -> float:
        """Pearson correlation of model estimates and measurements (nan when not measured)."""
        pairs = [(x, y) for x, y in self.pairs if math.isfinite(x) and math.isfinite(y)]
        if not self.measured or len(pairs) < 3:
            return math.nan  # candidates that failed to compile or run are left out
        xs, ys = zip(*pairs)
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        cov = sum((x - mx) * (y - my) for x, y in pairs)
        vx = sum((x - mx) ** 2 for x in xs)
        vy = sum((y - my) ** 2 for y in ys)
        return cov / math.sqrt(vx * vy) if vx and vy else math.nan


def evolutionary_search(
    space: SearchSpace,
    model: Callable[[Candidate], float],
    measure: Callable[[Candidate], float] | None = None,
    config: SearchConfig | None = None,
    progress: Callable[[int, float], None] | None = None,
    prepare: Callable[[list], None] | None = None,
) -> SearchResult:
    """Algorithm 1 over ``space``.

    Parameters
    ----------
    space : SearchSpace
        Pruned candidates (rules 1–4).
    model : callable
        Estimated seconds of a candidate.
    measure : callable, optional
        Measured seconds of a candidate on the device; ``None`` searches with the model only.
    config : SearchConfig, optional
    progress : callable, optional
        Called with ``(round, best_time)`` after every round.
    prepare : callable, optional
        Called with each round's candidates about to be measured, before the first is: their
        kernels compiled side by side (:func:`~tvm_stitch.tune.measure.measured_search`).

    Raises
    ------
    ValueError
        If the space has no candidate.
    """
    cfg = config or SearchConfig()
    rng = random.Random(cfg.seed)
    pool = list(space.candidates())
    if not pool:
        raise ValueError("the pruned search space is empty")
    population = rng.sample(pool, min(cfg.population, len(pool)))
    cache: dict[Candidate, float] = {}
    estimates: dict[Candidate, float] = {}
    best, best_time = None, math.inf
    pairs: list[tuple[float, float]] = []
    rounds = 0
    for rounds in range(1, cfg.max_rounds + 1):
        for cand in population:
            if cand not in estimates:
                estimates[cand] = model(cand)
        # ties keep the population's order (a set's would change with string hashing per process)
        ranked = sorted(dict.fromkeys(population), key=estimates.__getitem__)
        top = ranked[: cfg.top_n]
        if measure and prepare is not None:
            prepare([c for c in top if c not in cache])
        for cand in top:
            if cand not in cache:
                cache[cand] = measure(cand) if measure else estimates[cand]
                pairs.append((estimates[cand], cache[cand]))
        top1 = min(top, key=cache.__getitem__)
        top1_time = cache[top1]
        converged = best is not None and abs(top1_time - best_time) < cfg.eps * best_time
        if top1_time < best_time:
            best, best_time = top1, top1_time
        if progress is not None:
            progress(rounds, best_time)
        if converged:
            break
        population = _mutate(space, population, estimates, cfg.population, rng)
    return SearchResult(best, best_time, rounds, pairs, measure is not None, cache)


def _mutate(space, population, estimates, size, rng) -> list[Candidate]:
    """Draw ``size`` candidates weighted by 1/estimate; change one loop's tile in each."""
    weights = [1.0 / max(estimates[c], 1e-12) for c in population]
    out = []
    for parent in rng.choices(population, weights=weights, k=size):
        out.append(_mutate_one(space, parent, rng) or parent)
    return out


def _mutate_one(space, parent: Candidate, rng, tries: int = 8) -> Candidate | None:
    tiles = parent.tile_dict
    for _ in range(tries):
        loop = rng.choice(list(tiles))
        options = [t for t in space.tiles[loop] if t != tiles[loop]]
        if not options:
            continue
        cand = Candidate(parent.expr, tuple({**tiles, loop: rng.choice(options)}.items()))
        if space.admits(cand):
            return cand
    return None
