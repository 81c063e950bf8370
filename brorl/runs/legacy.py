"""Readers' fallbacks for run files written before a field existed, gathered in one module.

Every writer in brorl writes the current format; only the readers below accept the older one:

- `eval_split`: an `evals.jsonl` row without "split" (written before validation rows existed)
  is a test row.
- `instance_scores`: an eval row without per-instance "score" (written before it existed) is
  scored by its "pass_at_1"; `row_families`: a row without "families" names none.
- `family_key`: a family's scores without "score" (written before the headline score existed)
  hold it under the family's headline quantity (`ProblemFamily.headline`).
- `data_keys`: a data section with the flat keys of the three families (`math_per_task`,
  `code_jsonl`, `reasoning_tasks`, ...; written before `data.families` existed) is read as the
  `families` subsections they name, with a `FutureWarning` naming the new keys. Kept for one
  release: params files written for it keep working; rewrite them with the new keys.
- `params_unrecorded`: a checkpoint folder without `params.json` (written before the params
  record existed) resumes without comparing params.

Removal: `data_keys` after one release (its callers then refuse the old keys as unknown). The
rest once no kept run folder or DVC-cached output holds such a file, delete this module and
its callers' fallbacks: `evals.row_split` reads `row["split"]`, `brorl.evaluation.compare` reads
`row["score"]`, `row["families"]` and the family's `quantity`, and `preflight` refuses a
checkpoint without a params record (`run_files.recorded_params`). The study's reader
(`brorl.study.results`) has fallbacks of its own for the same rows.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

DATA_KEYS = {
    "math_per_task": ("math", "per_task"), "math_max_operand": ("math", "max_operand"),
    "math_jsonl": ("math", "jsonl"), "code_per_task": ("code", "per_task"),
    "code_max_constant": ("code", "max_constant"), "code_jsonl": ("code", "jsonl"),
    "reasoning_per_task": ("reasoning", "per_task"), "reasoning_tasks": ("reasoning", "tasks"),
}
"""The data section's flat keys of the three families -> (family, key in its subsection)."""


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


def data_keys(section: dict[str, Any]) -> dict[str, Any]:
    """A data section with its flat family keys (`DATA_KEYS`) moved into `families`: the paper's
    three families at their defaults, each flat key set in its subsection (a `families` given
    beside them is kept and the flat keys go into it). A section without flat keys is returned
    as it is; otherwise a FutureWarning names the new keys."""
    old = [key for key in section if key in DATA_KEYS]
    if not old:
        return section
    out = {key: value for key, value in section.items() if key not in DATA_KEYS}
    families = {name: dict(sub or {}) for name, sub in
                (out.get("families") or {"math": {}, "code": {}, "reasoning": {}}).items()}
    for key in old:
        name, field = DATA_KEYS[key]
        families.setdefault(name, {})[field] = section[key]
    out["families"] = families
    new = ", ".join(f"data.families.{DATA_KEYS[k][0]}.{DATA_KEYS[k][1]}" for k in old)
    warnings.warn(f"data.{', data.'.join(old)}: old keys, read as {new}; write the new keys "
                  "(brorl.runs.legacy: the old ones go after one release).", FutureWarning,
                  stacklevel=2)
    return out
