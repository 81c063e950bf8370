"""Readers' fallbacks for run files written before a field existed, gathered in one module.

Every writer in brorl writes the current format; only the readers below accept the older one:

- `eval_split`: an `evals.jsonl` row without "split" (written before validation rows existed)
  is a test row.
- `instance_scores`: an eval row without per-instance "score" (written before it existed) is
  scored by its "pass_at_1"; `row_families`: a row without "families" names none.
- `family_key`: a family's scores without "score" (written before the headline score existed)
  hold it under the family's headline quantity (`brorl.scoring.HEADLINE`).
- `params_unrecorded`: a checkpoint folder without `params.json` (written before the params
  record existed) resumes without comparing params.

Removal: once no kept run folder or DVC-cached output holds such a file, delete this module and
its callers' fallbacks: `evals.row_split` reads `row["split"]`, `brorl.compare` reads
`row["score"]`, `row["families"]` and the family's `quantity`, and `preflight` refuses a
checkpoint without a params record (`run_files.recorded_params`). The study's reader
(`brorl.study.results`) has fallbacks of its own for the same rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def eval_split(row: dict[str, Any]) -> str:
    """The split of an eval row; a row without "split" is a test row."""
    return row.get("split", "test")


def instance_scores(row: dict[str, Any]) -> list[float]:
    """An eval row's per-instance headline scores, in `problem_ids` order; "pass_at_1" in a row
    written without "score"."""
    return row.get("score", row["pass_at_1"])


def row_families(row: dict[str, Any]) -> list[str | None]:
    """An eval row's per-instance families, in `problem_ids` order; None each in a row written
    without "families"."""
    return row.get("families") or [None] * len(row["problem_ids"])


def family_key(family_scores: dict[str, Any], quantity: str, headline: str) -> str:
    """The key of `quantity` in one family's scores: "score" is `headline` (the family's headline
    quantity) in scores written without a "score" entry."""
    return headline if quantity == "score" and "score" not in family_scores else quantity


def params_unrecorded(path: Path) -> bool:
    """True when the params record `path` of a checkpoint folder is absent: the checkpoint was
    written before records existed, and resumes without the comparison."""
    return not path.is_file()
