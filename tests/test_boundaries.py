"""The shape of the code, read from its imports with `ast` (every import: top-level, function-local
and under `TYPE_CHECKING`): the language server and the CLI reach OptiML only through
`optiml.api`, and no module of `optiml/` or `server/` imports itself back through others."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("optiml", "server")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its own name)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(module, line) for each import in the file: the longest known module each names (an
    `from a import b` names `a.b` where that is a module, else `a`); outside imports left out."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [
                f"{stem}.{a.name}" if f"{stem}.{a.name}" in modules else stem for a in node.names
            ]
        else:
            continue
        for n in names:
            while n and n not in modules:
                n = n.rpartition(".")[0]
            if n and n != name:
                out.append((n, node.lineno))
    return out


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module → {module it imports: the line of the first such import}."""
    modules = module_files(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges: dict[str, int] = {}
        for target, line in imported(name, path, modules):
            edges.setdefault(target, line)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One import cycle (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


# The one import of a front beyond the door, and why: `optiml worker` runs the worker's loop, and
# the worker answers each request through optiml.api itself (optiml.api importing it would be a
# cycle).
BEYOND_THE_DOOR = {("optiml.cli", "optiml.executors.worker")}


def is_front(module: str) -> bool:
    """The language server and the CLI: what may import only `optiml.api` of OptiML."""
    return module == "server" or module.startswith(("server.", "optiml.cli"))


def test_the_server_and_the_cli_import_only_the_api():
    graph = import_graph()
    files = module_files()
    fronts = [m for m in graph if is_front(m)]
    assert "server.app" in fronts and "optiml.cli" in fronts
    wrong = [
        f"{files[m].relative_to(ROOT)}:{line}: imports {target}"
        for m in fronts
        for target, line in sorted(graph[m].items())
        if target.split(".")[0] == "optiml"
        and target != "optiml.api"
        and not is_front(target)
        and (m, target) not in BEYOND_THE_DOOR
    ]
    assert not wrong, "only optiml.api is the door:\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        files = module_files()
        steps = [
            f"{files[a].relative_to(ROOT)}:{graph[a][b]}: {a} imports {b}"
            for a, b in zip(cycle, cycle[1:], strict=False)
        ]
        pytest.fail("an import cycle:\n" + "\n".join(steps))


# ---- the checks themselves, on small trees of their own ------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_cycle_through_a_function_local_import_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "optiml/__init__.py": "",
            "optiml/a.py": "from optiml.b import f\n",
            "optiml/b.py": "def f():\n    from optiml import a\n",
            "server/__init__.py": "",
        },
    )
    assert find_cycle(import_graph(root)) == ["optiml.a", "optiml.b", "optiml.a"]


def test_a_cycle_under_type_checking_and_relative_imports_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "optiml/__init__.py": "",
            "server/__init__.py": "",
            "server/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import Y\n",
            "server/y.py": "from . import x\n",
        },
    )
    graph = import_graph(root)
    assert graph["server.y"] == {"server.x": 1}
    assert find_cycle(graph) == ["server.x", "server.y", "server.x"]


def test_no_cycle_in_a_tree_without_one(tmp_path):
    root = _tree(
        tmp_path,
        {
            "optiml/__init__.py": "",
            "optiml/a.py": "import optiml.b\nimport os\n",
            "optiml/b.py": "from optiml.c import g\n",
            "optiml/c.py": "import json\n",
            "server/__init__.py": "from optiml.a import x\n",
        },
    )
    graph = import_graph(root)
    assert graph["server"] == {"optiml.a": 1}
    assert find_cycle(graph) is None


def test_no_script_folder_shadows_a_standard_module():
    """`python3 benchmarks/X.py` puts benchmarks/ first on the import path: a benchmarks/profile.py
    there once stood in for the standard `profile` that torch.compile imports (every intent's
    torch.compile failed on the GPU with "module 'profile' has no attribute 'run'")."""
    import sys

    folders = ("benchmarks", "tools", "tests")
    shadowing = sorted(
        str(path.relative_to(ROOT))
        for folder in folders
        for path in (ROOT / folder).glob("*.py")
        if path.stem in sys.stdlib_module_names
    )
    assert not shadowing, shadowing
