"""Rules the test suite itself keeps, read from its source with `ast`.

No test bounds wall-clock seconds tightly. Two pipelines share the cores with the rest of the
suite, so a check that took 0.2 s alone may take 10 s: a test asserts the event instead (the
verdict says `timeout`, the process is gone, the workers' start and end markers overlap) and
keeps at most a ceiling that only catches a hang. Speed claims belong in benchmarks/.

The rule, per function of tests/*.py (`tight_time_bounds`): an `assert` may not compare a
*duration* with an upper bound below `CEILING_S`, nor a *clock reading* with a *deadline* whose
bound is below it, where

- a clock reading is a call to `time.time`, `time.monotonic` or `time.perf_counter` (or their
  `_ns` forms, or the same names imported from `time`);
- a duration is a subtraction with a reading (or a name bound to one) on either side, or a name
  bound to a duration, also by unpacking the same position of what a function of the module
  returns;
- a deadline is a name bound to a reading plus a bound.

A bound counts only when it folds to a number: literals, module constants, parameter defaults,
and arithmetic on them; any other bound (`timeout_s + MARGIN` with `timeout_s` a local) is
treated as tight. Lower bounds (`elapsed >= 125`) and stand-in clocks are not wall-clock bounds.

A second rule holds for every tracked file (`outside_spec_citations`): a citation must be one a
reader of the repository can check, so no file cites the specification that was written outside
it (its section numbers, its file name or its folder); the papers are cited by their own sections
("BroRL §4.2.1", "ProRL (arXiv 2505.24864) §3.2").
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CEILING_S = 30.0
"""The smallest upper bound a test may put on wall-clock seconds."""
CLOCKS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}
UPPER = (ast.Lt, ast.LtE)
LOWER = (ast.Gt, ast.GtE)
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _is_reading(node: ast.AST, from_time: set[str], clock_names: set[str] = frozenset()) -> bool:
    """A call of a wall clock (`time.monotonic()`, or `monotonic()` imported from `time`), or a
    name bound to one."""
    if isinstance(node, ast.Name):
        return node.id in clock_names
    if not isinstance(node, ast.Call) or node.args:
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return (func.attr in CLOCKS and isinstance(func.value, ast.Name)
                and func.value.id == "time")
    return isinstance(func, ast.Name) and func.id in from_time


def _is_duration(node: ast.AST, from_time: set[str], clock_names: set[str],
                 durations: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in durations
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
            and (_is_reading(node.left, from_time, clock_names)
                 or _is_reading(node.right, from_time, clock_names)))


def _fold(node: ast.AST, names: dict[str, ast.AST], depth: int = 0) -> float | None:
    """The number `node` stands for, from literals, `names` (module constants, then parameter
    defaults) and arithmetic; None when it is not a fixed number."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name) and node.id in names:
        return _fold(names[node.id], names, depth + 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _fold(node.operand, names, depth + 1)
        return None if value is None else -value
    if isinstance(node, ast.BinOp):
        left, right = _fold(node.left, names, depth + 1), _fold(node.right, names, depth + 1)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div) and right:
            return left / right
    return None


def _module_constants(tree: ast.Module) -> dict[str, ast.AST]:
    constants: dict[str, ast.AST] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 \
                and isinstance(stmt.targets[0], ast.Name):
            constants[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value:
            constants[stmt.target.id] = stmt.value
    return constants


def _parameter_defaults(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.AST]:
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    found = {a.arg: d for a, d in zip(positional[len(positional) - len(args.defaults):],
                                      args.defaults)}
    found |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None}
    return found


def _returned_durations(tree: ast.Module, from_time: set[str]) -> dict[str, set[int | None]]:
    """Function name -> the positions of its returned tuple that are durations (None: the
    whole value is one)."""
    found: dict[str, set[int | None]] = {}
    for func in ast.walk(tree):
        if not isinstance(func, FUNCTIONS):
            continue
        clock_names, durations, _ = _bindings(func, from_time, {})
        for ret in (n for n in ast.walk(func) if isinstance(n, ast.Return) and n.value):
            values = ret.value.elts if isinstance(ret.value, ast.Tuple) else [ret.value]
            for i, value in enumerate(values):
                if _is_duration(value, from_time, clock_names, durations):
                    found.setdefault(func.name, set()).add(
                        i if isinstance(ret.value, ast.Tuple) else None)
    return found


def _bindings(func: ast.AST, from_time: set[str], returns: dict[str, set[int | None]]
              ) -> tuple[set[str], set[str], dict[str, list[tuple[int, ast.AST]]]]:
    """The names `func` binds to clock readings, to durations, and to deadlines (each binding's
    line and the bound added to the reading), in source order."""
    clock_names: set[str] = set()
    durations: set[str] = set()
    deadlines: dict[str, list[tuple[int, ast.AST]]] = {}
    assigns = sorted((n for n in ast.walk(func) if isinstance(n, (ast.Assign, ast.AnnAssign))),
                     key=lambda n: (n.lineno, n.col_offset))
    for node in assigns:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value
        if value is None:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                if _is_reading(value, from_time):
                    clock_names.add(target.id)
                elif _is_duration(value, from_time, clock_names, durations):
                    durations.add(target.id)
                elif isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
                    if _is_reading(value.left, from_time, clock_names):
                        deadlines.setdefault(target.id, []).append((node.lineno, value.right))
                    elif _is_reading(value.right, from_time, clock_names):
                        deadlines.setdefault(target.id, []).append((node.lineno, value.left))
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Call) \
                    and isinstance(value.func, ast.Name) and value.func.id in returns:
                for i in returns[value.func.id] - {None}:
                    if i < len(target.elts) and isinstance(target.elts[i], ast.Name):
                        durations.add(target.elts[i].id)
    return clock_names, durations, deadlines


def tight_time_bounds(source: str, filename: str = "<test>") -> list[str]:
    """`file:line: what` for each assert of `source` that bounds wall-clock seconds below
    `CEILING_S` (the rule in this module's docstring)."""
    tree = ast.parse(source, filename)
    from_time = {alias.asname or alias.name for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module == "time"
                 for alias in node.names if alias.name in CLOCKS}
    constants = _module_constants(tree)
    returns = _returned_durations(tree, from_time)
    found: set[tuple[int, str]] = set()
    for func in (n for n in ast.walk(tree) if isinstance(n, FUNCTIONS)):
        clock_names, durations, deadlines = _bindings(func, from_time, returns)
        names = {**constants, **_parameter_defaults(func)}
        for check in (n for n in ast.walk(func) if isinstance(n, ast.Assert)):
            for compare in (n for n in ast.walk(check.test) if isinstance(n, ast.Compare)):
                sides = [compare.left, *compare.comparators]
                for left, op, right in zip(sides, compare.ops, sides[1:]):
                    for measured, bound, upper in ((left, right, UPPER), (right, left, LOWER)):
                        if not isinstance(op, upper):
                            continue
                        if _is_duration(measured, from_time, clock_names, durations):
                            limit = _fold(bound, names)
                        elif _is_reading(measured, from_time, clock_names) \
                                and isinstance(bound, ast.Name) and bound.id in deadlines:
                            # the deadline's last binding before this assert
                            _, added = max((b for b in deadlines[bound.id] if b[0] <= check.lineno),
                                           key=lambda b: b[0], default=deadlines[bound.id][0])
                            limit = _fold(added, names)
                            bound = added
                        else:
                            continue
                        if limit is None or limit < CEILING_S:
                            value = "not a fixed number" if limit is None else f"{limit:g} s"
                            found.add((check.lineno, f"{filename}:{check.lineno}: "
                                       f"`{ast.unparse(compare)}` bounds wall-clock seconds by "
                                       f"`{ast.unparse(bound)}` ({value}, under {CEILING_S:g} s)"))
    return [message for _, message in sorted(found)]


def test_no_test_bounds_wall_clock_seconds_tightly():
    found = [hit for path in sorted(TESTS.glob("*.py"))
             for hit in tight_time_bounds(path.read_text(), path.name)]
    assert found == [], ("assert the event (a verdict, a marker, a process gone) and keep at "
                         f"most a ceiling of {CEILING_S:.0f} s or more:\n" + "\n".join(found))


PLANTED_TIGHT = {
    "elapsed_name": "import time\ndef test():\n    start = time.monotonic()\n    work()\n"
                    "    elapsed = time.monotonic() - start\n    assert elapsed < 5.0\n",
    "inline": "import time\ndef test():\n    start = time.perf_counter()\n"
              "    assert time.perf_counter() - start < 5\n",
    "reversed": "import time\ndef test():\n    t0 = time.time()\n    assert 4 > time.time() - t0\n",
    "imported": "from time import monotonic as now\ndef test():\n    t = now()\n"
                "    assert now() - t <= 10\n",
    "constant": "import time\nLIMIT = 2.0\nMARGIN = 2.0\ndef test():\n    t = time.monotonic()\n"
                "    assert time.monotonic() - t < LIMIT + MARGIN\n",
    "unknown_bound": "import time\ndef test(limit):\n    t = time.monotonic()\n"
                     "    assert time.monotonic() - t < limit + 2\n",
    "unpacked": "import time\ndef run():\n    start = time.monotonic()\n"
                "    return 1, time.monotonic() - start\n"
                "def test():\n    value, seconds = run()\n    assert value and seconds < 12\n",
    "deadline": "import time\ndef test():\n    deadline = time.monotonic() + 60\n"
                "    assert ready() or time.monotonic() < deadline\n"
                "    deadline = time.monotonic() + 10\n"
                "    while busy():\n        assert time.monotonic() < deadline, 'hung'\n",
}
"""Asserts the rule forbids, one per way of writing them."""

PLANTED_FINE = {
    "ceiling": "import time\nHANG_S = 60.0\ndef test():\n    t = time.monotonic()\n"
               "    assert time.monotonic() - t < HANG_S\n",
    "lower_bound": "import time\ndef test():\n    assert age(time.time() - 125) >= 125\n",
    "default_deadline": "import time\ndef wait(timeout_s: float = 150):\n"
                        "    deadline = time.monotonic() + timeout_s\n"
                        "    assert time.monotonic() < deadline\n",
    "stand_in_clock": "def test(clock):\n    t = clock.perf_counter()\n"
                      "    assert clock.perf_counter() - t < 1\n",
    "not_an_assert": "import time\ndef test():\n    t = time.monotonic()\n"
                     "    while time.monotonic() - t < 5:\n        poll()\n",
}
"""Asserts and loops the rule allows."""


@pytest.mark.parametrize("name", sorted(PLANTED_TIGHT))
def test_the_rule_finds_each_planted_tight_bound(name):
    assert len(tight_time_bounds(PLANTED_TIGHT[name], name)) == 1


@pytest.mark.parametrize("name", sorted(PLANTED_FINE))
def test_the_rule_allows_ceilings_lower_bounds_and_stand_in_clocks(name):
    assert tight_time_bounds(PLANTED_FINE[name], name) == []


OUTSIDE_SPEC = ("spec " + "§", "paper" + ".md", "shared" + "/spec", "anchors " + "§",
                "anchors" + ".md", "(anchors" + ")")
"""What cites the outside specification, lower case: its sections, its files, its folder. Built by
concatenation so that this module does not match itself."""


def outside_spec_citations(text: str, filename: str = "<file>") -> list[str]:
    """`file:line: text` for each line of `text` that holds one of `OUTSIDE_SPEC`, in any case."""
    return [f"{filename}:{number}: {line.strip()[:120]}"
            for number, line in enumerate(text.splitlines(), 1)
            if any(needle in line.lower() for needle in OUTSIDE_SPEC)]


def _tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            check=True, timeout=60).stdout.decode()
    return [name for name in listed.split("\0") if name]


def test_no_tracked_file_cites_the_outside_spec():
    found = []
    for name in _tracked_files():
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):  # deleted in the work tree, a folder, binary
            continue
        found += outside_spec_citations(text, name)
    assert found == [], ("cite the source's own section instead (e.g. \"BroRL §4.2.1\", "
                         "\"ProRL (arXiv 2505.24864) §3.2\", \"the ProRLv2 blog post\"), or say "
                         "the value is our choice:\n" + "\n".join(found))


@pytest.mark.parametrize("line", ["# lr rule (Spec " + "§4.1)", "as in PAPER" + ".MD",
                                  "see shared" + "/spec/paper" + ".md §2",
                                  "SHARED" + "/SPEC/platform.md",
                                  "Knapsack RL (anchors " + "§14.1)", "update (Anchors" + ")"])
def test_the_citation_rule_finds_each_planted_citation(line):
    assert len(outside_spec_citations(f"x = 1\n{line}\n", "planted")) == 1


@pytest.mark.parametrize("line", ["# lr rule (BroRL §4.2.1)", "the spec of the params file",
                                  "ProRL (arXiv 2505.24864) §3.2", "find_spec(name)"])
def test_the_citation_rule_allows_the_papers_own_sections(line):
    assert outside_spec_citations(line, "fine") == []
