"""Deterministic, disjoint train/validation/test splits, stratified by (family, task).

Problems are first deduplicated by normalised prompt (`records.normalise_prompt`), so the same
question can never sit in two splits even when two sources (or two seeds of one generator)
produce it. Then each (family, task) group is sorted by id, shuffled with `random.Random(seed)`
and cut, so every task appears in every split in its share and the result does not depend on
the input order.

Deliberately ignored: near-duplicates beyond case and whitespace (paraphrases, reordered terms).
Paper: the held-out evaluation split of ProRL (arXiv 2505.24864) §3.4, which BroRL App. D follows
(100 held-out samples per RG task).
"""

from __future__ import annotations

import random
from collections import defaultdict

from brorl.data.records import normalise_prompt
from brorl.types import Problem

SPLITS = ("train", "validation", "test")


def dedupe(problems: list[Problem]) -> list[Problem]:
    """Keep one problem per normalised prompt: the smallest id, so input order does not matter."""
    best: dict[str, Problem] = {}
    for p in problems:
        key = normalise_prompt(p.prompt)
        if key not in best or p.id < best[key].id:
            best[key] = p
    return sorted(best.values(), key=lambda p: p.id)


def _cut(n: int, validation_fraction: float, test_fraction: float) -> tuple[int, int]:
    """Sizes of validation and test for a group of n; each at least 1 when its fraction > 0."""
    n_val = max(round(n * validation_fraction), 1 if validation_fraction > 0 and n >= 3 else 0)
    n_test = max(round(n * test_fraction), 1 if test_fraction > 0 and n >= 3 else 0)
    return n_val, n_test


def split_problems(problems: list[Problem], *, seed: int, validation_fraction: float = 0.1,
                   test_fraction: float = 0.2) -> dict[str, list[Problem]]:
    """Dedupe, then split each (family, task) group by seed into train / validation / test.

    Returns {"train": [...], "validation": [...], "test": [...]}, each sorted by id.
    """
    if validation_fraction < 0 or test_fraction < 0 or validation_fraction + test_fraction >= 1:
        raise ValueError(
            f"validation_fraction ({validation_fraction}) and test_fraction ({test_fraction}) "
            "must be >= 0 and sum below 1, so some problems are left to train on."
        )
    groups: dict[tuple[str, str], list[Problem]] = defaultdict(list)
    for p in dedupe(problems):
        groups[(p.family, p.task)].append(p)
    out: dict[str, list[Problem]] = {name: [] for name in SPLITS}
    for key in sorted(groups):
        group = groups[key]
        random.Random(f"{seed}/{key[0]}/{key[1]}").shuffle(group)
        n_val, n_test = _cut(len(group), validation_fraction, test_fraction)
        out["test"] += group[:n_test]
        out["validation"] += group[n_test:n_test + n_val]
        out["train"] += group[n_test + n_val:]
    return {name: sorted(ps, key=lambda p: p.id) for name, ps in out.items()}
