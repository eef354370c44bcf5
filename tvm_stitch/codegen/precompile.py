"""Triton kernels compiled ahead in worker processes, into Triton's own cache.

A measured search compiles dozens of candidates a kernel (:mod:`tvm_stitch.tune.measure`).
Side by side in threads, the compiles take turns at the interpreter lock (Triton's front end
and its passes hold it often): on the H200 host's 16 cores, BERT-base's 314 candidates took
70 s of a 108 s cold compile. Here each launch is first *specialized* in this process, as
Triton's JIT would for its arguments, without compiling: Triton's ``jit_cache_hook`` receives
the specialization (signature, constants, attributes, options) as the JIT serializes it for
its own ``preload``, and declines the compile. Worker processes then compile each one from
that data with the same ``triton.compile`` call the JIT makes, which writes Triton's on-disk
cache; the JIT's first launch of it here finds it there.

Nothing depends on it for correctness: a launch whose specialization or compile fails here is
compiled by the JIT when it is first launched, as without this module.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import json
import logging
import multiprocessing
import os
import sys
import threading

logger = logging.getLogger("tvm_stitch.precompile")

#: launches specialized here (``specialized``) or not (``unspecialized``: the JIT compiles
#: them at their launch), and compiled by the workers (``compiled``) or not (``failed``)
STATS = {"specialized": 0, "unspecialized": 0, "compiled": 0, "failed": 0}
_STATE = {"pool": None, "broken": None}  # the worker processes; why they cannot be used
_POOL_LOCK = threading.Lock()
_HOOK_LOCK = threading.Lock()


def available() -> bool:
    """Whether compiles go to worker processes: unless ``TVM_STITCH_COMPILE_PROCESSES=0``,
    and while the processes can be started."""
    if os.environ.get("TVM_STITCH_COMPILE_PROCESSES", "").strip() == "0":
        return False
    return _pool() is not None


def compile_workers(jobs: int) -> int:
    """Threads compiling Triton kernels side by side (a launch's variants, a search's
    candidates): one a job, at most one a core, or at most ``$TVM_STITCH_COMPILE_WORKERS``
    (``1``: one after the other)."""
    limit = os.cpu_count() or 1
    env = os.environ.get("TVM_STITCH_COMPILE_WORKERS", "")
    if env.strip():
        try:
            limit = max(1, int(env))
        except ValueError:
            logger.warning("TVM_STITCH_COMPILE_WORKERS=%r is not a number: ignored", env)
    return max(1, min(jobs, limit))


def specialization(fn, args, kwargs, grid) -> str | None:
    """Triton's serialized specialization of launching ``fn`` (a JIT function) with ``args``
    and ``kwargs`` (launch options included), as its ``preload`` takes it, found without
    compiling; None where Triton finds it compiled already, or it cannot be had."""
    from triton import knobs

    found = []

    def hook(*_, compile, **__):  # Triton's keyword
        found.append(compile["specialization_data"])
        return True  # not compiled here

    with _HOOK_LOCK:
        previous = knobs.runtime.jit_cache_hook
        knobs.runtime.jit_cache_hook = hook
        try:
            fn.warmup(*args, grid=grid, **kwargs)
        except Exception as err:  # noqa: BLE001 - any: the JIT compiles it when launched
            logger.debug("%s: no specialization: %s", getattr(fn, "__name__", fn), err)
            return None
        finally:
            knobs.runtime.jit_cache_hook = previous
    return found[0] if found else None


def compile_ahead(items) -> int | None:
    """Compile ``items`` — ``(fn, specialization)`` pairs (:func:`specialization`) — in worker
    processes, one a core (:func:`compile_workers`), into Triton's
    cache. Returns how many compiled (a kernel that fails is logged and left to the JIT), or
    None where the processes cannot be used (the caller compiles them itself)."""
    target = _target()
    jobs = []
    for fn, data in items:
        module = sys.modules.get(fn.fn.__module__)
        path = getattr(module, "__file__", None)
        if data is None or path is None:
            STATS["unspecialized"] += 1
            continue
        jobs.append((path, module.__name__, fn.fn.__name__, data, target))
    STATS["specialized"] += len(jobs)
    if not jobs:
        return 0
    pool = _pool()
    if pool is None:
        return None
    done = 0
    try:
        futures = [(j, pool.submit(_compile, *j)) for j in jobs]
        for job, future in futures:
            try:
                future.result()
                done += 1
            except concurrent.futures.process.BrokenProcessPool:
                raise
            except Exception as err:  # noqa: BLE001 - any: the JIT compiles it when launched
                STATS["failed"] += 1
                logger.debug("%s: not compiled ahead: %s: %s", job[2], type(err).__name__,
                             err)
    except (concurrent.futures.process.BrokenProcessPool, RuntimeError) as err:
        _broken(err)  # a worker died, or the pool cannot take work: none again
        return None
    STATS["compiled"] += done
    return done


def _pool():
    """The worker processes, one a core (:func:`compile_workers`),
    started once, on first use and kept for every batch; None where they cannot be."""
    with _POOL_LOCK:
        if _STATE["pool"] is None and _STATE["broken"] is None:
            try:
                context = multiprocessing.get_context("spawn")  # CUDA is initialized here
                _STATE["pool"] = concurrent.futures.ProcessPoolExecutor(
                    compile_workers(os.cpu_count() or 1), mp_context=context,
                    initializer=_second)
                atexit.register(_STATE["pool"].shutdown, wait=False, cancel_futures=True)
            except Exception as err:  # noqa: BLE001 - any: compiles stay in this process
                _broken(err)
        return _STATE["pool"]


def _second() -> None:
    """In a worker: below this process in the scheduler's order, so that timings taken here
    while the workers compile another search's candidates are not kept waiting for a core."""
    try:
        os.nice(5)
    except OSError:  # pragma: no cover - a platform without it: the same priority
        pass


def _broken(err) -> None:
    """The worker processes given up (their compiles stay in this process), said once."""
    if _STATE["broken"] is None:
        logger.warning("Triton kernels compiled in this process: worker processes failed "
                       "(%s: %s)", type(err).__name__, err)
    _STATE["broken"], _STATE["pool"] = err, None


def _target() -> dict | None:
    """This process's Triton target (older Tritons leave it out of the serialized data)."""
    try:
        from triton.runtime import driver

        return dict(driver.active.get_current_target().__dict__)
    except Exception:  # noqa: BLE001 - any: the data's own target, where it has one
        return None


def _compile(path: str, module_name: str, name: str, data: str, target=None) -> None:
    """In a worker: ``name`` of the generated module at ``path`` compiled as Triton's JIT
    compiles it for the specialization ``data`` (what its ``preload`` decodes), for the
    ``target`` (a dict; else the one recorded in ``data``), into Triton's cache. No device is
    touched."""
    import importlib.util

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    fn = getattr(sys.modules[module_name], name)
    obj = json.loads(data)
    target = GPUTarget(**(obj.get("target") or target))
    constexprs = {tuple(k): _constant(v) for k, v in zip(obj["constant_keys"],
                                                          obj["constant_vals"])}
    attrs = dict(zip(map(tuple, obj["attrs_keys"]), obj["attrs_vals"]))
    signature = {k: _tuple(v) for k, v in obj["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in obj["options"].items()}
    options = make_backend(target).parse_options(options)
    src = ast_source(fn)(fn, signature, constexprs, attrs)
    triton.compile(src, target=target, options=options.__dict__)


def is_gluon(fn) -> bool:
    """Whether ``fn`` is a Gluon kernel."""
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:
        return False
    return isinstance(fn, GluonJITFunction)


def ast_source(fn):
    """Triton's source class for ``fn``: Gluon's for a Gluon kernel (here, not in
    :mod:`.embed`, so a worker imports no TVM)."""
    if is_gluon(fn):
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource
    from triton.compiler import ASTSource

    return ASTSource


def _tuple(value):
    """JSON's lists back to the tuples Triton's signatures hold (as its ``preload`` does)."""
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _constant(value):
    """A constant of a serialized specialization decoded (as Triton's ``preload`` does)."""
    import triton.language as tl

    if tl.dtype.is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict):
        if "constexpr" in value:
            return tl.constexpr(_tuple(value["constexpr"]))
        raise ValueError(f"a constant Triton cannot preload: {value}")
    return _tuple(value)
