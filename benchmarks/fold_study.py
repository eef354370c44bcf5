"""Where a folded normalization's cost goes in the warp-specialized Gluon GEMM (issue 11: five
kernels a layer without losing speed).

    python -m tvm_stitch.benchmarks.fold_study [--batch 8] [--seq 512] [--rounds 5]
        [--tiles C,N,K,SLOTS[,EW];...] [--only TEXT] [--variants NAME,...] [--show NAME]
        [--grid-ln] [--stage32]

With ``fold_norms`` (and ``lift_params``), BERT-base's GEMMs read row statistics (Q/K/V,
FFN-in, and the residual of the out-projection and FFN-out) and write row moments (the
out-projection and FFN-out); each costs ~3 µs more than its unfolded form at 8×512
(``h100-launch-exit-2026-11-26.md``). This study times the folded kernels as generated beside
copies of their text with one part of the consumers' epilogue taken out or done another way
(the numbers they compute are then wrong: only the time means something):

* ``no-moments``: the moments' row sums and stores removed;
* ``const-stats``: the statistics neither loaded nor combined (a constant row);
* ``stats-rows``: the moments' pieces loaded in the accumulator's own row layout, a piece at a
  time, and added after the product loop: no layout conversion;
* ``stats-late``: the pieces loaded after the product loop instead of before it;
* ``stats-async``: the pieces copied into shared memory by ``cp.async`` before the product
  loop, read back after it (no register load outstanding at a ``wgmma``);
* ``moments-late``: the values only the moments read computed after the output's store is
  issued;
* ``cols-after``: column vectors loaded after the product loop in the accumulator's layout
  instead of before it in a compact layout converted after it;
* ``bare``: both the moments and the statistics removed.

Each variant is timed in ``--rounds`` interleaved rounds (CUDA-graph replays; medians), the
unfolded kernel of the same shape and cuBLAS beside them.

``--grid-ln`` times the other way to five kernels a layer: the unfolded residual GEMMs
(out-projection, FFN-out) normalizing their own rows after a grid-wide barrier
(:func:`grid_ln`; one wave, so every program is resident), against the GEMM followed by a
LayerNorm kernel, with the one kernel's output checked against the two's.

``--stage32`` times the folded GEMMs whose consumers compute a normalized value before
staging it for the epilogue partition (FFN-in) against a copy staging the float32 product
instead, the partition computing the normalization (:func:`stage32`).

Results: ``benchmarks/results/h100-fold-costs-2026-11-27.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics

from tvm_stitch.benchmarks.ws_gemm import device_hw, generated_gemms, parse_tiles

from tvm_stitch.codegen.triton_gen import _gemm_tiles


def _consumer(text: str) -> tuple[str, str, str]:
    """``text`` split around the consumer function's body (``_consume``)."""
    start = text.index("def _consume(")
    end = text.index("def _consume1(")
    return text[:start], text[start:end], text[end:]


def no_moments(body: str) -> str:
    out = []
    for line in body.splitlines(keepends=True):
        if re.search(r"\bmo\d", line) or "for piece in" in line:
            continue
        out.append(line)
    return "".join(out)


def const_stats(body: str) -> str:
    out = []
    for line in body.splitlines(keepends=True):
        m = re.match(r"(\s*)(stat\d+) = gl\.convert_layout\(", line)
        if m:
            out.append(f"{m[1]}{m[2]} = gl.full([BLOCK_M], 768.0, gl.float32, "
                       "layout=gl.SliceLayout(1, ACC_L))\n")
            continue
        if re.match(r"\s*(s\d+_0 = gl\.load\(|stat\d+ = gl\.full\(\[BLOCK_M\], 0\.0)", line):
            continue
        out.append(line)
    return "".join(out)


def stats_rows(body: str) -> str:
    """The pieces of each statistic loaded one by one in ``SliceLayout(1, ACC_L)`` (the rows a
    thread's accumulator holds) before the loop, added after it."""
    out, pieces = [], {}
    for line in body.splitlines(keepends=True):
        m = re.match(r"(\s*)s(\d+)_0 = gl\.load\((\w+) \+ rs\[:, None\] \* (\d+) "
                     r"\+ rr\d+\[None, :\], "
                     r"mask=\(rs < (\d+)\)\[:, None\] & \(rr\d+ < (\d+)\)", line)
        if m:
            ind, i, ptr, stride, rows, n = m.groups()
            pieces[i] = int(n)
            for p in range(int(n)):
                out.append(f"{ind}s{i}_p{p} = gl.load({ptr} + rm * {stride} + {p}, "
                           f"mask=rm < {rows}, other=0)\n")
            continue
        m = re.match(r"(\s*)stat(\d+) = gl\.full\(\[BLOCK_M\], 0\.0.*", line)
        if m and m[2] in pieces:
            terms = " + ".join(f"s{m[2]}_p{p}.to(gl.float32)" for p in range(pieces[m[2]]))
            out.append(f"{m[1]}stat{m[2]} = {terms}\n")
            continue
        if re.match(r"\s*stat\d+ = gl\.convert_layout\(", line):
            continue
        out.append(line)
    return "".join(out)


def _stat_loads(body: str):
    """The statistics' piece loads of ``body``: ``{index: (line, indent)}``."""
    found = {}
    for line in body.splitlines(keepends=True):
        m = re.match(r"(\s*)s(\d+)_0 = gl\.load\(.*\)\s*$", line)
        if m:
            found[m[2]] = (line, m[1])
    return found


def stats_late(body: str) -> str:
    """The pieces loaded after the product loop, right before they are summed."""
    loads = _stat_loads(body)
    out = []
    for line in body.splitlines(keepends=True):
        if any(line == ld for ld, _ in loads.values()):
            continue
        m = re.match(r"(\s*)stat(\d+) = gl\.full\(\[BLOCK_M\], 0\.0", line)
        if m and m[2] in loads:
            out.append(m[1] + loads[m[2]][0].lstrip())
        out.append(line)
    return "".join(out)


def stats_async(body: str) -> str:
    """The pieces copied to shared memory by ``cp.async`` before the product loop (no register
    is written, so nothing waits for them before a ``wgmma``), read back after it."""
    loads = _stat_loads(body)
    if not loads:
        return body
    out = []
    for line in body.splitlines(keepends=True):
        if "STAT_L: gl.constexpr" in line:
            out.append(line)
            ind = re.match(r"\s*", line)[0]
            for i in loads:
                out.append(f"{ind}st{i} = gl.allocate_shared_memory(gl.float32, [BLOCK_M, 8], "
                           "gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))\n")
            continue
        m = re.match(r"(\s*)s(\d+)_0 = gl\.load\((.*), other=0\)\s*$", line)
        if m and m[2] in loads:
            ptr, mask = m[3].split(", mask=")
            out.append(f"{m[1]}_async_load(st{m[2]}, {ptr}, mask={mask})\n")
            if m[2] == max(loads):
                out.append(f"{m[1]}async_copy.commit_group()\n")
            continue
        m = re.match(r"(\s*)stat(\d+) = gl\.full\(\[BLOCK_M\], 0\.0", line)
        if m and m[2] in loads:
            if m[2] == min(loads):
                out.append(f"{m[1]}async_copy.wait_group(0)\n")
            out.append(f"{m[1]}s{m[2]}_0 = st{m[2]}.load(STAT_L)\n")
        out.append(line)
    return "".join(out)


def moments_late(body: str) -> str:
    """The values only the moments read computed after the output's store is issued."""
    lines = body.splitlines(keepends=True)

    def moment(line):
        return re.match(r"\s*mo\d+ = gl\.sum", line)

    first = next((i for i, line in enumerate(lines) if moment(line)), None)
    if first is None:
        return body
    defs = {}
    for i, line in enumerate(lines[:first]):
        m = re.match(r"\s*(e\d+_\d+) = ", line)
        if m:
            defs[m[1]] = i
    moved, grew = set(), True
    while grew:  # a value moves when every line reading it is a moment's or has moved
        grew = False
        for name, i in defs.items():
            readers = [j for j, line in enumerate(lines)
                       if j != i and re.search(rf"\b{name}\b", line)]
            if i not in moved and readers and all(moment(lines[j]) or j in moved
                                                  for j in readers):
                moved.add(i)
                grew = True
    if not moved:
        return body
    ind = re.match(r"\s*", lines[first])[0]
    late = [ind + lines[i].lstrip() for i in sorted(moved)]
    return "".join([line for i, line in enumerate(lines[:first]) if i not in moved] + late
                   + lines[first:])


def cols_after(body: str) -> str:
    out, hoisted = [], {}
    for line in body.splitlines(keepends=True):
        m = re.match(r"(\s*)(e\d+_\d+) = gl\.load\((\w+) \+ rc\)\s*$", line)
        if m:
            hoisted[m[2]] = m[3]
            continue
        m = re.match(r"(\s*)(e\d+_\d+) = gl\.convert_layout\(\2, gl\.SliceLayout\(0, ACC_L\)\)"
                     r"\[None, :\]", line)
        if m and m[2] in hoisted:
            out.append(f"{m[1]}{m[2]} = gl.load({hoisted[m[2]]} + rn)[None, :]\n")
            continue
        out.append(line)
    return "".join(out)


VARIANTS = {
    "no-moments": no_moments,
    "const-stats": const_stats,
    "stats-rows": stats_rows,
    "cols-after": cols_after,
    "stats-late": stats_late,
    "stats-async": stats_async,
    "moments-late": moments_late,
    "bare": lambda body: const_stats(no_moments(body)),
}


def variant(source, name: str):
    head, body, tail = _consumer(source.ws)
    changed = VARIANTS[name](body)
    if changed == body:
        return None
    if "async_copy." in changed:
        head = head.replace("\nfrom triton.language import",
                            _ASYNC + "from triton.language import", 1)
    return dataclasses.replace(source, ws=head + changed + tail)


_ASYNC = """
from triton.experimental.gluon.language.nvidia.ampere import async_copy
# cp.async (renamed after Triton 3.6)
_async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
"""


def timed_rounds(fns: dict, rounds: int, tag) -> dict:
    """Each of ``fns`` (name -> launch) timed in ``rounds`` interleaved rounds of CUDA-graph
    replays; prints and returns the medians. A launch that fails is reported and dropped."""
    from tvm_stitch.tune.measure import time_torch

    times = {name: [] for name in fns}
    live = dict(fns)
    for _ in range(rounds):
        for name, fn in list(live.items()):
            try:
                times[name].append(time_torch(fn, [], "cuda", budget_ms=20))
            except Exception as e:  # noqa: BLE001 - a variant that fails is reported
                print(f"  {tag} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                del live[name]
    medians = {name: statistics.median(ts) for name, ts in times.items() if ts}
    for name, ts in times.items():
        if ts:
            print(f"  {tag} {name:12s} {medians[name]:6.2f} us "
                  f"({' '.join(f'{x:.2f}' for x in ts)})", flush=True)
    return medians


def _unfolded(batch: int, seq: int) -> dict:
    """BERT-base's unfolded GEMMs (one layer, Q/K/V joined) by description."""
    return {g[0].describe(): g for g in generated_gemms("bert-base", batch=batch, seq=seq,
                                                         layers=1, joined=True)}


def run(batch: int, seq: int, rounds: int, tiles: list, only: str | None,
        names: list | None = None) -> None:
    import torch

    from tvm_stitch.codegen.gluon_gemm import ws_config
    from tvm_stitch.tune.kernels import generated_runner
    from tvm_stitch.tune.measure import time_torch

    hw = device_hw()
    plain = _unfolded(batch, seq)
    folded = generated_gemms("bert-base", batch=batch, seq=seq, layers=2, joined=True,
                             fold_norms=True)
    for match, source, shapes, _ in folded:
        if not source.ws or (only and only not in match.describe()):
            continue
        outs = ", ".join(source.outputs)
        ext = match.frame.extents
        m, k, n = ext["m"], ext["k"], sum(s.n for s in match.segments)
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        wt = torch.randn(k, n, device="cuda", dtype=torch.float16)
        cublas = time_torch(lambda x, wt=wt: torch.matmul(x, wt), [a], "cuda")
        print(f"{match.describe()} ({source.name}: reads {', '.join(source.inputs)}; writes "
              f"{outs}): cuBLAS matmul {cublas:.1f} us", flush=True)
        forms = {"folded": source}
        for name in names or VARIANTS:
            changed = variant(source, name)
            if changed is not None:
                forms[name] = changed
        unfolded = plain.get(match.describe())
        for t in tiles:
            config = ws_config(*t)
            fns = {}
            for name, src in forms.items():
                fns[name] = generated_runner(match, src, shapes, hw=hw)(config)
            if unfolded is not None:
                fns["unfolded"] = generated_runner(unfolded[0], unfolded[1], unfolded[2],
                                                   hw=hw)(config)
            timed_rounds(fns, rounds, t)


_GRID_SYNC = '''
_wg_barrier = getattr(gl, "thread_barrier", None) or gl.barrier  # renamed after Triton 3.6


@gluon.jit
def _grid_sync(cnt, total):
    # every consumer warpgroup of every program counts itself in on cnt (its first thread
    # counts and spins; int64, never reset: launch g waits for (g + 1) * total); one wave:
    # all programs are resident
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    ptr = cnt + gl.zeros([128], gl.int32, L)
    c0 = gl.inline_asm_elementwise("ld.relaxed.gpu.global.u64 $0, [$1];", "=l,l", [ptr],
                                   dtype=gl.int64, is_pure=False, pack=1)
    target = (c0 // total + 1) * total
    _wg_barrier()  # the warpgroup's stores before its count
    gl.inline_asm_elementwise(
        "{ .reg .pred p, q; .reg .b32 t; .reg .b64 c; mov.u32 t, %tid.x; and.b32 t, t, 127; "
        "setp.eq.u32 q, t, 0; @q red.release.gpu.global.add.u64 [$1], 1; "
        "spin: @q ld.acquire.gpu.global.u64 c, [$1]; @q setp.lt.s64 p, c, $2; "
        "@!q setp.ne.u32 p, t, t; @p nanosleep.u32 32; @p bra spin; mov.u32 $0, 0; }",
        "=r,l,l", [ptr, target], dtype=gl.int32, is_pure=False, pack=1)
    _wg_barrier()  # the warpgroup's first thread saw every count (acquire): the rest go on
'''


def grid_ln(source, match):
    """The unfolded GEMM's source whose consumers, instead of storing the output, store its
    rows' pieces of sum and sum of squares, synchronize the grid (:data:`_GRID_SYNC`), combine
    the pieces and store the LayerNorm of the rows (gamma, beta: extra inputs), or None."""
    text = source.ws
    m = re.search(rf"def {source.name}\(((?:I\d+, )+)((?:O\d+, )+)", text)
    ins = m[1].split(", ")[:-1]
    extra = [f"I{len(ins) + i}" for i in range(5)]  # pieces of sum, of squares, count, g, b
    text = text.replace(m[1] + m[2], m[1] + ", ".join(extra) + ", " + m[2])
    head, body, tail = _consumer(text)
    ext = match.frame.extents
    rows, n = ext["m"], sum(s.n for s in match.segments)
    p1, p2, cnt, gamma, beta = extra
    store = re.search(r"(\s*)c_smem\.index\(C\)\.store\(\((\w+)\)\.to\(gl\.float16\)\)", body)
    if store is None:
        return None
    ind, value = store[1].strip("\n"), store[2]
    new = [
        f"h = {value}.to(gl.float32)",
        f"gl.store({p1} + rm * ({n} // BLOCK_N) + pid_n, gl.sum(h, axis=1), mask=rm < {rows})",
        f"gl.store({p2} + rm * ({n} // BLOCK_N) + pid_n, gl.sum(h * h, axis=1), mask=rm < {rows})",
        f"gamma = gl.load({gamma} + rn[None, :])",
        f"beta = gl.load({beta} + rn[None, :])",
        f"_grid_sync({cnt}, gl.num_programs(0) * CONSUMERS)",
        "s1 = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, ACC_L))",
        "s2 = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, ACC_L))",
        f"for j in gl.static_range({n} // BLOCK_N):",
        f"    s1 += gl.load({p1} + rm * ({n} // BLOCK_N) + j, mask=rm < {rows}, other=0.0, "
        "cache_modifier='.cg')",
        f"    s2 += gl.load({p2} + rm * ({n} // BLOCK_N) + j, mask=rm < {rows}, other=0.0, "
        "cache_modifier='.cg')",
        f"mean = s1 / {n}",
        f"rstd = gl.rsqrt(gl.maximum(s2 / {n} - mean * mean, 0.0) + 1e-12)",
        "y = (h - mean[:, None]) * rstd[:, None] * gamma.to(gl.float32) + beta.to(gl.float32)",
        "c_smem.index(C).store(y.to(gl.float16))",
    ]
    body = body.replace(store[0], "".join(f"\n{ind}{line}" for line in new), 1)
    head = head.replace("\n\n@gluon.jit\ndef _tile_of",
                        _GRID_SYNC + "\n\n@gluon.jit\ndef _tile_of", 1)
    return dataclasses.replace(source, ws=head + body + tail,
                               inputs=[*source.inputs, "grid_p1", "grid_p2", "grid_cnt",
                                       "grid_gamma", "grid_beta"])


def run_grid_ln(batch: int, seq: int, rounds: int, tiles: list) -> None:
    """The unfolded out-projection and FFN-out, each with the LayerNorm after it: two
    kernels (the GEMM, then :func:`~tvm_stitch.benchmarks.grid_sync_study.layernorm`) against
    one (:func:`grid_ln`), in CUDA graphs, timed in interleaved rounds; the one kernel's
    output checked against the two."""
    import torch
    import triton
    from tvm_stitch.benchmarks.grid_sync_study import layernorm

    from tvm_stitch.codegen.gluon_gemm import ws_config
    from tvm_stitch.tune.kernels import generated_runner

    hw = device_hw()
    for match, source, shapes, _ in generated_gemms("bert-base", batch=batch, seq=seq, layers=1,
                                                    joined=True):
        if not source.ws or len(match.segments) > 1 or "r0_desc" not in source.ws:
            continue  # BERT's LayerNorms follow the GEMMs that add a residual
        fused = grid_ln(source, match)
        if fused is None:
            continue
        ext = match.frame.extents
        rows, n = ext["m"], sum(s.n for s in match.segments)
        both = {**shapes, "grid_p1": ((rows * 8,), "float32"),
                "grid_p2": ((rows * 8,), "float32"), "grid_cnt": ((1,), "int64"),
                "grid_gamma": ((n,), "float16"), "grid_beta": ((n,), "float16")}
        print(f"{match.describe()} ({source.name}) + LayerNorm", flush=True)
        for t in tiles:
            config = ws_config(*t)
            programs = _gemm_tiles(match, config)
            if programs > hw.num_sms:
                print(f"  {t}: {programs} tiles, more than one wave: no grid-wide barrier")
                continue
            plain_run = generated_runner(match, source, both, hw=hw)
            fused_run = generated_runner(match, fused, both, hw=hw)
            for a, b in zip(plain_run.inputs, fused_run.inputs):
                b.copy_(a)
            gamma, beta = fused_run.inputs[-2], fused_run.inputs[-1]
            y = plain_run.outputs[0].view(rows, n)
            out = torch.empty_like(y)
            gemm = plain_run(config)

            def norm(y=y, out=out, gamma=gamma, beta=beta, rows=rows, n=n):
                layernorm[(triton.cdiv(rows, 4),)](y, gamma, beta, out, rows, n, 1e-12, ROWS=4,
                                                   BLOCK=triton.next_power_of_2(n), num_warps=4)

            one = fused_run(config)
            fns = {"gemm": gemm, "layernorm": norm,
                   "two kernels": lambda g=gemm, f=norm: (g(), f()), "one kernel": one}
            gemm()
            norm()
            one()
            torch.cuda.synchronize()
            err = (fused_run.outputs[0].view(rows, n).float() - out.float()).abs().max().item()
            timed_rounds(fns, rounds, t)
            print(f"  {t} one kernel against two: max abs difference {err:.3g}; grid count "
                  f"{int(fused_run.inputs[-3].item())}", flush=True)


_F32_LAYOUT = '''

@gluon.constexpr_function
def _f32_layout(m, n):
    return gl.NVMMASharedLayout.get_default_for([m, n], gl.float32)
'''


def stage32(source):
    """A folded GEMM whose consumers hand the epilogue partition (``EW``) their float32
    product, not the 16-bit normalized value: the partition loads the statistics and column
    sums and computes ``rstd · (P − mean · c) + d`` itself, off the tensor cores' critical
    path (the staging tiles twice as large). None where the consumers compute nothing
    before staging."""
    text = source.ws
    head, body, tail = _consumer(text)
    lines = body.splitlines(keepends=True)
    try:
        pre = lines.index(next(x for x in lines if "else:  # EW: the staged value's reads" in x))
        zeros = lines.index(next(x for x in lines if "acc0 = gl.zeros(" in x))
        ew = lines.index(next(x for x in lines[zeros:] if x.strip() == "if EW:"), zeros)
        wait = lines.index(next(x for x in lines[ew:] if "mbarrier.wait(c_empty" in x), ew)
        store = wait + 1
    except StopIteration:
        return None
    m = re.match(r"(\s*)c_smem\.index\(C\)\.store\(\((\w+)\)\.to\(gl\.\w+\)\)", lines[store])
    if m is None:
        return None
    staged = m[2]
    reads = lines[pre + 1:zeros]
    compute = [x for x in lines[ew + 1:wait] if not x.strip().startswith("#")]
    if not compute:
        return None
    old_pre = reads[0][:len(reads[0]) - len(reads[0].lstrip())]
    body = "".join([*lines[:pre + 1], old_pre + "pass\n", *lines[zeros:ew + 1],
                    *lines[wait:store], f"{m[1]}c_smem.index(C).store(acc0)\n",
                    *lines[store + 1:]])
    # the partition: its reads before it waits, the staged value computed from the product
    part_start = tail.index("def _epilogue(")
    part = tail[part_start:]
    acc_l = re.search(r"\n(\s*)ACC_L: gl\.constexpr = gl\.BlockedLayout\(.*\)\n", part)
    part = part.replace(acc_l[0], acc_l[0] + f"{acc_l[1]}STAT_L: gl.constexpr = "
                        "gl.BlockedLayout([1, 4], [8, 4], [EW, 1], [1, 0])\n", 1)
    wait_p = re.search(r"\n(\s*)mbarrier\.wait\(c_full\.index\(C\), n & 1\)\n", part)
    ind = wait_p[1]

    def reindent(block, old):
        return "".join(ind + x[len(old):] if x.strip() else x for x in block)

    old_cmp = compute[0][:len(compute[0]) - len(compute[0].lstrip())]
    pre_text = reindent([x.replace("[4], [0]", "[EW], [0]") for x in reads
                         if not x.lstrip().startswith("rn =")], old_pre)
    part = part.replace(wait_p[0], "\n" + pre_text + wait_p[0].lstrip("\n"), 1)
    load = re.search(r"\n(\s*)acc16 = c_smem\.index\(C\)\.load\(ACC_L\)\n", part)
    part = part.replace(load[0], f"\n{ind}acc0 = c_smem.index(C).load(ACC_L)\n", 1)
    arrive = re.search(r"\n\s*mbarrier\.arrive\(c_empty\.index\(C\), count=1\)\n", part)
    part = part.replace(arrive[0], arrive[0] + reindent(compute, old_cmp)
                        + f"{ind}acc16 = {staged}.to(gl.float16)\n", 1)
    tail = tail[:part_start] + part
    alloc = re.search(r"\n(\s*)c_smem = gl\.allocate_shared_memory\(gl\.float16, "
                      r"\[CONSUMERS, BLOCK_M, BLOCK_N\],\s*o0_desc\.layout\)\n", tail)
    a = alloc[1]
    tail = tail.replace(alloc[0], (
        f"\n{a}if EW:\n{a}    c_smem = gl.allocate_shared_memory(gl.float32, [CONSUMERS, "
        f"BLOCK_M, BLOCK_N], _f32_layout(BLOCK_M, BLOCK_N))\n{a}else:\n{a}    c_smem = "
        f"gl.allocate_shared_memory(gl.float16, [CONSUMERS, BLOCK_M, BLOCK_N], "
        f"o0_desc.layout)\n"), 1)
    head = head.replace("\n\n@gluon.jit\ndef _tile_of",
                        _F32_LAYOUT + "\n\n@gluon.jit\ndef _tile_of", 1)
    return dataclasses.replace(source, ws=head + body + tail)


def run_stage32(batch: int, seq: int, rounds: int, tiles: list) -> None:
    """Folded GEMMs as generated against :func:`stage32` and their unfolded forms, timed in
    interleaved rounds; the two folded forms' outputs compared on the same inputs."""
    import torch

    from tvm_stitch.codegen.gluon_gemm import ws_config
    from tvm_stitch.tune.kernels import generated_runner

    hw = device_hw()
    plain = _unfolded(batch, seq)
    for match, source, shapes, _ in generated_gemms("bert-base", batch=batch, seq=seq, layers=2,
                                                    joined=True, fold_norms=True):
        if not source.ws:
            continue
        wide = stage32(source)
        if wide is None:
            continue
        print(f"{match.describe()} ({source.name})", flush=True)
        unfolded = plain.get(match.describe())
        for t in tiles:
            config = ws_config(*t)
            runs = {"folded": generated_runner(match, source, shapes, hw=hw),
                    "stage32": generated_runner(match, wide, shapes, hw=hw)}
            for t_name, a, b in zip(source.inputs, runs["folded"].inputs,
                                    runs["stage32"].inputs):
                if ".moment_" in t_name:  # pieces of a row of mean 0.5, variance 0.25
                    a.fill_(64.0)
                b.copy_(a)
            fns = {}
            for name, r in runs.items():
                try:
                    fns[name] = r(config)
                    fns[name]()
                except Exception as e:  # noqa: BLE001 - a form that fails is reported
                    print(f"  {t} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            if unfolded is not None:
                fns["unfolded"] = generated_runner(unfolded[0], unfolded[1], unfolded[2],
                                                   hw=hw)(config)
            torch.cuda.synchronize()
            if "folded" in fns and "stage32" in fns:
                diff = max((x.float() - y.float()).abs().max().item()
                           for x, y in zip(runs["folded"].outputs, runs["stage32"].outputs))
                print(f"  {t} stage32 against folded: max abs difference {diff:.3g}")
            timed_rounds(fns, rounds, t)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiles", default="3,128,64,4")
    parser.add_argument("--only", default=None)
    parser.add_argument("--variants", default=None, help="comma-separated; default: all")
    parser.add_argument("--show", default=None,
                        help="print the text of this variant of the first kernel and stop (CPU)")
    parser.add_argument("--grid-ln", action="store_true",
                        help="the residual GEMMs with their LayerNorm after a grid-wide barrier")
    parser.add_argument("--stage32", action="store_true",
                        help="folded GEMMs staging their float32 product for the partition")
    args = parser.parse_args(argv)
    if args.grid_ln:
        run_grid_ln(args.batch, args.seq, args.rounds, parse_tiles(args.tiles))
        return 0
    if args.stage32:
        run_stage32(args.batch, args.seq, args.rounds, parse_tiles(args.tiles))
        return 0
    if args.show:

        for match, source, _, _ in generated_gemms("bert-base", batch=args.batch, seq=args.seq,
                                                   layers=2, joined=True, fold_norms=True):
            if source.ws and (not args.only or args.only in match.describe()):
                changed = variant(source, args.show)
                print(f"# {source.name}: {'changed' if changed else 'unchanged'}")
                print(_consumer(changed.ws if changed else source.ws)[1])
        return 0
    run(args.batch, args.seq, args.rounds, parse_tiles(args.tiles), args.only,
        args.variants.split(",") if args.variants else None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
