"""What the command line shows while it works: steps with their progress, without the noise
third-party libraries print."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
import warnings

#: lines TVM's C++ logs that say nothing to a user of tvm-stitch: ``take`` in "fast" mode (the
#: embedding lookups of TVM's default pipeline; the stitch pipeline wraps ids, and from_torch
#: checks them), and ``pow(x, 3)`` in GELU's tanh form (an odd power of a real x is defined)
NOISE = ("Fast mode segfaults when there are out-of-bounds indices",
         "Detected pow(x, y) where y >= 3")

#: Python warnings of the libraries underneath, not of tvm-stitch
_THIRD_PARTY = r"(torch|transformers|tvm|tvm_ffi|triton|xgboost|copyreg)(\.|$)"


def say(text: str, width: int = 100) -> None:
    """Print ``text`` as paragraphs (blank lines between them) wrapped at ``width``."""
    import textwrap

    print("\n\n".join(textwrap.fill(p, width) for p in text.split("\n\n")))


def quiet_warnings() -> None:
    """Filter the deprecation and future warnings the libraries underneath raise."""
    for category in (FutureWarning, DeprecationWarning, UserWarning):
        warnings.filterwarnings("ignore", category=category, module=_THIRD_PARTY)


@contextlib.contextmanager
def filtered_stderr(noise=NOISE):
    """Inside the block, what is written to file descriptor 2 (C++ logs included) is kept back
    and written after it, without the lines that hold one of ``noise``."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # captured (pytest, notebooks): leave it
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(True)
                    if not any(n in line for n in noise)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


@contextlib.contextmanager
def step(label: str, out=None, every: float = 2.0):
    """Say ``label`` before a step and how long it took after it; on a terminal, the seconds
    count up (every ``every`` s) while it runs."""
    out = out or sys.stdout
    start = time.perf_counter()
    out.write(f"{label} ...")
    out.flush()
    tty = hasattr(out, "isatty") and out.isatty()
    stop = threading.Event()

    def tick():
        while not stop.wait(every):
            out.write(f"\r{label} ... {time.perf_counter() - start:.0f} s")
            out.flush()

    ticker = threading.Thread(target=tick, daemon=True) if tty else None
    if ticker:
        ticker.start()
    try:
        yield
    finally:
        stop.set()
        if ticker:
            ticker.join()
        seconds = time.perf_counter() - start
        out.write(f"\r{label} ... {seconds:.1f} s\n" if tty else f" {seconds:.1f} s\n")
        out.flush()
