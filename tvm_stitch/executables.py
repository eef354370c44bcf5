"""Compiled executables kept across runs: a model compiled again is loaded, not rebuilt.

:func:`~tvm_stitch.frontend.from_torch` compiles the Relax module it imported; with the tuning
database and the kernel caches filled, the compile still recognizes, plans and builds every
kernel (about 7 s for BERT-base on the H200 host). Here the executable is exported to
``$TVM_STITCH_CACHE/executables`` (default ``~/.cache/tvm-stitch``) under a key of everything
the build depends on:

- the imported module (TVM's structural hash: its functions, shapes, symbolic dims with their
  ranges, and its constants; the weights are the executable's parameters, not part of it),
- the target, the pipeline's options and the ``PassContext`` (opt level, passes required or
  disabled, config such as CUDA graphs),
- the versions of TVM, Triton and PyTorch and a digest of tvm-stitch's own sources.

The tuning database decides tiles, so an entry also records a digest of the database file
as it was once the compile finished: an entry whose database has changed since (another
compile measured something) is compiled again and replaced.

Loading an entry that fails (a corrupt or truncated file) warns, removes it and compiles.
An executable that cannot be exported (no host compiler to link it) is used as built, with a
warning. ``TVM_STITCH_EXECUTABLES=0`` turns the cache off; at most
``$TVM_STITCH_EXECUTABLES_MAX`` entries (64) are kept, the least recently used removed first.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import tvm

logger = logging.getLogger("tvm_stitch.executables")

#: bumped when what an entry holds changes
FORMAT = 1
#: entries kept at most (``$TVM_STITCH_EXECUTABLES_MAX``); the least recently used go first
MAX_ENTRIES = 64


def enabled() -> bool:
    """Whether compiled executables are kept (unless ``TVM_STITCH_EXECUTABLES=0``)."""
    return os.environ.get("TVM_STITCH_EXECUTABLES", "").strip() != "0"


def folder() -> Path:
    """``$TVM_STITCH_CACHE/executables`` (default ``~/.cache/tvm-stitch/executables``)."""
    from tvm_stitch.config import cache_root

    return cache_root() / "executables"


def key(mod, target, options: dict, context: dict) -> str:
    """The cache key of compiling ``mod`` for ``target`` with the pipeline's ``options`` in a
    ``PassContext`` described by ``context`` (see the module's description)."""
    import tvm_ffi

    parts = {
        "format": FORMAT,
        "module": str(tvm_ffi.structural_hash(mod)),
        "target": str(target),
        "options": sorted((k, repr(v)) for k, v in options.items()),
        "context": sorted((k, repr(v)) for k, v in context.items()),
        "versions": _versions(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def load(name: str, database: Path):
    """The executable kept under ``name`` (a runtime module), or None: none kept, kept with a
    tuning database other than ``database``'s contents now, or not loadable (removed, with a
    warning)."""
    meta = folder() / f"{name}.json"
    if not meta.exists():
        return None
    try:
        recorded = json.loads(meta.read_text())
        if recorded.get("database") != _digest(database):
            logger.info("executable %s: the tuning database changed since; compiled again", name)
            return None
        loaded = tvm.runtime.load_module(str(folder() / recorded["library"]))
        os.utime(meta)  # used now: the last to go (:func:`_evict`)
        return loaded
    except Exception as err:  # noqa: BLE001 - any: a corrupt entry is compiled again
        logger.warning("executable %s could not be loaded (%s: %s); removed and compiled "
                       "again", name, type(err).__name__, err)
        _remove(name)
        return None


def store(name: str, executable, database: Path) -> bool:
    """Keep ``executable`` under ``name`` with the digest of ``database`` now; False (with a
    warning) where it cannot be exported or written. Each version of an entry is a library
    of its own name (a process that loaded one keeps it: the dynamic loader would hand an
    older one loaded from the same name back)."""
    where = folder()
    digest = _digest(database)
    library = f"{name}-{(digest or 'none')[:12]}.so"
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            built = Path(tmp) / library
            executable.export_library(str(built))
            meta = Path(tmp) / f"{name}.json"
            meta.write_text(json.dumps({"database": digest, "library": library,
                                        "format": FORMAT}))
            _remove(name, keep=library)
            os.replace(built, where / library)  # the library first: an entry with its
            os.replace(meta, where / meta.name)  # description is whole
        _evict()
        return True
    except Exception as err:  # noqa: BLE001 - any: the executable is used as built
        logger.warning("executable not kept for later runs (%s: %s)", type(err).__name__, err)
        return False


def _evict() -> None:
    """The least recently used entries removed beyond ``$TVM_STITCH_EXECUTABLES_MAX``
    (default :data:`MAX_ENTRIES`): a service compiling many models or shapes does not fill
    the disk."""
    try:
        limit = int(os.environ.get("TVM_STITCH_EXECUTABLES_MAX", MAX_ENTRIES))
    except ValueError:
        logger.warning("TVM_STITCH_EXECUTABLES_MAX=%r is not a number: %d kept",
                       os.environ["TVM_STITCH_EXECUTABLES_MAX"], MAX_ENTRIES)
        limit = MAX_ENTRIES
    entries = []
    for meta in folder().glob("*.json"):
        try:
            entries.append((meta.stat().st_mtime, meta.stem))
        except OSError:  # removed meanwhile by another process
            continue
    for _, name in sorted(entries, reverse=True)[max(limit, 1):]:
        _remove(name)


def _remove(name: str, keep: str | None = None) -> None:
    """Entry ``name``'s files (but for the library ``keep``)."""
    for path in folder().glob(f"{name}*"):
        if path.name != keep and path.suffix in (".json", ".so"):
            path.unlink(missing_ok=True)


def _digest(path: Path) -> str | None:
    """A digest of the tuning database file's contents (None where there is none)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
    """TVM's, Triton's and PyTorch's versions and a digest of tvm-stitch's sources (its
    package and its passes)."""
    import tvm_stitch

    out = {"tvm": getattr(tvm, "__version__", "?")}
    for name in ("triton", "torch"):
        try:
            out[name] = __import__(name).__version__
        except ImportError:
            out[name] = None
    digest = hashlib.sha256()
    roots = [Path(tvm_stitch.__file__).parent]
    try:
        from tvm_stitch import passes

        roots.append(Path(passes.__file__).parent)
    except ImportError:
        pass
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    out["tvm_stitch"] = digest.hexdigest()
    return out
