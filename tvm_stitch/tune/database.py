"""A small persistent tuning database: best configs keyed by workload, shapes, dtype and GPU.

One JSON file (default ``~/.cache/tvm-stitch/tuning.json``, or ``$TVM_STITCH_TUNING_DB``).  A file
that cannot be read or parsed, or a record of another format version, is reported with a warning
and ignored — never trusted — and rewritten on the next store.

The file may be shared by processes compiling at once: a store takes an exclusive lock on a
sibling lock file (``tuning.json.lock``; without ``fcntl`` stores are not serialized), reads
the file again, merges its records with this process's and replaces the file by an atomic
rename of a uniquely named temporary file, so readers always see a whole file and no writer
loses another's records.  Where the file cannot be written, records go to a file in a temporary
directory of this process (with a warning naming it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: stores are not serialized between processes
    fcntl = None

logger = logging.getLogger("tvm_stitch.tune")

VERSION = 1


def default_path() -> Path:
    env = os.environ.get("TVM_STITCH_TUNING_DB")
    return Path(env) if env else Path.home() / ".cache" / "tvm-stitch" / "tuning.json"


class TuningDatabase:
    """Best configurations by key.

    Parameters
    ----------
    path : str or Path, optional
        The JSON file; see :func:`default_path`.
    """

    def __init__(self, path=None):
        self.path = Path(path) if path else default_path()
        self.records: dict[str, dict] = {}
        self._load()

    @staticmethod
    def key(kind: str, shape, dtype: str, arch: str) -> str:
        return f"{kind}|{'x'.join(str(int(d)) for d in shape)}|{dtype}|{arch}"

    def _load(self) -> None:
        try:
            self.records = read_records(self.path)
        except (OSError, ValueError, AttributeError) as err:
            logger.warning("tuning database %s ignored: %s", self.path, err)
            self.records = {}

    def get(self, key: str) -> dict | None:
        rec = self.records.get(key)
        if rec is not None and not (isinstance(rec, dict) and isinstance(rec.get("config"), dict)):
            logger.warning("tuning record %s is malformed; ignored", key)
            return None
        return rec

    def put(self, key: str, config: dict, **info) -> None:
        """Store ``config`` (and ``info``) under ``key``, merged into the file with what other
        processes stored meanwhile; where the file cannot be written, into a temporary one."""
        self.records[key] = {"config": config, **info}
        try:
            self._store(key)
            return
        except OSError as err:
            failed, why = self.path, err
        try:
            self.path = Path(tempfile.mkdtemp(prefix="tvm-stitch-")) / failed.name
            self._store(key)
        except OSError as err:
            logger.warning("tuning database %s not written (%s), nor a temporary one (%s): "
                           "records are kept for this process only", failed, why, err)
            return
        logger.warning("tuning database %s not written (%s): records go to %s", failed, why,
                       self.path)

    def _store(self, key: str) -> None:
        """Write every record, under the lock, over the file's records (but ``key``'s)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(self.path):
            try:
                stored = read_records(self.path)
            except (OSError, ValueError, AttributeError) as err:
                logger.warning("tuning database %s replaced: %s", self.path, err)
                stored = {}
            self.records = {**self.records, **stored, key: self.records[key]}
            _write_atomic(self.path, {"version": VERSION, "records": self.records})


def read_records(path: Path) -> dict:
    """The records of the database file ``path`` (none where it does not exist).

    Raises
    ------
    OSError
        Where it cannot be read.
    ValueError
        Where it is not JSON or of another format version.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    data = json.loads(text)
    if data.get("version") != VERSION or not isinstance(data.get("records"), dict):
        raise ValueError(f"format version {data.get('version')!r}, expected {VERSION}")
    return data["records"]


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s sibling lock file (none where ``fcntl`` is missing)."""
    if fcntl is None:
        yield
        return
    # read-only: flock needs no write access (a lock file another user made stays usable)
    fd = os.open(path.with_name(path.name + ".lock"), os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _write_atomic(path: Path, data: dict) -> None:
    """Replace ``path`` by a whole file holding ``data``: a unique temporary file beside it,
    renamed over it (readers see the old file or the new one, never a part)."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
