"""The cost model that ranks generated kernels' tiles and launches: MCFuser's analytical model
recalibrated for Hopper, times a learned correction.

:func:`analytical` prices one candidate — tile sizes plus launch options (warps, pipeline stages,
persistent or not) — from :class:`~tvm_stitch.hardware.HardwareModel` facts alone.  Each family
describes one program of its kernel (its ``cost.program``: a :class:`Program` of iterations,
flops, bytes, registers, shared memory, and whether it loads by TMA, runs persistent, overlaps
a softmax or an epilogue; e.g. ``families/attention/cost.py``); the shared model prices:

* per main-loop iteration of a program, the larger of its tensor-core time (a warpgroup's wgmma
  takes 64 rows; fewer rows per warpgroup leave the rest idle), the time to bring its operand
  tiles from L2 (the SM's share of L2 bandwidth), its exponentials (the SFUs) and the memory
  latency its ``stages - 1`` loads in flight cannot hide;
* programs resident on an SM at once (shared memory and registers permitting) share its tensor
  cores, SFUs and bandwidth but overlap their latencies; programs run in waves over the SMs
  (wave quantization); a persistent kernel pays its pipeline fill once per SM, not per tile;
* tiles brought in by the TMA unit stream from L2 faster per SM than the warps' own loads;
  descriptors made on the device cost each program their writes and fences;
* a split-K launch runs ``SPLIT_K`` programs per tile over slices of k, each storing its partial
  tile and counting itself in, the last adding them up;
* accumulators beyond the registers a thread has spill to local memory: a large penalty;
* two consumer warpgroups taking turns (a warp-specialized attention) hide each one's softmax
  behind the other's products: per iteration the larger of the two, not their sum;
* the whole kernel moves at least its unique bytes through DRAM, and pays one launch.

:class:`CostModel` multiplies that by a correction learned from every measurement the tuning
database holds (an xgboost regressor of ``log(measured / analytical)`` on the model's terms and
the candidate's knobs), refit as measurements arrive.  Without xgboost, or with too few
measurements, the analytical model ranks alone.  A candidate that cannot run at all
(:func:`infeasible`) is priced infinite before any model looks at it; measurements whose terms
are not finite are left out of the fit, and a correction that fails to fit or predict is
dropped with a warning: the analytical model ranks alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np

from tvm_stitch.errors import error_line
from tvm_stitch.hardware import HardwareModel

logger = logging.getLogger("tvm_stitch.cost")

WGMMA_ROWS = 64  # rows one warpgroup's wgmma instruction takes
BASE_REGISTERS = 48  # registers a GEMM thread needs besides its accumulators (addresses, loop)
MIN_FIT = 40  # measurements below which no correction is learned


@dataclasses.dataclass(frozen=True)
class Workload:
    """What the model needs to know about a kernel besides its tiles.

    Attributes
    ----------
    family : str
        A registered family (:mod:`tvm_stitch.families`): its ``cost.program`` describes a
        program.
    extents : dict
        Loop extents: ``m, n, k`` for a GEMM (``n`` summed over merged products), ``m, n, k, h``
        for attention and chains (``k`` the head dim of Q·Kᵀ, ``h`` of P·V).
    batch : int
        Independent instances (batch × heads for attention).
    dtype_bytes : int
    accumulators : int
        Products sharing the A operand (two for gate × up).
    persistent : bool
        The kernel has the persistent formulation (its launch may choose it).
    row_elements : int
        Elements of a row its row statistics read per row (a folded normalization: the first
        phase of its two-phase reduction, e.g. 2 × 768 for a LayerNorm's mean and variance).
    """

    family: str
    extents: dict
    batch: int = 1
    dtype_bytes: int = 2
    accumulators: int = 1
    persistent: bool = False
    row_elements: int = 0

    @staticmethod
    def from_dict(d: dict) -> Workload:
        """From the ``workload`` entry of a tuning record."""
        return Workload(
            d["family"],
            dict(d["extents"]),
            int(d.get("batch", 1)),
            int(d.get("dtype_bytes", 2)),
            int(d.get("accumulators", 1)),
            bool(d.get("persistent", False)),
            int(d.get("row_elements", 0)),
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def cdiv(a, b) -> int:
    """``ceil(a / b)`` of integers."""
    return -(-int(a) // int(b))



@dataclasses.dataclass(frozen=True)
class Program:
    """One program of a kernel, as its family's ``cost.program`` describes it (bytes, flops
    and registers per program or main-loop iteration; the shared model prices the rest).

    Attributes
    ----------
    warps : int
        Warps that compute (a warp-specialized form's loading warp does not).
    bm, bn : int
        Rows and columns of its output tile.
    programs, iters : int
        Programs of the launch (split-K ones included) and main-loop iterations of each.
    flops, loaded, sfu : float
        Per iteration: tensor-core flops, bytes brought in, seconds of exponentials.
    registers : float
        Per thread.
    smem_fixed : float
        Shared memory besides the ring's stages (``stages × loaded``).
    unique, stored : float
        Bytes the whole kernel must move through DRAM; bytes a program's epilogue stores.
    persistent : bool
        One program per SM over several tiles.
    split : int
        Programs per output tile (split-K).
    tma : bool
        Its tiles come in by the TMA unit (faster per SM than the warps' own loads).
    busy_with_load : bool
        A ring slot is busy for a load's latency and its transfer (GEMMs: few stages bound
        the loop even where L2 keeps up); else for the latency alone.
    overlapped : bool
        Two consumer warpgroups take turns: one's softmax (``sfu``) runs during the other's
        products; without, a softmax between the products does not overlap them.
    descriptors : int
        Tensor descriptors each program makes on the device before its first load.
    epilogue_overlapped : bool
        An epilogue partition runs a tile's epilogue during the next tile's products.
    """

    warps: int
    bm: int
    bn: int
    programs: int
    iters: int
    flops: float
    loaded: float
    sfu: float
    registers: float
    smem_fixed: float
    unique: float
    stored: float
    persistent: bool = False
    split: int = 1
    tma: bool = False
    busy_with_load: bool = False
    overlapped: bool = False
    descriptors: int = 0
    epilogue_overlapped: bool = False


def pair_program(w: Workload, tiles: dict, launch: dict, sfu: float, warps: int) -> Program:
    """A flash-style program of two products (attention, chains): one per (instance, row
    tile), a loop over the first product's column tiles (``k`` the head dim of the first
    product, ``h`` of the second), ``sfu`` seconds of exponentials per iteration."""
    ext, b = w.extents, w.dtype_bytes
    bm, bn = tiles["m"], tiles["n"]
    dk, dh = ext["k"], ext["h"]
    threads = 32 * warps
    loaded = bn * (dk + dh) * b
    # the output accumulator, the logits tile and its half-precision copy
    registers = (bm * dh + 1.5 * bm * bn) / threads + BASE_REGISTERS
    if b >= 4:  # FMA products hold Q and K (then V) in registers
        registers += (bm * dk + bn * max(dk, dh)) / threads
    return Program(
        warps=warps, bm=bm, bn=bn,
        programs=w.batch * cdiv(ext["m"], bm),
        iters=cdiv(ext["n"], bn),
        flops=2 * bm * bn * (dk + dh),
        loaded=loaded,
        sfu=sfu,
        registers=registers,
        smem_fixed=bm * dk * b,
        unique=w.batch * (ext["m"] * dk + ext["n"] * (dk + dh) + ext["m"] * dh) * b,
        stored=bm * dh * b,
        persistent=bool(launch.get("PERSISTENT", False)) and w.persistent,
    )


def _family(w: Workload):
    from tvm_stitch.families import part  # the registry: data only

    return part(w.family, "cost")


def infeasible(w: Workload, tiles: dict, launch: dict) -> str | None:
    """Why ``tiles`` cannot be launched with ``launch`` at all, or None: what no model may
    price (the family's ``infeasible``, e.g. a warp-specialized attention of other than its
    128 query rows)."""
    check = getattr(_family(w), "infeasible", None)
    return check(w, tiles, launch) if check else None


def terms(w: Workload, tiles: dict, launch: dict, hw: HardwareModel) -> dict:
    """The analytical model's terms for one candidate (seconds unless named otherwise);
    infinite times for an :func:`infeasible` one."""
    if infeasible(w, tiles, launch):
        return {**_INFEASIBLE, "time": math.inf}
    p = _family(w).program(w, tiles, launch, hw)
    stages = max(int(launch.get("num_stages", 3)), 1)
    persistent, split, bm, bn = p.persistent, p.split, p.bm, p.bn
    b = w.dtype_bytes
    # float32 products are IEEE float32 (``DOT_PREC``): FMAs on the CUDA cores, no wgmma
    ieee = b >= 4
    flops_sm = (hw.peak_flops_fp32 if ieee else hw.peak_flops_fp16) / hw.num_sms
    latency = hw.mem_latency_cycles / hw.clock_hz
    groups = max(p.warps // 4, 1)
    row_use = 1.0 if ieee else min(1.0, bm / groups / WGMMA_ROWS)
    threads = 32 * p.warps
    programs, iters, flops, loaded, sfu = p.programs, p.iters, p.flops, p.loaded, p.sfu
    registers, unique, stored = p.registers, p.unique, p.stored
    ws = p.overlapped
    # a kernel whose stages do not fit in shared memory is built with fewer (the pass retries)
    fixed = p.smem_fixed
    stages = max(1, min(stages, (hw.smem_per_block - fixed) // max(loaded, 1)))
    smem = fixed + stages * loaded
    spill = max(0.0, registers - hw.max_registers_per_thread)
    by_smem = hw.smem_per_sm // max(smem, 1)
    by_regs = hw.registers_per_sm // (threads * min(registers, hw.max_registers_per_thread))
    resident = int(max(1, min(by_smem, by_regs, hw.max_threads_per_sm // threads)))
    resident = min(resident, cdiv(programs, hw.num_sms))
    comp = flops / (flops_sm * row_use)
    # L2 bandwidth of an SM: its port, or its share of the whole when every SM pulls
    active = min(programs, hw.num_sms)
    # the TMA unit fills shared memory faster than the warps' own loads
    port = hw.sm_l2_tma_bytes_per_cycle if p.tma else hw.sm_l2_bytes_per_cycle
    l2_sm = min(port * hw.clock_hz, hw.mem_bandwidth * hw.l2_bandwidth_ratio / active)
    load = loaded / l2_sm
    # a folded normalization's statistics: its rows read once more per program, before the
    # product (the loads wait for each other: latency per step of the statistics' loop)
    stats = 0.0
    if w.row_elements:
        stats = bm * w.row_elements * b / l2_sm + cdiv(w.row_elements, 64) * latency / 2
    epilogue = stored / l2_sm + stats
    if split > 1:
        # split-K: every split stores its float32 partial tile and counts itself in (an atomic
        # round trip); the last reads all the partials back before the epilogue
        epilogue += (1 + split) * bm * bn * w.accumulators * 4 / l2_sm + 2 * latency
    # the ring's stages - 1 loads in flight, each slot busy for a load's latency (and, where
    # the family says so, its transfer: Little's law)
    busy = latency + load if p.busy_with_load else latency
    hidden = busy / max(stages - 1, 1)
    overhead = hw.loop_overhead_cycles / hw.clock_hz
    # resident programs share the SM's throughput and overlap their latencies
    t_iter = max(resident * comp, resident * load, resident * sfu, hidden) + overhead
    if sfu and not ws:  # the softmax sits between the two products: one program's steps do
        # not overlap, and resident programs contend for the same issue slots
        t_iter = max(resident * (comp + sfu), resident * load, hidden) + overhead
    elif ws:  # each warpgroup's softmax runs during the other's products: the tensor cores
        # or the SM's arithmetic, whichever is busier (the overlap's bound; measured 15-20%
        # above it at 4x16x512 on the H100)
        t_iter = max(comp, sfu, load, hidden) + overhead
    if stages == 1:  # nothing in flight: every load's latency and time precede its product
        t_iter = resident * (comp + load + sfu) + latency + overhead
    spill_factor = 1.0 + spill / 8.0
    fill = latency * 2  # the pipeline's first loads and the last tile's store
    if p.descriptors:  # tensor descriptors made on the device: each program writes them to
        # global memory and fences them before the first load
        fill += p.descriptors * latency
    slots = hw.num_sms * resident
    waves = cdiv(programs, slots)
    per_program = iters * t_iter * spill_factor + resident * epilogue
    if persistent:
        tiles_per_sm = cdiv(programs, hw.num_sms)
        step = t_iter if resident == 1 else max(comp, load, sfu, hidden) + overhead
        # an epilogue partition leaves only the last tile's epilogue exposed
        exposed = epilogue / tiles_per_sm if p.epilogue_overlapped else epilogue
        main = tiles_per_sm * (iters * step * spill_factor + exposed)
        main += fill
    else:
        main = waves * (per_program + fill)
    dram = unique / hw.mem_bandwidth
    return {
        "time": max(main, dram) + hw.launch_overhead,
        "main": main,
        "dram": dram,
        "comp": comp,
        "load": load,
        "sfu": sfu,
        "hidden": hidden,
        "programs": programs,
        "waves": waves,
        "resident": resident,
        "iters": iters,
        "registers": registers,
        "spill": spill,
        "row_use": row_use,
        "tail": programs / slots - math.floor(programs / slots),
        "split": split,
    }


_INFEASIBLE = {k: math.inf for k in ("main", "dram", "comp", "load", "sfu", "hidden")} | {
    "programs": 1, "waves": 1, "resident": 1, "iters": 1, "registers": 0.0, "spill": 0.0,
    "row_use": 1.0, "tail": 0.0, "split": 1}


def analytical(w: Workload, tiles: dict, launch: dict, hw: HardwareModel) -> float:
    """Seconds the analytical model predicts for ``tiles`` launched with ``launch``."""
    return terms(w, tiles, launch, hw)["time"]


_KNOBS = ("m", "n", "k")
_TERMS = ("main", "dram", "comp", "load", "sfu", "hidden")


def features(w: Workload, tiles: dict, launch: dict, t: dict) -> list[float]:
    """The learned correction's inputs: the analytical terms ``t`` (:func:`terms`; log), the
    candidate's knobs and the kernel's shape — the same for every family (absent knobs are 0)."""
    ext = w.extents
    return [
        *(math.log(t[k] + 1e-9) for k in _TERMS),
        *(math.log2(tiles.get(k, 1)) for k in _KNOBS),
        float(launch.get("num_warps", 4)),
        float(launch.get("num_stages", 3)),
        float(bool(launch.get("PERSISTENT", False)) and w.persistent),
        float(bool(launch.get("WS"))),  # a warp-specialized Gluon form
        math.log2(t["split"]),
        math.log2(t["programs"]),
        float(t["waves"]),
        float(t["resident"]),
        float(t["iters"]),
        t["registers"],
        t["spill"],
        t["row_use"],
        t["tail"],
        float(_family_index(w.family)),
        float(w.accumulators),
        *(math.log2(ext.get(k, 1)) for k in ("m", "n", "k", "h")),
        math.log2(w.batch),
    ]


def _family_index(name: str) -> int:
    """The family's place in the registry (the learned correction's family feature)."""
    from tvm_stitch.families import REGISTRY  # the registry: data only

    return list(REGISTRY).index(name) if name in REGISTRY else -1


class CostModel:
    """Analytical model times a correction learned from measurements.

    Parameters
    ----------
    hw : HardwareModel
    """

    def __init__(self, hw: HardwareModel):
        self.hw = hw
        self.booster = None
        self.fitted_on = 0

    def predict(self, w: Workload, tiles: dict, launch: dict) -> float:
        """Predicted seconds of one candidate: infinite for an :func:`infeasible` one (no
        model prices it); the analytical model's alone where the correction cannot be
        applied (non-finite terms) or fails (then it is dropped, with a warning)."""
        if infeasible(w, tiles, launch):
            return math.inf
        t = terms(w, tiles, launch, self.hw)
        if self.booster is None:
            return t["time"]
        try:
            x = np.array([features(w, tiles, launch, t)])
            if not np.isfinite(x).all():  # nothing to correct: the terms price it alone
                return t["time"]
            # in place: a DMatrix a candidate costs milliseconds, the same prediction
            return t["time"] * math.exp(float(self.booster.inplace_predict(x)[0]))
        except Exception as err:  # noqa: BLE001 - the learned part is optional: rank without it
            logger.warning("cost model correction dropped (%s: %s): the analytical model ranks "
                           "alone", type(err).__name__, error_line(err))
            self.booster = None
            return t["time"]

    def fit(self, samples) -> bool:
        """Learn the correction from ``samples``: ``(Workload, tiles, launch, seconds)``
        (failed measurements, infinite, and candidates whose model terms are not finite are
        left out).  Returns whether a correction is in use: not where fitting fails (a
        warning; the analytical model ranks alone).
        """
        self.booster = None
        try:
            import xgboost
        except ImportError:
            logger.info("xgboost is not installed: the analytical cost model ranks alone")
            return False
        x, y = _training_rows(samples, self.hw)
        if len(y) < MIN_FIT:
            return False
        # shallow trees: across compiles of other shapes deeper ones fit noise (chosen by
        # predicting each recorded H100 compile from the other: mean Spearman per kernel)
        params = {"max_depth": 2, "eta": 0.1, "subsample": 0.9, "nthread": 1, "seed": 0}
        try:
            self.booster = xgboost.train(params, xgboost.DMatrix(x, label=y),
                                         num_boost_round=100)
        except Exception as err:  # noqa: BLE001 - the learned part is optional: rank without it
            logger.warning("cost model correction not fitted (%s: %s): the analytical model "
                           "ranks alone", type(err).__name__, error_line(err))
            return False
        self.fitted_on = len(y)
        return True

    def fit_database(self, database) -> bool:
        """:meth:`fit` on every measurement ``database`` holds for this GPU."""
        return self.fit(samples(database.records, self.hw.arch))


def _training_rows(samples, hw: HardwareModel) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels (``log(measured / analytical)``) of the finite ``samples``: a
    failed measurement, an infeasible candidate or a non-finite term is left out."""
    x, y, dropped = [], [], 0
    for w, t, la, s in samples:
        if not (math.isfinite(s) and s > 0):
            continue
        row = _row(w, t, la, hw)
        if row is None or not (0 < row[1] < math.inf and all(math.isfinite(v) for v in row[0])):
            dropped += 1
            continue
        x.append(row[0])
        y.append(math.log(s / row[1]))
    if dropped:
        logger.info("cost model: %d measurements of infeasible or unpriceable candidates left "
                    "out of the fit", dropped)
    return np.array(x), np.array(y)


def _row(w: Workload, tiles: dict, launch: dict, hw: HardwareModel):
    """``(features, analytical seconds)`` of a candidate, or None where it is
    :func:`infeasible` or its terms cannot be computed (a malformed record's tiles)."""
    if infeasible(w, tiles, launch):
        return None
    try:
        m = terms(w, tiles, launch, hw)
        return features(w, tiles, launch, m), m["time"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None


def samples(records: dict, arch: str | None = None) -> list:
    """``(Workload, tiles, launch, seconds)`` of every measurement in tuning ``records``
    (optionally only those of ``arch``); malformed records are left out (logged)."""
    from tvm_stitch.families import REGISTRY  # the registry: data only

    out, malformed, unknown = [], 0, 0
    for key, rec in records.items():
        if not isinstance(rec, dict) or "workload" not in rec or (
                arch and not key.endswith(f"|{arch}")):
            continue
        try:
            w = Workload.from_dict(rec["workload"])
            if w.family not in REGISTRY:  # a family this build does not have
                unknown += 1
                continue
            out += [(w, dict(m["tiles"]), dict(m["launch"]), float(m["time_s"]))
                    for m in rec.get("measurements", ())]
        except (KeyError, TypeError, ValueError, AttributeError):
            malformed += 1
    if malformed:
        logger.warning("cost model: %d malformed tuning records left out", malformed)
    if unknown:
        logger.info("cost model: %d tuning records of unknown kernel families left out", unknown)
    return out


def spearman(a, b) -> float:
    """Spearman rank correlation (ties take their average rank); nan under three pairs."""
    pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
    if len(pairs) < 3:
        return math.nan
    ra, rb = (_ranks([p[i] for p in pairs]) for i in (0, 1))
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / den) if den else math.nan


def _ranks(values) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v))
    ranks[order] = np.arange(len(v), dtype=float)
    for value in np.unique(v):  # ties: average rank
        tied = v == value
        ranks[tied] = ranks[tied].mean()
    return ranks
