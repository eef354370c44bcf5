"""Triton source for recognized kernels (:mod:`tvm_stitch.analysis.recognize`): the dispatch to
the families' printers (:func:`printed`), the kernels' names, and their loading.

One printer per family (``tvm_stitch/families/<family>/triton.py``'s ``kernel``) turns a
:class:`~tvm_stitch.analysis.match.Match` into the text of one ``@triton.jit`` kernel: shapes,
strides and offsets are literals, only the tensors' base pointers are arguments (inputs ``I0,
I1, ...`` then outputs ``O0, ...``), and the tile sizes and launch options stay
``tl.constexpr`` for the search; a GEMM's and an attention's warp-specialized Gluon form
(``families/<family>/gluon.py``) joins it where it applies.  Element expressions (epilogues,
attention logits) are printed operator by operator, each shared sub-expression once
(:mod:`tvm_stitch.codegen.elem_printer`).  The main loops are the templates' shared device
functions (:mod:`tvm_stitch.codegen.triton_kernels`), so a generated kernel and the template
the search measures run the same product loop.

The text is written to a cache directory and imported (Triton compiles functions from their
source), under a name derived from its content.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import logging
import os
import re
import sys
import threading
from pathlib import Path

from tvm_stitch.codegen.kernel_text import KernelSource, UnsupportedKernelError, pointer_args
from tvm_stitch.families import REGISTRY

logger = logging.getLogger("tvm_stitch.codegen")


def printed(match, name: str) -> KernelSource:
    """``match``'s kernel as its family prints it: the Triton form (the family's
    ``triton.kernel``) and, where the family has one and it applies, its warp-specialized Gluon
    form (``gluon.ws_source``, descriptors from ``gluon.ws_descriptors``; where
    ``gluon.ws_legality`` refuses it, without, the reason logged)."""
    family = REGISTRY[match.family]
    source = dataclasses.replace(family.module("triton").kernel(match, name), family=family.name)
    if not family.has("gluon"):
        return source
    gluon = family.module("gluon")
    why = gluon.ws_legality(match)  # with runtime extents, where its descriptors take them
    if why:
        logger.info("%s: no warp-specialized form: %s", match.describe(), why)
        return dataclasses.replace(source, ws=None, ws_descs=())
    return dataclasses.replace(source, ws=gluon.ws_source(match, name),
                               ws_descs=tuple(gluon.ws_descriptors(match)))


def kernel_source(match, name: str | None = None) -> KernelSource:
    """The generated kernel of ``match``, named after its content unless ``name`` is given."""
    draft = printed(match, "KERNEL")
    body = draft.text[draft.text.index("@triton.jit") :]  # the header names the call site
    if draft.ws:  # another form to search: records of the Triton form alone are stale
        body += draft.ws[draft.ws.index("@gluon") :]
    # the launch's buffers are part of the kernel: equal code over differently shaped tensors
    # (a residual of (1, s, h) in one layer, (s, h) in another) is another PrimFunc
    # (by the pointer arguments' order, never the graph's tensor names: equal kernels of two
    # layers or two models share their name, PrimFunc and tuning record)
    _, inputs, outputs = pointer_args(match)
    shapes = {v.tensor: (v.shape, v.dtype) for v in match.views.values()}
    signature = [shapes[t] for t in (*inputs, *outputs)]
    digest = hashlib.sha1((body + repr(signature)).encode()).hexdigest()[:10]
    name = name or f"stitch_{match.family}_{digest}"

    def named(text):  # the draft under its name (printing it again costs as much as the draft)
        return re.sub(r"\bKERNEL\b", name, text) if text else text

    return dataclasses.replace(draft, name=name, text=named(draft.text), ws=named(draft.ws))


# -- loading ---------------------------------------------------------------------------------------
_LOADED: dict = {}


#: unwritable kernel cache folders -> the temporary folder standing in for each
_CACHE_FALLBACKS: dict = {}


def cache_dir() -> Path:
    """Where generated sources are written (``$TVM_STITCH_CACHE`` or ``~/.cache/tvm-stitch``,
    its ``triton`` folder), made if missing; where that folder cannot be made or written, a
    private temporary folder of this process, removed at exit (with a warning, once)."""
    import atexit
    import shutil
    import tempfile

    from tvm_stitch.config import cache_root

    folder = cache_root() / "triton"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):  # writable, not only there
            return folder
    except OSError as err:
        fallbacks = _CACHE_FALLBACKS
        if folder not in fallbacks or not fallbacks[folder].is_dir():
            fallbacks[folder] = Path(tempfile.mkdtemp(prefix="tvm-stitch-triton-"))
            atexit.register(shutil.rmtree, fallbacks[folder], ignore_errors=True)
            logger.warning("kernel cache %s not writable (%s): generated sources go to %s",
                           folder, err, fallbacks[folder])
        return fallbacks[folder]


def load(source: KernelSource, config: dict | None = None):
    """The jitted function of ``source`` (written to :func:`cache_dir` and imported once); its
    warp-specialized Gluon form when ``config`` has ``WS``."""
    text = source.text
    if config and config.get("WS"):
        if not source.ws:
            raise UnsupportedKernelError(f"{source.name} has no warp-specialized form")
        text = source.ws
    key = hashlib.sha1(text.encode()).hexdigest()[:16]
    if key in _LOADED:
        return _LOADED[key]
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{source.name}_{key}.py"
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    module_name = f"tvm_stitch_generated_{key}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    _LOADED[key] = getattr(module, source.name)
    return _LOADED[key]
