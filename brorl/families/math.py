"""The math family: generated CPU-sized problems and local JSONL, judged by math-verify.

Problems. JSONL rows (`jsonl`) need `problem` and either `answer` (DeepScaleR) or a `solution`
whose last `\\boxed{...}` is the answer (MATH); the task name is the row's `task`, `type` or
`source` field, else the file's stem. The generated set has four tasks sized for a tiny
character-level model: `compare` (the larger of two two-digit numbers), `arithmetic` (a op b),
`fractions` (reduce a fraction) and `linear_equation` (solve ax + b = c).

Answers. The last `<answer>...</answer>`, else the last `\\boxed{...}` (`brorl.families.answers`).

Verifier. The answer is wrapped in `\\boxed{}` like the reference answer and both are parsed by
math-verify, so `0.75`, `3/4` and `\\frac{3}{4}` are equal; binary reward. Only math-verify's LaTeX
extraction is used: its plain-expression extraction hands text to sympy's `parse_expr`, which runs
`eval`, and a scorer never evaluates a policy's answer text (the LaTeX parser hands `parse_expr`
only the number literals its lexer matched, through `sympy.Number("0.75")`). math-verify's own
timeouts rely on SIGALRM and fail outside the main thread (math-verify 0.9.0), so they are
switched off and each check instead runs in a forked worker with a wall-clock limit
(`brorl.verifiers.workers.judge_answers`: only a response with an answer is sent to a worker,
each distinct answer once); this process compares two fixed answers first, so the workers fork
with math-verify's lazy tables built.

Deliberately ignored: answer normalisation beyond math-verify's, multi-answer problems, the
DeepScaleR grader that ProRL ORs with math-verify. Paper: ProRL (arXiv 2505.24864) App. E,
Table 4 (Math = DeepScaleR, 40k problems, binary reward, `\\boxed{}`).
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Sequence
from math import gcd
from pathlib import Path

from pydantic import NonNegativeInt, PositiveInt

from brorl.data.records import draw_per_task, jsonl_rows, make_problem
from brorl.families import FamilyParams, ProblemFamily
from brorl.families.answers import last_boxed, last_tag, stripped, tagged_target
from brorl.types import Problem
from brorl.verifiers.config import VerifyConfig
from brorl.verifiers.verdict import Verdict
from brorl.verifiers.workers import judge_answers

MATH_TASKS = ("compare", "arithmetic", "fractions", "linear_equation")
"""Generated math tasks, easiest first, each answered by one integer or one reduced fraction.
Their spread of difficulty for a tiny model (compare: pick the larger of two two-digit numbers;
linear_equation: solve) stands in for the spread of the paper's benchmarks (AIME to MATH)."""


class MathParams(FamilyParams):
    """`data.families.math`: the generated set's size and range, and local JSONL files."""

    per_task: NonNegativeInt = 600
    """Generated draws per task (compare, arithmetic, fractions, linear_equation); 0 leaves them
    out. Draws may repeat; splitting dedupes by prompt."""
    max_operand: PositiveInt = 9
    """Largest operand of the generated tasks (9: one-digit facts a tiny model can learn)."""
    jsonl: list[str] = []
    """Local JSONL files of math problems (`problem` + `answer`, the DeepScaleR / MATH shape)."""

    def size(self) -> int:
        return self.per_task * len(MATH_TASKS)


def build(section: MathParams, seed: int) -> list[Problem]:
    """The generated draws, then every JSONL file's rows."""
    problems = generate_math(section.per_task, seed=seed, max_operand=section.max_operand)
    for path in section.jsonl:
        problems += load_math_jsonl(path)
    return problems


def _row_answer(row: dict, where: str) -> str:
    if row.get("answer") not in (None, ""):
        return str(row["answer"])
    boxed = last_boxed(str(row.get("solution", "")))
    if boxed is None:
        raise ValueError(f"{where}: no `answer` and no \\boxed{{...}} in `solution`; "
                         "add an `answer` field to the row.")
    return boxed


def load_math_jsonl(path: str | Path) -> list[Problem]:
    """Read `problem`/`answer` rows (or MATH's `problem`/`solution`) into math Problems."""
    path = Path(path)
    problems = []
    for row, where in jsonl_rows(path):
        if "problem" not in row:
            raise ValueError(f"{where}: no `problem` field (keys {sorted(row)}); "
                             "math rows need `problem` and `answer`.")
        task = str(row.get("task") or row.get("type") or row.get("source") or path.stem)
        extra = {k: row[k] for k in ("level", "type", "source") if k in row}
        problems.append(make_problem("math", task, str(row["problem"]),
                                     answer=_row_answer(row, where), metadata=extra))
    return problems


def _compare(rng: random.Random, max_operand: int) -> tuple[str, str]:
    a, b = rng.sample(range(10, 100), 2)
    return f"Which is larger, {a} or {b}?", str(max(a, b))


def _arithmetic(rng: random.Random, max_operand: int) -> tuple[str, str]:
    a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice("+-*")
    value = {"+": a + b, "-": a - b, "*": a * b}[op]
    return f"Compute {a} {op} {b}.", str(value)


def _fraction(rng: random.Random, max_operand: int) -> tuple[str, str]:
    den = rng.randint(2, max(2, max_operand // 2))
    num = rng.randint(1, den - 1)
    num, den = num // gcd(num, den), den // gcd(num, den)
    # k spans 2..max_operand like the other tasks' operands: k in 2..5 gave 20 distinct prompts
    # at max_operand 9, 2 of them in validation, so one item moved the math score by 0.25.
    k = rng.randint(2, max(2, max_operand))
    return f"Reduce {num * k}/{den * k} to lowest terms.", f"{num}/{den}"


def _linear(rng: random.Random, max_operand: int) -> tuple[str, str]:
    span = max(2, max_operand // 2)
    a, x, b = rng.randint(2, 9), rng.randint(-span, span), rng.randint(-span, span)
    sign = "+" if b >= 0 else "-"
    return f"Solve for x: {a}x {sign} {abs(b)} = {a * x + b}.", str(x)


def generate_math(per_task: int, *, seed: int, max_operand: int = 9,
                  tasks: tuple[str, ...] = MATH_TASKS) -> list[Problem]:
    """`per_task` draws of each generated task (duplicates are possible; splitting dedupes)."""
    makers = {"compare": _compare, "arithmetic": _arithmetic, "fractions": _fraction,
              "linear_equation": _linear}

    def draw(task: str, rng: random.Random) -> Problem:
        prompt, answer = makers[task](rng, max_operand)
        return make_problem("math", task, prompt, answer=answer,
                            metadata={"generator": task, "seed": seed})

    return draw_per_task("math", tasks, makers, per_task, seed, draw)


def extract(text: str) -> str | None:
    """The last `<answer>` tag's content, else the last `\\boxed{}`'s; None when absent."""
    found = last_tag(text)
    return stripped(found if found is not None else last_boxed(text))



class MathVerifier:
    """Binary reward: 1 when math-verify finds the extracted answer equal to the reference."""

    def __init__(self, config: VerifyConfig = VerifyConfig()):
        self.config = config

    def verify(self, problems: Sequence[Problem], responses: Sequence[str]) -> list[Verdict]:
        """One verdict per pair; `timeout_s` bounds each check's wall time."""
        _warm_up()
        answers = [extract(response) for response in responses]
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


FAMILY = ProblemFamily(
    name="math", title="Math", params=MathParams, build=build,
    instruction="Answer in <answer></answer>.",
    # Outside the generated sets: their operands stop at 9 and their prompts differ.
    example=("Compute 12 + 30.", "12 + 30 = 42.\n<answer>42</answer>"),
    extract=extract, target=tagged_target, verifier=MathVerifier, headline="pass_at_1")
