"""Dependencies point one way: commands -> flows -> tasks -> tracking -> brorl. brorl never
imports prefect, mlflow or dvc; tracking never imports prefect (orchestration is the tasks' and
flows': a logger comes in from them).

Two checks. Reading: every .py file under brorl/, tracking/, tasks/ and flows/ is parsed with
`ast` and every import node anywhere in it (module level, inside functions, classes, `if
TYPE_CHECKING:`) is resolved to an absolute module name, relative imports included, with no
exception; and no flow module has an `if __name__ == "__main__":` block (the one command line is
`brorl <stage>`, commands/cli.py, which imports the flow after its checks). Loading: every brorl module is imported in a fresh interpreter, which then must hold none of the
orchestration libraries.
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

import yaml

import brorl

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN: Mapping[str, frozenset[str]] = {
    "brorl": frozenset({"prefect", "mlflow", "dvc", "tracking", "tasks", "flows", "commands"}),
    "tracking": frozenset({"prefect", "tasks", "flows", "commands"}),
    "tasks": frozenset({"flows", "commands"}),
    "flows": frozenset({"commands"}),
}
"""Top-level package -> the top-level names its modules must never import, anywhere."""


def module_name(path: Path, root: Path) -> str:
    """`brorl/train/__init__.py` -> `brorl.train`, `brorl/system/servers.py` -> `brorl.system.servers`."""
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


def main_blocks(path: Path) -> list[int]:
    """The lines of the module-level `if __name__ == "__main__":` blocks of `path`."""
    return [node.lineno for node in ast.parse(path.read_text(), filename=str(path)).body
            if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"]


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


def test_no_flow_module_is_a_program():
    """A flow runs through `brorl <stage>` only: no flow module has a `__main__` block (through
    which it would import an entry point, or run unchecked arguments)."""
    flows = sorted((ROOT / "flows").glob("*.py"))
    assert {p.stem for p in flows} >= {"simulate", "train", "compare", "study"}
    assert [p.name for p in flows if main_blocks(p)] == []


PLANTED = yaml.safe_load((Path(__file__).parent / "planted_trees.yaml").read_text())
"""Trees with known import faults, by name: file path -> text (tests/planted_trees.yaml)."""


def write_tree(root: Path, tree: str) -> None:
    """The planted `tree` under `root`: each file with its text, each folder on the way a package
    (an empty `__init__.py` where the tree gives none)."""
    for name, text in PLANTED[tree].items():
        path = root / name
        for folder in reversed(path.relative_to(root).parents[:-1]):
            (root / folder).mkdir(exist_ok=True)
            (root / folder / "__init__.py").touch()
        path.write_text(text)


def test_the_checker_finds_imports_inside_functions_classes_and_relative_ones(tmp_path: Path):
    write_tree(tmp_path, "layers")

    assert violations(tmp_path) == [
        "brorl/deep/mod.py:3 imports mlflow.tracking",
        "brorl/lazy.py:5 imports prefect",
        "brorl/rel.py:1 imports ...flows",
        "tracking/__init__.py:3 imports tasks",
        "tracking/record.py:5 imports prefect",
        "tasks/t.py:4 imports flows",
        "tasks/u.py:2 imports commands",
        "flows/late.py:2 imports commands.entry",
        "flows/more.py:2 imports commands.entry",
        "flows/more.py:4 imports commands",
        "flows/train.py:2 imports commands.entry",
    ]
    assert [p.name for p in sorted((tmp_path / "flows").glob("*.py")) if main_blocks(p)] == [
        "more.py", "train.py"]
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


def test_no_import_cycle_anywhere_in_brorl():
    """Not even through a function or an `if TYPE_CHECKING:` import: a module's dependencies can
    be read (and loaded) before it, everywhere in the library."""
    graph = import_graph(ROOT, "brorl")
    assert {"brorl.families.code", "brorl.train.run", "brorl.evaluation.protocol"} <= set(graph)
    assert import_cycles(graph) == []


def test_the_cycle_finder_sees_cycles_through_functions_and_packages(tmp_path: Path):
    write_tree(tmp_path, "cycles")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg"}
    assert import_cycles(graph) == [["pkg", "pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]


HEAVY_LIBRARIES = frozenset({"torch", "transformers", "deepspeed", "vllm", "datasets", "prefect",
                             "mlflow", "dvc"})
"""What a bad input must never wait for (tests/test_bad_inputs.py, benchmarks/bad_inputs.py)."""
LIGHT = ("brorl.runs.preflight", "brorl.model.checks", "brorl.runs.folder", "brorl.runs.files", "brorl.model.shapes",
         "brorl.system.environment", "brorl.params", "commands.entry", "commands.cli")
"""Modules (with their submodules) that the checks of every entry point run on: nowhere in them,
not even inside a function, an import of a heavy library or of a project module that loads one."""
ENTRY_POINTS = ("brorl.train", "brorl.train.__main__", "flows", "commands", "commands.entry",
                "commands.cli", "commands.server", "commands.deploy", *LIGHT)
"""What `python -m` (or the `brorl` script) loads before it checks its input."""


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when a module is imported: not function bodies, not `if
    TYPE_CHECKING:` blocks (`if __name__ == "__main__":` blocks included: `python -m` runs them)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _module_level(node.orelse)
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _module_level(getattr(node, field, []))


def _targets(node: ast.stmt, path: Path, root: Path) -> list[str]:
    """Every module an import statement loads, `from M import a` also `M.a` where that is a
    module of the project; [] for any other statement."""
    if not isinstance(node, (ast.Import, ast.ImportFrom)):
        return []
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names = _from_names(node, package)
    module = names[0]
    for alias in node.names:
        sub = root.joinpath(*f"{module}.{alias.name}".split("."))
        if sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file():
            names.append(f"{module}.{alias.name}")
    return names


def _project_files(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path
            for package in ("brorl", "tracking", "tasks", "flows", "commands")
            for path in sorted((root / package).rglob("*.py"))}


def heavy_modules(root: Path) -> set[str]:
    """Project modules whose import loads a heavy library: directly at module level, or through
    a project module they (or a package above them) load at module level."""
    files = _project_files(root)
    loads = {name: {t for node in _module_level(ast.parse(path.read_text()).body)
                    for t in _targets(node, path, root)} for name, path in files.items()}

    def with_packages(name: str) -> list[str]:
        parts = name.split(".")
        return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]

    heavy = {name for name, targets in loads.items()
             if any(t.split(".")[0] in HEAVY_LIBRARIES for t in targets)}
    grew = True
    while grew:
        grew = False
        for name, targets in loads.items():
            if name not in heavy and any(m in heavy for t in targets for m in with_packages(t)):
                heavy.add(name)
                grew = True
    return heavy


def _anywhere(node: ast.AST) -> Iterator[ast.AST]:
    """Every node under `node`, function bodies included, `if TYPE_CHECKING:` blocks not (they
    never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for other in child.orelse:
                yield other
                yield from _anywhere(other)
            continue
        yield child
        yield from _anywhere(child)


def light_violations(root: Path, light: tuple[str, ...] = LIGHT) -> list[str]:
    """`path:line imports name` for each import anywhere in a light module (functions included)
    of a heavy library or a heavy project module (`heavy_modules`)."""
    heavy, found = heavy_modules(root), []
    for name, path in _project_files(root).items():
        if not any(name == m or name.startswith(m + ".") for m in light):
            continue
        for node in _anywhere(ast.parse(path.read_text())):
            for target in _targets(node, path, root):
                parts = target.split(".")
                if parts[0] in HEAVY_LIBRARIES or any(
                        ".".join(parts[:i]) in heavy for i in range(1, len(parts) + 1)):
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {target}")
    return found


def test_light_modules_never_import_torch_heavy_ones_not_even_inside_a_function():
    """The checks an entry point runs before its expensive start (`brorl.runs.preflight`, the params,
    the run folder's files) import nothing that loads torch, transformers or orchestration, so a
    bad input is refused in about a second; `brorl.train.checkpoint` (torch) is one of the heavy
    modules they may not reach."""
    assert {"brorl.train.checkpoint", "brorl.policy", "tasks.train"} <= heavy_modules(ROOT)
    assert light_violations(ROOT) == []


def test_the_checker_finds_an_upward_import_inside_a_function(tmp_path: Path):
    write_tree(tmp_path, "light")
    assert heavy_modules(tmp_path) == {"brorl.train.checkpoint", "brorl.train.state"}
    assert light_violations(tmp_path) == ["brorl/params/x.py:2 imports transformers",
                                          "brorl/runs/preflight.py:2 imports brorl.train.checkpoint"]


def test_importing_an_entry_point_loads_no_heavy_library():
    code = (f"import importlib, sys\nfor m in {ENTRY_POINTS!r}: importlib.import_module(m)\n"
            f"print(sorted(x for x in {sorted(HEAVY_LIBRARIES)!r} if x in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
