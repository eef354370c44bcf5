"""Kernels launched dependently (programmatic dependent launch, sm_90) and what they do
before they wait.

A kernel launched with :data:`PDL_TAG` may start before the kernel before it has finished: its
first instructions wait for that grid (``griddepcontrol.wait``). :func:`dependent_launch` puts
the wait (and where the next launch is released) into a generated kernel's PTX,
:func:`dependent_kernels` into the kernels TVM schedules, and :func:`prefetch_inputs` has a
generated kernel pull its weights into L2 before it waits.
"""

from __future__ import annotations

import math

from tvm_stitch.config import DEFAULT_LAUNCH_DEPENDENTS, check_launch_dependents, release_point

#: TVM's launch tag for programmatic dependent launch (``cuLaunchKernelEx`` with programmatic
#: stream serialization; the spelling is TVM's)
PDL_TAG = "tirx.use_programtic_dependent_launch"


def dependent_launch(ptx: str, launch_dependents: str = "exit") -> str:
    """``ptx`` whose kernel may be launched before the kernel before it has finished
    (programmatic dependent launch, sm_90): its first instructions wait for that grid to complete
    and its memory to be visible (``griddepcontrol.wait``: before any load or store, so neither
    what it reads nor what it overwrites can race). Launched with :data:`PDL_TAG`, each generated
    kernel's launch and start-up overlap the previous kernel instead of following it; a kernel
    launched without the tag (TVM's own) waits for everything before it.

    ``launch_dependents`` (``"start"`` or ``"exit"``; :func:`compile_call` resolves
    ``"auto"``): ``"start"`` lets the next launch begin right after the wait
    (``griddepcontrol.launch_dependents``): the next kernel's blocks take the SMs this one
    leaves free and wait there; ``"exit"`` lets it begin once every block of this one has
    exited (no explicit trigger), so the next kernel's blocks are placed on SMs this one no
    longer holds."""
    if check_launch_dependents(launch_dependents) == "auto":
        raise ValueError("dependent_launch takes 'start' or 'exit': a grid resolves 'auto'")
    lines = ptx.splitlines(keepends=True)
    body = _first_instruction(lines)
    trigger = "\tgriddepcontrol.launch_dependents;\n" if launch_dependents == "start" else ""
    lines.insert(body, "\tgriddepcontrol.wait;\n" + trigger)
    return "".join(lines)


def _first_instruction(lines: list) -> int:
    """The index of the first line after the kernel's opening brace and its declarations."""
    start = next(i for i, line in enumerate(lines) if ".entry " in line)
    body = next(i for i in range(start, len(lines)) if lines[i].strip() == "{") + 1
    while lines[body].strip().startswith((".reg", ".shared", ".local")) or not lines[body].strip():
        body += 1
    return body


def prefetch_inputs(ptx: str, sizes: list[int]) -> str:
    """``ptx`` whose kernel takes one more pointer per entry of ``sizes`` (after its own
    parameters) and, first thing — before it waits for the grid before it
    (:func:`dependent_launch`), so while that grid still runs when it releases the next
    launch early — has its blocks pull those ``sizes[i]`` bytes into L2, each block one
    share (``cp.async.bulk.prefetch.L2``, issued by its first thread; a hint: it neither
    waits nor changes what is read). Meant for weights, which no kernel of the function
    writes: a small-M GEMM's latency is then its weights' walk through L2, not through
    memory.
    """
    if not sizes:
        return ptx
    lines = ptx.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if ".entry " in line)
    symbol = lines[start].split(".entry ", 1)[1].split("(", 1)[0].strip()
    close = next(i for i in range(start, len(lines)) if lines[i].strip() == ")")
    last = close - 1
    names = [f"{symbol}_prefetch_{i}" for i in range(len(sizes))]
    lines[last] = lines[last].rstrip("\n").rstrip(",") + ",\n"
    lines[close:close] = [f"\t.param .u64 {n}{',' if i < len(names) - 1 else ''}\n"
                          for i, n in enumerate(names)]
    code = ["{", ".reg .pred %pfp<2>;", ".reg .b32 %pfr<12>;", ".reg .b64 %pfd<3>;",
            "mov.u32 %pfr0, %tid.x;", "setp.ne.u32 %pfp0, %pfr0, 0;",
            "@%pfp0 bra $L__stitch_prefetch_done;",
            # the block's place in its grid (x fastest) and the grid's size
            "mov.u32 %pfr1, %ctaid.x;", "mov.u32 %pfr2, %ctaid.y;", "mov.u32 %pfr3, %ctaid.z;",
            "mov.u32 %pfr4, %nctaid.x;", "mov.u32 %pfr5, %nctaid.y;",
            "mov.u32 %pfr6, %nctaid.z;",
            "mad.lo.u32 %pfr7, %pfr3, %pfr5, %pfr2;", "mad.lo.u32 %pfr7, %pfr7, %pfr4, %pfr1;",
            "mul.lo.u32 %pfr8, %pfr4, %pfr5;", "mul.lo.u32 %pfr8, %pfr8, %pfr6;"]
    for i, (name, size) in enumerate(zip(names, sizes)):
        units = size // 16  # 16-byte pieces (what the instruction moves); a tail is left
        if units == 0:
            continue
        skip = f"$L__stitch_prefetch_skip{i}"
        code += [f"ld.param.u64 %pfd0, [{name}];", "cvta.to.global.u64 %pfd0, %pfd0;",
                 # a block's share: ceil(units / blocks) pieces, from id * share
                 f"add.u32 %pfr9, %pfr8, {units - 1};", "div.u32 %pfr9, %pfr9, %pfr8;",
                 "mul.lo.u32 %pfr10, %pfr7, %pfr9;",
                 f"setp.ge.u32 %pfp1, %pfr10, {units};", f"@%pfp1 bra {skip};",
                 f"sub.u32 %pfr11, {units}, %pfr10;", "min.u32 %pfr11, %pfr11, %pfr9;",
                 "shl.b32 %pfr11, %pfr11, 4;", "mul.wide.u32 %pfd1, %pfr10, 16;",
                 "add.s64 %pfd0, %pfd0, %pfd1;",
                 "cp.async.bulk.prefetch.L2.global [%pfd0], %pfr11;", f"{skip}:"]
    code += ["$L__stitch_prefetch_done:", "}"]
    # the first instruction: the wait, where :func:`dependent_launch` put one
    lines.insert(_first_instruction(lines), "".join(f"\t{c}\n" for c in code))
    return "".join(lines)


def dependent_kernels(func, launch_dependents: str = DEFAULT_LAUNCH_DEPENDENTS,
                      max_blocks: int | None = None, grids: list | None = None):
    """``func`` (a scheduled PrimFunc) whose kernels TVM launches dependently, or None when it
    launches none, says already how to (``tirx.kernel_launch_params``), or has a kernel of more
    than ``max_blocks`` blocks (or, released at ``"start"``, of a grid not known here): the
    TIR counterpart of
    :func:`dependent_launch`, for the kernels TVM generates (LayerNorms, gathers, copies).

    Each kernel — the statement under an outermost thread binding — first waits for the grid
    before it (``griddepcontrol.wait``, before any load or store), then with ``"start"`` lets
    the next launch begin (``"auto"``: where every kernel's grid is known and smaller than
    ``max_blocks``, :func:`~tvm_stitch.config.release_point`); the function is tagged
    :data:`PDL_TAG` (TVM adds the thread tags
    itself; the tag holds for all the function's kernels, so all wait or none does).  A
    statement above the kernels this walk does not know (anything but blocks, sequences,
    loops, conditions, attributes and flat statements) leaves the function as it is: None.
    ``grids``, where given, receives each kernel's blocks (None: known at run time).
    """
    from tvm import s_tir, tirx

    check_launch_dependents(launch_dependents)
    if func.attrs is not None and "tirx.kernel_launch_params" in func.attrs:
        return None
    if launch_dependents == "auto":  # the grids decide: walked once, released at exit
        seen = []
        if dependent_kernels(func, "exit", max_blocks, seen) is None:
            return None
        blocks = None if None in seen else max(seen)
        launch_dependents = release_point("auto", blocks, max_blocks)
    actions = ["wait"] + (["launch_dependents"] if launch_dependents == "start" else [])
    prologue = [tirx.Evaluate(tirx.call_intrin("void", "tirx.ptx.griddepcontrol", a, ""))
                for a in actions]
    grids = [] if grids is None else grids

    def kernel(node, body):
        grids.append(_blocks(node))
        return tirx.SeqStmt([*prologue, body])

    def walk(node):  # the node with every kernel under it rewritten; None: unknown structure
        if isinstance(node, tirx.For):
            if node.kind == tirx.ForKind.THREAD_BINDING:
                return tirx.For(node.loop_var, node.min, node.extent, node.kind,
                                kernel(node, node.body), node.thread_binding, node.annotations,
                                node.step)
            body = walk(node.body)
            return body and tirx.For(node.loop_var, node.min, node.extent, node.kind, body,
                                     node.thread_binding, node.annotations, node.step)
        if isinstance(node, tirx.AttrStmt):
            body = (kernel(node, node.body) if node.attr_key == "thread_extent"
                    else walk(node.body))
            return body and tirx.AttrStmt(node.node, node.attr_key, node.value, body)
        if isinstance(node, tirx.SeqStmt):
            seq = [walk(s) for s in node.seq]
            return None if any(s is None for s in seq) else tirx.SeqStmt(seq)
        if isinstance(node, s_tir.SBlockRealize):
            block = walk(node.block)
            return block and s_tir.SBlockRealize(node.iter_values, node.predicate, block)
        if isinstance(node, s_tir.SBlock):
            body = walk(node.body)
            return body and s_tir.SBlock(node.iter_vars, node.reads, node.writes,
                                         node.name_hint, body, node.init, node.alloc_buffers,
                                         node.match_buffers, node.annotations)
        if isinstance(node, tirx.IfThenElse):
            then, other = walk(node.then_case), node.else_case and walk(node.else_case)
            known = then is not None and (node.else_case is None or other is not None)
            return tirx.IfThenElse(node.condition, then, other) if known else None
        if isinstance(node, (tirx.Bind, tirx.Evaluate, tirx.BufferStore, tirx.AssertStmt,
                             tirx.DeclBuffer, tirx.AllocBuffer)):
            return node  # host work, or a declaration of the statements after it
        return None

    body = walk(func.body)
    if body is None or not grids:
        return None
    # a grid known only at run time (a dynamic build's) is launched dependently where the
    # next launch is released at exit: its small calls, where launches dominate, gain, and the
    # next kernel's blocks are placed only once this one's have left the SMs (the crowding
    # ``max_blocks`` guards against follows an early release)
    unknown = launch_dependents == "start"
    if max_blocks is not None and any(unknown if g is None else g > max_blocks for g in grids):
        return None
    return func.with_body(body).with_attr("tirx.kernel_launch_params", [PDL_TAG])


def _blocks(kernel) -> int | None:
    """The blocks of the kernel under ``kernel`` (its outermost thread binding: a loop or a
    ``thread_extent`` attribute) — the product of its ``blockIdx`` extents — or None when one
    is not a constant."""
    import tvm_ffi
    from tvm import tirx

    bindings = []  # (thread tag, extent) of every thread binding in the kernel

    def loop(node):
        if node.kind == tirx.ForKind.THREAD_BINDING:
            bindings.append((node.thread_binding.thread_tag, node.extent))

    def attr(node):
        if node.attr_key == "thread_extent":
            bindings.append((node.node.thread_tag, node.value))

    tvm_ffi.structural_walk(kernel, [(tirx.For, loop), (tirx.AttrStmt, attr)])
    extents = {}
    for tag, extent in bindings:
        if tag.startswith("blockIdx"):
            if not isinstance(extent, tirx.IntImm):
                return None
            extents[tag] = max(extents.get(tag, 1), int(extent))
    return math.prod(extents.values())
