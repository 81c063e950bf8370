"""The Reasoning Gym family: reasoning-gym tasks by name, config and seed, each scored by its
dataset's own `score_answer`.

Problems. `reasoning_problems(task, size=, seed=, config=)` wraps `reasoning_gym.create_dataset`;
each item's question becomes the prompt, its answer the reference, and its metadata (which the
task's `score_answer` needs) the problem's metadata, checked to be JSON-safe.

The default set (`DEFAULT_REASONING_TASKS`) is three skills with short prompts (12-51
characters: every prompt character costs training compute on CPU) and short answers (1-3
characters), each answer depending on the prompt, no single answer right for more than 12% of items:

- spell_backward, 3-letter words: reverse a word (string manipulation, a copying skill the tiny
  policy learns in ~1000 steps, after which it solves about half of the held-out words);
- simple_equations, `x + a = b` / `a - x = b` with values 1-9: solve for a variable (algebra; the
  variable letter and three phrasings vary, so held-out prompts are new);
- basic_arithmetic, two one-digit terms, + and -, "natural" phrasings (Compute, What is,
  Evaluate, ...): arithmetic facts asked in wordings the policy may not have seen for that fact.

With params/tiny.yaml the two equation/arithmetic tasks stay near 0.1-0.25 held-out pass@1 and
rise slowly, spell_backward rises from 0 to 0.3-0.55 once learned, so the family lands in the
20-60% band (`dvc repro base`, metrics/base.json). Left out: chain_sum (the same facts as
basic_arithmetic behind a 60-character preamble), leg_counting and word_sequence_reversal
(100-130-character preambles; 0-0.1 after 1000 steps), calendar_arithmetic weekday_offset
(about 115-character prompts, 0.12), products (0-0.14), caesar_cipher (one word: few distinct
items), simple_equations with values 1-5 (0.2-0.27, which is what guessing among 5 answers gives),
count_bits, letter_counting and gcd (one constant answer covers 27-80% of their items). The
held-out evaluation set is the `test` split of these tasks (instances never trained on, deduped
by prompt), as the paper holds out samples per task (ProRL (arXiv 2505.24864) §3.4).

Answers. The last `<answer>...</answer>`.

Verifier. The scorer is rebuilt from the task name (`problem.metadata["source_dataset"]`, else
`problem.task`) with `reasoning_gym.get_score_answer_fn`, and called on the answer inside the
last `<answer></answer>` with the entry `{question, answer, metadata}` rebuilt from the record.
Extracting first matters: given a whole response, several scorers give partial credit when the
reference is a substring of it (reasoning-gym 0.1.25). The reward stays continuous, as in the paper
(ProRL (arXiv 2505.24864) App. E, Table 4: Reasoning Gym, continuous, `<answer></answer>`).

A scorer never evaluates the answer text: tasks whose `score_answer` (or a function of its module
or method of its class that it calls) calls `eval`, `exec`, `compile`, sympy's `parse_expr`,
`sympify`, `simplify` or `S` on anything are refused (`evaluating_call`: 11 of reasoning-gym's
106 tasks, e.g. countdown, puzzle24, number_sorting, bitwise_arithmetic), here with an error verdict and by
`reasoning_problems` when data is made. The three default tasks use plain string comparison.

Deliberately ignored: the paper's 96-task curriculum (too long for a tiny model), RG's difficulty
schedules, binarising (evaluation reports the mean continuous reward, like the paper) and scorer
configs other than the dataset's default (scorers read the entry's metadata). Paper: ProRL
(arXiv 2505.24864) App. E, Table 4 (Logic puzzles = Reasoning Gym, continuous, `<answer></answer>`).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import NonNegativeInt

from brorl.data.records import make_problem
from brorl.families import FamilyParams, ProblemFamily
from brorl.families.answers import last_tag, stripped, tagged_target
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict, error_verdict, verdict_for_score
from brorl.verifiers.workers import judge_answers

DEFAULT_REASONING_TASKS: dict[str, dict[str, Any]] = {
    "spell_backward": {"min_word_len": 3, "max_word_len": 3},
    "simple_equations": {"min_terms": 2, "max_terms": 2, "max_value": 9,
                         "operators": ["+", "-"], "operators_weights": [0.5, 0.5]},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "operators": ["+", "-"], "allow_parentheses": False,
                         "allow_negation": False, "format_style": "natural"},
}
"""Task name -> reasoning-gym config of the CPU default: three skills with prompts of 12-51
characters and answers of 1-3 (see the module docstring for why these and not others)."""


class ReasoningParams(FamilyParams):
    """`data.families.reasoning`: which reasoning-gym tasks, and how many items of each."""

    per_task: NonNegativeInt = 600
    """Reasoning-gym items per task; 0 leaves reasoning-gym out."""
    tasks: dict[str, dict[str, Any]] | None = None
    """Reasoning-gym task name -> config. None: the CPU default set `DEFAULT_REASONING_TASKS`
    (spell_backward, simple_equations, basic_arithmetic at tiny sizes: short prompts and answers
    a tiny model partly learns)."""

    def size(self) -> int:
        return self.per_task * len(DEFAULT_REASONING_TASKS if self.tasks is None else self.tasks)


def build(section: ReasoningParams, seed: int) -> list[Problem]:
    """`per_task` items of each task (`tasks`, else the default set), each with its config."""
    if not section.per_task:
        return []
    tasks = DEFAULT_REASONING_TASKS if section.tasks is None else section.tasks
    return [p for name, options in tasks.items()
            for p in reasoning_problems(name, size=section.per_task, seed=seed, config=options)]


def reasoning_problems(task: str, *, size: int, seed: int,
                       config: dict[str, Any] | None = None) -> list[Problem]:
    """`size` items of reasoning-gym task `task` built with `config` and `seed`."""
    config = dict(config or {})
    if "operators" in config:  # YAML gives lists; reasoning-gym compares operator tuples
        config["operators"] = tuple(config["operators"])
    import reasoning_gym  # here: a second at import (it loads matplotlib), only data needs it

    if (why := refusal(task)) is not None:
        raise ValueError(why)
    try:
        items = reasoning_gym.create_dataset(task, seed=seed, size=size, **config)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"reasoning-gym task {task!r} with config {config}: {err}. Check the "
                         "name against reasoning_gym.factory.DATASETS and the config keys.") from None
    return [
        make_problem("reasoning", task, item["question"], answer=str(item["answer"]),
                     metadata=dict(item["metadata"]))
        for item in items
    ]

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
        answers = [None if isinstance(scorers[name], Exception) else extract(r)
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


def extract(text: str) -> str | None:
    """The last `<answer>` tag's content, stripped; None when absent or blank."""
    return stripped(last_tag(text))



FAMILY = ProblemFamily(
    name="reasoning", title="Reasoning", params=ReasoningParams, build=build,
    instruction="Answer in <answer></answer>.",
    # Outside the default set: its spell_backward words have three letters.
    example=("Spell this word backward (example: sun -> nus): stone",
             "stone backward is enots.\n<answer>enots</answer>"),
    extract=extract, target=tagged_target, verifier=ReasoningVerifier, headline="reward_mean")
