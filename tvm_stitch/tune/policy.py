"""The tuning policy of a compile: where each generated kernel's tiles come from (the tuning
database, a measured search, or the cost model) and what is kept."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time

from tvm_stitch.cost.model import CostModel

from . import remote
from .kernels import QUICK_SEARCH, best_measured, record_legality, tune_generated
from .measure import TURNS

logger = logging.getLogger("tvm_stitch.mcfuser")


def concurrent_searches() -> int:
    """Measured searches run side by side (:meth:`KernelTuner.prefetch`): one per four of the
    host's cores (a search's round compiles about a dozen candidates), at least two, or
    ``$TVM_STITCH_SEARCHES`` (``1``: one after the other)."""
    env = os.environ.get("TVM_STITCH_SEARCHES", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            logger.warning("TVM_STITCH_SEARCHES=%r is not a number: ignored", env)
    return max(2, (os.cpu_count() or 1) // 4)


class KernelTuner:
    """Configs of generated kernels: tuning database first, else Algorithm 1 timing the kernel
    itself, ranked by the cost model (or the cost model alone without a GPU, or with
    ``tune="model"``).

    Parameters
    ----------
    hw : HardwareModel
    database : TuningDatabase
    on_device : bool
        Measure (Algorithm 1 on this GPU) where the database holds no config; else take the
        cost model's choice, which is not stored.
    """

    def __init__(self, hw, database, on_device):
        self.hw, self.db, self.on_device = hw, database, on_device
        self.seen: dict[str, dict] = {}  # model-only choices of this compile
        self.cost = CostModel(hw)  # corrected by the database's measurements when it has some
        self.fitted = False  # fit when a kernel first needs a search, not when none does
        self.rejected: set[str] = set()  # keys of records this compile does not use
        self._remotes = None  # tuning servers (:meth:`remotes`)
        #: where this compile's searches spent their time (:meth:`summary`)
        self.spent = {"searches": 0, "search": 0.0, "compile": 0.0, "time": 0.0,
                      "compiled": 0, "timed": 0, "fit": 0.0, "ahead": 0.0}

    def record(self, match, source) -> dict | None:
        """The tuning database's config of the kernel, where it holds a usable one: a record
        the kernel cannot launch (:func:`~tvm_stitch.tune.kernels.record_legality`) is
        :meth:`reject`-ed."""
        key = tuning_key(self.db, match, source, self.hw)
        rec = None if key in self.rejected else self.db.get(key)
        if rec is None:
            return None
        why = record_legality(match, source, rec["config"], self.hw)
        if why:
            self.reject(match, source, why)
            return None
        return rec["config"]

    def reject(self, match, source, why: str) -> None:
        """Leave the tuning record of the kernel unused in this compile (the tiles are
        searched as if there were none), with a warning saying ``why``."""
        key = tuning_key(self.db, match, source, self.hw)
        self.rejected.add(key)
        logger.warning("%s: tuning record %s ignored (%s); tiles searched again",
                       match.describe(), key, why)

    def config(self, match, source, shapes, constants, like=None, quick=False) -> dict:
        """The kernel's config: its tuning record's; else, with ``like`` (``(match,
        source)`` of the same computation at the same extents in another formulation: the
        static kernel of a runtime kernel's bucket point), the fastest of that kernel's
        measurements this one can launch (:func:`~tvm_stitch.tune.kernels.best_measured`);
        else searched (measured, or the cost model's). ``quick``: a measured search is the
        short one (:data:`~tvm_stitch.tune.kernels.QUICK_SEARCH`, the best candidate
        refined): a runtime kernel's bucket points, a dozen a kernel, are not each searched
        at length in a compile from an empty database."""
        key = tuning_key(self.db, match, source, self.hw)
        recorded = self.record(match, source)
        if recorded is not None:
            return recorded
        if key in self.seen:
            return self.seen[key]
        if like is not None:
            found = self._measured_like(match, source, *like)
            if found is not None:
                self.seen[key] = found
                return found
        if not self.fitted:
            self.fitted = True
            if self.cost.fit_database(self.db):
                logger.info("cost model corrected on %d measurements", self.cost.fitted_on)
        # the model alone searches at length in milliseconds: a short search only when
        # candidates are measured
        search = {"config": QUICK_SEARCH, "refine_top": 1} if quick and self.on_device else {}
        tuned = tune_generated(
            match, source, shapes, constants, self.hw, on_device=self.on_device, cost=self.cost,
            **search,
        )
        self.spent["searches"] += 1
        self.spent["search"] += tuned.seconds
        for phase, value in tuned.phases.items():
            self.spent[phase] += value
        if self.on_device:  # model-only choices are not kept: a GPU compile measures them
            self.db.put(
                key,
                tuned.config,
                time_us=tuned.time * 1e6,
                search_s=tuned.seconds,
                correlation=tuned.result.correlation,
                workload=tuned.workload,
                measurements=tuned.measurements,
                **({"search": "quick"} if quick else {}),
            )
            start = time.perf_counter()
            self.cost.fit_database(self.db)  # refit as measurements arrive
            self.spent["fit"] += time.perf_counter() - start
        logger.info(
            "%s: %s, %.1f us (%s)",
            match.describe(),
            tuned.config,
            tuned.time * 1e6,
            "measured" if self.on_device else "model",
        )
        self.seen[key] = tuned.config
        return tuned.config

    def prefetch(self, requests) -> None:
        """Run the searches that the calls ``requests`` will need, side by side, and keep
        their configs for those calls. ``requests`` holds ``(args, kwargs)`` of
        :meth:`config`, an iterable taken only when it is used.

        :func:`concurrent_searches` threads run the searches. A search compiles a round's
        candidates in worker processes and waits; meanwhile another search runs. They take
        :data:`~tvm_stitch.tune.measure.TURNS`: one at a time on the interpreter and the
        device, so timings are taken alone. With tuning servers (:meth:`remotes`) the searches
        take the devices in turn, this process's GPU first; a search on a server has it
        compile and time each batch (:mod:`~tvm_stitch.tune.remote`) and gives its turn up
        meanwhile. Without a GPU, or with one search to run, nothing is done ahead. A request
        that fails here is left to its call, which fails again and says why."""
        if not self.on_device:
            return
        todo = {}
        for args, kwargs in requests:
            match, source = args[0], args[1]
            key = tuning_key(self.db, match, source, self.hw)
            if key not in self.seen and key not in self.rejected and self.db.get(key) is None:
                todo.setdefault(key, (args, kwargs))
        if len(todo) < 2 or concurrent_searches() < 2:
            return
        devices = [None, *self.remotes()]  # None: this process's GPU
        threads = min(max(concurrent_searches(), 2 * len(devices)), len(todo))

        def search(i, args, kwargs):
            device = devices[i % len(devices)]
            try:
                with remote.using(device), TURNS.hold():
                    self.config(*args, **kwargs)
            except Exception as err:
                if device is not None:  # the server's trouble: say so (the call searches here)
                    logger.warning("a search on tuning server %s failed: %s: %s", device.name,
                                   type(err).__name__, err)
                raise

        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            futures = [pool.submit(search, i, *request)
                       for i, request in enumerate(todo.values())]
            for future in futures:
                try:
                    future.result()
                except Exception as err:  # noqa: BLE001 - any: its call fails again, saying why
                    logger.debug("a search ahead failed: %s: %s", type(err).__name__, err)
        self.spent["ahead"] += time.perf_counter() - start
        logger.info("%d kernels' tiles found side by side (%d searches at a time) in %.1f s",
                    len(todo), threads, time.perf_counter() - start)
        for device in devices[1:]:
            logger.info("tuning server %s: %d candidates timed in %d batches", device.name,
                        device.timed, device.batches)

    def remotes(self) -> list:
        """The tuning servers this compile's searches also time on (:func:`.remote.connect`,
        ``$TVM_STITCH_RPC``), connected once."""
        if self._remotes is None:
            self._remotes = remote.connect() if os.environ.get("TVM_STITCH_RPC") else []
        return self._remotes

    def summary(self) -> str | None:
        """Where this compile's measured searches spent their time (None without one):
        candidates' kernels compiled ahead, timings on the device, the rest of the search
        (the cost model, compiles the timings waited for), and the cost model's refits."""
        s = self.spent
        if not s["searches"] or not self.on_device:
            return None
        from tvm_stitch.codegen.precompile import STATS

        rest = s["search"] - s["compile"] - s["time"]
        ahead = f"; side by side {s['ahead']:.1f} s of wall time" if s["ahead"] else ""
        workers = (f" (in worker processes {STATS['compiled']}, failed there "
                   f"{STATS['failed']}, not specialized {STATS['unspecialized']})"
                   if STATS["specialized"] or STATS["unspecialized"] else "")
        return (f"tuning: {s['searches']} searches, {s['search']:.1f} s: {s['compiled']} "
                f"candidates compiled ahead {s['compile']:.1f} s{workers}, {s['timed']} "
                f"timings {s['time']:.1f} s, the rest {rest:.1f} s; cost model refits "
                f"{s['fit']:.1f} s{ahead}")

    def _measured_like(self, match, source, other, other_source) -> dict | None:
        rec = self.db.get(tuning_key(self.db, other, other_source, self.hw))
        if rec is None or not rec.get("measurements"):
            return None
        config = best_measured(match, source, rec["measurements"], self.hw)
        if config is not None:
            logger.info("%s: %s, measured as %s", match.describe(), config, other_source.name)
        return config


def tuning_key(database, match, source, hw) -> str:
    """The tuning database's key of a generated kernel: its name (family and content digest),
    the frame's extents, dtype and architecture."""
    ext = match.frame.extents
    return database.key(source.name, [ext[a] for a in sorted(ext)], match.dtype, hw.arch)
