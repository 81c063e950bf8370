"""Prefect task `model`: the starting checkpoint folder from the `model` section's source."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.model import ModelConfig
from brorl.params import ExperimentParams
from brorl.runs.files import atomic_write_text
from brorl.runs.timings import write_timings
from brorl.types import timed


@task(name="model", cache_policy=NO_CACHE, persist_result=False)
def make_model(params: ExperimentParams) -> dict[str, Any]:
    """Write the checkpoint (or, for an `hf` source, its card) at `model.path` (paths taken from
    the working folder, as the data and base stages'); the card's headline (parameters,
    vocabulary) to `<tracking.metrics_dir>/<model_label>.json` for DVC; the seconds it took to
    `<model.path's folder>.timings.json` (`brorl.runs.timings`), outside what DVC tracks."""
    from brorl.model.make import make_checkpoint

    metrics_path = tracking.stage_metrics(params, params.model_label)
    made = timed(make_checkpoint, ModelConfig.from_params(params.model), params.model.path)
    card, seconds = made.value, {"model/seconds": round(made.seconds, 1)}
    headline = {k: card[k] for k in ("parameters", "vocab_size")}
    atomic_write_text(Path(metrics_path), json.dumps(headline, indent=2, sort_keys=True) + "\n")
    write_timings(Path(params.model.path).parent, seconds)
    return {"path": params.model.path, "metrics_path": metrics_path, "card": card,
            "timings": seconds}


@task(name="model-mlflow", cache_policy=NO_CACHE, persist_result=False)
def log_model(logged: dict, result: dict, experiment: str, tracking_uri: str) -> str:
    """One MLflow run: the model params and its card."""
    card = result["card"]
    with tracking.mlflow_run(experiment, tracking_uri, "model", {"stage": "model",
                             "model_type": card["model_type"]}) as run_id:
        tracking.log_params(tracking_uri, run_id, logged)
        tracking.log_metric_series(tracking_uri, run_id, [0], {
            "model/parameters": [float(card["parameters"])],
            "model/vocab_size": [float(card["vocab_size"])],
            "model/seconds": [float(result["timings"]["model/seconds"])]})
        tracking.log_artifacts(tracking_uri, run_id, [Path(result["metrics_path"])])
    return run_id
