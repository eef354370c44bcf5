"""Row statistics rewritten as moments (the two-phase reduction of a folded normalization)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm

from tvm_stitch.analysis.elem import (
    Const,
    Leaf,
    Op,
    Reduce,
    evaluate,
    format_elem,
    reductions,
    replace,
)
from tvm_stitch.analysis.moments import expand_statistics


def _row(name="r"):
    return tvm.tirx.Var(name, "int64")


def _layernorm_statistics(k=48):
    """LayerNorm's inverse deviation as TVM legalizes it: the variance reads the mean."""
    m = tvm.tirx.Var("m", "int64")
    r1, r2 = _row("r1"), _row("r2")
    x1 = Op("cast", (Leaf("x", (m, r1), "float16"),), "float32")
    x2 = Op("cast", (Leaf("x", (m, r2), "float16"),), "float32")
    mean = Op("div", (Reduce("sum", x1, r1, k, 0.0, "float32"), Const(float(k), "float32")),
              "float32")
    dev = Op("sub", (x2, mean), "float32")
    var = Reduce("sum", Op("mul", (dev, dev), "float32"), r2, k, 0.0, "float32")
    return Op("div", (var, Const(float(k), "float32")), "float32")


def test_variance_becomes_two_moments_and_keeps_its_value():
    var = _layernorm_statistics()
    expanded = expand_statistics(var)
    moments = reductions(expanded)
    assert len(moments) == 2, [format_elem(x) for x in moments]  # Σx and Σx²
    assert not any(isinstance(y, Reduce) for x in moments for y in [x.body])
    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((5, 48)) * 3 + 1).astype("float16")
    for e in (var, expanded):
        got = _evaluate_rows(e, rows)
        want = rows.astype("float32").var(axis=1)
        np.testing.assert_allclose(got, want, rtol=1e-4)


def test_a_constant_row_has_no_negative_variance():
    """Σx²/K - μ² of 48 copies of 7.3 rounds to -5e-6 in float32: clamped, as a variance."""
    var = _layernorm_statistics(k=48)
    rows = np.full((3, 48), 7.3, dtype="float16")
    assert (_evaluate_rows(expand_statistics(var), rows) >= 0).all()


def test_a_maximum_is_no_moment():
    m, r = tvm.tirx.Var("m", "int64"), _row()
    top = Reduce("max", Leaf("x", (m, r), "float32"), r, 8, float("-inf"), "float32")
    with pytest.raises(ValueError, match="no sum of moments"):
        expand_statistics(top)


def _evaluate_rows(elem, rows):
    """``elem`` (over the row ``m``; reads ``x[m, r]``) for every row of ``rows``, with numpy:
    reductions innermost first, each replaced by its value."""
    out = []
    for i in range(rows.shape[0]):
        out.append(float(evaluate(_reduced(elem, rows[i]), {"m": np.int64(i)}, None)))
    return np.array(out, dtype="float32")


def _reduced(elem, row):
    def fn(e):
        if not isinstance(e, Reduce):
            return None
        body = _reduced(e.body, row)
        r = np.arange(e.extent)
        vals = evaluate(body, {e.var.name: r}, lambda leaf: row[r])
        # accumulated in float32, as the kernels do
        total = np.sum(np.asarray(vals, dtype="float32"), dtype="float32")
        return Const(float(total), e.dtype)

    return replace(elem, fn)
