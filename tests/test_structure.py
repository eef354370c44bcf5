"""The code's shape, read from its imports: no circle, no import from a lower layer to a higher
one, no product module importing a study, no module too large to read; and a package whose
import costs nothing until it is used."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The layers, lowest first: a module imports from its own layer or lower ones only. Data flows
#: one way: graph -> analysis (recognition, legality) -> cost/explore (decisions) ->
#: codegen/stitch (kernels) -> tuning (searches that build and time kernels) -> passes -> the
#: pipeline and its entry points -> tools.  A family folder spans layers (its recognition is
#: analysis, its cost terms cost, its printers and reference codegen, its search tuning: see
#: ``tvm_stitch/families/__init__.py``); the family registry itself is data.
LAYERS = [
    ("foundation", ["_hooks", "errors", "config", "hardware", "console", "library", "codegen.ptx",
                    "families"]),
    ("graph", ["graph"]),
    ("analysis", ["analysis", "families.*.recognize"]),
    ("cost/explore", ["cost", "explore", "families.*.cost"]),
    ("codegen/stitch", ["codegen", "stitch", "families.*.triton", "families.*.gluon",
                        "families.*.gluon_launch", "families.*.reference",
                        "families.*.template"]),
    ("tuning", ["tune", "families.*.tune"]),
    ("passes", ["passes"]),
    ("pipeline", ["pipeline", "report", "frontend", "executables", "workloads", "fuzz"]),
    ("tools", ["benchmarks", "cli", "__main__"]),
]
MAX_LINES = 900


def _name(path: Path) -> str | None:
    """The installed module name of a source file (passes/ and benchmarks/ are installed as
    tvm_stitch.passes and tvm_stitch.benchmarks; benchmarks/studies/ is not installed)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in ("passes", "benchmarks"):
        if parts[0] == "benchmarks" and len(parts) > 2:
            return None
        parts = ["tvm_stitch", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    files = [*ROOT.glob("tvm_stitch/**/*.py"), *ROOT.glob("passes/*.py"),
             *ROOT.glob("benchmarks/*.py")]
    return {name: f for f in files if (name := _name(f))}


def _imports(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of every import in ``path``, module level or inside functions."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out.append((module, [a.name for a in node.names]))
    return out


def _graph() -> dict[str, set[str]]:
    """Module -> the tvm_stitch modules it imports (the package's own lazy ``__init__`` aside)."""
    sources = _sources()
    edges: dict[str, set[str]] = {m: set() for m in sources}
    for module, path in sources.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target, names in _imports(path, package):
            for name in [f"{target}.{n}" for n in names] + [target]:
                found = name
                while found and found not in sources:
                    found = found.rpartition(".")[0]
                if found and found not in (module, "tvm_stitch"):
                    edges[module].add(found)
                    break
    return edges


def _layer(module: str) -> int:
    short = module.removeprefix("tvm_stitch.")
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            pattern = prefix.split(".")
            parts = short.split(".")
            if len(parts) >= len(pattern) and all(
                    p in ("*", q) for p, q in zip(pattern, parts)):
                # the longest pattern decides (families.gemm.triton is codegen, not analysis)
                if best is None or len(pattern) > best[0]:
                    best = (len(pattern), rank)
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_structure.py's LAYERS")
    return best[1]


def test_every_module_has_a_layer():
    for module in _graph():
        if module != "tvm_stitch":
            _layer(module)


def test_no_import_circle():
    edges = _graph()
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert circles == []


def test_imports_go_down_the_layers():
    upward = [
        f"{m} ({LAYERS[_layer(m)][0]}) imports {t} ({LAYERS[_layer(t)][0]})"
        for m, targets in _graph().items() if m != "tvm_stitch"
        for t in sorted(targets) if _layer(t) > _layer(m)
    ]
    assert upward == []


def test_studies_are_apart():
    """No product module imports a study; a study uses the public API only."""
    sources = _sources()
    for module, path in sources.items():
        for target, _ in _imports(path, module):
            assert "studies" not in target.split("."), f"{module} imports {target}"
        assert "benchmarks/studies" not in path.read_text().replace("\\", "/") or (
            module.startswith("tvm_stitch.benchmarks")), module
    private = []
    for path in sorted(ROOT.glob("benchmarks/studies/*.py")):
        for target, names in _imports(path, ""):
            if target.startswith("tvm_stitch"):
                private += [f"{path.name}: {target}.{n}" for n in names if n.startswith("_")]
                private += [f"{path.name}: {target}" for part in target.split(".")
                            if part.startswith("_")]
    assert private == []


def _defines(path: Path) -> set[str] | None:
    """Names a module defines at its top level (functions, classes, assignments, imports), or
    None where it resolves names at run time (a module-level ``__getattr__``)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # guarded definitions: every branch counts
            for inner in ast.walk(node):
                if isinstance(inner, (ast.FunctionDef, ast.ClassDef)):
                    names.add(inner.name)
                elif isinstance(inner, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in inner.names}
                elif isinstance(inner, ast.Assign):
                    names |= {n.id for t in inner.targets for n in ast.walk(t)
                              if isinstance(n, ast.Name)}
    return names


def test_every_imported_name_exists():
    """Every ``from tvm_stitch... import name`` of the package, the benchmarks and the studies
    names something its module defines, inside functions too: a renamed function whose lazy
    importers were missed fails here, not on the GPU host (``cli._options`` in
    ``hf_families.main``, session 55)."""
    sources = _sources()
    files = {**{p: m for m, p in sources.items()},
             **{p: "" for p in ROOT.glob("benchmarks/studies/*.py")}}
    missing = []
    for path, module in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for target, names in _imports(path, package):
            if target not in sources:
                continue
            defined = _defines(sources[target])
            if defined is None:
                continue
            missing += [f"{path.relative_to(ROOT)}: {target}.{name}" for name in names
                        if name != "*" and name not in defined
                        and f"{target}.{name}" not in sources]
    assert missing == []


def test_no_module_is_too_large():
    large = {m: n for m, p in _sources().items()
             if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert large == {}


def _python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_package_and_its_help_import_nothing_heavy():
    """``import tvm_stitch`` and ``tvm-stitch --help`` load neither TVM nor PyTorch."""
    out = _python(
        "import contextlib, io, sys\n"
        "import tvm_stitch\n"
        "from tvm_stitch.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as text, "
        "contextlib.suppress(SystemExit):\n"
        "    main(['--help'])\n"
        "assert 'usage: tvm-stitch' in text.getvalue()\n"
        "print(sorted(m for m in ('tvm', 'torch', 'triton') if m in sys.modules))\n"
    )
    assert out == "[]"


@pytest.mark.parametrize("first", ["tvm_stitch", "tvm", "tvm_stitch.pipeline", "tvm_stitch.report"])
def test_stitch_is_registered_whatever_is_imported_first(first):
    out = _python(
        f"import {first}\n"
        "import tvm, tvm_stitch\n"
        "from tvm import relax\n"
        "print('stitch' in relax.pipeline.PIPELINE_MAP, callable(tvm_stitch.pipeline),\n"
        "      type(tvm_stitch.pipeline).__name__)\n"
    )
    assert out == "True True function"
