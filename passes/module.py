"""Replacing functions of an IRModule without touching the module a pass was given."""

from __future__ import annotations

import tvm


def replace_functions(mod: tvm.IRModule, updates: dict) -> tvm.IRModule:
    """A new module: ``mod``'s functions with ``updates`` (GlobalVar -> function) in place, and
    its attributes and global infos.  ``mod[gv] = f`` would change the caller's module too."""
    if not updates:
        return mod
    functions = dict(mod.functions)
    functions.update(updates)
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
