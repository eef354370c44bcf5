"""MCFuser's Relax integration for single GEMMs with fused epilogues (chains of length one).

Runs before ``LegalizeOps``.  It matches Linear layers — ``matmul(x, permute_dims(W))``, an
optional ``astype`` (float32 accumulation), ``+ bias``, then optionally ``gelu`` or ``+ residual``
— and replaces each with a ``call_tir`` to a PrimFunc that launches the Triton GEMM template with
the epilogue fused, its tile sizes chosen by the evolutionary search (measured on the GPU, kept
in the tuning database).  Everything else is left to TVM.  Nothing is rewritten, and the reason
is logged, when the pattern's legality check fails (shapes, dtypes, transposes) or when this
process cannot embed kernels (no CUDA runtime in TVM, or no GPU to tune on: see
``tvm_stitch.codegen.embed.can_embed``).
"""

from __future__ import annotations

import logging
import math

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.codegen.embed import can_embed, linear_primfunc

logger = logging.getLogger("tvm_stitch.mcfuser")


def _patterns():
    x, w, b, r = wildcard(), wildcard(), wildcard(), wildcard()
    wt = is_op("relax.permute_dims")(w)
    mm = is_op("relax.matmul")(x, wt)
    lin = is_op("relax.add")(is_op("relax.astype")(mm) | mm, b)
    gelu = is_op("relax.nn.gelu")(lin)
    res = is_op("relax.add")(lin, r)
    return {"x": x, "w": w, "b": b, "r": r, "wt": wt, "lin": lin}, [
        (gelu, tk.GELU_ERF, False),
        (res, tk.GELU_NONE, True),
        (lin, tk.GELU_NONE, False),
    ]


def _shape(expr):
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (TypeError, ValueError):
        return None


def linear_legality(x, w, b, r, wt, out_dtype) -> str | None:
    """Why a matched Linear layer cannot become a Triton kernel, or None."""
    xs, ws, bs = _shape(x), _shape(w), _shape(b)
    if None in (xs, ws, bs):
        return "dynamic or unknown shapes"
    if len(ws) != 2 or bs != (ws[0],) or xs[-1] != ws[1]:
        return f"not a Linear layer: x {xs}, W {ws}, bias {bs}"
    axes = wt.attrs.axes
    if axes is not None and [int(a) for a in axes] != [1, 0]:
        return f"weight permuted by {list(axes)}"
    dtypes = {str(e.ty.dtype) for e in (x, w, b)}
    if dtypes != {out_dtype} or out_dtype not in ("float16", "float32"):
        return f"dtypes {sorted(dtypes)} -> {out_dtype}"
    if r is not None and _shape(r) != (*xs[:-1], ws[0]):
        return f"residual of shape {_shape(r)}"
    return None


class _Tuner:
    """Tile sizes per GEMM shape: tuning database first, else Algorithm 1 measured on the GPU."""

    def __init__(self, hw, database):
        self.hw, self.db = hw, database

    def config(self, m, n, k, dtype) -> dict:
        key = self.db.key("gemm", (m, n, k), dtype, self.hw.arch)
        rec = self.db.get(key)
        if rec is not None:
            return rec["config"]
        import torch

        from tvm_stitch.explore.tiling import ChainSpec
        from tvm_stitch.tune.evolution import SearchConfig
        from tvm_stitch.tune.measure import measured_search

        spec = ChainSpec.gemm(m, n, k, dtype_bytes=2 if dtype == "float16" else 4)
        tdt = getattr(torch, dtype)
        x = torch.randn(m, k, device="cuda", dtype=tdt)
        w = torch.randn(n, k, device="cuda", dtype=tdt)
        b = torch.randn(n, device="cuda", dtype=tdt)

        def make(cand):
            conf = tk.gemm_config(cand)
            warps = conf.pop("num_warps")
            return lambda: tk.run_gemm_epilogue(x, w, b, config=conf, num_warps=warps)

        _, res, seconds, _ = measured_search(
            spec,
            self.hw,
            make,
            tk.powers_of_two,
            SearchConfig(population=64, top_n=8, max_rounds=4),
        )
        config = tk.gemm_config(res.best)
        self.db.put(
            key,
            config,
            time_us=res.best_time * 1e6,
            search_s=seconds,
            correlation=res.correlation,
        )
        logger.info("gemm %dx%dx%d: %s, %.1f us", m, n, k, config, res.best_time * 1e6)
        return config


@tvm.transform.module_pass(opt_level=0, name="StitchFuseLinearTriton")
class FuseLinearTriton:
    """Replace Linear layers (+ GELU or + residual) with searched Triton kernels.

    Parameters
    ----------
    database : TuningDatabase, optional
        Where tuned tile sizes are kept (default: the user's tuning database).
    builder : callable, optional
        ``builder(m, n, k, dtype, has_res, gelu, config, num_warps) -> (PrimFunc,
        external_mods)``; default :func:`~tvm_stitch.codegen.embed.linear_primfunc`, which needs
        a GPU.  Tests pass another to check the rewrite on a CPU.
    """

    def __init__(self, database=None, builder=None):
        self.database = database
        self.builder = builder

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        builder = self.builder
        if builder is None:
            ok, why = can_embed()
            if not ok:
                logger.info("Triton GEMMs not used: %s; TVM keeps the Linear layers", why)
                return mod
            builder = linear_primfunc
        from tvm_stitch.hardware import HardwareModel
        from tvm_stitch.tune.database import TuningDatabase

        target = tvm.target.Target.current(allow_none=True)
        try:
            hw = HardwareModel.from_target(target)
        except ValueError as err:
            logger.info("Triton GEMMs not used: %s", err)
            return mod
        tuner = _Tuner(hw, self.database or TuningDatabase())
        builder_ctx = relax.BlockBuilder(mod)  # hands out typed GlobalVars for new PrimFuncs
        new_funcs: dict[str, relax.GlobalVar] = {}
        externals: list = list((mod.attrs or {}).get("external_mods", []))
        names, patterns = _patterns()

        def make_rewriter(gelu, has_res):
            def rewrite(expr, matches):
                x, w, b, wt = (matches[names[k]] for k in ("x", "w", "b", "wt"))
                r = matches[names["r"]] if has_res else None
                out_dtype = str(expr.ty.dtype)
                reason = linear_legality(x, w, b, r, wt, out_dtype)
                if reason:
                    logger.info("Linear layer left to TVM: %s", reason)
                    return expr
                xs, (n, k) = _shape(x), _shape(w)
                m = math.prod(xs[:-1])
                cfg = tuner.config(m, n, k, out_dtype)
                name = f"stitch_linear_{m}x{n}x{k}_g{gelu}_r{int(has_res)}_{out_dtype}"
                if name not in new_funcs:
                    func, ext = builder(
                        m,
                        n,
                        k,
                        out_dtype,
                        has_res,
                        gelu,
                        {key: cfg[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K")},
                        num_warps=cfg.get("num_warps", 4),
                    )
                    # opaque to FuseOps: the kernel is complete, nothing may be fused into it
                    func = func.with_attrs({"global_symbol": name, "op_pattern": 8})
                    new_funcs[name] = builder_ctx.add_func(func, name)
                    externals.extend(ext)
                gv = new_funcs[name]
                args = [relax.op.reshape(x, (m, k)), w, b]
                if r is not None:
                    args.append(relax.op.reshape(r, (m, n)))
                out = relax.call_tir(gv, args, relax.TensorType((m, n), out_dtype))
                return relax.op.reshape(out, (*xs[:-1], n))

            return rewrite

        rewritten = {}
        for gv, func in mod.functions.items():
            if isinstance(func, relax.Function):
                new = func
                for pattern, gelu, has_res in patterns:
                    new = rewrite_call(pattern, make_rewriter(gelu, has_res), new)
                rewritten[gv] = new
        if not new_funcs:
            return mod
        mod = builder_ctx.get()
        for gv, func in rewritten.items():
            mod[gv] = func
        mod = relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
        logger.info("%d Linear shapes run as Triton kernels", len(new_funcs))
        return mod.with_attr("external_mods", externals)
