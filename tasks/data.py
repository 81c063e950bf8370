"""Prefect task `data`: build, dedupe and split the problems, save them, write their counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.data import DataConfig, make_splits, save_splits, split_counts
from brorl.params import ExperimentParams
from brorl.runs.files import atomic_write_text


@task(name="data", cache_policy=NO_CACHE, persist_result=False)
def build_data(params: ExperimentParams) -> dict[str, Any]:
    """Save the train/validation/test `DatasetDict` at `data.path`, the headline (problems) at
    `<tracking.metrics_dir>/<data_label>.json` for DVC, the counts beside the splits; return the
    paths and the counts."""
    data, metrics_path = params.data, tracking.stage_metrics(params, params.data_label)
    splits = make_splits(DataConfig.from_params(data))
    save_splits(splits, data.path)
    counts = {f"data/{key}": n for key, n in split_counts(splits).items()}
    problems = sum(n for key, n in counts.items() if key.endswith("/total"))
    atomic_write_text(Path(metrics_path), json.dumps({"problems": problems}, indent=2) + "\n")
    atomic_write_text(Path(data.path).parent / "counts.json",
                      json.dumps(counts, indent=2, sort_keys=True) + "\n")
    return {"path": data.path, "metrics_path": metrics_path, "counts": counts}


@task(name="data-mlflow", cache_policy=NO_CACHE, persist_result=False)
def log_data(logged: dict, result: dict, experiment: str, tracking_uri: str) -> str:
    """One MLflow run: the data params and the split counts."""
    with tracking.mlflow_run(experiment, tracking_uri, "data", {"stage": "data"}) as run_id:
        tracking.log_params(tracking_uri, run_id, logged)
        tracking.log_metric_series(tracking_uri, run_id, [0],
                                   {k: [float(v)] for k, v in result["counts"].items()})
        tracking.log_artifacts(tracking_uri, run_id, [Path(result["metrics_path"])])
    return run_id
