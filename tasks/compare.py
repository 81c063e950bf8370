"""Prefect tasks of the comparison: resolve the arms' params, build the report, record it in MLflow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from prefect import task
from prefect.cache_policies import NO_CACHE

import tracking
from brorl.evaluation.compare import ArmResult, build_report, headline, report_metrics
from brorl.evaluation.protocol import EvalProtocol
from brorl.params import ExperimentParams, compare_arms
from brorl.runs.files import atomic_write_text
from brorl.runs.timings import timings_path
from brorl.system.checkout import find_root

_TASK = dict(cache_policy=NO_CACHE, persist_result=False)


@task(name="resolve-arms", **_TASK)
def resolve_arms(params: ExperimentParams) -> dict[str, ExperimentParams]:
    """Each arm's resolved params, with the comparison's shared start and budget applied
    (`brorl.params.compare_arms`: refused unless the arms start and are scored alike)."""
    return compare_arms(params, find_root())


@task(name="report", **_TASK)
def report(arm_params: dict[str, ExperimentParams], report_dir: str,
           metrics_path: str | None = None, baseline: str = "prorl") -> dict[str, Any]:
    """The Markdown/JSON/PNG report from the arms' run folders, each arm tested against
    `baseline`; with `metrics_path`, its `headline` there too (the DVC stage's metrics)."""
    root = find_root()
    arms = [ArmResult.load(name, root / p.train.run_dir) for name, p in arm_params.items()]
    first = next(iter(arm_params.values()))
    out = build_report(arms, root / report_dir, baseline,  # the arms are scored alike
                       EvalProtocol.from_params(first).sampling())
    if metrics_path is not None:
        path = root / metrics_path
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(headline(out), indent=2) + "\n")
    return {**out, "report_dir": str(root / report_dir)}


@task(name="compare-mlflow", **_TASK)
def log_report(p: ExperimentParams, result: dict[str, Any], run_id: str | None = None) -> str:
    """The comparison's MLflow run (the arms' parent when they were trained here): report attached."""
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    client = MlflowClient(uri)
    if run_id is None:
        run_id = create_mlflow_run(p)
    tracking.log_params(uri, run_id, p.model_dump(mode="json", include={"name", "compare"}))
    metrics = {k: [v] for k, v in report_metrics(result).items()}
    tracking.log_metric_series(uri, run_id, [0], metrics)
    folder = Path(result["report_dir"])
    for name in ("report.md", "report.json", "scores.png", "pass_at_1.png"):
        client.log_artifact(run_id, str(folder / name), artifact_path="report")
    client.log_artifact(run_id, str(timings_path(folder)), artifact_path="report")
    tracking.stop_system_metrics(run_id)
    client.set_terminated(run_id, status="FINISHED")
    return run_id


@task(name="create-compare-run", **_TASK)
def create_mlflow_run(p: ExperimentParams) -> str:
    """A new MLflow run for the comparison (status RUNNING until the report is logged)."""
    uri = tracking.resolve_tracking_uri(p.tracking.tracking_uri)
    experiment_id = tracking.ensure_experiment(p.tracking.experiment, uri)
    tags = {"stage": "compare", "git_commit": tracking.git_commit(),
            "arms": ",".join(p.compare.arms)}
    run_id = MlflowClient(uri).create_run(experiment_id, run_name=f"{p.name}-compare",
                                          tags=tags).info.run_id
    tracking.start_system_metrics(run_id, uri)
    return run_id
