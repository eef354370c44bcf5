"""Shrinking a failing program to a small reproducer.

Greedy, to a fixed point: drop an op together with every op that reads its result, or let an
op's readers read one of its operands instead (same shape and dtype) — each kept only while the
program still fails the same way — then drop the inputs nothing reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .programs import Program


def minimize(program: Program, fails: Callable[[Program], bool], budget: int = 200) -> Program:
    """The smallest program reached from ``program`` for which ``fails`` stays true.

    Parameters
    ----------
    program : Program
        A program for which ``fails(program)`` is true.
    fails : callable
        The failure to keep (e.g. "check gives the same status").
    budget : int
        At most this many calls of ``fails``.
    """
    calls = 0

    def still(candidate):
        nonlocal calls
        calls += 1
        try:
            return fails(candidate)
        except Exception:  # noqa: BLE001 - a candidate that breaks the checker is not kept
            return False

    changed = True
    while changed and calls < budget:
        changed = False
        for k in reversed(range(len(program.ops))):
            if k >= len(program.ops) or calls >= budget:
                continue
            for candidate in (_without(program, k), *_bypasses(program, k)):
                if candidate is not None and candidate.ops and still(candidate):
                    program, changed = candidate, True
                    break
    return _prune_inputs(program)


def _without(program: Program, k: int) -> Program | None:
    """``program`` without op ``k`` and the ops that read it, directly or not."""
    first = len(program.inputs)
    dropped = {first + k}
    for j in range(k + 1, len(program.ops)):
        if dropped.intersection(program.ops[j].args):
            dropped.add(first + j)
    return _renumber(program, dropped, {})


def _bypasses(program: Program, k: int):
    """``program`` with op ``k``'s readers reading one of its operands instead (where the
    operand's shape and dtype are the op's)."""
    types = program.types()
    me = len(program.inputs) + k
    for a in dict.fromkeys(program.ops[k].args):
        if types[a] == types[me]:
            yield _renumber(program, {me}, {me: a})


def _renumber(program: Program, dropped: set, redirect: dict) -> Program:
    """``program`` without the values in ``dropped`` (ops only), readers of a redirected value
    reading its replacement."""
    first = len(program.inputs)
    new_id, ops = {v: v for v in range(first)}, []
    for j, op in enumerate(program.ops):
        v = first + j
        if v in dropped:
            if v in redirect:
                new_id[v] = new_id[redirect[v]]
            continue
        new_id[v] = first + len(ops)
        ops.append(dataclasses.replace(op, args=tuple(new_id[a] for a in op.args)))
    return Program(program.seed, program.dtype, list(program.inputs), ops)


def _prune_inputs(program: Program) -> Program:
    """``program`` without the inputs no op reads (the others keep their values: each input's
    are drawn from the seed and its own position in the original program)."""
    used = {a for op in program.ops for a in op.args}
    keep = [i for i in range(len(program.inputs)) if i in used]
    if len(keep) == len(program.inputs):
        return program
    new_id = {old: new for new, old in enumerate(keep)}
    first = len(program.inputs)
    for j in range(len(program.ops)):
        new_id[first + j] = len(keep) + j
    inputs = [dataclasses.replace(program.inputs[i], stream=program.inputs[i].stream
                                  if program.inputs[i].stream >= 0 else i) for i in keep]
    ops = [dataclasses.replace(op, args=tuple(new_id[a] for a in op.args)) for op in program.ops]
    return Program(program.seed, program.dtype, inputs, ops)
