"""The notebooks run top to bottom on a CPU (their code cells, in order, in one namespace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, capsys):
    cells = json.loads(path.read_text())["cells"]
    namespace: dict = {"__name__": "__notebook__"}
    for i, cell in enumerate(c for c in cells if c["cell_type"] == "code"):
        source = "".join(cell["source"])
        exec(compile(source, f"{path.name}[{i}]", "exec"), namespace)
    assert capsys.readouterr().out  # the notebook printed its results
