"""Compile on one machine, run on another (``tvm-stitch build`` / ``tvm-stitch check``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tvm_stitch import library
from tvm_stitch.cli import main


def test_build_then_check_on_the_cpu(tmp_path, capsys):
    """The saved folder holds the executable, its arguments, its reference outputs and what the
    workload was; check runs the library and compares with the reference."""
    folder = tmp_path / "bert"
    assert main(["build", "bert-tiny", "-p", "batch=2", "-p", "seq=7", "-o", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == [
        "args.npz", "expected.npz", "meta.json", "mod.so"]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["params"] == {"batch": 2, "seq": 7} and meta["target"] == "llvm"
    result = library.check(folder)
    assert result["correct"] and result["max_err"] < 1e-3 and result["time_us"] > 0
    capsys.readouterr()
    assert main(["check", str(folder)]) == 0
    assert "correct" in capsys.readouterr().out
    # where only TVM's runtime is installed: no Relax, no pipeline, no workloads (apache-tvm-ffi
    # imports PyTorch itself when it is installed)
    script = (
        "import sys, tvm_stitch\n"
        "from tvm_stitch import library\n"
        f"r = library.check({str(folder)!r})\n"
        "bad = [m for m in ('tvm.relax', 'tvm_stitch.pipeline', 'tvm_stitch.workloads')\n"
        "       if m in sys.modules]\n"
        "print(r['correct'], bad)\n"
    )
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True []"
    # a wrong reference is reported as wrong
    args = np.load(folder / "expected.npz")
    np.savez(folder / "expected.npz", dtypes=args["dtypes"], a0=args["a0"] + 1.0)
    assert main(["check", str(folder)]) == 1


def test_check_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(SystemExit, match="not a saved workload"):
        main(["check", str(tmp_path)])
    (tmp_path / "meta.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(SystemExit, match="format 99"):
        main(["check", str(tmp_path)])
    meta = {"format": library.FORMAT, "name": "x", "target": "cuda"}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit, match="unreadable arrays"):
        main(["check", str(tmp_path)])
    for name in ("args.npz", "expected.npz"):
        np.savez(tmp_path / name, dtypes=np.array(["float32"]), a0=np.zeros(3, "float32"))
    import tvm

    if not tvm.cuda(0).exist:
        with pytest.raises(SystemExit, match="compiled for cuda; no such device"):
            main(["check", str(tmp_path)])
