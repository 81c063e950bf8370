"""Math verifier: math-verify's `parse` + `verify` on the extracted answer; binary reward.

The response's answer is taken by `brorl.prompts.extract_answer` (`<answer>` or `\\boxed{}`),
wrapped in `\\boxed{}` like the reference answer, and both are parsed by math-verify, so `0.75`,
`3/4` and `\\frac{3}{4}` are equal. Only math-verify's LaTeX extraction is used: its
plain-expression extraction hands text to sympy's `parse_expr`, which runs `eval`, and a scorer
never evaluates a policy's answer text (the LaTeX parser hands `parse_expr` only the number
literals its lexer matched, through `sympy.Number("0.75")`). math-verify's own timeouts rely on
SIGALRM and fail outside the main thread (math-verify 0.9.0), so they are switched off and each
check instead runs in a forked worker with a wall-clock limit (`workers.judge_answers`: the
answer is extracted first, and only a response with one is sent to a worker, each distinct
answer once); this process compares two fixed answers first, so the workers fork with
math-verify's lazy tables built.

Deliberately ignored: the DeepScaleR grader that ProRL ORs with math-verify (ProRL (arXiv
2505.24864) App. E, Table 4); only math-verify decides here.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from brorl.prompts import extract_answer
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict
from brorl.verifiers.workers import judge_answers


class MathVerifier:
    """Binary reward: 1 when math-verify finds the extracted answer equal to the reference."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair; `timeout_s` bounds each check's wall time."""
        _warm_up()
        answers = [extract_answer(response, "math") for response in responses]
        return judge_answers(_check, problems, answers, workers=self.config.workers,
                             timeout_s=self.config.timeout_s)


def math_equal(reference: str, answer: str) -> bool:
    """Whether math-verify finds `answer` equal to `reference` (no time limit: call in a worker)."""
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    latex_only = [math_verify.LatexExtractionConfig()]  # never sympy's eval-based parse_expr
    gold = math_verify.parse(f"\\boxed{{{reference}}}", latex_only, parsing_timeout=None)
    pred = math_verify.parse(f"\\boxed{{{answer}}}", latex_only, parsing_timeout=None)
    return bool(gold and pred and math_verify.verify(gold, pred, timeout_seconds=None))


@functools.cache
def _warm_up() -> None:
    """Compare a number and an expression once in this process, before any worker forks: the
    first comparisons build math-verify's and sympy's lazy tables (0.3-0.5 s of CPU), which every
    forked worker would otherwise build again at every verify call."""
    math_equal("\\frac{1}{2}", "0.5")
    math_equal("x^2+1", "x+1")


def _check(item: tuple[Problem, str]) -> Verdict:
    problem, answer = item
    return Verdict(1.0, "correct") if math_equal(problem.answer, answer) else Verdict(0.0, "wrong")
