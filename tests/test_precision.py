"""Half-precision reductions accumulate in float32 (``passes.AccumulateFloat32``); imported float16
and bfloat16 models keep their activations in 16 bits (``passes.HalfActivations``,
``passes.AsBFloat16``)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T
from tvm_stitch.passes import AccumulateFloat32, AsBFloat16, ComputeFloat32, HalfActivations

import tvm_stitch
from tvm_stitch.report import fusion_report
from tvm_stitch.workloads.subgraphs import relax_function


def test_half_reductions_are_promoted_and_others_kept():
    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 130), "float16"), y: R.Tensor((4, 130), "float32")):
            with R.dataflow():
                a = R.nn.softmax(x, axis=-1)
                b = R.mean(x, axis=[-1], keepdims=True)
                c = R.sum(y, axis=[-1])
                d = R.max(x, axis=[-1])
                R.output(a, b, c, d)
            return (a, b, c, d)

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 130), "float16"), y: R.Tensor((4, 130), "float32")):
            with R.dataflow():
                lv = R.astype(x, "float32")
                lv1 = R.nn.softmax(lv, axis=-1)
                a = R.astype(lv1, "float16")
                lv2 = R.astype(x, "float32")
                lv3 = R.mean(lv2, axis=[-1], keepdims=True)
                b = R.astype(lv3, "float16")
                c = R.sum(y, axis=[-1])  # already float32
                d = R.max(x, axis=[-1])  # exact in any precision
                R.output(a, b, c, d)
            return (a, b, c, d)

    tvm.ir.assert_structural_equal(AccumulateFloat32()(Before), Expected)


def test_module_without_half_reductions_is_returned_unchanged():
    @I.ir_module
    class Mod:
        @R.function
        def main(x: R.Tensor((8, 3), "float32")):
            with R.dataflow():
                y = R.variance(x, axis=[1])
                R.output(y)
            return y

    assert AccumulateFloat32()(Mod).same_as(Mod)


def _sum_and_softmax(rows, cols):
    return relax_function(
        [("x", (rows, cols), "float16")],
        lambda x: [
            relax.Tuple(
                [relax.op.sum(x, axis=[-1], keepdims=True), relax.op.nn.softmax(x, axis=-1)]
            )
        ],
    )


def _run(mod, x, **options):
    ex = tvm.compile(mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm", **options))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    return [o.numpy().astype("float64") for o in out]


@pytest.mark.parametrize("stitch", [True, False])
def test_float16_sum_of_a_long_row_is_accurate(stitch):
    # 4099 values near 1: a float16 accumulator stops growing at 2048 (its spacing there is 2)
    rows, cols = 3, 4099
    x = (1.0 + np.random.default_rng(0).random((rows, cols)) / 64).astype("float16")
    mod = _sum_and_softmax(rows, cols)
    exact = x.astype("float64").sum(-1, keepdims=True)
    e = np.exp(x - x.max(-1, keepdims=True).astype("float64"))
    softmax = e / e.sum(-1, keepdims=True)
    got_sum, got_softmax = _run(mod, x, stitch=stitch)
    # float32 accumulation: only the final rounding to float16 (spacing 4 above 4096)
    np.testing.assert_allclose(got_sum, exact, rtol=1e-3)
    np.testing.assert_allclose(got_softmax, softmax, rtol=2e-3, atol=1e-7)
    if not stitch:
        # the same module with TVM's float16 accumulation misses that tolerance (0.9% off)
        off_sum, _ = _run(mod, x, stitch=False, accumulate_fp32=False)
        assert not np.allclose(off_sum, exact, rtol=1e-3)


def test_promotion_keeps_one_kernel_per_stitched_pattern():
    mod = _sum_and_softmax(64, 781)
    assert fusion_report(mod, "llvm", "stitch").kernels == 1


def test_activations_stay_half_after_mixed_precision():
    """What ToMixedPrecision leaves of an embedding, a residual add, a LayerNorm and a mask (all
    float32, from the float32 embedding lookup on) becomes float16: the lookup reads the float16
    table, the norm takes the float16 scale and shift, the mask's float32 minimum saturates to
    float16's lowest finite value (not -inf: 0 * -inf is NaN), the cast back disappears."""

    @I.ir_module
    class Before:
        @R.function
        def main(ids: R.Tensor((4,), "int64"), w: R.Tensor((10, 8), "float16"),
                 g: R.Tensor((8,), "float16"), b: R.Tensor((8,), "float16"),
                 m: R.Tensor((4, 1), "bool")):
            with R.dataflow():
                w32 = R.astype(w, "float32")
                e = R.take(w32, ids, axis=0)
                s = R.add(e, e)
                n = R.nn.layer_norm(s, R.astype(g, "float32"), R.astype(b, "float32"), axes=[-1])
                low = R.const(-3.4028234663852886e38, "float32")
                x = R.where(m, n, low)
                y = R.astype(x, "float16")
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(ids: R.Tensor((4,), "int64"), w: R.Tensor((10, 8), "float16"),
                 g: R.Tensor((8,), "float16"), b: R.Tensor((8,), "float16"),
                 m: R.Tensor((4, 1), "bool")):
            with R.dataflow():
                e = R.take(w, ids, axis=0)
                s = R.add(e, e)
                n = R.nn.layer_norm(s, g, b, axes=[-1])
                y = R.where(m, n, R.const(-65504.0, "float16"))
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(HalfActivations()(Before), Expected)


def test_products_and_float32_outputs_are_kept():
    """A product keeps its float16 operands and float32 accumulation; a float32 result the
    function returns is still float32 (computed in float16, then cast)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 8), "float16")):
            with R.dataflow():
                p = R.matmul(x, w, out_dtype="float32")
                r = R.add(p, R.astype(x, "float32"))
                R.output(r)
            return r

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float16"), w: R.Tensor((8, 8), "float16")):
            with R.dataflow():
                p = R.matmul(x, w, out_dtype="float32")
                p16 = R.astype(p, "float16")
                r16 = R.add(p16, x)
                r = R.astype(r16, "float32")
                R.output(r)
            return r

    tvm.ir.assert_structural_equal(HalfActivations()(Before), Expected)


def test_imported_bert_moves_the_bytes_of_the_nn_bert():
    """Imported from Hugging Face in float16, BERT keeps its residual stream in float16 like the
    nn BERT (and like PyTorch after ``model.half()``): the same kernels for the H100 and about
    the same bytes (before: the float32 stream moved 1.5x)."""
    from tvm_stitch.workloads import get_workload

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    reports = {
        name: fusion_report(get_workload(name).instance("float16", batch=2, seq=64).mod, target)
        for name in ("bert-tiny", "hf-bert-tiny")
    }
    nn, hf = reports["bert-tiny"], reports["hf-bert-tiny"]
    text = get_workload("hf-bert-tiny").instance("float16", batch=1, seq=8).mod.script()
    assert 'R.nn.layer_norm' in text and not any(
        "layer_norm" in line and '"float32"' in line for line in text.splitlines()
    )
    assert hf.bytes < 1.1 * nn.bytes


def test_input_independent_values_stay_float32_until_they_meet_activations():
    """Rotary angles (position × inverse frequency) and their cosine depend on no parameter:
    they keep the model's float32 (as PyTorch computes rotary tables) and are cast where they
    meet the float16 activations, their finite values saturated (infinities stay); the product
    with the activation is float16."""
    inv = np.exp(-np.arange(8) / 8).astype("float32").reshape(1, 8)

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float16")):
            with R.dataflow():
                pos = R.arange(0, 4, 1, dtype="int64")
                col = R.expand_dims(pos, axis=[1])
                p32 = R.astype(col, "float32")
                ang = R.multiply(p32, R.const(inv, "float32"))
                c = R.cos(ang)
                x32 = R.astype(x, "float32")
                y = R.multiply(x32, c)
                out = R.astype(y, "float16")
                R.output(out)
            return out

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float16")):
            with R.dataflow():
                pos = R.arange(0, 4, 1, dtype="int64")
                col = R.expand_dims(pos, axis=[1])
                p32 = R.astype(col, "float32")
                ang = R.multiply(p32, R.const(inv, "float32"))
                c = R.cos(ang)
                c_clip = R.clip(
                    c, R.prim_value(T.float64(-65504.0)), R.prim_value(T.float64(65504.0))
                )
                c_sat = R.where(R.isinf(c), c, c_clip)
                c16 = R.astype(c_sat, "float16")
                out = R.multiply(x, c16)
                R.output(out)
            return out

    tvm.ir.assert_structural_equal(HalfActivations()(Before), Expected)


def test_an_input_independent_minus_inf_stays_minus_inf():
    """A causal mask built from positions with ``-inf`` (no parameter in it: kept float32 until
    it meets the float16 logits) is still ``-inf`` there, not -65504; its zeros stay zeros."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 4), "float16")):
            with R.dataflow():
                pos = R.arange(0, 4, 1, dtype="int64")
                above = R.less(R.expand_dims(pos, axis=[1]), R.expand_dims(pos, axis=[0]))
                mask = R.where(above, R.const(float("-inf"), "float32"),
                               R.const(0.0, "float32"))
                y = R.add(R.astype(x, "float32"), mask)
                out = R.astype(y, "float16")
                R.output(out)
            return out

    after = HalfActivations()(Before)
    ex = tvm.compile(after, "llvm")
    x = np.arange(16, dtype="float16").reshape(4, 4)
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    expected = np.where(np.triu(np.ones((4, 4), bool), 1), np.float16("-inf"), x)
    np.testing.assert_array_equal(got, expected)
    assert "float16" in after.script() and "isinf" in after.script()


@pytest.mark.parametrize("spelling", ["multiply", "matmul"])
def test_rotary_tables_keep_their_precision_at_long_positions(spelling):
    """A rotary embedding imported in float16 at 1024 positions: angles up to 1023 rad lose
    0.25 rad to float16 rounding (the output was 0.9 off); computed in float32 and cast, the
    output is within float16 rounding of PyTorch's float32 result.  (An ``inv_freq`` kept as a
    buffer is rounded to float16 with the weights, as ``model.half()`` rounds it too.)  The
    angles as an outer product (transformers 5.17's LLaMA: ``inv_freq[:, None] @ pos[None]``)
    are a product of input-independent values: ``ToMixedPrecision`` gives it float16 operands
    and a float16 result, which ``HalfActivations`` computes in float32 again."""
    import torch

    from tvm_stitch.frontend import import_torch

    class Rotary(torch.nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.dim = dim
            self.proj = torch.nn.Linear(dim, dim)

        def forward(self, x):
            pos = torch.arange(x.shape[1], dtype=torch.float32)
            inv = 1.0 / 10000 ** (torch.arange(0, self.dim, 2, dtype=torch.float32) / self.dim)
            if spelling == "matmul":  # (1, N, d/2), then cat and a scaling, as 5.17's LLaMA
                freqs = (inv[None, :, None] @ pos[None, None, :]).transpose(1, 2)
            else:
                freqs = pos[:, None] * inv[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos() * 1.0, emb.sin() * 1.0
            h = self.proj(x)
            half = h.shape[-1] // 2
            rot = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
            return h * cos + rot * sin

    torch.manual_seed(0)
    net, x = Rotary(64).eval(), torch.randn(1, 1024, 64)
    with torch.no_grad():
        ref = net(x).numpy()
    imported = import_torch(net, (x,), "float16")
    ex = tvm.compile(imported.mod, "llvm", relax_pipeline=tvm_stitch.pipeline("llvm"))
    args = [tvm.runtime.tensor(a) for a in (x.numpy(), *imported.weights)]
    got = relax.VirtualMachine(ex, tvm.cpu())["main"](*args).numpy().astype("float32")
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_a_float32_minimum_cast_to_float16_saturates():
    """``astype(finfo(float32).min, float16)`` (a mask's fill value) is float16's lowest finite
    value, not -inf (``0 * -inf`` is NaN), also when nothing else in the function changes; a
    float32 ``-inf`` (what ``scaled_dot_product_attention`` makes of a boolean mask) stays -inf,
    so a row with no key visible is still one."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float16")):
            with R.dataflow():
                low = R.astype(R.const(-3.4028234663852886e38, "float32"), "float16")
                ninf = R.astype(R.const(float("-inf"), "float32"), "float16")
                y = R.add(R.add(x, low), ninf)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float16")):
            with R.dataflow():
                y = R.add(R.add(x, R.const(-65504.0, "float16")),
                          R.const(float("-inf"), "float16"))
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(HalfActivations()(Before), Expected)


def test_as_bfloat16_retypes_what_mixed_precision_made_float16():
    """``AsBFloat16``: ToMixedPrecision's float16 parameters, casts and constants become
    bfloat16, products keep their float32 accumulation; a LayerNorm (TVM 0.27 lowers it in
    float32 and float16 only) runs in float32 between casts, as PyTorch's bfloat16 LayerNorm
    computes, its scale and shift float32 parameters (read by nothing else; casts of them would
    be per-column work inside the row kernel); float32 stays float32."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "float16"),
                 g: R.Tensor((8,), "float16"), b: R.Tensor((8,), "float16")):
            with R.dataflow():
                a = R.astype(x, "float16")
                p = R.matmul(a, w, out_dtype="float32")
                h = R.astype(p, "float16")
                s = R.multiply(h, R.const(0.5, "float16"))
                n = R.nn.layer_norm(s, g, b, axes=[-1])
                y = R.add(R.astype(n, "float32"), R.const(1.0, "float32"))
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((4, 8), "float32"), w: R.Tensor((8, 8), "bfloat16"),
                 g: R.Tensor((8,), "float32"), b: R.Tensor((8,), "float32")):
            with R.dataflow():
                a = R.astype(x, "bfloat16")
                p = R.matmul(a, w, out_dtype="float32")
                h = R.astype(p, "bfloat16")
                s = R.multiply(h, R.const(0.5, "bfloat16"))
                s32 = R.astype(s, "float32")
                n32 = R.nn.layer_norm(s32, g, b, axes=[-1])
                n = R.astype(n32, "bfloat16")
                y = R.add(R.astype(n, "float32"), R.const(1.0, "float32"))
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(AsBFloat16()(Before), Expected)


def test_as_bfloat16_refuses_a_float16_it_cannot_retype():
    """An op with its own float16 attribute (a ``full``) would leave the module in two
    formats: the rewrite says so instead."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4,), "float16")):
            with R.dataflow():
                y = R.add(x, R.full((4,), R.const(1.0, "float16"), dtype="float16"))
                R.output(y)
            return y

    with pytest.raises(ValueError, match="float16 left after the bfloat16 rewrite"):
        AsBFloat16()(Before)


def test_as_bfloat16_runs_other_float32_only_norms_in_float32_and_retypes_tuples():
    """A GroupNorm (TVM 0.27 types it in float32 and float16 only) runs in float32 between
    casts; a float16 constant inside a tuple (a concat's operands) becomes bfloat16."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((2, 4, 6), "float16"), g: R.Tensor((4,), "float16"),
                 b: R.Tensor((4,), "float16")):
            with R.dataflow():
                n = R.nn.group_norm(x, g, b, num_groups=2, channel_axis=1, axes=[2])
                y = R.concat((n, R.const(np.ones((2, 4, 1)), "float16")), axis=2)
                R.output(y)
            return y

    @I.ir_module
    class Expected:
        @R.function
        def main(x: R.Tensor((2, 4, 6), "bfloat16"), g: R.Tensor((4,), "float32"),
                 b: R.Tensor((4,), "float32")):
            with R.dataflow():
                x32 = R.astype(x, "float32")
                n32 = R.nn.group_norm(x32, g, b, num_groups=2, channel_axis=1, axes=[2])
                n = R.astype(n32, "bfloat16")
                y = R.concat((n, R.const(np.ones((2, 4, 1)), "bfloat16")), axis=2)
                R.output(y)
            return y

    tvm.ir.assert_structural_equal(AsBFloat16()(Before), Expected)


def test_bfloat16_activations_saturate_to_bfloat16s_range():
    """In bfloat16 a mask's ``finfo(float32).min`` (which rounds to -inf in bfloat16) saturates
    to bfloat16's lowest finite value, not float16's -65504; ``-inf`` stays -inf; a float32
    LayerNorm is left in float32 (it runs between casts)."""

    @I.ir_module
    class Before:
        @R.function
        def main(x: R.Tensor((4, 8), "bfloat16"), g: R.Tensor((8,), "float32"),
                 b: R.Tensor((8,), "float32")):
            with R.dataflow():
                low = R.astype(R.const(-3.4028234663852886e38, "float32"), "bfloat16")
                ninf = R.astype(R.const(float("-inf"), "float32"), "bfloat16")
                y = R.add(R.add(x, low), ninf)
                n = R.nn.layer_norm(R.astype(y, "float32"), g, b, axes=[-1])
                R.output(n)
            return n

    low = float(np.float32(-3.3895313892515355e38))
    after = HalfActivations("bfloat16")(Before)
    consts = []
    relax.analysis.post_order_visit(
        after["main"], lambda e: consts.append(e) if isinstance(e, tvm.ir.expr.Constant)
        and hasattr(e, "value") and hasattr(e.value, "numpy") else None)
    values = sorted(float(c.value.numpy().astype("float32")) for c in consts)
    assert values == [float("-inf"), low]
    assert all(str(c.ty.dtype) == "bfloat16" for c in consts)
    norms = [b.value for b in after["main"].body.blocks[0].bindings
             if isinstance(b.value, relax.Call) and b.value.op.name == "relax.nn.layer_norm"]
    assert [str(n.ty.dtype) for n in norms] == ["float32"]
    with pytest.raises(ValueError, match="dtype must be one of"):
        HalfActivations("float8")


def test_bfloat16_arithmetic_in_a_kernel_is_computed_in_float32():
    """``ComputeFloat32`` widens bfloat16 arithmetic as it does float16's."""

    @I.ir_module
    class Before:
        @T.prim_func(s_tir=True)
        def main(x: T.Buffer((8,), "bfloat16"), u: T.Buffer((8,), "bfloat16"),
                 y: T.Buffer((8,), "bfloat16")):
            for i in range(8):
                with T.sblock("silu_up"):
                    v = T.axis.spatial(8, i)
                    y[v] = x[v] * T.sigmoid(x[v]) * u[v]

    @I.ir_module
    class Expected:
        @T.prim_func(s_tir=True)
        def main(x: T.Buffer((8,), "bfloat16"), u: T.Buffer((8,), "bfloat16"),
                 y: T.Buffer((8,), "bfloat16")):
            for i in range(8):
                with T.sblock("silu_up"):
                    v = T.axis.spatial(8, i)
                    y[v] = T.Cast(
                        "bfloat16",
                        T.Cast("float32", x[v])
                        * T.sigmoid(T.Cast("float32", x[v]))
                        * T.Cast("float32", u[v]),
                    )

    tvm.ir.assert_structural_equal(ComputeFloat32()(Before), Expected)


def test_float16_arithmetic_in_a_kernel_is_computed_in_float32():
    """``ComputeFloat32``: a fused SiLU × up rounds once, where it is stored; an explicit cast to
    float16 stays a rounding; a reduction's update and a plain copy are left as they are."""

    @I.ir_module
    class Before:
        @T.prim_func(s_tir=True)
        def main(
            x: T.Buffer((8,), "float16"),
            u: T.Buffer((8,), "float16"),
            s: T.Buffer((8,), "float32"),
            y: T.Buffer((8,), "float16"),
            z: T.Buffer((8,), "float16"),
            acc: T.Buffer((1,), "float16"),
            c: T.Buffer((8,), "float16"),
        ):
            for i in range(8):
                with T.sblock("silu_up"):
                    v = T.axis.spatial(8, i)
                    y[v] = x[v] * T.sigmoid(x[v]) * u[v]
            for i in range(8):
                with T.sblock("scale"):
                    v = T.axis.spatial(8, i)
                    z[v] = T.Cast("float16", s[v] * T.float32(0.5)) * u[v] + T.float16(1)
            for i in range(8):
                with T.sblock("sum"):
                    k = T.axis.reduce(8, i)
                    with T.init():
                        acc[0] = T.float16(0)
                    acc[0] = acc[0] + x[k] * u[k]
            for i in range(8):
                with T.sblock("copy"):
                    v = T.axis.spatial(8, i)
                    c[v] = T.if_then_else(v < 4, x[v], u[v])

    @I.ir_module
    class Expected:
        @T.prim_func(s_tir=True)
        def main(
            x: T.Buffer((8,), "float16"),
            u: T.Buffer((8,), "float16"),
            s: T.Buffer((8,), "float32"),
            y: T.Buffer((8,), "float16"),
            z: T.Buffer((8,), "float16"),
            acc: T.Buffer((1,), "float16"),
            c: T.Buffer((8,), "float16"),
        ):
            for i in range(8):
                with T.sblock("silu_up"):
                    v = T.axis.spatial(8, i)
                    y[v] = T.Cast(
                        "float16",
                        T.Cast("float32", x[v])
                        * T.sigmoid(T.Cast("float32", x[v]))
                        * T.Cast("float32", u[v]),
                    )
            for i in range(8):
                with T.sblock("scale"):
                    v = T.axis.spatial(8, i)
                    z[v] = T.Cast(
                        "float16",
                        T.Cast("float32", T.Cast("float16", s[v] * T.float32(0.5)))
                        * T.Cast("float32", u[v])
                        + T.float32(1),
                    )
            for i in range(8):
                with T.sblock("sum"):
                    k = T.axis.reduce(8, i)
                    with T.init():
                        acc[0] = T.float16(0)
                    acc[0] = acc[0] + x[k] * u[k]
            for i in range(8):
                with T.sblock("copy"):
                    v = T.axis.spatial(8, i)
                    c[v] = T.if_then_else(v < 4, x[v], u[v])

    before = Before
    after = ComputeFloat32()(before)
    tvm.ir.assert_structural_equal(after, Expected)
    tvm.ir.assert_structural_equal(before, Before)  # the given module is not changed
    assert ComputeFloat32()(Expected).same_as(Expected)  # nothing left to widen


def test_cuda_kernels_of_the_stitch_pipeline_do_no_float16_arithmetic():
    """The CUDA source of a fused SiLU × up (GPT-2's and LLaMA's FFN, PyTorch's op by op):
    ``expf`` on float32 values and one rounding per store; without the pass, TVM's CUDA code
    computes ``hexp`` and rounds after every operation."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((64, 96), "float16"))
    u = relax.Var("u", R.Tensor((64, 96), "float16"))
    with bb.function("main", [x, u]):
        with bb.dataflow():
            out = bb.emit_output(R.multiply(R.nn.silu(x), u))
        bb.emit_func_output(out)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})

    def source(**options):
        ex = tvm.compile(bb.get(), target, relax_pipeline=tvm_stitch.pipeline(target, **options))
        mods, found = [ex.mod], []
        while mods:
            m = mods.pop()
            mods.extend(m.imports)
            found += [m.inspect_source("")] if m.kind == "cuda" else []
        src = "".join(found)
        return src[src.index("__global__"):]  # the kernels, not the header's helpers

    assert "hexp" in source(compute_fp32=False)
    src = source()
    assert "hexp" not in src and "expf(" in src
    stores = [line for line in src.splitlines() if "expf(" in line]
    assert stores and all(line.count("(half)") == 1 for line in stores)  # one rounding each
