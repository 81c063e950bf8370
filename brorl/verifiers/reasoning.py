"""Reasoning verifier: the reasoning-gym dataset's own `score_answer` on the extracted answer.

The scorer is rebuilt from the task name (`problem.metadata["source_dataset"]`, else
`problem.task`) with `reasoning_gym.get_score_answer_fn`, and called on the answer inside the
last `<answer></answer>` with the entry `{question, answer, metadata}` rebuilt from the record.
Extracting first matters: given a whole response, several scorers give partial credit when the
reference is a substring of it (reasoning-gym 0.1.25). The reward stays continuous, as in the paper
(ProRL (arXiv 2505.24864) App. E, Table 4: Reasoning Gym, continuous, `<answer></answer>`).

A scorer never evaluates the answer text: tasks whose `score_answer` (or a function of its module
or method of its class that it calls) calls `eval`, `exec`, `compile`, sympy's `parse_expr`,
`sympify`, `simplify` or `S` on anything are refused (`evaluating_call`: 11 of reasoning-gym's
106 tasks, e.g. countdown, puzzle24, number_sorting, bitwise_arithmetic), here with an error verdict and by
`brorl.data.reasoning` when data is made. The three default tasks use plain string comparison.

Deliberately ignored: binarising (evaluation reports the mean continuous reward, like the paper)
and scorer configs other than the dataset's default (scorers read the entry's metadata).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Sequence

from brorl.prompts import extract_answer
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict, error_verdict, verdict_for_score
from brorl.verifiers.workers import judge_answers

Scorer = Callable[[str | None, dict], float]

EVALUATING = frozenset({"eval", "exec", "compile", "parse_expr", "sympify", "simplify", "S"})
"""Calls that run (or may run) a string as code: a scorer that makes one is refused."""


class ReasoningVerifier:
    """Continuous reward in [0, 1] from reasoning-gym's scorer for each problem's task."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair; scorers are built here, before the workers fork."""
        names = [task_name(p) for p in problems]
        scorers = {name: _scorer(name) for name in set(names)}
        answers = [None if isinstance(scorers[name], Exception) else extract_answer(r, "reasoning")
                   for name, r in zip(names, responses)]  # a refused task's rows need no worker
        verdicts = judge_answers(functools.partial(_check, scorers), problems, answers,
                                 workers=self.config.workers,
                                 timeout_s=self.config.timeout_s)
        return [error_verdict(scorer) if isinstance(scorer := scorers[name], Exception) else v
                for name, v in zip(names, verdicts)]


def task_name(problem: Problem) -> str:
    """The reasoning-gym dataset that made `problem`."""
    return str(problem.metadata.get("source_dataset") or problem.task)


def entry_of(problem: Problem) -> dict:
    """The reasoning-gym entry `{question, answer, metadata}` that `score_answer` expects."""
    return {"question": problem.prompt, "answer": problem.answer, "metadata": problem.metadata}


@functools.cache
def evaluating_call(task: str) -> str | None:
    """Where reasoning-gym task `task`'s scorer could evaluate text (`Class.method calls eval`),
    None when it cannot. Follows the functions of the scorer's module and the methods of its
    class that it calls, by name (a static read of their source)."""
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        return None  # unknown: get_score_answer_fn reports it
    cls = DATASETS[task][0]
    pending, seen = [("score_answer", getattr(cls, "score_answer"))], set()
    while pending:
        name, fn = pending.pop()
        if fn in seen or not inspect.isfunction(fn):
            continue
        seen.add(fn)
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError, SyntaxError):
            return f"{cls.__name__}.{name} (no source to check)"
        module = inspect.getmodule(fn)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = (func.id if isinstance(func, ast.Name)
                      else func.attr if isinstance(func, ast.Attribute) else None)
            if called in EVALUATING:
                return f"{cls.__name__}.{name} calls {called}"
            if isinstance(func, ast.Name) and module is not None:
                pending.append((called, getattr(module, called, None)))
            elif (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                  and func.value.id in ("self", "cls")):
                pending.append((called, getattr(cls, called, None)))
    return None


def refusal(task: str) -> str | None:
    """Why reasoning task `task` cannot be scored here, with the fix; None when it can."""
    where = evaluating_call(task)
    if where is None:
        return None
    return (f"reasoning task {task!r} is refused: its scorer evaluates answer text as code "
            f"({where}), which a policy could exploit. Choose another reasoning-gym task.")


@functools.cache
def _scorer(name: str) -> Scorer | Exception:
    """The dataset's `score_answer`, or the exception that building it raised; built once per
    task and process (building a dataset can cost 0.2 s: spell_backward reads a word list)."""
    import reasoning_gym

    if (why := refusal(name)) is not None:
        return ValueError(why)
    try:
        return reasoning_gym.get_score_answer_fn(name)
    except Exception as exc:  # noqa: BLE001 - becomes each of the task's verdicts
        return exc


def _check(scorers: dict[str, Scorer], item: tuple[Problem, str]) -> Verdict:
    problem, answer = item
    return verdict_for_score(scorers[task_name(problem)](answer, entry_of(problem)))
