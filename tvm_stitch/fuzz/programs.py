"""Random Relax programs for differential testing, as data.

A :class:`Program` is a list of inputs and a list of :class:`Op` over numbered values (inputs
first, then each op's result), so it can be saved as JSON, rebuilt in another dtype (a float64
reference of the same computation), and shrunk op by op (:mod:`tvm_stitch.fuzz.shrink`).
:func:`generate` draws one from a seed: elementwise chains, broadcasts, reshapes, transposes,
slices and concatenations, reductions over any axes with and without ``keepdims``, softmax,
LayerNorm and RMSNorm written as ops, masked ``where``, gathers, matrix products with bias and
activation epilogues, and attention under folded masks (bands of diagonals, documents, none),
over odd shapes, in float32 or float16.

Values are kept well conditioned, so that a difference between two builds is a bug and not
rounding: divisions and square roots read ``|x| + 1``, ``exp`` reads a clipped value, masks are
computed from inputs only (never from rounded intermediates), and a normalization's epsilon keeps
a constant row finite.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random

import numpy as np
import tvm
from tvm import relax

from tvm_stitch.analysis.indexing import HALF

#: extents of ordinary axes: odd, prime, one, and around powers of two
DIMS = (1, 2, 3, 5, 7, 8, 13, 16, 17, 31, 33, 64, 100, 127, 128, 129)
#: extents of rows that are reduced (the innermost axis more often than not)
ROW_DIMS = (33, 64, 100, 127, 128, 129, 255, 256, 768, 1000)
#: elements of the largest value a program makes (llvm runs stay fast)
MAX_ELEMENTS = 1 << 15
#: multiply-adds of the largest product (llvm runs TVM's unscheduled loops)
MAX_MACS = 1 << 21

UNARY = ("neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "sqrt",
         "rsqrt", "log", "square", "erf")
BINARY = ("add", "sub", "mul", "div", "max", "min")
REDUCE = ("sum", "mean", "max", "min", "variance")
EPILOGUE = ("relu", "gelu", "gelu_tanh", "silu", "tanh")


@dataclasses.dataclass(frozen=True)
class Input:
    """A program input: ``role`` is ``data`` (normal values), ``mask`` (int32 zeros and ones)
    or ``index`` (int32 rows of a table with ``bound`` rows).  Its values are drawn from the
    program's seed and ``stream`` (its position when the program was generated; -1: its
    position now), so a reproducer that dropped inputs reads the same values."""

    shape: tuple
    dtype: str
    role: str = "data"
    bound: int = 0
    stream: int = -1


@dataclasses.dataclass(frozen=True)
class Op:
    """One step: ``kind`` applied to the values ``args`` with ``attrs`` (JSON values)."""

    kind: str
    args: tuple
    attrs: dict = dataclasses.field(default_factory=dict, hash=False)


@dataclasses.dataclass
class Program:
    """A random program: value ``i`` is input ``i`` for ``i < len(inputs)``, else the result of
    ``ops[i - len(inputs)]``; the outputs are the op results nothing reads."""

    seed: int
    dtype: str
    inputs: list
    ops: list

    # -- identity and storage ---------------------------------------------------------------
    def to_json(self) -> str:
        return json.dumps({
            "seed": self.seed,
            "dtype": self.dtype,
            "inputs": [dataclasses.asdict(i) for i in self.inputs],
            "ops": [{"kind": o.kind, "args": list(o.args), "attrs": o.attrs} for o in self.ops],
        }, sort_keys=True)

    @staticmethod
    def from_json(text) -> Program:
        data = json.loads(text) if isinstance(text, str) else text
        inputs = [Input(tuple(i["shape"]), i["dtype"], i["role"], i["bound"],
                        i.get("stream", -1)) for i in data["inputs"]]
        ops = [Op(o["kind"], tuple(o["args"]), _attrs(o["attrs"])) for o in data["ops"]]
        return Program(data["seed"], data["dtype"], inputs, ops)

    def describe(self) -> str:
        """One line a step: what a reproducer computes."""
        lines = [f"program seed={self.seed} dtype={self.dtype}"]
        for i, inp in enumerate(self.inputs):
            lines.append(f"  v{i} = input {inp.role} {inp.dtype}{list(inp.shape)}")
        for k, op in enumerate(self.ops):
            args = ", ".join(f"v{a}" for a in op.args)
            attrs = " ".join(f"{k}={v}" for k, v in sorted(op.attrs.items()))
            lines.append(f"  v{len(self.inputs) + k} = {op.kind}({args}) {attrs}".rstrip())
        return "\n".join(lines)

    # -- structure ---------------------------------------------------------------------------
    def outputs(self) -> list[int]:
        """The values nothing reads (at least the last op's result)."""
        read = {a for op in self.ops for a in op.args}
        first = len(self.inputs)
        outs = [first + k for k in range(len(self.ops)) if first + k not in read]
        return outs or [first + len(self.ops) - 1]

    @property
    def has_reduction(self) -> bool:
        return any(o.kind in ("reduce", "softmax", "layer_norm", "layer_norm_ops",
                              "rms_norm_ops", "matmul") for o in self.ops)

    @property
    def reduces_without_keepdims(self) -> bool:
        return any(o.kind == "reduce" and not o.attrs["keepdims"] for o in self.ops)

    # -- building ----------------------------------------------------------------------------
    def module(self, dtype: str | None = None) -> tvm.IRModule:
        """The Relax module ``main(*inputs) -> outputs``; ``dtype`` replaces every floating
        dtype of the program (a float64 reference of the same computation)."""
        return self._build(dtype)[0]

    def types(self) -> list[tuple]:
        """``(shape, dtype)`` of every value, inputs first (Relax's own inference)."""
        return [(tuple(int(d) for d in v.ty.shape.values), str(v.ty.dtype))
                for v in self._build(None)[1]]

    def _build(self, dtype):
        """The module and every value's variable (an op's result may be bound after the
        bindings of its parts: a normalization written as ops)."""

        def ty(d):
            return dtype if dtype and d.startswith("float") else d

        bb = relax.BlockBuilder()
        params = [relax.Var(f"v{i}", relax.TensorType(inp.shape, ty(inp.dtype)))
                  for i, inp in enumerate(self.inputs)]
        with bb.function("main", params):
            with bb.dataflow():
                values = list(params)
                for op in self.ops:
                    values.append(bb.emit(_emit(op, [values[a] for a in op.args], ty)))
                outs = [values[i] for i in self.outputs()]
                out = bb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
            bb.emit_func_output(out)
        return bb.get(), values

    def arguments(self, dtype: str | None = None) -> list[np.ndarray]:
        """Inputs drawn from the program's seed (the same values in every dtype: 16-bit values
        are rounded first, so a float64 build reads exactly what a float16 build reads)."""
        args = []
        for k, inp in enumerate(self.inputs):
            rng = np.random.default_rng([self.seed, inp.stream if inp.stream >= 0 else k])
            if inp.role == "mask":
                args.append(rng.integers(0, 2, inp.shape).astype("int32"))
            elif inp.role == "index":
                args.append(rng.integers(0, inp.bound, inp.shape).astype("int32"))
            else:
                value = rng.standard_normal(inp.shape).astype(inp.dtype)
                args.append(value.astype(dtype) if dtype else value)
        return args


def _attrs(attrs: dict) -> dict:
    """JSON's lists back to the tuples the builders take."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}


# -- building one op ---------------------------------------------------------------------------
def _const(value: float, dtype: str):
    return relax.const(value, dtype)


def _unary(fn: str, x, dtype):
    op = relax.op
    if fn == "exp":
        return op.exp(op.clip(x, -4.0, 4.0))
    if fn in ("sqrt", "rsqrt", "log"):
        return getattr(op, fn)(op.add(op.abs(x), _const(1.0, dtype)))
    simple = {"neg": op.negative, "abs": op.abs, "tanh": op.tanh, "sigmoid": op.sigmoid,
              "square": op.square, "erf": op.erf, "relu": op.nn.relu, "gelu": op.nn.gelu,
              "gelu_tanh": op.nn.gelu_tanh, "silu": op.nn.silu}
    return simple[fn](x)


def _binary(fn: str, a, b, dtype):
    op = relax.op
    if fn == "div":
        return op.divide(a, op.add(op.abs(b), _const(1.0, dtype)))
    table = {"add": op.add, "sub": op.subtract, "mul": op.multiply, "max": op.maximum,
             "min": op.minimum}
    return table[fn](a, b)


def _emit(op: Op, args, ty):
    """The Relax expression of ``op`` over ``args`` (``ty`` maps a program dtype to the built
    one)."""
    R, a = relax.op, op.attrs  # noqa: N806 - Relax's own spelling
    x = args[0] if args else None
    dtype = str(x.ty.dtype) if x is not None else None
    kind = op.kind
    if kind == "unary":
        return _unary(a["fn"], x, dtype)
    if kind == "binary":
        return _binary(a["fn"], x, args[1], dtype)
    if kind == "scalar":
        return _binary(a["fn"], x, _const(a["value"], dtype), dtype)
    if kind == "cast":
        return R.astype(x, ty(a["dtype"]))
    if kind == "broadcast_to":
        return R.broadcast_to(x, a["shape"])
    if kind == "reshape":
        return R.reshape(x, a["shape"])
    if kind == "permute":
        return R.permute_dims(x, list(a["axes"]))
    if kind == "slice":
        return R.strided_slice(x, [a["axis"]], [a["begin"]], [a["end"]], [a["stride"]])
    if kind == "concat":
        return R.concat(list(args), axis=a["axis"])
    if kind == "reduce":
        fn = {"sum": R.sum, "mean": R.mean, "max": R.max, "min": R.min,
              "variance": R.variance}[a["fn"]]
        return fn(x, axis=list(a["axes"]), keepdims=a["keepdims"])
    if kind == "softmax":
        return (R.nn.log_softmax if a.get("log") else R.nn.softmax)(x, axis=a["axis"])
    if kind == "layer_norm" and dtype != "float64":  # TVM's has no float64 form
        return R.nn.layer_norm(x, args[1], args[2], axes=[-1], epsilon=a["eps"])
    if kind in ("layer_norm", "layer_norm_ops"):
        mean = R.mean(x, axis=[-1], keepdims=True)
        centred = R.subtract(x, mean)
        var = R.mean(R.multiply(centred, centred), axis=[-1], keepdims=True)
        scale = R.rsqrt(R.add(var, _const(a["eps"], dtype)))
        return R.add(R.multiply(R.multiply(centred, scale), args[1]), args[2])
    if kind == "rms_norm_ops":
        ms = R.mean(R.square(x), axis=[-1], keepdims=True)
        return R.multiply(R.multiply(x, R.rsqrt(R.add(ms, _const(a["eps"], dtype)))), args[1])
    if kind == "mask":
        if a["from"] == "mask":
            return R.not_equal(x, relax.const(0, "int32"))
        return R.less(x, _const(a["value"], dtype))
    if kind == "where":
        mask, value = args[0], args[1]
        other = args[2] if len(args) > 2 else _const(a["fill"], str(value.ty.dtype))
        return R.where(mask, value, other)
    if kind == "matmul":
        return R.matmul(x, args[1])
    if kind == "take":
        return R.take(x, args[1], axis=0)
    if kind == "key_mask":
        return relax.const(key_mask(a), ty(a["dtype"]))
    raise ValueError(f"unknown op kind {kind!r}")


def key_mask(attrs: dict) -> np.ndarray:
    """A ``key_mask`` op's constant: ``[queries, keys]`` of 0 where a query sees a key and
    ``fill`` where it does not (as models add a folded mask to their logits). ``pattern``:
    ``band`` (``lo <= key - query <= hi``, a limit None for none: causal, sliding windows),
    ``documents`` (block-diagonal, ``cuts`` the first query of each document) or ``random``
    (drawn from ``seed``)."""
    n = attrs["n"]
    rows, cols = np.indices((n, n))
    pattern = attrs["pattern"]
    if pattern == "band":
        seen = np.ones((n, n), bool)
        if attrs["lo"] is not None:
            seen &= cols - rows >= attrs["lo"]
        if attrs["hi"] is not None:
            seen &= cols - rows <= attrs["hi"]
    elif pattern == "documents":
        doc = np.searchsorted(np.asarray(attrs["cuts"]), np.arange(n), side="right")
        seen = doc[:, None] == doc[None, :]
    else:
        seen = np.random.default_rng(attrs["seed"]).random((n, n)) < 0.7
    return np.where(seen, 0.0, attrs["fill"]).astype("float64")


# -- generation -----------------------------------------------------------------------------
class _Gen:
    """The state of one program's generation: values' shapes and dtypes, and readers."""

    def __init__(self, seed: int, dtype: str | None = None):
        self.rng = random.Random(seed)
        self.seed = seed
        self.dtype = dtype or ("float16" if self.rng.random() < 0.4 else "float32")
        self.inputs: list[Input] = []
        self.ops: list[Op] = []
        self.shapes: list[tuple] = []
        self.dtypes: list[str] = []
        self.reads: list[int] = []

    # values
    def add_input(self, shape, role="data", bound=0, dtype=None) -> int:
        dtype = dtype or (self.dtype if role == "data" else "int32")
        assert not self.ops, "inputs come first"
        self.inputs.append(Input(tuple(shape), dtype, role, bound))
        self.shapes.append(tuple(shape))
        self.dtypes.append(dtype)
        self.reads.append(0)
        return len(self.shapes) - 1

    def add(self, kind, args, out_shape, out_dtype, **attrs) -> int:
        self.ops.append(Op(kind, tuple(args), attrs))
        for x in args:
            self.reads[x] += 1
        self.shapes.append(tuple(out_shape))
        self.dtypes.append(out_dtype)
        self.reads.append(0)
        return len(self.shapes) - 1

    def floats(self):
        return [v for v, d in enumerate(self.dtypes) if d.startswith("float")]

    def pick(self, candidates=None):
        """A floating value, the unread and recent ones first (chains, not fans)."""
        candidates = candidates if candidates is not None else self.floats()
        weights = [(4 if self.reads[v] == 0 else 1) * (1 + v) for v in candidates]
        return self.rng.choices(candidates, weights)[0]

    def shape(self, rank=None, row=False) -> tuple:
        rank = rank or self.rng.choice((1, 2, 2, 3, 3, 4))
        dims = [self.rng.choice(DIMS) for _ in range(rank)]
        if row or self.rng.random() < 0.5:
            dims[-1] = self.rng.choice(ROW_DIMS)
        while math.prod(dims) > MAX_ELEMENTS // 4:
            i = max(range(rank), key=lambda k: dims[k])
            dims[i] = max(1, dims[i] // 3)
        return tuple(dims)


def generate(seed: int, dtype: str | None = None, ops: int | None = None) -> Program:
    """A random program drawn from ``seed`` (float16 with probability 0.4 unless ``dtype``)."""
    g = _Gen(seed, dtype)
    rng = g.rng
    first = g.shape(row=rng.random() < 0.6)
    g.add_input(first)
    # inputs the ops may take: a second activation, weights, masks and tables, made up front
    # (a program's inputs come first); a partner of the first's shape for binary ops
    g.add_input(first if rng.random() < 0.5 else g.shape())
    extra = _Extras(g, first)
    count = ops or rng.randint(3, 12)
    steps = [_unary_step, _binary_step, _scalar_step, _layout_step, _reduce_step,
             _softmax_step, _norm_step, _where_step, _matmul_step, _cast_step, _concat_step,
             _take_step, _attention_step, _rotate_step]
    weights = [4, 4, 2, 4, 9, 2, 2, 2, 3, 2, 1, 1, 2, 1]
    attempts = 0
    while len(g.ops) < count and attempts < 20 * count:
        attempts += 1
        rng.choices(steps, weights)[0](g, extra)
    return Program(seed, g.dtype, g.inputs, g.ops)


class _Extras:
    """Inputs decided before any op (weights, biases, masks, tables): a value needing one
    takes one of matching shape, so a program's inputs all come first."""

    def __init__(self, g: _Gen, first):
        rng = g.rng
        self.g = g
        n = first[-1]
        # a weight (n, m) and bias (m,), a gamma and beta (n,), a 0/1 mask over the first
        # input's trailing axes, an embedding table and its indices
        m = rng.choice((16, 33, 64, 96, 128, 200, 256))
        self.weight = g.add_input((n, m))
        self.bias = g.add_input((m,))
        self.gamma = g.add_input((n,))
        self.beta = g.add_input((n,))
        mask_shape = tuple(d if rng.random() < 0.6 else 1 for d in first)
        self.mask = g.add_input(mask_shape, role="mask")
        rows = rng.choice((7, 50, 128))
        self.table = g.add_input((rows, rng.choice((16, 64, 100, 128))))
        self.index = g.add_input(g.shape(rank=rng.choice((1, 2))), role="index", bound=rows)


def _broadcastable(g: _Gen, shape) -> tuple:
    """A shape that broadcasts against ``shape``: trailing axes kept or set to one, leading
    axes dropped."""
    rng = g.rng
    keep = rng.randint(1, len(shape))
    return tuple(d if rng.random() < 0.6 else 1 for d in shape[len(shape) - keep:])


def _unary_step(g, _):
    x = g.pick()
    g.add("unary", [x], g.shapes[x], g.dtypes[x], fn=g.rng.choice(UNARY))


def _scalar_step(g, _):
    x = g.pick()
    value = g.rng.choice((0.5, 2.0, -1.5, 0.125, 3.0))
    g.add("scalar", [x], g.shapes[x], g.dtypes[x], fn=g.rng.choice(("add", "mul", "sub", "div")),
          value=value)


def _binary_step(g, _):
    x = g.pick()
    shape, dtype = g.shapes[x], g.dtypes[x]
    rng = g.rng
    partners = [v for v in g.floats() if v != x and g.dtypes[v] == dtype
                and _broadcast(shape, g.shapes[v]) == shape]
    if partners and rng.random() < 0.8:
        y = g.pick(partners)
    else:
        # an operand broadcast to x: x's own reduction, kept, or x itself
        axes = (len(shape) - 1,)
        y = g.add("reduce", [x], _reduced(shape, axes, True), dtype, fn="max", axes=axes,
                  keepdims=True) if rng.random() < 0.5 else x
    fn = rng.choice(BINARY)
    a, b = (x, y) if rng.random() < 0.7 else (y, x)
    g.add("binary", [a, b], _broadcast(g.shapes[a], g.shapes[b]), dtype, fn=fn)


def _layout_step(g, _):
    x = g.pick()
    shape, rng = g.shapes[x], g.rng
    choice = rng.choice(("reshape", "permute", "slice", "broadcast_to"))
    if choice == "permute" and len(shape) > 1:
        axes = list(range(len(shape)))
        while axes == sorted(axes):
            rng.shuffle(axes)
        g.add("permute", [x], tuple(shape[a] for a in axes), g.dtypes[x], axes=tuple(axes))
    elif choice == "slice":
        axis = rng.randrange(len(shape))
        n = shape[axis]
        if n < 2:
            return
        begin = rng.randrange(n - 1)
        end = rng.randint(begin + 1, n)
        stride = rng.choice((1, 1, 2, 3))
        out = list(shape)
        out[axis] = len(range(begin, end, stride))
        g.add("slice", [x], out, g.dtypes[x], axis=axis, begin=begin, end=end, stride=stride)
    elif choice == "broadcast_to":
        if 1 not in shape or math.prod(shape) * 8 > MAX_ELEMENTS:
            lead = rng.choice((2, 3, 5))
            if math.prod(shape) * lead > MAX_ELEMENTS:
                return
            out = (lead, *shape)
        else:
            out = tuple(rng.choice((2, 3, 7)) if d == 1 else d for d in shape)
        g.add("broadcast_to", [x], out, g.dtypes[x], shape=out)
    else:
        out = _reshaped(rng, shape)
        if out is not None:
            g.add("reshape", [x], out, g.dtypes[x], shape=out)


def _reshaped(rng, shape):
    """Adjacent axes merged, or one split in two, or a unit axis inserted or dropped."""
    dims = list(shape)
    move = rng.choice(("merge", "split", "unit"))
    if move == "merge" and len(dims) > 1:
        i = rng.randrange(len(dims) - 1)
        dims[i: i + 2] = [dims[i] * dims[i + 1]]
    elif move == "split":
        i = rng.randrange(len(dims))
        factors = [f for f in range(2, dims[i]) if dims[i] % f == 0]
        if not factors:
            return None
        f = rng.choice(factors)
        dims[i: i + 1] = [f, dims[i] // f]
    elif 1 in dims and len(dims) > 1:
        dims.remove(1)
    else:
        dims.insert(rng.randrange(len(dims) + 1), 1)
    return tuple(dims) if len(dims) <= 5 else None


def _reduced(shape, axes, keepdims):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_step(g, _):
    x = g.pick()
    shape, rng = g.shapes[x], g.rng
    rank = len(shape)
    pick = rng.random()
    if pick < 0.5:
        axes = (rank - 1,)
    elif pick < 0.7:
        axes = (rng.randrange(rank),)
    elif pick < 0.85:
        axes = tuple(sorted(rng.sample(range(rank), rng.randint(1, rank))))
    else:
        axes = tuple(range(rank))
    keepdims = rng.random() < 0.25
    out = _reduced(shape, axes, keepdims)
    if not out:  # a scalar: kept as one element, so every program returns tensors
        keepdims, out = True, _reduced(shape, axes, True)
    fn = rng.choice(REDUCE)
    g.add("reduce", [x], out, g.dtypes[x], fn=fn, axes=axes, keepdims=keepdims)


def _softmax_step(g, _):
    x = g.pick()
    rank = len(g.shapes[x])
    axis = -1 if g.rng.random() < 0.6 else g.rng.randrange(rank)
    g.add("softmax", [x], g.shapes[x], g.dtypes[x], axis=axis, log=g.rng.random() < 0.2)


def _norm_step(g, extra):
    n = g.shapes[extra.gamma][0]
    rows = [v for v in g.floats() if g.shapes[v][-1] == n and g.dtypes[v] == g.dtype
            and v not in (extra.gamma, extra.beta, extra.bias)]
    if not rows:
        return
    x = g.pick(rows)
    kind = g.rng.choice(("layer_norm", "layer_norm_ops", "rms_norm_ops"))
    eps = g.rng.choice((1e-5, 1e-6, 1e-2))
    args = [x, extra.gamma] + ([] if kind == "rms_norm_ops" else [extra.beta])
    g.add(kind, args, g.shapes[x], g.dtype, eps=eps)


def _where_step(g, extra):
    rng = g.rng
    if rng.random() < 0.6:
        mask = g.add("mask", [extra.mask], g.shapes[extra.mask], "bool", **{"from": "mask"})
    else:  # a comparison of an input: exact in every dtype
        src = rng.choice([0, 1])
        mask = g.add("mask", [src], g.shapes[src], "bool", value=rng.choice((0.0, 0.5, -1.0)),
                     **{"from": "input"})
    mshape = g.shapes[mask]
    targets = [v for v in g.floats() if _broadcast(g.shapes[v], mshape) == g.shapes[v]]
    if not targets:
        return
    x = g.pick(targets)
    fill = rng.choice((0.0, -1e4, -3.0)) if g.dtypes[x] in HALF else rng.choice(
        (0.0, -1e9, -3.0))
    others = [v for v in targets if v != x and g.shapes[v] == g.shapes[x]
              and g.dtypes[v] == g.dtypes[x]]
    args = [mask, x] + ([g.pick(others)] if others and rng.random() < 0.3 else [])
    g.add("where", args, g.shapes[x], g.dtypes[x], fill=fill)


def _matmul_step(g, extra):
    rng = g.rng
    k, m = g.shapes[extra.weight]
    lhs = [v for v in g.floats() if g.shapes[v][-1] == k and len(g.shapes[v]) >= 1
           and g.dtypes[v] == g.dtype and v != extra.weight]
    if rng.random() < 0.3:  # a product of two computed values: q @ k^T
        rank3 = [v for v in g.floats() if len(g.shapes[v]) >= 2 and g.dtypes[v] == g.dtype]
        if rank3:
            a = g.pick(rank3)
            shape = g.shapes[a]
            if math.prod(shape) * shape[-2] <= MAX_MACS:
                axes = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
                t = g.add("permute", [a], tuple(shape[i] for i in axes), g.dtype, axes=axes)
                out = (*shape[:-1], shape[-2])
                g.add("matmul", [a, t], out, g.dtype)
                return
    if not lhs:
        return
    x = g.pick(lhs)
    out = (*g.shapes[x][:-1], m)
    if math.prod(out) > MAX_ELEMENTS or math.prod(out) * k > MAX_MACS:
        return
    y = g.add("matmul", [x, extra.weight], out, g.dtype)
    if rng.random() < 0.7:
        y = g.add("binary", [y, extra.bias], out, g.dtype, fn="add")
    if rng.random() < 0.6:
        y = g.add("unary", [y], out, g.dtype, fn=rng.choice(EPILOGUE))


def _attention_step(g, _):
    """``softmax(q·kᵀ · c + mask) · v`` over a value ``(..., n, d)`` (as q, and k and v where
    no other value has its shape), the mask a folded constant: a band of diagonals (causal,
    sliding windows, limits that leave a query no key), documents, or no pattern."""
    rng = g.rng
    ranked = [v for v in g.floats() if len(g.shapes[v]) >= 2 and g.dtypes[v] == g.dtype
              and g.shapes[v][-2] > 1]
    if not ranked:
        return
    q = g.pick(ranked)
    shape = g.shapes[q]
    n = shape[-2]
    if 2 * math.prod(shape) * n > MAX_MACS or math.prod((*shape[:-1], n)) > MAX_ELEMENTS:
        return
    alike = [v for v in ranked if g.shapes[v] == shape]
    k, v = rng.choice(alike), rng.choice(alike)
    axes = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
    kt = g.add("permute", [k], tuple(shape[i] for i in axes), g.dtype, axes=axes)
    scores_shape = (*shape[:-1], n)
    s = g.add("matmul", [q, kt], scores_shape, g.dtype)
    s = g.add("scalar", [s], scores_shape, g.dtype, fn="mul",
              value=rng.choice((1.0, 0.125, shape[-1] ** -0.5)))
    pattern = rng.choices(("band", "documents", "random"), (6, 2, 1))[0]
    mask = {"n": n, "pattern": pattern, "dtype": g.dtype,
            "fill": rng.choice((float("-inf"), -1e4 if g.dtype in HALF else -1e9))}
    if pattern == "band":
        lo = rng.choice((None, -rng.randint(0, n), rng.randint(1, 3)))
        hi = rng.choice((None, 0, rng.randint(0, n), -1))
        if lo is not None and hi is not None and hi < lo:
            lo, hi = hi, lo
        mask.update(lo=lo, hi=hi)
    elif pattern == "documents":
        mask["cuts"] = sorted(rng.sample(range(1, n), min(3, n - 1)))
    else:
        mask["seed"] = rng.randrange(1 << 30)
    if g.dtype in HALF and math.isfinite(mask["fill"]) and \
            (key_mask(mask) != 0).all(axis=-1).any():
        # a query that sees no key: with a finite fill its scores are ``fill + s``, rounded to
        # the fill's spacing (8 at -1e4 in float16), and what each build makes of them is
        # rounding noise, not a result the float64 reference can judge (seed 473): -inf
        # makes that row undefined in every build alike
        mask["fill"] = float("-inf")
    m = g.add("key_mask", [], (n, n), g.dtype, **mask)
    s = g.add("binary", [s, m], scores_shape, g.dtype, fn="add")
    p = g.add("softmax", [s], scores_shape, g.dtype, axis=-1, log=False)
    g.add("matmul", [p, v], shape, g.dtype)


def _cast_step(g, _):
    if g.dtype != "float16":
        return
    x = g.pick()
    to = "float32" if g.dtypes[x] == "float16" else "float16"
    g.add("cast", [x], g.shapes[x], to, dtype=to)


def _concat_step(g, _):
    x = g.pick()
    shape = g.shapes[x]
    axis = g.rng.randrange(len(shape))
    partners = [v for v in g.floats() if len(g.shapes[v]) == len(shape)
                and g.dtypes[v] == g.dtypes[x]
                and all(a == b for i, (a, b) in enumerate(zip(shape, g.shapes[v])) if i != axis)]
    y = g.pick(partners)
    out = list(shape)
    out[axis] += g.shapes[y][axis]
    if math.prod(out) <= MAX_ELEMENTS:
        g.add("concat", [x, y], out, g.dtypes[x], axis=axis)


def _rotate_step(g, _):
    """A rotary embedding's ``x·c + rotate_half(x)·s`` along the last axis (the halves swapped,
    the second negated: reads shifted by half a row), ``c`` and ``s`` a partner of x's shape or
    x itself."""
    x = g.pick()
    shape, dtype = g.shapes[x], g.dtypes[x]
    n = shape[-1]
    if n < 2 or n % 2:
        return
    axis, half = len(shape) - 1, n // 2
    out = (*shape[:-1], half)
    first = g.add("slice", [x], out, dtype, axis=axis, begin=0, end=half, stride=1)
    second = g.add("slice", [x], out, dtype, axis=axis, begin=half, end=n, stride=1)
    turned = g.add("concat", [g.add("unary", [second], out, dtype, fn="neg"), first], shape,
                   dtype, axis=axis)
    partners = [v for v in g.floats() if g.shapes[v] == shape and g.dtypes[v] == dtype]
    c, s = (g.pick(partners) if partners else x for _ in range(2))
    y = g.add("binary", [x, c], shape, dtype, fn="mul")
    g.add("binary", [y, g.add("binary", [turned, s], shape, dtype, fn="mul")], shape, dtype,
          fn="add")


def _take_step(g, extra):
    shape = (*g.shapes[extra.index], g.shapes[extra.table][1])
    g.add("take", [extra.table, extra.index], shape, g.dtype)


def _broadcast(a, b) -> tuple | None:
    """NumPy's broadcast of two shapes, None where they do not broadcast."""
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)),
                    reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(reversed(out))
