"""Subgraph workloads: memory-intensive patterns of a transformer layer, MCFuser's GEMM chains
(Table II) and self-attention modules (Table III).

Each builder returns an :class:`~tvm_stitch.workloads.base.Instance` whose Relax module is written
with ``relax.op`` exactly as a framework importer would emit it, and whose PyTorch functions have
the same meaning.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from tvm import relax
from tvm.script import relax as R

from tvm_stitch.analysis.indexing import HALF

from .base import Instance, Workload

LN_EPS = 1e-5


def relax_function(params, body, name="main"):
    """A one-function Relax module: ``params`` = [(name, shape, dtype)], ``body(*vars) -> [exprs]``.

    Every expression ``body`` returns is emitted in order; the last one is the output.
    """
    bb = relax.BlockBuilder()
    rvars = [relax.Var(n, R.Tensor(tuple(shape), dtype)) for n, shape, dtype in params]
    with bb.function(name, rvars):
        with bb.dataflow():
            exprs = body(*rvars)
            for e in exprs[:-1]:
                bb.emit(e)
            out = bb.emit_output(exprs[-1])
        bb.emit_func_output(out)
    return bb.get()


def _matmul(a, b, dtype):
    """``a @ b``; 16-bit floats accumulate in float32 and cast back, as cuBLAS does for
    PyTorch."""
    if dtype in HALF:
        return relax.op.astype(relax.op.matmul(a, b, out_dtype="float32"), dtype)
    return relax.op.matmul(a, b)


def _nbytes(*arrays_or_specs) -> int:
    total = 0
    for shape, dtype in arrays_or_specs:
        total += int(np.prod(shape)) * np.dtype(dtype).itemsize
    return total


def _rand(rng, shape, dtype, scale=1.0, offset=0.0):
    return (rng.standard_normal(shape) * scale + offset).astype(dtype)


# -- memory-intensive patterns ---------------------------------------------------------------------
def _layernorm(dtype, rng, rows, cols, transposed=False):
    """``relax.nn.layer_norm`` over the last axis; with ``transposed`` the input is (cols, rows)
    (channels first) and the LayerNorm reads it through a transpose (TVM's default: a transpose
    kernel, then the LayerNorm)."""
    x = _rand(rng, (cols, rows) if transposed else (rows, cols), dtype)
    w, b = _rand(rng, (cols,), dtype, 0.1, 1.0), _rand(rng, (cols,), dtype, 0.1)

    def body(x_, w_, b_):
        t = relax.op.permute_dims(x_, [1, 0]) if transposed else x_
        ln = relax.op.nn.layer_norm(t, w_, b_, axes=[-1], epsilon=LN_EPS)
        return [t, ln] if transposed else [ln]

    params = [("x", x.shape, dtype), ("w", w.shape, dtype), ("b", b.shape, dtype)]
    mod = relax_function(params, body)

    def eager(device, tdtype):
        import torch.nn.functional as F

        def fn(x_, w_, b_):
            return F.layer_norm(x_.t() if transposed else x_, (cols,), w_, b_, LN_EPS)

        return fn

    io = _nbytes((x.shape, dtype), (x.shape, dtype), (w.shape, dtype), (b.shape, dtype))
    name = "transpose-layernorm" if transposed else "layernorm"
    return Instance(
        f"{name} {rows}x{cols} {dtype}", mod, "main", [x, w, b], {"eager": eager}, 0, io, dtype
    )


def _layernorm_ops(dtype, rng, rows, cols):
    """LayerNorm written as separate ops: mean, subtract, square, mean, rsqrt, scale, shift."""
    x = _rand(rng, (rows, cols), dtype)
    w, b = _rand(rng, (cols,), dtype, 0.1, 1.0), _rand(rng, (cols,), dtype, 0.1)
    eps = relax.const(LN_EPS, dtype)

    def body(x_, w_, b_):
        mean = relax.op.mean(x_, axis=[-1], keepdims=True)
        d = relax.op.subtract(x_, mean)
        var = relax.op.mean(relax.op.multiply(d, d), axis=[-1], keepdims=True)
        inv = relax.op.rsqrt(relax.op.add(var, eps))
        return [relax.op.add(relax.op.multiply(relax.op.multiply(d, inv), w_), b_)]

    params = [("x", x.shape, dtype), ("w", w.shape, dtype), ("b", b.shape, dtype)]
    mod = relax_function(params, body)

    def eager(device, tdtype):
        import torch

        def fn(x_, w_, b_):
            d = x_ - x_.mean(-1, keepdim=True)
            return d * torch.rsqrt((d * d).mean(-1, keepdim=True) + LN_EPS) * w_ + b_

        return fn

    io = _nbytes((x.shape, dtype), (x.shape, dtype), (w.shape, dtype), (b.shape, dtype))
    return Instance(
        f"layernorm-ops {rows}x{cols} {dtype}",
        mod,
        "main",
        [x, w, b],
        {"eager": eager},
        0,
        io,
        dtype,
    )


def _add_layernorm(dtype, rng, rows, cols):
    """Bias + residual add + LayerNorm (the end of BERT's attention and FFN blocks)."""
    x, r = _rand(rng, (rows, cols), dtype), _rand(rng, (rows, cols), dtype)
    bias = _rand(rng, (cols,), dtype, 0.1)
    w, b = _rand(rng, (cols,), dtype, 0.1, 1.0), _rand(rng, (cols,), dtype, 0.1)
    params = [
        ("x", x.shape, dtype),
        ("bias", (cols,), dtype),
        ("residual", r.shape, dtype),
        ("w", (cols,), dtype),
        ("b", (cols,), dtype),
    ]

    def body(x_, bias_, r_, w_, b_):
        h = relax.op.add(relax.op.add(x_, bias_), r_)
        return [relax.op.nn.layer_norm(h, w_, b_, axes=[-1], epsilon=LN_EPS)]

    def eager(device, tdtype):
        import torch.nn.functional as F

        return lambda x_, bias_, r_, w_, b_: F.layer_norm(x_ + bias_ + r_, (cols,), w_, b_, LN_EPS)

    io = _nbytes(*((s, dtype) for _, s, _ in params), (x.shape, dtype))
    return Instance(
        f"add-layernorm {rows}x{cols} {dtype}",
        relax_function(params, body),
        "main",
        [x, bias, r, w, b],
        {"eager": eager},
        0,
        io,
        dtype,
    )


def _softmax(dtype, rng, rows, cols):
    x = _rand(rng, (rows, cols), dtype, 2.0)
    mod = relax_function([("x", x.shape, dtype)], lambda x_: [relax.op.nn.softmax(x_, axis=-1)])

    def eager(device, tdtype):
        import torch

        return lambda x_: torch.softmax(x_, dim=-1)

    io = _nbytes((x.shape, dtype), (x.shape, dtype))
    return Instance(
        f"softmax {rows}x{cols} {dtype}", mod, "main", [x], {"eager": eager}, 0, io, dtype
    )


def _softmax_ops(dtype, rng, rows, cols):
    """Attention-score softmax written as separate ops: scale, additive mask, max, subtract, exp,
    sum, divide; float16 inputs are cast to float32 and the result back."""
    x = _rand(rng, (rows, cols), dtype, 2.0)
    mask = np.where(rng.random((1, cols)) < 0.2, -10000.0, 0.0).astype(dtype)
    scale = 0.125

    def body(x_, m_):
        f32 = dtype != "float32"
        s = relax.op.astype(x_, "float32") if f32 else x_
        m = relax.op.astype(m_, "float32") if f32 else m_
        s = relax.op.add(relax.op.multiply(s, relax.const(scale, "float32")), m)
        e = relax.op.exp(relax.op.subtract(s, relax.op.max(s, axis=[-1], keepdims=True)))
        y = relax.op.divide(e, relax.op.sum(e, axis=[-1], keepdims=True))
        return [relax.op.astype(y, dtype) if f32 else y]

    def eager(device, tdtype):
        import torch

        return lambda x_, m_: torch.softmax(x_.float() * scale + m_.float(), dim=-1).to(x_.dtype)

    params = [("x", x.shape, dtype), ("mask", mask.shape, dtype)]
    io = _nbytes((x.shape, dtype), (mask.shape, dtype), (x.shape, dtype))
    return Instance(
        f"softmax-ops {rows}x{cols} {dtype}",
        relax_function(params, body),
        "main",
        [x, mask],
        {"eager": eager},
        0,
        io,
        dtype,
    )


def _bias_gelu(dtype, rng, rows, cols, tanh=0):
    x, b = _rand(rng, (rows, cols), dtype), _rand(rng, (cols,), dtype, 0.1)
    gelu = relax.op.nn.gelu_tanh if tanh else relax.op.nn.gelu
    mod = relax_function(
        [("x", x.shape, dtype), ("b", b.shape, dtype)], lambda x_, b_: [gelu(relax.op.add(x_, b_))]
    )

    def eager(device, tdtype):
        import torch.nn.functional as F

        approximate = "tanh" if tanh else "none"
        return lambda x_, b_: F.gelu(x_ + b_, approximate=approximate)

    io = _nbytes((x.shape, dtype), (b.shape, dtype), (x.shape, dtype))
    form = "tanh" if tanh else "erf"
    return Instance(
        f"bias-gelu-{form} {rows}x{cols} {dtype}",
        mod,
        "main",
        [x, b],
        {"eager": eager},
        0,
        io,
        dtype,
    )


def _rmsnorm(dtype, rng, rows, cols):
    x, w = _rand(rng, (rows, cols), dtype), _rand(rng, (cols,), dtype, 0.1, 1.0)
    mod = relax_function(
        [("x", x.shape, dtype), ("w", w.shape, dtype)],
        lambda x_, w_: [relax.op.nn.rms_norm(x_, w_, axes=[-1], epsilon=LN_EPS)],
    )

    def eager(device, tdtype):
        import torch

        return lambda x_, w_: x_ * torch.rsqrt((x_ * x_).mean(-1, keepdim=True) + LN_EPS) * w_

    io = _nbytes((x.shape, dtype), (w.shape, dtype), (x.shape, dtype))
    return Instance(
        f"rmsnorm {rows}x{cols} {dtype}", mod, "main", [x, w], {"eager": eager}, 0, io, dtype
    )


def _mean_pool(dtype, rng, batch, seq, hidden):
    """Masked mean pooling over the sequence (sentence embeddings), as ``torch.export`` of
    ``(h * m).sum(1) / m.sum(1).clamp(min=1e-9)`` with ``m`` the mask broadcast to ``h``: two
    column reductions (the sequence is not the innermost axis) over one input space."""
    h = _rand(rng, (batch, seq, hidden), dtype)
    lengths = rng.integers(1, seq + 1, size=batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype("int64")

    def body(h_, m_):
        m = relax.op.astype(
            relax.op.broadcast_to(relax.op.expand_dims(m_, axis=[-1]), (batch, seq, hidden)), dtype
        )
        total = relax.op.sum(relax.op.multiply(h_, m), axis=[1])
        count = relax.op.clip(relax.op.sum(m, axis=[1]), 1e-9, float("inf"))
        return [relax.op.divide(total, count)]

    mod = relax_function([("h", h.shape, dtype), ("mask", mask.shape, "int64")], body)

    def eager(device, tdtype):
        def fn(h_, m_):
            m = m_.unsqueeze(-1).expand(h_.shape).to(h_.dtype)
            return (h_ * m).sum(1) / m.sum(1).clamp(min=1e-9)

        return fn

    io = _nbytes((h.shape, dtype), (mask.shape, "int64"), ((batch, hidden), dtype))
    return Instance(
        f"mean-pool {batch}x{seq}x{hidden} {dtype}", mod, "main", [h, mask], {"eager": eager},
        0, io, dtype,
    )


def _column_mean(dtype, rng, rows, cols):
    """``x.mean(0)``: a mean over the rows, one value per column (a BatchNorm's statistics)."""
    x = _rand(rng, (rows, cols), dtype, 1.0, 0.5)
    mod = relax_function([("x", x.shape, dtype)], lambda x_: [relax.op.mean(x_, axis=[0])])

    def eager(device, tdtype):
        return lambda x_: x_.mean(0)

    io = _nbytes((x.shape, dtype), ((cols,), dtype))
    return Instance(
        f"column-mean {rows}x{cols} {dtype}", mod, "main", [x], {"eager": eager}, 0, io, dtype
    )


def _rotary(dtype, rng, batch, seq, heads, dim):
    """Rotary embedding of a projection's output as LLaMA's import writes it: ``(batch·seq,
    heads·dim)`` viewed as heads, moved to ``(batch, heads, seq, dim)``, then
    ``x·cos + rotate_half(x)·sin`` (``rotate_half``: the two halves swapped, the first negated:
    reads shifted by half a head)."""
    x = _rand(rng, (batch * seq, heads * dim), dtype)
    angles = np.arange(seq)[:, None] / 10000.0 ** (np.arange(0, dim, 2) / dim)[None, :]
    angles = np.concatenate([angles, angles], -1)[None, None]
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    half = dim // 2

    def body(x_, c_, s_):
        q = relax.op.permute_dims(relax.op.reshape(x_, (batch, seq, heads, dim)), [0, 2, 1, 3])
        first = relax.op.strided_slice(q, axes=[3], begin=[0], end=[half])
        second = relax.op.strided_slice(q, axes=[3], begin=[half], end=[dim])
        rotated = relax.op.concat([relax.op.negative(second), first], axis=3)
        return [relax.op.add(relax.op.multiply(q, c_), relax.op.multiply(rotated, s_))]

    mod = relax_function(
        [("x", x.shape, dtype), ("cos", cos.shape, dtype), ("sin", sin.shape, dtype)], body
    )

    def eager(device, tdtype):
        import torch

        def fn(x_, c_, s_):
            q = x_.view(batch, seq, heads, dim).transpose(1, 2)
            rotated = torch.cat([-q[..., half:], q[..., :half]], -1)
            return q * c_ + rotated * s_

        return fn

    io = _nbytes((x.shape, dtype), (cos.shape, dtype), (sin.shape, dtype), (x.shape, dtype))
    return Instance(
        f"rotary {batch}x{seq}x{heads}x{dim} {dtype}", mod, "main", [x, cos, sin],
        {"eager": eager}, 0, io, dtype,
    )


def _qk_norms(dtype, rng, batch, seq, heads, kv_heads, dim):
    """Qwen3's per-head query and key RMSNorms, each of a projection's output viewed as heads
    and moved to ``(batch, heads, seq, dim)``: two independent patterns, each written through
    its transpose, of different row counts where the keys have fewer heads (GQA)."""
    q = _rand(rng, (batch * seq, heads * dim), dtype)
    k = _rand(rng, (batch * seq, kv_heads * dim), dtype)
    wq, wk = (_rand(rng, (dim,), dtype, 0.1, 1.0) for _ in range(2))

    def body(q_, k_, wq_, wk_):
        def norm(x, n, w):
            x = relax.op.reshape(x, (batch, seq, n, dim))
            return relax.op.permute_dims(relax.op.nn.rms_norm(x, w, axes=[-1], epsilon=LN_EPS),
                                         [0, 2, 1, 3])

        return [relax.Tuple([norm(q_, heads, wq_), norm(k_, kv_heads, wk_)])]

    params = [("q", q.shape, dtype), ("k", k.shape, dtype), ("wq", wq.shape, dtype),
              ("wk", wk.shape, dtype)]
    mod = relax_function(params, body)

    def eager(device, tdtype):
        import torch

        def norm(x, n, w):
            x = x.view(batch, seq, n, dim)
            return (x * torch.rsqrt((x * x).mean(-1, keepdim=True) + LN_EPS) * w).transpose(1, 2)

        return lambda q_, k_, wq_, wk_: (norm(q_, heads, wq_), norm(k_, kv_heads, wk_))

    io = 2 * _nbytes((q.shape, dtype), (k.shape, dtype))
    return Instance(
        f"qk-norms {batch}x{seq}x{heads}/{kv_heads}x{dim} {dtype}", mod, "main", [q, k, wq, wk],
        {"eager": eager}, 0, io, dtype,
    )


def _mask_layernorms(dtype, rng, batch, seq, hidden):
    """A mask broadcast from ``(batch, 1, hidden)`` added before two LayerNorms that a GEMM
    keeps apart: the explorer recomputes the broadcast in both patterns (nobody writes it);
    the greedy rule writes it in the first and reads it back in the second."""
    x = _rand(rng, (batch, seq, hidden), dtype)
    m = _rand(rng, (batch, 1, hidden), dtype, 0.1)
    w = _rand(rng, (hidden, hidden), dtype, hidden ** -0.5)
    g, b = _rand(rng, (hidden,), dtype, 0.1, 1.0), _rand(rng, (hidden,), dtype, 0.1)

    def body(x_, m_, w_, g_, b_):
        mask = relax.op.broadcast_to(m_, (batch, seq, hidden))
        first = relax.op.nn.layer_norm(relax.op.add(x_, mask), g_, b_, axes=[-1], epsilon=LN_EPS)
        h = _matmul(first, w_, dtype)
        return [relax.op.nn.layer_norm(relax.op.add(h, mask), g_, b_, axes=[-1], epsilon=LN_EPS)]

    params = [("x", x.shape, dtype), ("m", m.shape, dtype), ("w", w.shape, dtype),
              ("g", g.shape, dtype), ("b", b.shape, dtype)]
    mod = relax_function(params, body)

    def eager(device, tdtype):
        import torch.nn.functional as F

        def fn(x_, m_, w_, g_, b_):
            mask = m_.expand(batch, seq, hidden)
            first = F.layer_norm(x_ + mask, (hidden,), g_, b_, LN_EPS)
            return F.layer_norm(first @ w_ + mask, (hidden,), g_, b_, LN_EPS)

        return fn

    io = _nbytes((x.shape, dtype), (m.shape, dtype), (w.shape, dtype), (x.shape, dtype))
    flops = 2 * batch * seq * hidden * hidden
    return Instance(
        f"mask-layernorms {batch}x{seq}x{hidden} {dtype}", mod, "main", [x, m, w, g, b],
        {"eager": eager}, flops, io, dtype,
    )


# -- MCFuser Table II: batched GEMM chains E = (A·B)·D ---------------------------------------------
#: name -> (batch, M, N, K, H): A is (batch, M, K), B (batch, K, N), D (batch, N, H).
GEMM_CHAINS = {
    "G1": (1, 512, 256, 64, 64),
    "G2": (1, 512, 256, 64, 128),
    "G3": (1, 512, 256, 64, 256),
    "G4": (1, 512, 512, 256, 256),
    "G5": (1, 512, 512, 512, 256),
    "G6": (1, 512, 512, 1024, 256),
    "G7": (1, 512, 512, 128, 128),
    "G8": (1, 1024, 512, 128, 128),
    "G9": (1, 2048, 512, 128, 128),
    "G10": (1, 1024, 1024, 128, 128),
    "G11": (4, 1024, 1024, 128, 128),
    "G12": (8, 1024, 1024, 128, 128),
}

#: name -> (heads, M, N, K, H): Q is (heads, M, K), K (heads, N, K), V (heads, N, H).
ATTENTION = {
    "S1": (8, 512, 512, 64, 64),
    "S2": (12, 512, 512, 64, 64),
    "S3": (16, 512, 512, 64, 64),
    "S4": (12, 256, 256, 64, 64),
    "S5": (16, 256, 256, 64, 64),
    "S6": (16, 256, 256, 80, 80),
    "S7": (1, 512, 256, 64, 64),
    "S8": (1, 768, 384, 64, 64),
    "S9": (1, 1024, 512, 64, 64),
}


def _gemm_chain(name):
    def build(dtype, rng, batch, m, n, k, h):
        a = _rand(rng, (batch, m, k), dtype, 1 / math.sqrt(k))
        b = _rand(rng, (batch, k, n), dtype, 1.0)
        d = _rand(rng, (batch, n, h), dtype, 1 / math.sqrt(n))
        params = [("a", a.shape, dtype), ("b", b.shape, dtype), ("d", d.shape, dtype)]
        mod = relax_function(
            params,
            lambda a_, b_, d_: [_matmul(_matmul(a_, b_, dtype), d_, dtype)],
        )

        def eager(device, tdtype):
            import torch

            return lambda a_, b_, d_: torch.bmm(torch.bmm(a_, b_), d_)

        flops = 2 * batch * m * n * (k + h)
        io = _nbytes(*((s, dtype) for _, s, _ in params), ((batch, m, h), dtype))
        return Instance(
            f"{name} {batch}x{m}x{n}x{k}x{h} {dtype}",
            mod,
            "main",
            [a, b, d],
            {"eager": eager},
            flops,
            io,
            dtype,
        )

    batch, m, n, k, h = GEMM_CHAINS[name]
    return Workload(
        name,
        "gemm-chain",
        f"MCFuser {name}: (A·B)·D, batch={batch} M={m} N={n} K={k} H={h}",
        {"batch": batch, "m": m, "n": n, "k": k, "h": h},
        build,
    )


def _attention(name):
    def build(dtype, rng, heads, m, n, k, h):
        q = _rand(rng, (heads, m, k), dtype)
        kk = _rand(rng, (heads, n, k), dtype)
        v = _rand(rng, (heads, n, h), dtype)
        scale = 1.0 / math.sqrt(k)
        params = [("q", q.shape, dtype), ("k", kk.shape, dtype), ("v", v.shape, dtype)]

        def body(q_, k_, v_):
            s = _matmul(q_, relax.op.permute_dims(k_, [0, 2, 1]), dtype)
            s = relax.op.multiply(s, relax.const(scale, dtype))
            return [_matmul(relax.op.nn.softmax(s, axis=-1), v_, dtype)]

        def eager(device, tdtype):
            import torch

            return lambda q_, k_, v_: torch.softmax(q_ @ k_.transpose(1, 2) * scale, -1) @ v_

        def sdpa(device, tdtype):
            import torch.nn.functional as F

            return lambda q_, k_, v_: F.scaled_dot_product_attention(q_[None], k_[None], v_[None])[
                0
            ]

        flops = 2 * heads * m * n * (k + h)
        io = _nbytes(*((s, dtype) for _, s, _ in params), ((heads, m, h), dtype))
        return Instance(
            f"{name} {heads}x{m}x{n}x{k}x{h} {dtype}",
            relax_function(params, body),
            "main",
            [q, kk, v],
            {"eager": eager, "sdpa": sdpa},
            flops,
            io,
            dtype,
        )

    heads, m, n, k, h = ATTENTION[name]
    return Workload(
        name,
        "attention",
        f"MCFuser {name}: softmax(Q·K^T/sqrt(K))·V, heads={heads} M={m} N={n} K={k} H={h}",
        {"heads": heads, "m": m, "n": n, "k": k, "h": h},
        build,
    )


def subgraph_workloads() -> list[Workload]:
    """All subgraph workloads with their default (benchmark) shapes."""
    bert = {"rows": 4096, "cols": 768}
    memory = [
        Workload("layernorm", "memory", "relax.nn.layer_norm over the last axis", bert, _layernorm),
        Workload(
            "layernorm-ops",
            "memory",
            "LayerNorm as separate ops (mean, sub, square, mean, rsqrt, scale, shift)",
            bert,
            _layernorm_ops,
        ),
        Workload(
            "add-layernorm", "memory", "bias + residual add + LayerNorm", bert, _add_layernorm
        ),
        Workload(
            "transpose-layernorm",
            "memory",
            "LayerNorm of a transposed (channels-first) input",
            bert,
            functools.partial(_layernorm, transposed=True),
        ),
        Workload(
            "softmax",
            "memory",
            "softmax over the last axis",
            {"rows": 49152, "cols": 128},
            _softmax,
        ),
        Workload(
            "softmax-ops",
            "memory",
            "softmax as separate ops with scale and additive mask (max, sub, exp, sum, div)",
            {"rows": 49152, "cols": 128},
            _softmax_ops,
        ),
        Workload(
            "bias-gelu",
            "memory",
            "bias add + GELU (erf form; tanh=1 for the tanh form)",
            {"rows": 4096, "cols": 3072, "tanh": 0},
            _bias_gelu,
        ),
        Workload("rmsnorm", "memory", "RMSNorm over the last axis", bert, _rmsnorm),
        Workload(
            "mean-pool",
            "memory",
            "masked mean pooling over the sequence (two column reductions)",
            {"batch": 8, "seq": 512, "hidden": 768},
            _mean_pool,
        ),
        Workload("column-mean", "memory", "mean over the rows (x.mean(0))", bert, _column_mean),
        Workload(
            "rotary",
            "memory",
            "rotary embedding of LLaMA's queries (heads moved, halves rotated)",
            {"batch": 4, "seq": 512, "heads": 32, "dim": 128},
            _rotary,
        ),
        Workload(
            "qk-norms",
            "memory",
            "Qwen3's per-head query and key RMSNorms, each moved to heads (GQA: rows differ)",
            {"batch": 4, "seq": 512, "heads": 32, "kv_heads": 8, "dim": 128},
            _qk_norms,
        ),
        Workload(
            "mask-layernorms",
            "memory",
            "a broadcast mask added before two LayerNorms a GEMM keeps apart",
            {"batch": 8, "seq": 512, "hidden": 768},
            _mask_layernorms,
        ),
    ]
    return memory + [_gemm_chain(n) for n in GEMM_CHAINS] + [_attention(n) for n in ATTENTION]
