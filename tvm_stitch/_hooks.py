"""Run a function once a module has been imported, whichever imports it first."""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable

_lock = threading.Lock()


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the functions waiting for it."""

    def __init__(self, loader, name: str):
        self.loader = loader
        self.name = name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _run(self.name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give a watched module."""

    def __init__(self):
        self.waiting: dict[str, list[Callable[[], None]]] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _Finder()


def _run(name: str) -> None:
    with _lock:
        functions = _finder.waiting.pop(name, [])
        if not _finder.waiting and _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
    for function in functions:
        function()


def after_import(name: str, function: Callable[[], None]) -> None:
    """Call ``function`` once module ``name`` is imported: now if it already is, else right
    after its import completes (whoever imports it)."""
    if name in sys.modules:
        function()
        return
    with _lock:
        _finder.waiting.setdefault(name, []).append(function)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
