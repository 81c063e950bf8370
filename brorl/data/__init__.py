"""Problem data: every family's problems, deterministic splits, `datasets` storage.

`build_problems` gathers the problems of every family the data section names (each family's own
`build`, `brorl.families`); `split_problems` dedupes and splits; `make_splits` does both for a
`DataConfig` (the `data` stage, built by `DataConfig.from_params`); `save_splits` / `load_split`
store and read them. Paper: BroRL Table 1 and ProRL (arXiv 2505.24864) §3.1 (Math, Code, RG).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from brorl.data.records import load_split, make_problem, normalise_prompt, save_splits
from brorl.data.splits import SPLITS, dedupe, split_problems
from brorl.families import family
from brorl.types import Problem

if TYPE_CHECKING:
    from brorl.params import DataParams


@dataclass(frozen=True)
class DataConfig:
    """The sources and split of one experiment's problems, no defaults (the schema has them):
    the `data` section's fields but `path` (`brorl.params.DataParams` documents each).
    `families` maps each family's name to its validated params subsection."""

    seed: int
    families: dict[str, Any]
    chat_example: bool
    validation_fraction: float
    test_fraction: float

    @classmethod
    def from_params(cls, params: DataParams) -> DataConfig:
        """The `data` section's fields of the same names; where to save is the caller's (`path`)."""
        from brorl.params.loading import same_named  # here: the params validate data's families

        return same_named(cls, params, families=dict(params.families))


def build_problems(config: DataConfig) -> list[Problem]:
    """All problems of one experiment: each named family's `build(section, seed)`, in the
    section's order."""
    return [p for name, section in config.families.items()
            for p in family(name).build(section, config.seed)]


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
    "DataConfig",
    "SPLITS",
    "build_problems",
    "dedupe",
    "load_split",
    "make_problem",
    "make_splits",
    "normalise_prompt",
    "save_splits",
    "split_counts",
    "split_problems",
]
