"""Problem data for the three families: sources, deterministic splits, `datasets` storage.

`build_problems` gathers every source for one experiment; `split_problems` dedupes and splits;
`save_splits` / `load_split` store and read them. Paper: spec §5 and §7.1 (Math, Code, RG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from brorl.data.code import generate_code, load_code_jsonl
from brorl.data.math import generate_math, load_math_jsonl
from brorl.data.reasoning import DEFAULT_REASONING_TASKS, reasoning_problems
from brorl.data.records import FAMILIES, load_split, make_problem, normalise_prompt, save_splits
from brorl.data.splits import SPLITS, dedupe, split_problems
from brorl.types import Problem


def build_problems(*, seed: int, math_per_task: int = 0, code_per_task: int = 0,
                   reasoning_per_task: int = 0, math_max_operand: int = 9,
                   reasoning_tasks: dict[str, dict[str, Any]] | None = None,
                   math_jsonl: tuple[str | Path, ...] = (),
                   code_jsonl: tuple[str | Path, ...] = ()) -> list[Problem]:
    """All problems of one experiment: the generated sets, RG tasks and local JSONL files.

    A count of 0 leaves that generated source out; `reasoning_tasks` None means the default set.
    """
    problems: list[Problem] = []
    if math_per_task:
        problems += generate_math(math_per_task, seed=seed, max_operand=math_max_operand)
    if code_per_task:
        problems += generate_code(code_per_task, seed=seed)
    if reasoning_per_task:
        tasks = DEFAULT_REASONING_TASKS if reasoning_tasks is None else reasoning_tasks
        for name, config in tasks.items():
            problems += reasoning_problems(name, size=reasoning_per_task, seed=seed, config=config)
    for path in math_jsonl:
        problems += load_math_jsonl(path)
    for path in code_jsonl:
        problems += load_code_jsonl(path)
    return problems


def make_splits(*, seed: int, validation_fraction: float, test_fraction: float,
                **sources: Any) -> dict[str, list[Problem]]:
    """`build_problems(seed=seed, **sources)`, deduped and split by the same seed."""
    return split_problems(build_problems(seed=seed, **sources), seed=seed,
                          validation_fraction=validation_fraction, test_fraction=test_fraction)


def split_counts(splits: dict[str, list[Problem]]) -> dict[str, int]:
    """Problem counts `{"<split>/<family>": n, "<split>/total": n}` for metrics."""
    counts: dict[str, int] = {}
    for name, problems in splits.items():
        counts[f"{name}/total"] = len(problems)
        for p in problems:
            counts[f"{name}/{p.family}"] = counts.get(f"{name}/{p.family}", 0) + 1
    return counts


__all__ = [
    "DEFAULT_REASONING_TASKS",
    "FAMILIES",
    "SPLITS",
    "build_problems",
    "dedupe",
    "generate_code",
    "generate_math",
    "load_code_jsonl",
    "load_math_jsonl",
    "load_split",
    "make_problem",
    "make_splits",
    "normalise_prompt",
    "reasoning_problems",
    "save_splits",
    "split_counts",
    "split_problems",
]
