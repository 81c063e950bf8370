"""Problem identity and on-disk storage: ids, prompt normalisation, `datasets` round-trip.

Every family's problems become the same Arrow table (one row per `Problem`): `tests` is a list of
strings and `metadata` a JSON string, because metadata differs from task to task and Arrow wants
one schema per column. Splits are saved together with `DatasetDict.save_to_disk`.

Deliberately ignored: streaming and sharding (the datasets here fit in memory), hub uploads.
Paper: BroRL Table 1 / ProRL (arXiv 2505.24864) App. E (the three families Math, Code, Reasoning
Gym).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from datasets import Dataset, DatasetDict, load_from_disk

from brorl.families import BUILTIN
from brorl.types import FAMILIES, Family, Problem  # noqa: F401 - brorl.data re-exports FAMILIES


def normalise_prompt(prompt: str) -> str:
    """The dedupe key: lower case, runs of whitespace collapsed to one space, ends stripped."""
    return re.sub(r"\s+", " ", prompt).strip().lower()


def problem_id(family: str, task: str, prompt: str) -> str:
    """A stable id `family/task/<12 hex of sha1(normalised prompt)>`: same prompt, same id."""
    digest = hashlib.sha1(normalise_prompt(prompt).encode()).hexdigest()[:12]
    return f"{family}/{task}/{digest}"


def make_problem(family: Family, task: str, prompt: str, *, answer: str = "",
                 tests: Iterable[str] = (), metadata: dict | None = None) -> Problem:
    """A `Problem` with its id derived from the prompt and metadata checked to be JSON-safe."""
    if family not in BUILTIN:
        raise ValueError(f"family {family!r} is not one of {BUILTIN}; pick one of those.")
    if not prompt.strip():
        raise ValueError(f"{family}/{task}: empty prompt; every problem needs a prompt.")
    try:
        meta = json.loads(json.dumps(metadata or {}))
    except TypeError as err:
        raise ValueError(f"{family}/{task}: metadata is not JSON-serialisable ({err}); "
                         "convert sets and objects to lists, strings or numbers.") from None
    return Problem(id=problem_id(family, task, prompt), family=family, task=task, prompt=prompt,
                   answer=str(answer), tests=tuple(tests), metadata=meta)


def draw_per_task(family: Family, tasks: Iterable[str], known: Iterable[str], per_task: int,
                  seed: int, draw: Callable[[str, random.Random], Problem]) -> list[Problem]:
    """`per_task` problems `draw(task, rng)` of each task, each task with its own generator
    seeded by `family/task/seed` (a task's draws do not depend on the others); a ValueError
    naming the choices for a task not in `known`."""
    unknown = sorted(set(tasks) - set(known))
    if unknown:
        raise ValueError(f"unknown {family} tasks {unknown}; choose from {sorted(known)}.")
    problems = []
    for task in tasks:
        rng = random.Random(f"{family}/{task}/{seed}")
        problems.extend(draw(task, rng) for _ in range(per_task))
    return problems


def jsonl_rows(path: Path) -> Iterator[tuple[dict, str]]:
    """The rows of a JSON-lines file, blank lines skipped, each with `path:line` for messages."""
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            yield json.loads(line), f"{path}:{n}"


def problems_to_dataset(problems: list[Problem]) -> Dataset:
    """One Arrow table, columns id, family, task, prompt, answer, tests (list), metadata (JSON)."""
    return Dataset.from_dict({
        "id": [p.id for p in problems],
        "family": [p.family for p in problems],
        "task": [p.task for p in problems],
        "prompt": [p.prompt for p in problems],
        "answer": [p.answer for p in problems],
        "tests": [list(p.tests) for p in problems],
        "metadata": [json.dumps(p.metadata, sort_keys=True) for p in problems],
    })


def dataset_to_problems(table: Dataset) -> list[Problem]:
    """The inverse of `problems_to_dataset`."""
    return [
        Problem(id=row["id"], family=row["family"], task=row["task"], prompt=row["prompt"],
                answer=row["answer"], tests=tuple(row["tests"]),
                metadata=json.loads(row["metadata"]))
        for row in table
    ]


def save_splits(splits: dict[str, list[Problem]], path: str | Path) -> Path:
    """Save named splits (e.g. train/validation/test) as one `DatasetDict` folder at `path`."""
    path = Path(path)
    DatasetDict({name: problems_to_dataset(ps) for name, ps in splits.items()}).save_to_disk(path)
    return path


def load_split(path: str | Path, split: str) -> list[Problem]:
    """Load one split saved by `save_splits`; the error lists the splits that exist."""
    tables = load_from_disk(str(path))
    if split not in tables:
        raise KeyError(f"{path}: no split {split!r}; it has {sorted(tables)}.")
    return dataset_to_problems(tables[split])
