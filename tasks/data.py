"""Prefect task `data`: build, dedupe and split the problems, save them, write their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from brorl.data import make_splits, save_splits, split_counts


@task(name="data", cache_policy=NO_CACHE, persist_result=False)
def build_data(*, path: str, metrics_path: str, seed: int, validation_fraction: float,
               test_fraction: float, **sources: Any) -> dict[str, Any]:
    """Save the train/validation/test `DatasetDict` at `path`; return the path and the counts."""
    splits = make_splits(seed=seed, validation_fraction=validation_fraction,
                         test_fraction=test_fraction, **sources)
    save_splits(splits, path)
    counts = {f"data/{key}": n for key, n in split_counts(splits).items()}
    Path(metrics_path).parent.mkdir(parents=True, exist_ok=True)
    Path(metrics_path).write_text(json.dumps(counts, indent=2, sort_keys=True) + "\n")
    return {"path": path, "metrics_path": metrics_path, "counts": counts}
