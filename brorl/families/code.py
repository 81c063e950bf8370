"""The code family: generated function-writing problems and local JSONL, judged in the sandbox.

Problems. A code `Problem` holds a statement with the function signature as its prompt and unit
tests as Python snippets (`assert f(2) == 5`) judged against the candidate's values. JSONL rows
(`jsonl`) give the statement as `statement`, `question` or `problem`; tests either as `tests` (a
list of assert snippets of the forms `brorl.verifiers.checks` judges outside the sandbox, checked
on load) or APPS's `input_output` ({"fn_name", "inputs", "outputs"}, one positional-argument list
per input), which become `assert fn_name(*inputs) == outputs`. A reference solution (`solution`,
or the first of `solutions`) goes to metadata["solution"]. The generated set: one-line functions
(add, scale, compare, slice, repeat, ...) with a parameter k and a function name drawn by seed,
reference solution in metadata["solution"], three tests each.

Answers. The last fenced ```` ```python ```` block (```` ```py ```` or a bare fence also count).

Verifier. The fraction of a problem's test snippets that the extracted code passes. A syntax
error is caught in the parent without starting a process; otherwise the candidate runs in one
sandboxed process that evaluates each test's subject (`f(3)`), and the judge compares the plain
values it sends back against the expected ones here (`brorl.verifiers.sandbox.run_tests`,
`checks`): the candidate never sees an expected value and none of its code takes part in a
comparison. Reward = passed / total (ProRL's continuous code reward), 0 when the run times out
(`timeout_s` bounds all tests together, ProRL's 5 s total, counted without the time the run
waited for a CPU: `brorl.verifiers.clock`), when the candidate's top level raises, or when the
process dies before finishing. Sandboxes run concurrently from a thread pool, one per available
core (the threads only wait on their sandboxes, each forked by this process's zygote:
`brorl.verifiers.zygote`). Where the OS does not give the sandbox its namespaces and jail
(`sandbox.capabilities`), the first verification in a process warns.

Deliberately ignored: stdin/stdout programs (rows without `fn_name` are refused with the fix),
floating-point tolerance in tests, per-test time limits. Paper: ProRL (arXiv 2505.24864) App. E,
Table 4 (Code = Eurus-2-RL: continuous, all test cases, syntax error or >5 s total timeout gives 0).
"""

from __future__ import annotations

import functools
import json
import random
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import NonNegativeInt, PositiveInt

from brorl.data.records import draw_per_task, jsonl_rows, make_problem
from brorl.families import FamilyParams, ProblemFamily
from brorl.families.answers import last_fence
from brorl.types import Problem
from brorl.verifiers.checks import parse_test
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.sandbox import SandboxResult, capabilities, run_tests
from brorl.verifiers.verdict import Verdict, error_verdict
from brorl.verifiers.workers import default_workers

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


class CodeParams(FamilyParams):
    """`data.families.code`: the generated set's size and range, and local JSONL files."""

    per_task: NonNegativeInt = 600
    """Generated draws per template (7 one-line function templates); 0 leaves them out."""
    max_constant: PositiveInt = 9
    """Largest constant k of the generated templates (k in 1..this). Distinct problems are
    7 templates x k values x 4 function names: 9 gives 252 (49 in a 20% test split), 20 gives 560
    (112 in test), enough for 100 held-out code instances. Our choice."""
    jsonl: list[str] = []
    """Local JSONL files of code problems (statement, signature, tests or APPS `input_output`)."""

    def size(self) -> int:
        return self.per_task * len(TEMPLATES)


def build(section: CodeParams, seed: int) -> list[Problem]:
    """The generated draws, then every JSONL file's rows."""
    problems = generate_code(section.per_task, seed=seed, max_constant=section.max_constant)
    for path in section.jsonl:
        problems += load_code_jsonl(path)
    return problems


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


class CodeVerifier:
    """Continuous reward: the fraction of test snippets passed in the sandbox."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair, sandboxes run `workers` at a time."""
        _warn_if_partial()
        with ThreadPoolExecutor(max_workers=self.config.workers or default_workers()) as pool:
            return list(pool.map(self.verify_one, problems, responses))

    def verify_one(self, problem: Problem, response: str) -> Verdict:
        """The verdict for one response; never raises."""
        try:
            if not problem.tests:
                raise ValueError(f"code problem {problem.id!r} has no tests")
            code = extract(response)
            if code is None:
                return Verdict(0.0, "no_answer")
            try:
                compile(code, "<candidate>", "exec")
            except (SyntaxError, ValueError):
                return Verdict(0.0, "syntax_error")
            result = run_tests(code, problem.tests, timeout_s=self.config.timeout_s,
                               limits=self.config.limits)
            return verdict_of(result)
        except Exception as exc:  # noqa: BLE001 - a verifier must never stop the run
            return error_verdict(exc)


@functools.cache
def _warn_if_partial() -> None:
    """Warn once per process when the sandbox's isolation is incomplete here."""
    missing = [name for name, holds in capabilities().items() if not holds]
    if missing:
        warnings.warn(f"code sandbox isolation is partial on this machine (missing: "
                      f"{', '.join(missing)}): a hostile candidate may reach other processes or "
                      "files. Run the verifier as root, or where user namespaces are allowed.",
                      RuntimeWarning, stacklevel=3)


def verdict_of(result: SandboxResult) -> Verdict:
    """Reward passed/total for a finished run; 0 with the run's status otherwise."""
    if result.status != "ok":
        return Verdict(0.0, result.status)
    if result.passed == result.total:
        return Verdict(1.0, "correct")
    return Verdict(result.passed / result.total, "partial" if result.passed else "wrong")


def extract(text: str) -> str | None:
    """The last fenced block's code (blank lines around it dropped); None when absent or blank."""
    found = last_fence(text)
    return found.strip("\n") if found is not None and found.strip() else None


def target(problem: Problem) -> str:
    """The reference solution `metadata["solution"]` in a ```` ```python ```` fence."""
    solution = problem.metadata.get("solution")
    if not solution:
        raise ValueError(f"code problem {problem.id!r} has no metadata['solution']: the warm-up "
                         "needs a reference solution; add one to the record or skip it")
    return f"```python\n{solution.strip()}\n```"


FAMILY = ProblemFamily(
    name="code", title="Code", params=CodeParams, build=build,
    instruction="Answer in a ```python block.",
    # Outside the generated templates (none maps over a list).
    example=("Write a Python function double_all(xs) that returns a list with every item of xs "
             "doubled.", "```python\ndef double_all(xs):\n    return [2 * x for x in xs]\n```"),
    extract=extract, target=target, verifier=CodeVerifier, headline="pass_at_1")
