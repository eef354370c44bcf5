"""A small persistent tuning database: best configs keyed by workload, shapes, dtype and GPU.

One JSON file (default ``~/.cache/tvm-stitch/tuning.json``, or ``$TVM_STITCH_TUNING_DB``).  A file
that cannot be read or parsed, or a record of another format version, is reported with a warning
and ignored — never trusted — and rewritten on the next store.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

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
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") != VERSION or not isinstance(data.get("records"), dict):
                raise ValueError(f"format version {data.get('version')!r}, expected {VERSION}")
            self.records = data["records"]
        except (OSError, ValueError, AttributeError) as err:
            logger.warning("tuning database %s ignored: %s", self.path, err)
            self.records = {}

    def get(self, key: str) -> dict | None:
        rec = self.records.get(key)
        if rec is not None and not isinstance(rec.get("config"), dict):
            logger.warning("tuning record %s is malformed; ignored", key)
            return None
        return rec

    def put(self, key: str, config: dict, **info) -> None:
        self.records[key] = {"config": config, **info}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"version": VERSION, "records": self.records}, indent=1))
            tmp.replace(self.path)
        except OSError as err:
            logger.warning("tuning database %s not written: %s", self.path, err)
