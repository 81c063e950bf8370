"""A study's MLflow record: its parent run, the runs' tags, the report on the parent.

One parent run per study, found by its tags (`stage=study`, `study=<name>`) and created when
missing, so reruns and resumed studies reuse it; the warm-up and each run are children. A run
that is started over has its earlier MLflow run deleted (soft: `mlflow gc` would purge it). The
Prefect tasks of a study (`tasks/study.py`) call these; this module defines no task.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

import tracking
from brorl.params import ExperimentParams


def forget_run(tracking_uri: str, run_id: str) -> None:
    """Delete the MLflow run a cleared run folder named; one the store no longer holds (another
    tracking database, or deleted by hand) is already gone."""
    try:
        MlflowClient(tracking_uri).delete_run(run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise


def parent_run(params: ExperimentParams) -> str:
    """The study's MLflow parent run, RUNNING: found by its tags, else created."""
    uri = tracking.resolve_tracking_uri(params.tracking.tracking_uri)
    experiment_id = tracking.ensure_experiment(params.tracking.experiment, uri)
    client = MlflowClient(uri)
    found = client.search_runs([experiment_id],
                               f"tags.stage = 'study' and tags.study = '{params.name}'",
                               max_results=1, order_by=["attributes.start_time ASC"])
    if found:
        client.update_run(found[0].info.run_id, status="RUNNING")
        return found[0].info.run_id
    tags = {"stage": "study", "study": params.name, "git_commit": tracking.git_commit()}
    run_id = client.create_run(experiment_id, run_name=params.name, tags=tags).info.run_id
    tracking.log_params(uri, run_id, params.model_dump(mode="json", include={"name", "study"}))
    return run_id


def tag_run(params: ExperimentParams, run_id: str, tags: dict[str, str]) -> None:
    """Set `tags` on MLflow run `run_id` (a study run's arm, seed, N and B)."""
    client = MlflowClient(tracking.resolve_tracking_uri(params.tracking.tracking_uri))
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def log_report(params: ExperimentParams, run_id: str, headline: dict[str, Any],
               out_dir: Path) -> None:
    """The report's files (those in `out_dir`) and each estimated contrast's difference on the
    parent run, which is then FINISHED."""
    uri = tracking.resolve_tracking_uri(params.tracking.tracking_uri)
    metrics = {f"study/{name}_delta": [c["delta"]] for name, c in headline["contrasts"].items()
               if c["reached"]}
    tracking.log_metric_series(uri, run_id, [0], metrics)
    files = [f for f in sorted(out_dir.glob("*")) if f.is_file()]
    tracking.log_artifacts(uri, run_id, files, subdir="report")
    MlflowClient(uri).set_terminated(run_id, status="FINISHED")
