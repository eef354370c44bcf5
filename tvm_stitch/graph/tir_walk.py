"""Small walkers over TIR statements and expressions.

TVM 0.27's Python API has no TIR ``post_order_visit``; these helpers cover what the graph builder
reads: the sblocks of a PrimFunc in program order, and the sub-expressions of a value.
"""

from __future__ import annotations

from collections.abc import Iterator

from tvm import ir, s_tir, tirx

_EXPR_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value", "base", "body")


def iter_sblocks(stmt) -> Iterator[tuple[s_tir.SBlock, list[tirx.For]]]:
    """Yield ``(block, enclosing_loops)`` for every non-root sblock under ``stmt``, in order."""
    for realize, loops in iter_realizes(stmt):
        yield realize.block, loops


def iter_realizes(stmt) -> Iterator[tuple[s_tir.SBlockRealize, list[tirx.For]]]:
    """Yield ``(realize, enclosing_loops)`` for every non-root sblock under ``stmt`` (its
    realization: iteration values and predicate), in order."""

    def walk(node, loops):
        if isinstance(node, s_tir.SBlockRealize):
            block = node.block
            if block.name_hint != "root":
                yield node, loops
            yield from walk(block.body, loops)
        elif isinstance(node, s_tir.SBlock):
            yield from walk(node.body, loops)
        elif isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                yield from walk(child, loops)
        elif isinstance(node, tirx.For):
            yield from walk(node.body, [*loops, node])
        elif isinstance(node, tirx.IfThenElse):
            yield from walk(node.then_case, loops)
            if node.else_case is not None:
                yield from walk(node.else_case, loops)
        elif hasattr(node, "body") and isinstance(node.body, tirx.Stmt):
            yield from walk(node.body, loops)

    yield from walk(stmt, [])


def iter_exprs(expr) -> Iterator:
    """Yield ``expr`` and its sub-expressions, pre-order, without entering buffer indices."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        yield node
        if isinstance(node, ir.expr.TensorLoad):
            continue
        if isinstance(node, ir.expr.Call):
            stack.extend(reversed(list(node.args)))
            continue
        for field in _EXPR_FIELDS:
            child = getattr(node, field, None)
            if isinstance(child, ir.expr.Expr):
                stack.append(child)


def buffer_loads(expr) -> list:
    """The buffer loads in ``expr`` (outside buffer indices), in pre-order."""
    return [e for e in iter_exprs(expr) if isinstance(e, ir.expr.TensorLoad)]


def loads_in_index(index) -> list:
    """Buffer loads nested inside an index expression (a gather's data-dependent index)."""
    out = []
    for node in iter_exprs(index):
        if isinstance(node, ir.expr.TensorLoad):
            out.append(node)
            for idx in node.indices:
                out.extend(loads_in_index(idx))
    return out


def is_one(extent) -> bool:
    """Whether ``extent`` is the constant 1 (a unit loop, a unit region)."""
    return isinstance(extent, tirx.IntImm) and int(extent) == 1
