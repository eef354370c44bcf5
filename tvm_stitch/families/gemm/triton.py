"""The ``gemm`` family's Triton kernel (:func:`gemm_source`): ``A`` times each band's ``B``, the
epilogues, the stores; split-K, a computed ``A`` (a folded normalization), and the persistent
formulation reading its operands (and writing its outputs) by TMA (:func:`tma_layout`,
:func:`tma_descriptors`).  Its warp-specialized Gluon form is :mod:`.gluon`'s."""

from __future__ import annotations

import re

from tvm_stitch.analysis.indexing import Strided
from tvm_stitch.codegen.elem_printer import ElemPrinter, row_statistics, store
from tvm_stitch.codegen.kernel_text import (
    Descriptor,
    KernelSource,
    UnsupportedKernelError,
    base,
    cdiv,
    consumers,
    extra_views,
    function,
    pointer_args,
    smaller,
    tl_dtype,
    tma_unreadable,
)
from tvm_stitch.families.gemm.template import GEMM_MAX_TILE

#: largest tile (BLOCK_M * BLOCK_N) whose GEMM combines its row statistics after the product loop
LATE_STATISTICS = 64 * 64
#: axes whose extent may be a kernel argument (:mod:`tvm_stitch.codegen.runtime`): the rows
RUNTIME_EXTENTS = ("m",)


def gemm_source(match, name: str) -> KernelSource:
    """The GEMM kernel: ``A`` (b, m, k) times each segment's ``B`` (b, k, n), epilogues, stores.

    One program per output tile; a product per band whose operands TMA can read (see
    :func:`tma_layout`) also gets the persistent formulation, chosen by ``PERSISTENT``, whose
    tiles, with one band whose outputs TMA can write, may be stored through descriptors
    (``TMA_STORE``).
    """
    pointers, inputs, outputs = pointer_args(match)
    ext = match.frame.extents
    m, k = ext["m"], ext["k"]
    views = match.views
    a = views["a"]
    scalars = {"b": "pid_b"}
    if a.stride.get("k") is None:
        raise UnsupportedKernelError("A does not vary along k")
    s_am, s_ak = _strides(a, "m", "k")
    prelude = [f"tiles_m = tl.cdiv({m}, BLOCK_M)"]
    bounds, start = [], "0"
    for i, seg in enumerate(match.segments):
        prelude.append(f"t{i} = tl.cdiv({seg.n}, BLOCK_N)")
        bounds.append(f"{start} + t{i}" if start != "0" else f"t{i}")
        start = bounds[-1]
    prelude.append(f"tiles_n = {start}")
    # split-K (a computed A, a folded normalization, is not split): SPLIT_K programs per output
    # tile, each over a slice of k whole BLOCK_K steps long (with rows known at run time, in
    # the variants of bounded rows only: the workspace is sized by the tiles,
    # :func:`tvm_stitch.codegen.embed.generated_launch`)
    split = match.prologue is None
    lines = ["pid_b = tl.program_id(1)"]
    if split:
        per = f"(({k} + BLOCK_K * SPLIT_K - 1) // (BLOCK_K * SPLIT_K) * BLOCK_K)"
        lines += [
            "if SPLIT_K == 1:",
            "    tile = tl.program_id(0)",
            "    k_lo = 0",
            f"    k_hi = {k}",
            "else:",
            "    tile = tl.program_id(0) // SPLIT_K",
            f"    k_lo = tl.program_id(0) % SPLIT_K * {per}",
            f"    k_hi = tl.minimum(k_lo + {per}, {k})",
        ]
    else:
        lines.append("tile = tl.program_id(0)")
    lines += [
        "pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)",
        "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
    ]
    if match.prologue is None:
        lines.append(f"A = {base(a, pointers, scalars)}")
    extras = extra_views(match)
    row_tiles = {"b": "pid_b", "m": "rm[:, None]"}
    row_masks = {"m": f"(rm < {m})[:, None]"} if m % GEMM_MAX_TILE else {}
    stat_issue, stat_combine, reduced = row_statistics(match.statistics, row_tiles, row_masks,
                                                       pointers, extras)
    stat_lines = stat_issue + stat_combine
    lines += stat_issue
    # small tiles (latency-bound kernels, registers to spare) combine the statistics after the
    # product loop, their loads in flight meanwhile (BERT-base 1x128 folded through the
    # weights: 386.6 -> 367-375 us on an H100); larger ones before it, keeping the registers
    # (held across the loop, (128, 64) float32 pieces cost 32 registers a thread: Q/K/V at
    # 4096 tokens 102 -> 167 registers and no faster, 45.6 vs 45.3 us); so does a prologue
    # reading them
    after = f"BLOCK_M * BLOCK_N <= {LATE_STATISTICS}"
    before = f"BLOCK_M * BLOCK_N > {LATE_STATISTICS}"
    if match.prologue is not None:
        lines += stat_combine
    elif stat_combine:
        lines += [f"if {before}:", *["    " + line for line in stat_combine]]
    segments = match.segments
    # one product loop for every band: recognition groups bands by their number of products
    # (families.gemm.recognize), so this only guards matches built otherwise
    products = {len(seg.products) for seg in segments}
    if len(products) != 1 or products.pop() > 2:
        raise UnsupportedKernelError("bands with different numbers of products")
    bviews = [[views[f"b{si}.{pi}"] for pi in range(len(seg.products))]
              for si, seg in enumerate(segments)]
    n_axes = [n_axis_of(bv[0]) for bv in bviews]
    strides = [[tuple(_strides(bv, "k", n_axes[si])) for bv in bvs]
               for si, bvs in enumerate(bviews)]
    # one product loop for every band (one set of pipeline buffers): the band's B pointers,
    # width and strides are chosen first; literals where every band agrees
    same_n = len({seg.n for seg in segments}) == 1
    same_strides = len({tuple(st) for st in strides}) == 1
    heads = []
    for si in range(len(segments)):
        first = bounds[si - 1] if si else "0"
        if si == 0:
            heads.append((f"if pid_n < {bounds[0]}:" if len(segments) > 1 else None, first))
        elif si == len(segments) - 1:
            heads.append(("else:", first))
        else:
            heads.append((f"elif pid_n < {bounds[si]}:", first))
    for si, (head, first) in enumerate(heads):
        body = [f"rn = (pid_n - ({first})) * BLOCK_N + tl.arange(0, BLOCK_N)"]
        for bi, bv in enumerate(bviews[si]):
            body.append(f"B{bi} = {base(bv, pointers, scalars)}")
            if not same_strides:
                body.append(f"s_b{bi}k = {strides[si][bi][0]}")
                body.append(f"s_b{bi}n = {strides[si][bi][1]}")
        if not same_n:
            body.append(f"n_band = {segments[si].n}")
        lines += ["    " + line for line in body] if head else body
        if head:
            lines.insert(len(lines) - len(body), head)
    width = str(segments[0].n) if same_n else "n_band"

    def stride(bi, which):
        return str(strides[0][bi][which]) if same_strides else f"s_b{bi}{'kn'[which]}"

    zeros = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
    # operands stored in another precision than the product's are converted in registers
    stored = {a.dtype, *(bv.dtype for bvs in bviews for bv in bvs)}
    convert = f", {tl_dtype(match.dtype)}" if stored != {match.dtype} else ""
    if match.prologue is not None:
        lines += _prologue_product(match, pointers, extras, reduced, row_masks, width,
                                   len(bviews[0]), stride, convert)
    elif match.paired:
        # gate and up interleaved (analysis.weights.pair_weights): one product over 2 *
        # BLOCK_N rows (columns) of the joined B, its even columns the gate's, its odd ones
        # the up's (a thread's accumulator holds columns in pairs: the split moves nothing)
        s_bk, s_bn = strides[0][0]
        lines += [
            "rn2 = pid_n * 2 * BLOCK_N + tl.arange(0, 2 * BLOCK_N)",
            f"acc = _tile_product({_PAIRED_ZEROS}, A, B0, rm, rn2, {m}, {2 * segments[0].n}, "
            f"{k}, {s_am}, {s_ak}, {s_bk}, {s_bn // 2}, BLOCK_K, DOT_PREC{convert}, "
            "K_LO=k_lo, K_HI=k_hi)",
            _PAIRED_SPLIT,
        ]
    elif len(bviews[0]) == 1:
        lines.append(
            f"acc0 = _tile_product({zeros}, A, B0, rm, rn, {m}, {width}, {k}, {s_am}, {s_ak}, "
            f"{stride(0, 0)}, {stride(0, 1)}, BLOCK_K, DOT_PREC{convert}, K_LO=k_lo, K_HI=k_hi)"
        )
    else:
        lines.append(
            f"acc0, acc1 = _tile_product2({zeros}, {zeros}, A, B0, B1, rm, rn, {m}, {width}, "
            f"{k}, {s_am}, {s_ak}, {stride(0, 0)}, {stride(0, 1)}, {stride(1, 0)}, "
            f"{stride(1, 1)}, BLOCK_K, DOT_PREC{convert}, K_LO=k_lo, K_HI=k_hi)"
        )
    if match.prologue is None and stat_combine:
        lines += [f"if {after}:", *["    " + line for line in stat_combine]]
    if split:
        lines += _split_reduction(len(bviews[0]))
    def band_body(si, seg, within=None, names=pointers, prefix=None, stores=None):
        """Band ``si``'s epilogue; ``within``: a condition every load and store of it also
        needs (a program computing every band's epilogue, storing only its own); ``names``:
        the pointer of each tensor it reads or writes; ``stores``: output tensor -> the TMA
        descriptor storing its tiles (instead of pointers)."""
        n_axis = n_axes[si]
        tiles = {"b": "pid_b", "m": "rm[:, None]", n_axis: "rn[None, :]"}
        # no bounds checks along an axis every legal tile divides
        masks = {
            axis: text
            for axis, extent, text in (
                ("m", m, f"(rm < {m})[:, None]"),
                (n_axis, seg.n, f"(rn < {seg.n})[None, :]"),
            )
            if extent % GEMM_MAX_TILE
        }
        if within:  # on the column axis: every store and every load of a column varies
            masks[n_axis] = f"{masks[n_axis]} & {within}" if n_axis in masks else within
        acc = {t: (f"acc{i}", match.acc_dtype) for i, t in enumerate(seg.accumulators)}
        printer = ElemPrinter(tiles, masks, names, extras, acc, prefix=prefix or f"e{si}_",
                              reduced=reduced)
        body = []
        for oi, out in enumerate(seg.outputs):
            value = printer.expr(out.elem)
            body += printer.lines
            printer.lines = []
            if out.chunk:
                body += _moment_store(out, value, names, m, seg.n, f"mo{oi}")
            elif stores:  # the descriptor clips the tile at the tensor's bounds: no masks
                dtype = tl_dtype(views[f"out{si}.{oi}"].dtype)
                body.append(f"{stores[out.tensor]}.store([pid_m * BLOCK_M, pid_n * BLOCK_N], "
                            f"tl.broadcast_to({value}, (BLOCK_M, BLOCK_N)).to({dtype}))")
            else:
                body.append(store(printer, value, views[f"out{si}.{oi}"]))
        return body

    epilogues = []
    for si, seg in enumerate(segments):
        head = heads[si][0]
        body = band_body(si, seg)
        if head:
            epilogues.append(head)
            body = ["    " + line for line in body]
        epilogues += body
    if split:  # only a tile's last split applies the epilogue
        lines += ["if last:", *["    " + line for line in epilogues]]
    else:
        lines += epilogues
    constexprs = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "DOT_PREC"]
    if split:
        constexprs.append("SPLIT_K")
    layout = tma_layout(match)
    if isinstance(layout, str):
        body = prelude + lines
    else:
        b_nk, _ = layout
        descs = tma_descriptors(match)  # bands: consecutive column ranges of one B
        # B's column of the tile: a band's tiles start at its first column (a tile reading
        # past its band's last column reads the next band's: those columns are not stored)
        def by_band(value):  # value(band, its first tile) for the band holding pid_n
            text = value(len(segments) - 1, heads[-1][1])
            for si in range(len(segments) - 2, -1, -1):
                text = f"tl.where(pid_n < {bounds[si]}, {value(si, heads[si][1])}, {text})"
            return text

        def first_column(si, first):
            column = sum(seg.n for seg in segments[:si])
            return f"{column} + (pid_n - ({first})) * BLOCK_N" if si else "pid_n * BLOCK_N"

        off_n = by_band(first_column)
        if len(segments) > 1:
            # no `if` choosing the band (Triton 3.6 cannot flatten the tile loop around one):
            # bands whose epilogues differ only in the tensors they read and write (Q, K, V's
            # biases and outputs) and in integers (widths, strides) share one, over pointers
            # and integers chosen by the tile's band; otherwise every band's epilogue runs on
            # the tile's columns, its loads and stores predicated on the tile being in that
            # band (BERT-base's Q/K/V at 4096 tokens on an H100: 28.8 µs shared, 32.8 so)
            local = by_band(lambda si, first: f"pid_n - ({first})" if si else "pid_n")
            epilogues = [f"rn = ({local}) * BLOCK_N + tl.arange(0, BLOCK_N)"]
            shared = _shared_epilogue(segments, band_body, pointers, views)
            if shared is not None:
                choose, body = shared
                epilogues += [f"{p} = {by_band(lambda si, _f, c=c: c[si])}" for p, c in choose]
                epilogues += body
            else:
                epilogues.append("tile_n = (rn * 0 + pid_n)[None, :]")  # a row: a mask's shape
                for si, seg in enumerate(segments):
                    lower = f"tile_n >= {bounds[si - 1]}" if si else None
                    upper = f"tile_n < {bounds[si]}" if si < len(segments) - 1 else None
                    cond = " & ".join(f"({c})" for c in (lower, upper) if c)
                    epilogues += [f"in_band{si} = {cond}", *band_body(si, seg, f"in_band{si}")]
        else:
            # TMA_STORE: the outputs' tiles stored through descriptors (from shared memory, by
            # the copy engine) where TMA can write them
            stores = _tma_stores(match)
            if stores:
                out_descs = [Descriptor(desc, t, views[role].dtype, views[role].offset, m,
                                        segments[0].n, views[role].stride["m"],
                                        ("BLOCK_M", "BLOCK_N"))
                             for t, (desc, role) in stores.items()]
                descs = (*descs, *out_descs)
                tma = band_body(0, segments[0], stores={t: d for t, (d, _) in stores.items()})
                epilogues = ["if TMA_STORE:", *["    " + line for line in tma],
                             "else:", *["    " + line for line in epilogues]]
                constexprs.append("TMA_STORE")
            epilogues = ["rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)", *epilogues]
        # float32 products in IEEE precision, as PyTorch's (Triton's default is TF32); a
        # 16-bit kernel's text is left as it was (its tuning records are found by its name)
        ieee = ", DOT_PREC=DOT_PREC" if match.dtype == "float32" else ""
        if match.paired:  # one product of the gate's and up's columns in turn, split
            product = [f"    acc = _tile_product_tma({_PAIRED_ZEROS}, a_desc, b_desc, "
                       f"pid_m * BLOCK_M, 2 * ({off_n}), {k}, BLOCK_K, {b_nk}{convert}{ieee})",
                       f"    {_PAIRED_SPLIT}"]
        else:
            product = [f"    acc0 = _tile_product_tma({zeros}, a_desc, b_desc, pid_m * BLOCK_M, "
                       f"{off_n}, {k}, BLOCK_K, {b_nk}{convert}{ieee})"]
        persistent = [
            "pid_b = 0",
            "done = tl.program_id(0) - NUM_SMS",
            "for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, NUM_SMS, flatten=True):",
            "    pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)",
            *product,
            "    # the epilogue's own tile counter keeps it apart from the pipelined prologue",
            "    done += NUM_SMS",
            "    pid_m, pid_n = _tile_of(done, tiles_m, tiles_n, GROUP_M)",
            "    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
            *["    " + line for line in stat_lines],
            *["    " + line for line in epilogues],
        ]
        body = [
            *prelude,
            "if PERSISTENT:",
            *["    " + line for line in persistent],
            "else:",
            *["    " + line for line in lines],
        ]
        constexprs += ["PERSISTENT", "NUM_SMS"]
    workspace = ["WS", "CNT"] if split else []
    descs = () if isinstance(layout, str) else descs
    text = function(match, name, inputs, outputs, constexprs, body,
                    [*workspace, *(d.name for d in descs)])
    return KernelSource(name, text, inputs, outputs, {}, "gemm", persistent=not isinstance(
        layout, str), split_k=split, descs=descs, tma_store="TMA_STORE" in constexprs)


#: a paired GEMM's accumulator (gate and up columns in turn), and its split into the two
_PAIRED_ZEROS = "tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)"
_PAIRED_SPLIT = "acc0, acc1 = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N, 2)))"


def _split_reduction(products: int) -> list[str]:
    """Lines adding up a split-K tile (``SPLIT_K > 1``): every split stores its float32
    partial products in the tile's slots of the workspace ``WS``, counts itself in on the
    tile's counter in ``CNT`` (zero between launches), and the last to arrive sums the slots
    and goes on to the epilogue (``last``)."""
    tile = "BLOCK_M * BLOCK_N"
    lines = [
        "last = True",
        "if SPLIT_K > 1:",
        "    slot = pid_b * tiles_m * tiles_n + tile",
        f"    ws = WS + slot * (SPLIT_K * {products} * {tile})",
        "    rw = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
        f"    mine = ws + tl.program_id(0) % SPLIT_K * ({products} * {tile})",
    ]
    lines += [f"    tl.store(mine + {i} * {tile} + rw, acc{i})" for i in range(products)]
    lines += ["    last = _split_arrive(CNT + slot, SPLIT_K)", "    if last:"]
    lines += [
        f"        acc{i} = _split_sum(ws + {i} * {tile}, {products} * {tile}, rw, SPLIT_K)"
        for i in range(products)
    ]
    return lines


class _Placeholders(dict):
    """Tensor -> a placeholder pointer name (``P0``, ``P1``, ...), numbered in the order the
    tensors are first asked for."""

    def __init__(self):
        super().__init__()
        self.order: list[str] = []

    def __missing__(self, tensor):
        self[tensor] = name = f"P{len(self.order)}"
        self.order.append(tensor)
        return name


#: a number in printed code (not part of a name): integers and floats
_NUMBER = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[-+]?\d+)?|\d+(?:e[-+]?\d+)?)(?![\w.])")


def _shared_epilogue(segments, band_body, pointers, views):
    """One epilogue for every band of a GEMM, when the bands' epilogues are the same code over
    different tensors of the same types, up to integers (bounds and strides: Q, K and V
    bands of different widths; no moments: their slots follow the tile's column).
    Returns ``(choices, lines)``: ``choices`` pairs each placeholder of ``lines`` (a pointer
    ``P<j>`` or an integer ``N<j>``) with what it stands for in each band; None when the
    bands differ otherwise."""
    bodies, orders = [], []
    for si, seg in enumerate(segments):
        if any(out.chunk for out in seg.outputs):
            return None
        names = _Placeholders()
        bodies.append(band_body(si, seg, names=names, prefix="e_"))
        orders.append(names.order)
    dtypes = {v.tensor: v.dtype for v in views.values()}
    if len({len(b) for b in bodies}) != 1 or len({len(o) for o in orders}) != 1:
        return None
    if any(len({dtypes[o[j]] for o in orders}) != 1 for j in range(len(orders[0]))):
        return None
    choices = [(f"P{j}", [pointers[o[j]] for o in orders]) for j in range(len(orders[0]))]
    integers: dict = {}  # the bands' values -> placeholder
    lines = []
    for band_lines in zip(*bodies):
        pieces = [_NUMBER.split(line) for line in band_lines]
        if len({len(p) for p in pieces}) != 1:
            return None
        merged = []
        for i, alike in enumerate(zip(*pieces)):
            if len(set(alike)) == 1:
                merged.append(alike[0])
            elif i % 2 and all(v.isdigit() and int(v) < 2**31 for v in alike):
                # integers (numbers sit at odd indices) of int32 range: in the epilogue's
                # addresses and masks (no shapes there: moments are left out above)
                name = integers.setdefault(alike, f"N{len(integers)}")
                merged.append(name)
            else:
                return None
        lines.append("".join(merged))
    choices += [(name, list(values)) for values, name in integers.items()]
    return choices, lines


def _moment_store(out, value: str, pointers, m: int, n: int, name: str) -> list[str]:
    """Lines storing a row moment in pieces (the first phase of a two-phase reduction; the
    readers of the row add the pieces): the sum of ``value`` (the tile of its monomial) over
    the tile's columns goes to the first of the ``BLOCK_N // out.chunk`` slots the tile owns,
    zeros to the others — a row's total whatever the tiles, from one reduction along the
    accumulator's rows (no change of layout)."""
    c = out.chunk
    chunks = cdiv(n, c)
    v = f"{value}.to(tl.float32)"
    if n % GEMM_MAX_TILE:  # a tile may reach past the row: those columns add nothing
        v = f"tl.where((rn < {n})[None, :], {v}, 0.0)"
    rows = f"(rm < {m})[:, None] & " if m % GEMM_MAX_TILE else ""
    slots = f"tl.arange(0, BLOCK_N // {c})"
    return [
        f"{name} = tl.sum({v}, axis=1)",
        f"rj = pid_n * (BLOCK_N // {c}) + {slots}",
        f"{name} = tl.where(({slots} == 0)[None, :], {name}[:, None], 0.0)",
        f"tl.store({pointers[out.tensor]} + rm[:, None] * {chunks} + rj[None, :], {name}, "
        f"mask={rows}(rj < {chunks})[None, :])",
    ]


def _prologue_product(match, pointers, extras, reduced, row_masks, width, products, stride,
                      convert) -> list[str]:
    """The product loop of a GEMM whose ``A`` is computed (a folded normalization): each
    (BLOCK_M, BLOCK_K) tile of ``A`` is computed in registers from the tensors it reads and the
    row statistics, then multiplied."""
    k = match.frame.extents["k"]
    dtype = tl_dtype(match.dtype)
    masks = dict(row_masks)
    k_mask = f"(kk < {k})[None, :]"
    if k % GEMM_MAX_TILE:
        masks["k"] = k_mask
    printer = ElemPrinter({"b": "pid_b", "m": "rm[:, None]", "k": "kk[None, :]"}, masks,
                          pointers, extras, {}, prefix="a_", reduced=reduced)
    value = printer.expr(match.prologue)
    zeros = "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)"
    lines = [f"acc{i} = {zeros}" for i in range(products)]
    lines += [f"for k0 in range(0, {k}, BLOCK_K):", "    kk = k0 + tl.arange(0, BLOCK_K)"]
    body = [*printer.lines, f"a = {value}.to({dtype})"]
    if "k" in masks:  # the padding past k must not reach the product
        body.append(f"a = tl.where({k_mask}, a, 0.0)")
    for i in range(products):
        load = (f"tl.load(B{i} + kk[:, None] * {stride(i, 0)} + rn[None, :] * {stride(i, 1)}, "
                f"mask=(kk[:, None] < {k}) & (rn[None, :] < {width}), other=0.0)")
        body.append(f"b{i} = {load}" + (f".to({dtype})" if convert else ""))
        body.append(f"acc{i} = tl.dot(a, b{i}, acc{i}, input_precision=DOT_PREC)")
    return lines + ["    " + line for line in body]


def _tma_stores(match) -> dict:
    """Output tensor -> ``(descriptor name, view role)`` of every output of a one-band GEMM,
    when TMA can store each (row-major over (m, n), 16-byte aligned, no moments); else {}."""
    if len(match.segments) != 1:
        return {}
    (seg,) = match.segments
    n_axis = n_axis_of(match.views["b0.0"])
    stores = {}
    for oi, out in enumerate(seg.outputs):
        if out.chunk or tma_unreadable(match.views[f"out0.{oi}"], n_axis, "m"):
            return {}
        stores[out.tensor] = (f"o{oi}_desc", f"out0.{oi}")
    return stores


def tma_layout(match, apart: bool = False):
    """How TMA reads a GEMM's operands: ``(b_nk, b_row_stride)``, or why it cannot.

    One product per band, no batch axis, A contiguous along k and B along k (a Linear weight,
    ``b_nk``) or n, every other stride and offset a multiple of 16 bytes (TMA's alignment); the
    bands (if several) consecutive column ranges of one B tensor (see
    :mod:`tvm_stitch.analysis.weights`), which one descriptor reads, or with ``apart`` any B
    tensors of the same strides and dtype, each band read through a descriptor of its own
    (:func:`tma_descriptors` makes them)."""
    if match.paired:  # one product over the joined B (gate and up in turn)
        match = _one_product(match)
    ext = match.frame.extents
    if match.runtime and not apart:  # the warp-specialized form's are made on the host, at
        # call time (:mod:`tvm_stitch.codegen.runtime`); the Triton form's in the kernel
        return "rows known at run time (a descriptor is made for its sizes)"
    if any(len(seg.products) != 1 for seg in match.segments):
        return "several products"
    if match.prologue is not None:
        return "A is computed"
    if ext.get("b", 1) != 1:
        return "a batch axis"
    a, bv = match.views["a"], match.views["b0.0"]
    n_axis = n_axis_of(bv)
    s_bk, s_bn = _strides(bv, "k", n_axis)
    if s_bk != 1 and s_bn != 1:
        return "B is contiguous along neither k nor n"
    b_nk = s_bk == 1
    why = tma_unreadable(a, "k", "m")
    if why:
        return f"A {why}"
    if len(match.segments) > 1 and any(o.chunk for o in match.all_outputs):
        return "bands writing row moments"
    for si in range(len(match.segments)):
        view = match.views[f"b{si}.0"]
        if _strides(view, "k", n_axis_of(view)) != [s_bk, s_bn] or view.dtype != bv.dtype:
            return "bands read B with different strides"
    why = _apart(match)  # one descriptor: B's bands are consecutive columns of one tensor
    if why and not apart:
        return why
    for si in range(len(match.segments) if why else 1):  # else a descriptor a band
        view = match.views[f"b{si}.0"]
        n_si = n_axis_of(view)
        why = tma_unreadable(view, "k", n_si) if b_nk else tma_unreadable(view, n_si, "k")
        if why:
            return f"B {why}" if not si else f"band {si}'s B {why}"
    return b_nk, s_bn if b_nk else s_bk


def _one_product(match):
    """A paired GEMM (:func:`~tvm_stitch.analysis.weights.pair_weights`) as the one product it
    computes: twice the columns, over the joined B, rows (columns) one apart."""
    import dataclasses

    from tvm_stitch.analysis.match import Segment

    (seg,) = match.segments
    view = match.views["b0.0"]
    n_axis = n_axis_of(view)
    joined = Strided(view.tensor, view.shape, view.dtype, 0,
                     tuple((a, s // 2 if a == n_axis else s) for a, s in view.strides))
    return dataclasses.replace(
        match, paired=False, views={**match.views, "b0.0": joined},
        segments=[Segment(2 * seg.n, seg.products[:1], seg.outputs, seg.covered)])


def _apart(match) -> str | None:
    """Why ``match``'s bands are not consecutive column ranges of one B tensor, or None."""
    bv = match.views["b0.0"]
    s_bn = _strides(bv, "k", n_axis_of(bv))[1]
    column = bv.offset
    for si, seg in enumerate(match.segments):
        view = match.views[f"b{si}.0"]
        if view.tensor != bv.tensor:
            return "bands read different B tensors"
        if view.offset != column:
            return "bands are not consecutive columns of B"
        column += seg.n * s_bn
    return None


def tma_descriptors(match, apart: bool = False) -> tuple | str:
    """The TMA descriptors of ``match``'s operands, ``a_desc`` then ``b_desc`` (all bands'
    columns), or with ``apart`` and bands reading B tensors of their own, a descriptor a band
    (``b_desc``, ``b1_desc``, ...); or why TMA cannot read them (:func:`tma_layout`)."""
    layout = tma_layout(match, apart)
    if isinstance(layout, str):
        return layout
    b_nk, b_stride = layout
    columns = (2, "BLOCK_N") if match.paired else "BLOCK_N"
    if match.paired:
        match = _one_product(match)
    a = match.views["a"]
    m, k = match.frame.extents["m"], match.frame.extents["k"]
    s_am = _strides(a, "m", "k")[0]
    box = (columns, "BLOCK_K") if b_nk else ("BLOCK_K", columns)
    descs = [Descriptor("a_desc", a.tensor, a.dtype, a.offset, m, k, s_am, ("BLOCK_M", "BLOCK_K"))]
    if _apart(match) is None:  # one descriptor over every band's columns
        widths = [sum(seg.n for seg in match.segments)]
    else:
        widths = [seg.n for seg in match.segments]
    for si, n in enumerate(widths):
        bv = match.views[f"b{si}.0"]
        descs.append(Descriptor("b_desc" if not si else f"b{si}_desc", bv.tensor, bv.dtype,
                                bv.offset, *((n, k) if b_nk else (k, n)), b_stride, box))
    return tuple(descs)


def n_axis_of(view: Strided) -> str:
    axes = [a for a, _ in view.strides if a.startswith("n")]
    nonzero = [a for a, s in view.strides if a.startswith("n") and s]
    return (nonzero or axes or ["n"])[0]


def _strides(view: Strided, *axes) -> list[int]:
    s = view.stride
    return [s.get(a, 0) for a in axes]


kernel = gemm_source  # the family's printer (see :mod:`tvm_stitch.families`)


def grid(config: dict, match, source) -> tuple:
    """Programs along x, y: one per output tile (times ``SPLIT_K``) and batch instance; a
    persistent launch (the Triton form's ``PERSISTENT``, the warp-specialized form's consumer
    warpgroups, whose descriptors are its own) one per SM."""
    tiles = output_tiles(match, config)
    if (source.persistent and config.get("PERSISTENT")) or consumers(config) > 1:
        return (smaller(config["NUM_SMS"], tiles), 1)
    return (tiles * config.get("SPLIT_K", 1), match.frame.extents.get("b", 1))


def output_tiles(match, config: dict) -> int:
    """Output tiles of one batch instance of a GEMM (every band's columns) for ``config``: a
    warp-specialized launch's tile is ``WS`` consumers' ``BLOCK_M`` rows each."""
    tiles_n = sum(cdiv(s.n, config["BLOCK_N"]) for s in match.segments)
    rows = config["BLOCK_M"] * consumers(config)
    return cdiv(match.frame.extents["m"], rows) * tiles_n


def buffers(source, match, consts: dict) -> dict:
    """Buffers a split-K launch needs (``consts`` from
    :func:`~tvm_stitch.codegen.kernel_text.launch_constexprs`): name -> ``(elements, dtype)``
    for the float32 workspace ``WS`` (``SPLIT_K`` partial tiles per output tile and product)
    and the int32 counters ``CNT`` (one per output tile), which must be zero before the first
    launch (the kernel leaves them zero); empty without a split."""
    split = consts.get("SPLIT_K", 1)
    if not source.split_k or split == 1:
        return {}
    tiles = output_tiles(match, consts) * match.frame.extents.get("b", 1)
    products = len(match.segments[0].products)
    per_tile = split * products * consts["BLOCK_M"] * consts["BLOCK_N"]
    return {"WS": (tiles * per_tile, "float32"), "CNT": (tiles, "int32")}
