"""Compile on one machine, run on another (``tvm-stitch build`` / ``tvm-stitch check``)."""

from __future__ import annotations

import json

import pytest

from tvm_stitch import library
from tvm_stitch.cli import main


def test_build_then_check_on_the_cpu(tmp_path, capsys):
    """The saved folder holds the executable and what the workload was, not its weights; check
    rebuilds the arguments, runs the library and compares with PyTorch."""
    folder = tmp_path / "bert"
    assert main(["build", "bert-tiny", "-p", "batch=2", "-p", "seq=7", "-o", str(folder)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "mod.so"]
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["params"] == {"batch": 2, "seq": 7} and meta["target"] == "llvm"
    result = library.check(folder)
    assert result["correct"] and result["max_err"] < 1e-3 and result["time_us"] > 0
    capsys.readouterr()
    assert main(["check", str(folder)]) == 0
    assert "correct" in capsys.readouterr().out


def test_check_refuses_what_it_cannot_run(tmp_path):
    with pytest.raises(SystemExit, match="not a saved workload"):
        main(["check", str(tmp_path)])
    (tmp_path / "meta.json").write_text(json.dumps({"format": 99}))
    with pytest.raises(SystemExit, match="format 99"):
        main(["check", str(tmp_path)])
    meta = {
        "format": library.FORMAT,
        "workload": "bert-tiny",
        "dtype": "float16",
        "params": {},
        "seed": 0,
        "target": "cuda",
    }
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    import tvm

    if not tvm.cuda(0).exist:
        with pytest.raises(SystemExit, match="compiled for cuda; no such device"):
            main(["check", str(tmp_path)])
