"""Reasoning verifier: the reasoning-gym dataset's own `score_answer` on the extracted answer.

The scorer is rebuilt from the task name (`problem.metadata["source_dataset"]`, else
`problem.task`) with `reasoning_gym.get_score_answer_fn`, and called on the answer inside the
last `<answer></answer>` with the entry `{question, answer, metadata}` rebuilt from the record.
Extracting first matters: given a whole response, several scorers give partial credit when the
reference is a substring of it (spec platform.md). The reward stays continuous, as in the paper
(spec paper.md §7.1 data table: Reasoning Gym, continuous, `<answer></answer>`).

Deliberately ignored: binarising (evaluation reports the mean continuous reward, like the paper)
and scorer configs other than the dataset's default (scorers read the entry's metadata).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from brorl.prompts import extract_answer
from brorl.types import Family, Problem
from brorl.verifiers import Verdict, error_verdict, verdict_for_score
from brorl.verifiers.workers import map_with_deadline, outcome_verdict

Scorer = Callable[[str | None, dict], float]


class ReasoningVerifier:
    """Continuous reward in [0, 1] from reasoning-gym's scorer for each problem's task."""

    family: Family = "reasoning"

    def __init__(self, *, workers: int | None = None, timeout_s: float = 5.0):
        self.workers = workers
        self.timeout_s = timeout_s

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair; scorers are built here, before the workers fork."""
        scorers = {name: _scorer(name) for name in {task_name(p) for p in problems}}
        items = [(scorers[task_name(p)], p, r) for p, r in zip(problems, responses)]
        outcomes = map_with_deadline(_check, items, workers=self.workers, timeout_s=self.timeout_s)
        return [outcome_verdict(outcome) for outcome in outcomes]


def task_name(problem: Problem) -> str:
    """The reasoning-gym dataset that made `problem`."""
    return str(problem.metadata.get("source_dataset") or problem.task)


def entry_of(problem: Problem) -> dict:
    """The reasoning-gym entry `{question, answer, metadata}` that `score_answer` expects."""
    return {"question": problem.prompt, "answer": problem.answer, "metadata": problem.metadata}


def _scorer(name: str) -> Scorer | Exception:
    """The dataset's `score_answer`, or the exception that building it raised."""
    import reasoning_gym

    try:
        return reasoning_gym.get_score_answer_fn(name)
    except Exception as exc:  # noqa: BLE001 - becomes each of the task's verdicts
        return exc


def _check(item: tuple[Scorer | Exception, Problem, str]) -> Verdict:
    scorer, problem, response = item
    if isinstance(scorer, Exception):
        return error_verdict(scorer)
    answer = extract_answer(response, "reasoning")
    if answer is None:
        return Verdict(0.0, "no_answer")
    return verdict_for_score(scorer(answer, entry_of(problem)))
