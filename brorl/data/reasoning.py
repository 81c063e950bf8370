"""Reasoning Gym problems by task name, config and seed, and the CPU default task set.

`reasoning_problems(task, size=, seed=, config=)` wraps `reasoning_gym.create_dataset`; each
item's question becomes the prompt, its answer the reference, and its metadata (which the task's
`score_answer` needs) the problem's metadata, checked to be JSON-safe.

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

Deliberately ignored: the paper's 96-task curriculum (too long for a tiny model), RG's difficulty
schedules. Paper: ProRL (arXiv 2505.24864) App. E, Logic puzzles = Reasoning Gym, continuous reward.
"""

from __future__ import annotations

from typing import Any

from brorl.data.records import make_problem
from brorl.types import Problem
from brorl.verifiers.reasoning import refusal

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
