"""Problem data for the three families: sources, deterministic splits, `datasets` storage.

`build_problems` gathers every source for one experiment; `split_problems` dedupes and splits;
`make_splits` does both for a `DataConfig` (the `data` stage, built by `DataConfig.from_params`);
`save_splits` / `load_split` store and read them. Paper: BroRL Table 1 and ProRL (arXiv 2505.24864)
§3.1 (Math, Code, RG).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from brorl.data.code import generate_code, load_code_jsonl
from brorl.data.math import generate_math, load_math_jsonl
from brorl.data.reasoning import DEFAULT_REASONING_TASKS, reasoning_problems
from brorl.data.records import FAMILIES, load_split, make_problem, normalise_prompt, save_splits
from brorl.data.splits import SPLITS, dedupe, split_problems
from brorl.params.loading import same_named
from brorl.types import Problem

if TYPE_CHECKING:
    from brorl.params import DataParams


@dataclass(frozen=True)
class DataConfig:
    """The sources and split of one experiment's problems, no defaults (the schema has them):
    the `data` section's fields but `path` (`brorl.params.DataParams` documents each)."""

    seed: int
    math_per_task: int
    math_max_operand: int
    code_per_task: int
    code_max_constant: int
    reasoning_per_task: int
    reasoning_tasks: dict[str, dict[str, Any]] | None
    math_jsonl: tuple[str, ...]
    code_jsonl: tuple[str, ...]
    chat_example: bool
    validation_fraction: float
    test_fraction: float

    @classmethod
    def from_params(cls, params: DataParams) -> DataConfig:
        """The `data` section's fields of the same names; where to save is the caller's (`path`)."""
        return same_named(cls, params, math_jsonl=tuple(params.math_jsonl),
                          code_jsonl=tuple(params.code_jsonl))


def build_problems(config: DataConfig) -> list[Problem]:
    """All problems of one experiment: the generated sets, RG tasks and local JSONL files.

    A count of 0 leaves that generated source out; `reasoning_tasks` None means the default set.
    """
    c = config
    problems: list[Problem] = []
    if c.math_per_task:
        problems += generate_math(c.math_per_task, seed=c.seed, max_operand=c.math_max_operand)
    if c.code_per_task:
        problems += generate_code(c.code_per_task, seed=c.seed, max_constant=c.code_max_constant)
    if c.reasoning_per_task:
        tasks = DEFAULT_REASONING_TASKS if c.reasoning_tasks is None else c.reasoning_tasks
        for name, options in tasks.items():
            problems += reasoning_problems(name, size=c.reasoning_per_task, seed=c.seed,
                                           config=options)
    for path in c.math_jsonl:
        problems += load_math_jsonl(path)
    for path in c.code_jsonl:
        problems += load_code_jsonl(path)
    return problems


def make_splits(config: DataConfig) -> dict[str, list[Problem]]:
    """`build_problems` of the config's sources, deduped and split by the same seed."""
    c = config
    problems = build_problems(c)
    if c.chat_example:
        problems = [replace(p, metadata={**p.metadata, "chat_example": True}) for p in problems]
    return split_problems(problems, seed=c.seed, validation_fraction=c.validation_fraction,
                          test_fraction=c.test_fraction)


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
    "DataConfig",
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
