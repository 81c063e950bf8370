"""Reasoning Gym problems by task name, config and seed, and the CPU default task set.

`reasoning_problems(task, size=, seed=, config=)` wraps `reasoning_gym.create_dataset`; each
item's question becomes the prompt, its answer the reference, and its metadata (which the task's
`score_answer` needs) the problem's metadata, checked to be JSON-safe.

The default set (`DEFAULT_REASONING_TASKS`) are short-answer tasks a tiny character-level model
can partly learn on CPU (platform notes): chain_sum (2 one-digit terms), basic_arithmetic (2
terms, + and -), spell_backward (3-4 letters), leg_counting (1 animal, up to 3), word_sequence_reversal (2-3
words; one of the paper's Fig. 4 tasks). count_bits (n <= 255) is left out to keep training
short; letter_counting and gcd too: one constant answer covers 80% and 34% of their items. The held-out evaluation set is the `test` split of these tasks (instances never trained
on, deduped by prompt), as the paper holds out samples per task (spec §5.2).

Deliberately ignored: the paper's 96-task curriculum (too long for a tiny model), RG's
difficulty schedules. Paper: spec §7.1, Logic puzzles = Reasoning Gym, continuous reward.
"""

from __future__ import annotations

from typing import Any

import reasoning_gym

from brorl.data.records import make_problem
from brorl.types import Problem

DEFAULT_REASONING_TASKS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "operators": ["+", "-"]},
    "spell_backward": {"min_word_len": 3, "max_word_len": 4},
    "leg_counting": {"min_animals": 1, "max_animals": 1, "max_instances": 3},
    "word_sequence_reversal": {"min_words": 2, "max_words": 3},
}
"""Task name -> reasoning-gym config for the CPU default (platform notes, tiny-model friendly)."""


def reasoning_problems(task: str, *, size: int, seed: int,
                       config: dict[str, Any] | None = None) -> list[Problem]:
    """`size` items of reasoning-gym task `task` built with `config` and `seed`."""
    config = dict(config or {})
    if "operators" in config:  # YAML gives lists; reasoning-gym compares operator tuples
        config["operators"] = tuple(config["operators"])
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
