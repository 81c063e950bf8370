"""Dependencies point one way: flows -> tasks -> brorl. brorl never imports prefect, mlflow or dvc.

Two checks. Reading: every .py file under brorl/, tasks/ and flows/ is parsed with `ast` and every
import node anywhere in it (module level, inside functions, classes, `if TYPE_CHECKING:`) is
resolved to an absolute module name, relative imports included. Loading: every brorl module is
imported in a fresh interpreter, which then must hold none of the orchestration libraries.
tests/ and benchmarks/ may import anything. Imports spelt as strings (`importlib.import_module`)
are not read; the loading check catches those that run at import time.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import brorl

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN: Mapping[str, frozenset[str]] = {
    "brorl": frozenset({"prefect", "mlflow", "dvc", "tasks", "flows"}),
    "tasks": frozenset({"flows"}),
}
"""Top-level package -> the top-level names its modules must never import."""


def module_name(path: Path, root: Path) -> str:
    """`brorl/train/__init__.py` -> `brorl.train`, `brorl/servers.py` -> `brorl.servers`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _from_names(node: ast.ImportFrom, package: list[str]) -> list[str]:
    """What `from M import a, b` loads: M made absolute, plus `M.a`, `M.b` when M is a bare
    relative package (`from . import a`: `a` may be a submodule)."""
    if node.level > len(package):  # climbs above the top-level package: kept as spelt, flagged
        return ["." * node.level + (node.module or ", ".join(a.name for a in node.names))]
    base = package[:len(package) - node.level + 1] if node.level else []
    module = ".".join(base + ([node.module] if node.module else []))
    return [module] if node.module else [module, *(f"{module}.{a.name}" for a in node.names)]


def imported_names(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import statement anywhere in the file, in the order
    `ast.walk` meets them; relative imports are resolved against the file's package."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, name) for name in _from_names(node, package))


def violations(root: Path, forbidden: Mapping[str, frozenset[str]] = FORBIDDEN) -> list[str]:
    """`path:line imports name` for each import that breaks `forbidden`, in file order."""
    found = []
    for package, names in forbidden.items():
        for path in sorted((root / package).rglob("*.py")):
            for line, name in imported_names(path, root):
                top = name.split(".")[0]
                if top in names or name.startswith("."):
                    found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


def brorl_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(brorl.__path__, "brorl."))


def test_importing_every_brorl_module_loads_no_orchestration_library():
    modules = brorl_modules()
    assert "brorl.theory.simulator" in modules
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(x for x in ('prefect', 'mlflow', 'dvc') if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_no_module_imports_upward_not_even_inside_a_function():
    assert violations(ROOT) == []


def test_the_checker_finds_imports_inside_functions_classes_and_relative_ones(tmp_path: Path):
    files = {
        "brorl/__init__.py": "",
        "brorl/ok.py": "import prefectlike\nfrom . import ok\nfrom .sub import thing\n",
        "brorl/sub/__init__.py": "from .. import ok\nfrom ..ok import x\n",
        "brorl/lazy.py": "import os\n\n\ndef f():\n    import prefect\n",
        "brorl/deep/mod.py": "class C:\n    def m(self):\n        from mlflow.tracking import MlflowClient\n",
        "brorl/rel.py": "from ... import flows\n",
        "tasks/__init__.py": "",
        "tasks/t.py": "import brorl\nimport mlflow\nif True:\n    from flows import cli\n",
        "flows/f.py": "import tasks\nimport prefect\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert violations(tmp_path) == [
        "brorl/deep/mod.py:3 imports mlflow.tracking",
        "brorl/lazy.py:5 imports prefect",
        "brorl/rel.py:1 imports ...flows",
        "tasks/t.py:4 imports flows",
    ]
    assert list(imported_names(tmp_path / "brorl/sub/__init__.py", tmp_path)) == [
        (1, "brorl"), (1, "brorl.ok"), (2, "brorl.ok")]
    assert list(imported_names(tmp_path / "brorl/ok.py", tmp_path))[1:] == [
        (2, "brorl"), (2, "brorl.ok"), (3, "brorl.sub")]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, read from every import statement anywhere
    in each file (functions and `if TYPE_CHECKING:` included). `from M import a` points at the
    submodule `M.a` when there is one, else at `M`; a name that is not a module of the package
    points at the nearest enclosing one (`brorl.verifiers.Verdict` -> `brorl.verifiers`)."""
    paths = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}

    def owner(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                targets.update(owner(f"{source}.{alias.name}") for alias in node.names)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each
    sorted, in order of their first module: every import cycle lies inside one of them."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while not component or component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(cycles)


def test_no_import_cycle_inside_brorl_verifiers():
    graph = import_graph(ROOT, "brorl")
    verifiers = {m: t for m, t in graph.items() if m.split(".")[:2] == ["brorl", "verifiers"]}
    assert "brorl.verifiers.code" in verifiers
    assert import_cycles(verifiers) == []


def test_the_cycle_finder_sees_cycles_through_functions_and_packages(tmp_path: Path):
    files = {
        "pkg/__init__.py": "from pkg.a import run\n",
        "pkg/a.py": "def run():\n    from pkg import b\n",
        "pkg/b.py": "from pkg import Thing\n",  # a name in pkg/__init__: the package itself
        "pkg/c.py": "from .d import x\n",
        "pkg/d.py": "import pkg.c\n",
        "pkg/e.py": "import os\nfrom pkg import a\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg"}
    assert import_cycles(graph) == [["pkg", "pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
