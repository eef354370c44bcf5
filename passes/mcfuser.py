"""MCFuser's Relax integration: MBCI chains become searched Triton kernels.

Runs before ``LegalizeOps`` and rewrites, in this order:

* **attention** — ``matmul(q, kᵀ)`` [``astype``] [``* scale`` | ``/ scale``] [``+ mask``]
  ``softmax(axis=-1)`` ``matmul(·, v)`` [``astype``], optionally followed by the
  ``permute_dims``/``reshape`` that merges the heads: one kernel (online softmax).  Q, K and V
  are read where their producers wrote them: ``reshape``/``permute_dims`` chains that split the
  heads are folded into strides, and the merged output is written in place;
* **GEMM chains** — ``matmul(matmul(a, b)[astype], d)`` [``astype``] on (batch,) rows × cols;
* **Linear layers** — ``matmul(x, permute_dims(W))`` [``astype``] ``+ bias`` [``gelu`` |
  ``+ residual``]: one GEMM with the epilogue fused.

Each match is replaced by a ``call_tir`` to an opaque PrimFunc that launches the Triton
template with the tiles and launch options found by the evolutionary search (measured on the
GPU, kept in the tuning database: a second compile does no search).  Everything else is left to
TVM.  A match is left alone, with the reason logged, when its legality check fails (shapes,
dtypes, layouts), and the pass does nothing, with the reason logged, when this process cannot
embed kernels (see :func:`tvm_stitch.codegen.embed.can_embed`).
"""

from __future__ import annotations

import logging
import math
import zlib

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from tvm_stitch.codegen import embed
from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.codegen.embed import Param, View, can_embed, contiguous
from tvm_stitch.graph.tdg import static_shape

logger = logging.getLogger("tvm_stitch.mcfuser")

_FLOATS = ("float16", "float32")
_VIEW_OPS = ("relax.reshape", "relax.permute_dims")


def _shape(expr):
    return static_shape(expr.ty)


def _reshape(expr, shape, have=None):
    """``reshape(expr, shape)``, or ``expr`` itself when it has that shape (or ``have``) already."""
    shape = tuple(int(d) for d in shape)
    have = tuple(have) if have is not None else _shape(expr)
    return expr if have == shape else relax.op.reshape(expr, shape)


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


# -- patterns --------------------------------------------------------------------------------------
def _maybe_astype(p):
    return is_op("relax.astype")(p) | p


def _linear_patterns():
    x, w, b, r = wildcard(), wildcard(), wildcard(), wildcard()
    wt = is_op("relax.permute_dims")(w)
    lin = is_op("relax.add")(_maybe_astype(is_op("relax.matmul")(x, wt)), b)
    gelu = is_op("relax.nn.gelu")(lin)
    res = is_op("relax.add")(lin, r)
    names = {"x": x, "w": w, "b": b, "r": r, "wt": wt}
    return names, [
        (gelu, tk.GELU_ERF, False),
        (res, tk.GELU_NONE, True),
        (lin, tk.GELU_NONE, False),
    ]


def _attention_patterns():
    q, kt, v, mask, c = wildcard(), wildcard(), wildcard(), wildcard(), is_const()
    s = _maybe_astype(is_op("relax.matmul")(q, kt))
    mul, div = is_op("relax.multiply")(s, c), is_op("relax.divide")(s, c)
    scaled = mul | div | s
    names = {"q": q, "kt": kt, "v": v, "mask": mask, "c": c, "mul": mul, "div": div}
    out = []
    for has_mask in (True, False):
        probs = is_op("relax.nn.softmax")(is_op("relax.add")(scaled, mask) if has_mask else scaled)
        o = _maybe_astype(is_op("relax.matmul")(probs, v))
        perm = is_op("relax.permute_dims")(o)
        merged = is_op("relax.reshape")(perm, wildcard())
        out += [(merged, has_mask, perm, probs), (o, has_mask, None, probs)]
    return names, out


def _chain_pattern():
    a, b, d = wildcard(), wildcard(), wildcard()
    inner = _maybe_astype(is_op("relax.matmul")(a, b))
    return {"a": a, "b": b, "d": d}, _maybe_astype(is_op("relax.matmul")(inner, d))


# -- legality --------------------------------------------------------------------------------------
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
    dtypes = {_dtype(e) for e in (x, w, b)}
    if dtypes != {out_dtype} or out_dtype not in _FLOATS:
        return f"dtypes {sorted(dtypes)} -> {out_dtype}"
    if r is not None and _shape(r) != (*xs[:-1], ws[0]):
        return f"residual of shape {_shape(r)}"
    return None


def _view(expr, role: str, var2val) -> tuple[relax.Expr, View]:
    """The buffer ``expr`` lives in, following ``reshape``/``permute_dims`` back to a producer.

    Returns ``(base, view)``: ``base`` is the expression whose contiguous memory holds ``expr``
    and ``view`` its shape and strides inside it.  A reshape of a non-contiguous view stops the
    walk (that tensor must be materialised).
    """
    chain = []
    cur = expr
    while True:
        val = var2val.get(cur) if isinstance(cur, relax.Var) else cur
        if not isinstance(val, relax.Call) or getattr(val.op, "name", None) not in _VIEW_OPS:
            break
        if _shape(val.args[0]) is None or _dtype(val.args[0]) != _dtype(expr):
            break
        chain.append((cur, val))
        cur = val.args[0]
    base, shape = cur, _shape(cur)
    strides = contiguous(shape)
    for var, call in reversed(chain):
        if call.op.name == "relax.permute_dims":
            rank = len(shape)
            axes = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else None
            axes = axes if axes is not None else list(reversed(range(rank)))
            shape = tuple(shape[a] for a in axes)
            strides = tuple(strides[a] for a in axes)
        elif strides == contiguous(shape):
            shape = _shape(var)
            strides = contiguous(shape)
        else:  # reshaping a transposed view needs a copy: start from the reshape's result
            base, shape = var, _shape(var)
            strides = contiguous(shape)
    return base, View(Param(role, _shape(base), _dtype(base)), shape, strides)


def _broadcast(view: View, shape) -> View | None:
    """``view`` broadcast to ``shape`` (zero strides), or None if it does not broadcast."""
    if len(view.shape) > len(shape):
        return None
    pad = len(shape) - len(view.shape)
    dims, strides = (1,) * pad + view.shape, (0,) * pad + view.strides
    if any(d not in (1, t) for d, t in zip(dims, shape)):
        return None
    return View(
        view.param,
        tuple(shape),
        tuple(0 if d == 1 and t != 1 else s for d, s, t in zip(dims, strides, shape)),
    )


class _NotFusedError(Exception):
    """A match that cannot become a Triton kernel after all (the message says why)."""


class _Tuner:
    """Template configs per (family, shapes): tuning database first, else Algorithm 1."""

    def __init__(self, hw, database, on_device):
        self.hw, self.db, self.on_device = hw, database, on_device
        self.seen: dict[str, dict] = {}  # model-only choices of this compile

    def config(self, family: str, shape: tuple, dtype: str, tune) -> dict:
        key = self.db.key(family, shape, dtype, self.hw.arch)
        rec = self.db.get(key)
        if rec is not None:
            return rec["config"]
        if key in self.seen:
            return self.seen[key]
        try:
            tuned = tune(on_device=self.on_device)
        except ValueError as err:  # an empty search space: TVM keeps the operator
            raise _NotFusedError(f"no {family} tiling for {shape}: {err}") from err
        if self.on_device:  # model-only choices are not kept: a GPU compile measures them
            self.db.put(
                key,
                tuned.config,
                time_us=tuned.time * 1e6,
                search_s=tuned.seconds,
                correlation=tuned.result.correlation,
            )
        logger.info(
            "%s %s %s: %s, %.1f us (%s)",
            family,
            "x".join(map(str, shape)),
            dtype,
            tuned.config,
            tuned.time * 1e6,
            "measured" if self.on_device else "model",
        )
        self.seen[key] = tuned.config
        return tuned.config


def embed_builder(family: str, **kwargs):
    """Build the PrimFunc launching a Triton template and its CUDA module (needs a GPU runtime).

    ``family`` is ``"linear"``, ``"attention"`` or ``"chain"``; ``kwargs`` are the arguments of
    :func:`~tvm_stitch.codegen.embed.linear_launch`, ``attention_launch`` or ``chain_launch``.
    Returns ``(prim_func, external_mods)``.
    """
    make = {
        "linear": embed.linear_launch,
        "attention": embed.attention_launch,
        "chain": embed.chain_launch,
    }[family]
    launch = make(**kwargs)
    return launch.func, [launch.module()]


@tvm.transform.module_pass(opt_level=0, name="StitchFuseMBCI")
class FuseMBCI:
    """Replace attention, GEMM chains and Linear layers (+ GELU / + residual) with searched
    Triton kernels.

    Parameters
    ----------
    database : TuningDatabase, optional
        Where tuned configurations are kept (default: the user's tuning database).
    builder : callable, optional
        ``builder(family, **kwargs) -> (PrimFunc, external_mods)``; default
        :func:`embed_builder`, which needs a GPU.  Tests pass another to check the rewrite on a
        CPU; the tiles then come from the database or, without a GPU, the analytical model.
    families : tuple of str
        Which of ``"attention"``, ``"chain"``, ``"linear"`` to rewrite.
    """

    def __init__(self, database=None, builder=None, families=("attention", "chain", "linear")):
        unknown = set(families) - {"attention", "chain", "linear"}
        if unknown:
            raise ValueError(f"unknown MBCI families {sorted(unknown)}")
        self.database = database
        self.builder = builder
        self.families = tuple(families)

    def transform_module(self, mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        from tvm_stitch.hardware import HardwareModel
        from tvm_stitch.tune.database import TuningDatabase

        on_device, why = can_embed()
        builder = self.builder
        if builder is None:
            if not on_device:
                logger.info("Triton kernels not used: %s; TVM keeps every operator", why)
                return mod
            builder = embed_builder
        target = tvm.target.Target.current(allow_none=True)
        try:
            hw = HardwareModel.from_target(target)
        except ValueError as err:
            logger.info("Triton kernels not used: %s", err)
            return mod
        rewriter = _Rewriter(mod, builder, _Tuner(hw, self.database or TuningDatabase(), on_device))
        return rewriter.run(self.families)


class _Rewriter:
    """One pass over a module: rewrites matches, collects the new PrimFuncs and CUDA modules."""

    def __init__(self, mod, builder, tuner):
        self.mod, self.builder, self.tuner = mod, builder, tuner
        self.ctx = relax.BlockBuilder(mod)  # hands out typed GlobalVars for new PrimFuncs
        self.funcs: dict[str, relax.GlobalVar] = {}
        self.externals = list((mod.attrs or {}).get("external_mods", []))
        self.counts: dict[str, int] = {}

    def run(self, families) -> tvm.IRModule:
        rewritten = {}
        for gv, func in self.mod.functions.items():
            if not isinstance(func, relax.Function):
                continue
            new = func
            if "attention" in families:
                names, patterns = _attention_patterns()
                for pattern, has_mask, perm, probs in patterns:
                    var2val = relax.analysis.get_var2val(new)
                    rewrite = self._attention(names, has_mask, perm, probs, var2val)
                    new = rewrite_call(pattern, _guarded("attention", rewrite), new)
            if "chain" in families:
                names, pattern = _chain_pattern()
                new = rewrite_call(pattern, _guarded("GEMM chain", self._chain(names)), new)
            if "linear" in families:
                names, patterns = _linear_patterns()
                for pattern, gelu, has_res in patterns:
                    rewrite = self._linear(names, gelu, has_res)
                    new = rewrite_call(pattern, _guarded("Linear layer", rewrite), new)
            rewritten[gv] = new
        if not self.funcs:
            return self.mod
        mod = self.ctx.get()
        for gv, func in rewritten.items():
            mod[gv] = _collapse_reshapes(func)
        mod = relax.transform.DeadCodeElimination()(relax.transform.Normalize()(mod))
        logger.info("Triton kernels: %s", ", ".join(f"{v} {k}" for k, v in self.counts.items()))
        return mod.with_attr("external_mods", self.externals)

    def _call(self, family, name, kwargs, args, out_shape, out_dtype):
        """``call_tir`` of the PrimFunc ``name`` (built once per distinct kernel)."""
        if name not in self.funcs:
            func, ext = self.builder(family, **kwargs)
            # opaque to FuseOps: the kernel is complete, nothing may be fused into it
            func = func.with_attrs({"global_symbol": name, "op_pattern": 8})
            self.funcs[name] = self.ctx.add_func(func, name)
            self.externals.extend(ext)
        self.counts[family] = self.counts.get(family, 0) + 1
        return relax.call_tir(self.funcs[name], args, relax.TensorType(tuple(out_shape), out_dtype))

    # -- Linear layers ---------------------------------------------------------------------------
    def _linear(self, names, gelu, has_res):
        def rewrite(expr, matches):
            x, w, b, wt = (matches[names[k]] for k in ("x", "w", "b", "wt"))
            r = matches[names["r"]] if has_res else None
            out_dtype = _dtype(expr)
            reason = linear_legality(x, w, b, r, wt, out_dtype)
            if reason:
                logger.info("Linear layer left to TVM: %s", reason)
                return expr
            xs, (n, k) = _shape(x), _shape(w)
            m = math.prod(xs[:-1])
            cfg = self.tuner.config(
                "gemm",
                (m, n, k),
                out_dtype,
                lambda **kw: _kernels().tune_gemm(m, n, k, out_dtype, self.tuner.hw, **kw),
            )
            name = f"stitch_linear_{m}x{n}x{k}_g{gelu}_r{int(has_res)}_{out_dtype}"
            kwargs = dict(m=m, n=n, k=k, dtype=out_dtype, has_res=has_res, gelu=gelu, config=cfg)
            args = [_reshape(x, (m, k)), w, b]
            if r is not None:
                args.append(_reshape(r, (m, n)))
            out = self._call("linear", name, kwargs, args, (m, n), out_dtype)
            return _reshape(out, (*xs[:-1], n), have=(m, n))

        return rewrite

    # -- GEMM chains -----------------------------------------------------------------------------
    def _chain(self, names):
        def rewrite(expr, matches):
            a, b, d = (matches[names[k]] for k in "abd")
            shapes = [_shape(t) for t in (a, b, d)]
            dtype = _dtype(expr)
            reason = None
            if None in shapes:
                reason = "dynamic or unknown shapes"
            elif {len(s) for s in shapes} - {2, 3} or len({len(s) for s in shapes}) != 1:
                reason = f"ranks {[len(s) for s in shapes]} (2-D or 3-D operands only)"
            elif len(shapes[0]) == 3 and len({s[0] for s in shapes}) != 1:
                reason = f"batch dimensions differ: {shapes}"
            elif {_dtype(t) for t in (a, b, d)} != {dtype} or dtype not in _FLOATS:
                reason = f"dtypes {[_dtype(t) for t in (a, b, d)]} -> {dtype}"
            if reason:
                logger.info("GEMM chain left to TVM: %s", reason)
                return expr
            sa, sb, sd = ((1, *s) if len(s) == 2 else s for s in shapes)
            batch, m, k = sa
            n, h = sb[2], sd[2]
            cfg = self.tuner.config(
                "chain",
                (batch, m, n, k, h),
                dtype,
                lambda **kw: _kernels().tune_chain(batch, m, n, k, h, dtype, self.tuner.hw, **kw),
            )
            name = f"stitch_chain_{batch}x{m}x{n}x{k}x{h}_{dtype}"
            kwargs = dict(batch=batch, m=m, n=n, k=k, h=h, dtype=dtype, config=cfg)
            args = [_reshape(t, s) for t, s in zip((a, b, d), (sa, sb, sd))]
            out = self._call("chain", name, kwargs, args, (batch, m, h), dtype)
            return _reshape(out, _shape(expr), have=(batch, m, h))

        return rewrite

    # -- attention -------------------------------------------------------------------------------
    def _attention(self, names, has_mask, perm_pat, probs_pat, var2val):
        def rewrite(expr, matches):
            probs = matches[probs_pat]
            axis = int(probs.attrs.axis)
            if axis != -1 and axis != len(_shape(probs) or ()) - 1:
                logger.info("attention left to TVM: softmax over axis %d, not the last", axis)
                return expr
            reason, call = self._attention_call(names, has_mask, perm_pat, var2val, expr, matches)
            if reason:
                logger.info("attention left to TVM: %s", reason)
                return expr
            return call

        return rewrite

    def _attention_call(self, names, has_mask, perm_pat, var2val, expr, matches):
        q, kt, v = (matches[names[k]] for k in ("q", "kt", "v"))
        qs, ks, vs = _shape(q), _shape(kt), _shape(v)
        if None in (qs, ks, vs, _shape(expr)):
            return "dynamic or unknown shapes", None
        rank = len(qs)
        if rank not in (3, 4) or {len(ks), len(vs)} != {rank}:
            return f"ranks {len(qs)}, {len(ks)}, {len(vs)} (3-D or 4-D only)", None
        if not (qs[:-2] == ks[:-2] == vs[:-2] and qs[-1] == ks[-2] and ks[-1] == vs[-2]):
            return f"shapes q {qs}, kT {ks}, v {vs} are not one attention", None
        dtype = _dtype(q)
        out_dtype = _dtype(expr)
        if (
            {_dtype(kt), _dtype(v), dtype} != {dtype}
            or dtype not in _FLOATS
            or out_dtype not in _FLOATS
        ):
            return f"dtypes q/k/v {dtype}, {_dtype(kt)}, {_dtype(v)} -> {out_dtype}", None
        scale = 1.0
        for key, invert in (("mul", False), ("div", True)):
            if names[key] in matches:
                const = matches[names["c"]].value.numpy()
                if const.size != 1:
                    return "the scale is not a scalar", None
                scale = 1.0 / float(const.reshape(())) if invert else float(const.reshape(()))
        m, dk, n, dh = qs[-2], qs[-1], ks[-1], vs[-1]
        scores = (*qs[:-1], n)

        roles: dict = {}

        def view(e, role):
            base, vw = _view(e, role, var2val)
            for known, param in roles.items():
                if known.same_as(base):
                    return known, View(param, vw.shape, vw.strides)
            roles[base] = vw.param
            return base, vw

        _, qv = view(q, "q")
        _, ktv = view(kt, "k")
        kv = View(
            ktv.param,
            (*ktv.shape[:-2], ktv.shape[-1], ktv.shape[-2]),
            (*ktv.strides[:-2], ktv.strides[-1], ktv.strides[-2]),
        )
        _, vv = view(v, "v")
        mv = None
        if has_mask:
            mask = matches[names["mask"]]
            if _shape(mask) is None or _dtype(mask) not in _FLOATS:
                return "the mask has an unknown shape or a non-float dtype", None
            _, mv0 = view(mask, "mask")
            mv = _broadcast(mv0, scores)
            if mv is None:
                return f"a mask of shape {_shape(mask)} does not broadcast to {scores}", None
        out_shape = _shape(expr)
        o_shape = (*qs[:-1], dh)
        if perm_pat is not None:
            perm = matches[perm_pat]
            axes = perm.attrs.axes
            axes = [int(a) for a in axes] if axes is not None else list(reversed(range(rank)))
            p_strides = contiguous(tuple(o_shape[a] for a in axes))
            o_strides = [0] * rank
            for i, a in enumerate(axes):
                o_strides[a] = p_strides[i]
            if o_strides[-1] != 1:
                return f"the heads are merged with axes {axes}, leaving the head dim strided", None
        else:
            o_strides = contiguous(o_shape)
        ov = View(Param("out", out_shape, out_dtype), o_shape, tuple(o_strides))
        batch = math.prod(qs[:-2])
        cfg = self.tuner.config(
            "attention",
            (batch, m, n, dk, dh, int(has_mask)),
            dtype,
            lambda **kw: _kernels().tune_attention(
                batch, m, n, dk, dh, dtype, self.tuner.hw, mask=has_mask, **kw
            ),
        )
        kwargs = dict(q=qv, k=kv, v=vv, out=ov, mask=mv, scale=scale, config=cfg)
        # layers with the same shapes, layouts and scale share one PrimFunc
        key = zlib.crc32(repr(sorted(kwargs.items())).encode())
        name = f"stitch_attention_{batch}x{m}x{n}x{dk}x{dh}_{out_dtype}_{key:08x}"
        return None, self._call("attention", name, kwargs, list(roles), out_shape, out_dtype)


def _collapse_reshapes(func: relax.Function) -> relax.Function:
    """``reshape(reshape(x, a), b)`` -> ``reshape(x, b)``, and ``reshape(x, shape of x)`` -> ``x``.

    Kernel calls take 2-D operands, so consecutive Linear layers meet as reshape pairs
    (2-D -> 3-D -> 2-D); fused by ``FuseOps`` such a pair becomes a copy kernel instead of a view.
    """
    x = wildcard()
    inner = is_op("relax.reshape")(x, wildcard())
    outer = is_op("relax.reshape")(inner, wildcard())
    single = is_op("relax.reshape")(x, wildcard())

    def fold(expr, matches):
        return _reshape(matches[x], _shape(expr)) if _shape(expr) else expr

    def drop(expr, matches):
        return matches[x] if _shape(matches[x]) == _shape(expr) is not None else expr

    return rewrite_call(single, drop, rewrite_call(outer, fold, func))


def _guarded(what: str, rewrite):
    """``rewrite``, leaving the match to TVM (reason logged) on :class:`_NotFusedError`."""

    def run(expr, matches):
        try:
            return rewrite(expr, matches)
        except _NotFusedError as err:
            logger.info("%s left to TVM: %s", what, err)
            return expr

    return run


def _kernels():
    from tvm_stitch.tune import kernels

    return kernels
