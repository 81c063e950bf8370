"""Code problems: local JSONL in the APPS / Eurus-2 shape, and a generated function-writing set.

A code `Problem` holds a statement with the function signature as its prompt and unit tests as
Python snippets (`assert f(2) == 5`) judged against the candidate's values. JSONL rows give the
statement as `statement`, `question` or `problem`; tests either as `tests` (a list of assert
snippets of the forms `brorl.verifiers.checks` judges outside the sandbox, checked on load) or
APPS's `input_output` ({"fn_name", "inputs", "outputs"}, one positional-argument list per input),
which become `assert fn_name(*inputs) == outputs`. A reference solution (`solution`, or the first
of `solutions`) goes to metadata["solution"].

The generated set: one-line functions (add, scale, compare, slice, repeat, ...) with a parameter
k and a function name drawn by seed, reference solution in metadata["solution"], three tests each.

Deliberately ignored: stdin/stdout programs (rows without `fn_name` are refused with the fix),
floating-point tolerance in tests. Paper: ProRL (arXiv 2505.24864) App. E, Code = Eurus-2-RL,
reward = fraction passed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

from brorl.data.records import draw_per_task, jsonl_rows, make_problem
from brorl.types import Problem
from brorl.verifiers.checks import parse_test

# name -> (argument, statement (what it returns), solution expression, reference, test inputs)
_Template = tuple[str, str, str, Callable[[object, int], object], tuple]
TEMPLATES: dict[str, _Template] = {
    "add": ("x", "x plus {k}", "x + {k}", lambda x, k: x + k, (0, 3, -4)),
    "subtract": ("x", "x minus {k}", "x - {k}", lambda x, k: x - k, (0, 7, -2)),
    "scale": ("x", "x times {k}", "x * {k}", lambda x, k: x * k, (1, 4, -3)),
    "remainder": ("x", "x modulo {k}", "x % {k}", lambda x, k: x % k, (5, 12, 31)),
    "greater": ("x", "True if x is greater than {k}, else False", "x > {k}",
                lambda x, k: x > k, (0, 8, 15)),
    "repeat": ("s", "the string s repeated {k} times", "s * {k}", lambda s, k: s * k,
               ("a", "ab", "")),
    "head": ("xs", "the first {k} items of the list xs", "xs[:{k}]", lambda xs, k: xs[:k],
             ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [4, 5], [])),
}
FUNCTION_NAMES = ("f", "g", "h", "solve")


def generated_problem(template: str, k: int, name: str) -> Problem:
    """One generated problem from a template, its constant k and the function's name."""
    arg, says, expr, ref, inputs = TEMPLATES[template]
    prompt = f"Write a Python function {name}({arg}) that returns {says.format(k=k)}."
    tests = [f"assert {name}({x!r}) == {ref(x, k)!r}" for x in inputs]
    solution = f"def {name}({arg}):\n    return {expr.format(k=k)}"
    return make_problem("code", template, prompt, tests=tests,
                        metadata={"solution": solution, "fn_name": name})


def generate_code(per_task: int, *, seed: int, max_constant: int = 9,
                  tasks: tuple[str, ...] = tuple(TEMPLATES)) -> list[Problem]:
    """`per_task` draws per template (k in 1..max_constant, a random name); may repeat."""

    def draw(task: str, rng: random.Random) -> Problem:
        k, name = rng.randint(1, max_constant), rng.choice(FUNCTION_NAMES)
        return generated_problem(task, k, name)

    return draw_per_task("code", tasks, TEMPLATES, per_task, seed, draw)


def _row_tests(row: dict, where: str) -> list[str]:
    tests = _raw_tests(row, where)
    for test in tests:
        try:
            parse_test(test)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
    return tests


def _raw_tests(row: dict, where: str) -> list[str]:
    if row.get("tests"):
        return [str(t) for t in row["tests"]]
    io = row.get("input_output")
    io = json.loads(io) if isinstance(io, str) else io
    if not io or not io.get("fn_name"):
        raise ValueError(f"{where}: no `tests` and no `input_output` with `fn_name`; stdin/stdout "
                         "programs are not supported: give assert snippets in `tests`.")
    if len(io["inputs"]) != len(io["outputs"]):
        raise ValueError(f"{where}: {len(io['inputs'])} inputs but {len(io['outputs'])} outputs.")
    return [f"assert {io['fn_name']}(*{args!r}) == {out!r}"
            for args, out in zip(io["inputs"], io["outputs"], strict=True)]


def load_code_jsonl(path: str | Path) -> list[Problem]:
    """Read statement + signature + tests rows (or APPS `input_output` rows) into code Problems."""
    path = Path(path)
    problems = []
    for row, where in jsonl_rows(path):
        statement = row.get("statement") or row.get("question") or row.get("problem")
        if not statement:
            raise ValueError(f"{where}: no `statement`, `question` or `problem` field.")
        if row.get("signature"):
            statement = f"{statement}\nSignature: {row['signature']}"
        solutions = row.get("solutions") or []
        solutions = json.loads(solutions) if isinstance(solutions, str) else solutions
        meta = {"solution": row.get("solution") or (solutions[0] if solutions else "")}
        task = str(row.get("task") or row.get("source") or path.stem)
        problems.append(make_problem("code", task, str(statement),
                                     tests=_row_tests(row, where), metadata=meta))
    return problems
