"""Math problems: local JSONL in the DeepScaleR / MATH shape, and a generated CPU-sized set.

JSONL rows need `problem` and either `answer` (DeepScaleR) or a `solution` whose last
`\\boxed{...}` is the answer (MATH). The task name is the row's `task`, `type` or `source` field,
else the file's stem. The generated set has four tasks sized for a tiny character-level model:
`compare` (the larger of two two-digit numbers), `arithmetic` (a op b), `fractions` (reduce a
fraction) and `linear_equation` (solve ax + b = c).

Deliberately ignored: answer normalisation (math-verify in the verifier decides equivalence),
multi-answer problems. Paper: ProRL (arXiv 2505.24864) App. E, Math = DeepScaleR, 40k problems,
binary reward.
"""

from __future__ import annotations

import random
from math import gcd
from pathlib import Path

from brorl.data.records import draw_per_task, jsonl_rows, make_problem
from brorl.types import Problem

MATH_TASKS = ("compare", "arithmetic", "fractions", "linear_equation")
"""Generated math tasks, easiest first, each answered by one integer or one reduced fraction.
Their spread of difficulty for a tiny model (compare: pick the larger of two two-digit numbers;
linear_equation: solve) stands in for the spread of the paper's benchmarks (AIME to MATH)."""


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, braces matched; None if there is none."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


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
    makers = {"compare": _compare, "arithmetic": _arithmetic, "fractions": _fraction, "linear_equation": _linear}

    def draw(task: str, rng: random.Random) -> Problem:
        prompt, answer = makers[task](rng, max_operand)
        return make_problem("math", task, prompt, answer=answer,
                            metadata={"generator": task, "seed": seed})

    return draw_per_task("math", tasks, makers, per_task, seed, draw)
